"""Warp-level grouped reductions on the codegen side: which groups a renderer's `warp_size` lets combine by shuffles
(`Kernel.warp_split`), the shared memory they still need, the linear program they lower to, the heuristic's choice
of large groups and padding for reductions to few outputs, and padded reduce axes masked with the identity (run on
the PYTHON device against numpy)."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_cases import Case, check, load, reduce, run_python, sink, st
from codegen_cases import store as store_

from lazygrad_codegen import CRenderer, Kernel, Opt, OptOps, get_program
from lazygrad_codegen.heuristic import hand_coded_optimizations
from lazygrad_codegen.kernel import warp_size
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops


class WarpGPU(CRenderer):
    """A GPU whose renderer declares 32-thread warps (kernels are lowered, not rendered: C has no shuffles)."""

    device = "TESTWARPGPU"
    has_local = True
    has_shared = True
    warp_size = 32


class NoWarpGPU(WarpGPU):
    warp_size = 0


class SmallWarpGPU(WarpGPU):
    max_workgroup_threads = 256


def single_sum(n: int, op: Ops = Ops.ADD, rows: int = 1):
    x = load(1, dtypes.float32, st(rows, n))
    return sink(store_(0, reduce(x, op, (1,)), st(rows, 1)))


def grouped(amount: int, renderer=None, top: bool = False, n: int = 4096) -> Kernel:
    k = Kernel(single_sum(n), renderer or WarpGPU())
    k.apply_opt(Opt(OptOps.GROUPTOP if top else OptOps.GROUP, 0, amount))
    return k


@pytest.mark.parametrize(
    ("amount", "split"),
    [(32, (32, 1)), (256, (32, 8)), (1024, (32, 32)), (96, (32, 3)), (16, (16, 1)), (2, (2, 1)), (12, None)],
)
def test_warp_split_of_group_sizes(amount: int, split: tuple[int, int] | None) -> None:
    n = 4096 if 4096 % amount == 0 else amount * 8
    assert grouped(amount, n=n).warp_split() == split
    assert grouped(amount, NoWarpGPU(), n=n).warp_split() is None


def test_shared_memory_is_one_slot_per_warp_or_none() -> None:
    assert grouped(256).shared_bytes() == 8 * 4
    assert grouped(32).shared_bytes() == 0
    assert grouped(12, n=96).shared_bytes() == 12 * 4
    assert grouped(256, NoWarpGPU()).shared_bytes() == 256 * 4


def test_renderer_warp_size_must_be_a_power_of_two() -> None:
    class Odd(WarpGPU):
        warp_size = 24

    with pytest.raises(ValueError, match="power of two"):
        warp_size(Odd())
    assert warp_size(WarpGPU()) == 32 and warp_size(CRenderer()) == 0  # no local dimensions: no warps


def test_lowered_group_of_one_warp_shuffles_without_local_memory() -> None:
    spec = get_program(single_sum(4096), _PythonWarp(), [Opt(OptOps.GROUP, 0, 32)])
    ops = [u.op for u in spec.uops]
    shuffles = [u.arg for u in spec.uops if u.op is Ops.SHUFFLE_XOR]
    assert shuffles == [16, 8, 4, 2, 1]
    assert Ops.DEFINE_LOCAL not in ops and Ops.BARRIER not in ops
    # the butterfly runs after the thread's own loop has ended
    last_end = max(i for i, op in enumerate(ops) if op is Ops.END)
    assert ops.index(Ops.SHUFFLE_XOR) > last_end


def test_lowered_group_of_eight_warps_shuffles_twice_around_one_barrier() -> None:
    spec = get_program(single_sum(4096), _PythonWarp(), [Opt(OptOps.GROUPTOP, 0, 256)])
    shuffles = [u.arg for u in spec.uops if u.op is Ops.SHUFFLE_XOR]
    assert shuffles == [16, 8, 4, 2, 1, 4, 2, 1]
    (local,) = [u for u in spec.uops if u.op is Ops.DEFINE_LOCAL]
    assert local.dtype.size == 8  # one partial per warp
    barrier = next(i for i, u in enumerate(spec.uops) if u.op is Ops.BARRIER)
    (store,) = spec.uops[barrier].src
    assert len(store.src) == 3  # only each warp's first lane writes


def _PythonWarp():  # noqa: N802
    py = pytest.importorskip("lazygrad_python")
    return py.PythonRenderer(py.GPUTarget(name="WARPGPU", warp_size=32))


# *** heuristic ***


def _opts(ast, renderer) -> list[Opt]:
    return hand_coded_optimizations(Kernel(ast, renderer)).applied_opts


def test_few_outputs_get_a_workgroup_of_up_to_1024_threads_on_warp_gpus() -> None:
    assert _opts(single_sum(4096), WarpGPU())[0] == Opt(OptOps.GROUPTOP, 0, 1024)
    assert _opts(single_sum(4096, rows=4), WarpGPU())[0] == Opt(OptOps.GROUPTOP, 0, 1024)
    assert _opts(single_sum(4096), SmallWarpGPU())[0] == Opt(OptOps.GROUPTOP, 0, 256)
    # many outputs along contiguous rows: a workgroup of 256 per row (lazygrad_codegen.reductions)
    assert Opt(OptOps.GROUP, 0, 256) in _opts(single_sum(4096, rows=64), WarpGPU())
    # no warps: groups of 256 as before
    assert _opts(single_sum(4096), NoWarpGPU())[0] == Opt(OptOps.GROUPTOP, 0, 256)


@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX])
def test_lengths_no_group_divides_are_padded_to_whole_warps(op: Ops) -> None:
    opts = _opts(single_sum(1000, op), WarpGPU())
    assert opts[:2] == [Opt(OptOps.PADTO, 0, 128), Opt(OptOps.GROUPTOP, 0, 128)]
    opts = _opts(single_sum(100_003, op), WarpGPU())
    assert opts[:2] == [Opt(OptOps.PADTO, 0, 1024), Opt(OptOps.GROUPTOP, 0, 1024)]
    # too short to be worth it, or no warps: no padding
    assert not any(o.op is OptOps.PADTO for o in _opts(single_sum(100, op), WarpGPU()))
    assert not any(o.op is OptOps.PADTO for o in _opts(single_sum(1000, op), NoWarpGPU()))


# *** padded reduce axes ***


def _padded_case(op: str, rows: int = 4, n: int = 30) -> Case:
    rng = np.random.default_rng(5)
    a = (-(rng.random((rows, n)) + 0.5)).astype(np.float32)  # all negative: a 0 from the padding would win a max
    x = load(1, dtypes.float32, st(rows, n))
    if op == "max":
        red, ref = reduce(x, Ops.MAX, (1,)), a.max(1)
    else:
        red, ref = reduce(x.alu(Ops.EXP2), Ops.ADD, (1,)), np.exp2(a.astype(np.float64)).sum(1)
    return Case(f"padded_{op}", sink(store_(0, red, st(rows, 1))), {1: a}, {0: ref}, tol=1e-5)


@pytest.mark.parametrize("op", ["max", "exp2_sum"])
def test_padded_reduce_axis_reads_the_identity(op: str) -> None:
    py = pytest.importorskip("lazygrad_python")
    case = _padded_case(op)
    for renderer, opts in [
        (py.PythonRenderer(), [Opt(OptOps.PADTO, 1, 32), Opt(OptOps.UNROLL, 0, 4)]),
        (_PythonWarp(), [Opt(OptOps.PADTO, 1, 32), Opt(OptOps.GROUPTOP, 0, 16), Opt(OptOps.LOCAL, 0, 2)]),
    ]:
        out, spec = run_python(case.ast, renderer, opts, case.inputs)
        check(case, out, f"{case.name} with {spec.opts}")
