"""Memory planning on its own: `plan_memory` over buffer lifetimes (checked against the lifetimes computed here by
brute force), views that alias their block on the CPU device, devices without sub-buffers, and
`intermediate_buffers` on kernelized graphs and the live graphs that read them."""

from __future__ import annotations

import numpy as np
import pytest

import lazygrad_scheduler.memory as memory
from lazygrad_scheduler import kernelize
from lazygrad_scheduler.memory import intermediate_buffers, plan_memory, planned_bytes
from lazygrad_uop.device import Buffer
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.tensor_graph import buffer_of, new_buffer
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker

F32 = dtypes.float32


@pytest.fixture(autouse=True)
def _views_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan as for a device with sub-buffers without opening one (this package runs no kernels); the test of devices
    without them patches this again."""
    monkeypatch.setattr(memory, "_supports_views", lambda device: True)
    monkeypatch.setattr(memory, "_alignment", lambda device: memory.ALIGN)


def _bufs(*sizes: int, dtype=F32) -> list[Buffer]:
    return [Buffer("CPU", n, dtype) for n in sizes]


def _base(b: Buffer) -> Buffer:
    return b.base if b.base is not None else b


def _aligned(n: int) -> int:
    return -(-n // memory.ALIGN) * memory.ALIGN


def test_a_chain_takes_two_activations() -> None:
    inp, out, *mids = _bufs(100, 100, 100, 100, 100, 100, 100)
    uses = [(mids[0], inp)] + [(mids[i + 1], mids[i]) for i in range(4)] + [(out, mids[4])]
    plan = plan_memory(uses, set(mids))
    assert set(plan) == set(mids) and inp not in plan and out not in plan
    assert len({id(_base(v)) for v in plan.values()}) == 1
    assert plan[mids[0]].offset == plan[mids[2]].offset == plan[mids[4]].offset
    assert plan[mids[1]].offset == plan[mids[3]].offset != plan[mids[0]].offset
    assert planned_bytes(plan) == 2 * _aligned(400)


def _live_peak(life: dict[Buffer, tuple[int, int]], steps: int) -> int:
    return max(sum(_aligned(b.nbytes) for b, (lo, hi) in life.items() if lo <= i <= hi) for i in range(steps))


@pytest.mark.parametrize("seed", range(8))
def test_overlapping_lifetimes_never_share(seed: int) -> None:
    rng = np.random.default_rng(seed)
    bufs = _bufs(*(int(n) for n in rng.integers(1, 3000, 30)), dtype=[F32, dtypes.float16, dtypes.int8][seed % 3])
    steps = 40
    uses: list[list[Buffer]] = [[] for _ in range(steps)]
    life: dict[Buffer, tuple[int, int]] = {}
    for b in bufs:
        lo, hi = sorted(int(x) for x in rng.integers(0, steps, 2))
        for i in {lo, hi, *rng.integers(lo, hi + 1, 2).tolist()}:
            uses[i].append(b)
        life[b] = (lo, hi)
    candidates = set(bufs[::3]) | set(bufs[1::3])
    plan = plan_memory(uses, candidates)
    assert set(plan) == candidates
    for b, v in plan.items():
        assert (v.size, v.dtype) == (b.size, b.dtype) and v.offset % memory.ALIGN == 0
        assert v.offset + v.nbytes <= _base(v).nbytes
    planned = list(plan)
    for i, a in enumerate(planned):
        for b in planned[i + 1 :]:
            (a0, a1), (b0, b1) = life[a], life[b]
            va, vb = plan[a], plan[b]
            if a0 <= b1 and b0 <= a1 and _base(va) is _base(vb):
                apart = va.offset + va.nbytes <= vb.offset or vb.offset + vb.nbytes <= va.offset
                assert apart, "buffers alive at the same time overlap in memory"
    # never less than the most bytes alive at once (a bound no plan can beat), never more than no sharing at all
    peak = _live_peak({b: life[b] for b in candidates}, steps)
    assert peak - memory.ALIGN < planned_bytes(plan) <= sum(_aligned(b.nbytes) for b in candidates)


def test_offsets_follow_a_device_that_needs_more_alignment(monkeypatch: pytest.MonkeyPatch) -> None:
    # an OpenCL device whose sub-buffers start at multiples of 1024 bytes (its allocator's `offset_alignment`)
    monkeypatch.setattr(memory, "_alignment", lambda device: 1024)
    a, b, c, other = _bufs(100, 300, 70, 10)
    plan = plan_memory([(a, other), (b, a), (c, b), (other, c)], {a, b, c})
    assert all(v.offset % 1024 == 0 for v in plan.values()) and len({plan[a].offset, plan[b].offset}) == 2
    assert planned_bytes(plan) == 2048 + 1024  # b rounded up to 2048, a then c beside it


def test_a_larger_user_takes_the_smaller_ones_memory() -> None:
    small, big, other = _bufs(10, 1000, 10)
    plan = plan_memory([(small, other), (big, other)], {small, big})
    assert _base(plan[small]) is _base(plan[big]) and plan[small].offset == plan[big].offset == 0
    assert _base(plan[big]).nbytes == _aligned(4000)


def test_small_buffers_fill_the_gaps_beside_a_big_one() -> None:
    # two small intermediates alive together, then one big one: the block is the big one's size, not big + small
    a, b, big, other = _bufs(100, 100, 1000, 10)
    plan = plan_memory([(a, other), (b, a), (other, b), (big, other), (other, big)], {a, b, big})
    assert planned_bytes(plan) == _aligned(4000)
    assert {plan[a].offset, plan[b].offset} == {0, _aligned(400)}


def test_planned_views_alias_their_block_on_the_cpu() -> None:
    pytest.importorskip("lazygrad_cpu", reason="needs the CPU device to allocate memory")
    a, b = _bufs(8, 8)
    plan = plan_memory([(a,), (b,)], {a, b})
    va, vb = plan[a].allocate(), plan[b].allocate()
    va.copyin(memoryview(np.arange(8, dtype=np.float32)))
    out = np.empty(8, np.float32)
    vb.copyout(memoryview(out))
    np.testing.assert_array_equal(out, np.arange(8))


def test_devices_without_sub_buffers_reuse_buffers_of_the_same_size_and_dtype(monkeypatch) -> None:
    monkeypatch.setattr(memory, "_supports_views", lambda device: False)
    a, b, c = _bufs(16, 16, 8)
    d = Buffer("CPU", 16, dtypes.int32)
    plan = plan_memory([(a,), (b,), (c,), (d,)], {a, b, c, d})
    assert plan == {b: a}


def test_views_and_non_candidates_are_left_alone() -> None:
    base, keep = _bufs(64, 16)
    view = Buffer("CPU", 8, F32, base=base)
    assert plan_memory([(view, keep), (keep,)], {view}) == {}


# *** which buffers are intermediates ***


def _input(n: int) -> UOp:
    return UOp(Ops.VIEW, F32, (new_buffer("CPU", n, F32),), ShapeTracker.from_shape((n,)))


def _step(x: UOp) -> UOp:
    """x + x, stored (CONTIGUOUS): a kernel of its own."""
    return UOp(Ops.CONTIGUOUS, F32, (UOp(Ops.ADD, F32, (x, x)),))


def test_intermediates_are_the_new_buffers_nothing_live_reads() -> None:
    x = _input(4)
    a = _step(x)
    b = _step(a)
    c = _step(b)
    becomes = kernelize([c])
    out = c.substitute(becomes)
    new = {buffer_of(v.src[0].src[0]) for v in becomes.values()}
    assert len(new) == 3
    found = intermediate_buffers(becomes, [out])
    assert found == {buffer_of(becomes[a].src[0].src[0]), buffer_of(becomes[b].src[0].src[0])}
    # a live graph that reads `a` after the schedule (through no kernel) keeps it
    later = UOp(Ops.MUL, F32, (a, a)).substitute(becomes)
    assert intermediate_buffers(becomes, [out, later]) == {buffer_of(becomes[b].src[0].src[0])}
