"""Hopper's tensor memory accelerator on the PYTHON device: TMA_LOAD copies a box of a strided tensor into local
memory (zeros past the tensor's edges, swizzled), MBARRIER_INIT/EXPECT/WAIT count its bytes, and the copy lands only
when a wait needs it. Checked against numpy slicing of the tensor and the PTX ISA's barrier phases."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyinterp_helpers import const, end, glob, index, program, rng, run, store

from lazygrad_python import InterpreterError, ProgramTextError, parse_program, render_program
from lazygrad_python.program_text import arg_text, parse_arg
from lazygrad_uop import DType, Ops, UOp, dtypes
from lazygrad_uop.device import TensorMap, swizzled

RNG = np.random.default_rng(0)
# the bits of each dtype, as numpy holds them: the copies must move them exactly
BITS = {dtypes.float16: np.uint16, dtypes.bfloat16: np.uint16, dtypes.float32: np.uint32}
EXPONENT = {dtypes.float16: 0x7C00, dtypes.bfloat16: 0x7F80, dtypes.float32: 0x7F800000}


def i32(v: int) -> UOp:
    return const(dtypes.int32, v)


def tensor_bits(tmap: TensorMap, rng: np.random.Generator) -> np.ndarray:
    """A buffer holding the tensor of `tmap`: random bits, never a nan or inf (they would not survive the register
    round trip of the reads), never a zero (so that stale zeros show)."""
    span = tmap.offset + sum((d - 1) * s for d, s in zip(tmap.dims, tmap.strides, strict=True)) + 1
    bits = rng.integers(1, EXPONENT[tmap.dtype], span, dtype=BITS[tmap.dtype])
    return bits | (rng.integers(0, 2, span, dtype=BITS[tmap.dtype]) << (8 * tmap.dtype.itemsize - 1))


def box_reference(tmap: TensorMap, buf: np.ndarray, coords: tuple[int, ...]) -> np.ndarray:
    """The box at `coords` by numpy (innermost dim last, as numpy orders axes), zeros outside the tensor."""
    item = buf.itemsize
    view = np.lib.stride_tricks.as_strided(
        buf[tmap.offset :], tmap.dims[::-1], tuple(s * item for s in tmap.strides[::-1]), writeable=False
    )
    padded = np.zeros([d + 2 * b for d, b in zip(tmap.dims[::-1], tmap.box[::-1], strict=True)], buf.dtype)
    padded[tuple(slice(b, b + d) for d, b in zip(tmap.dims[::-1], tmap.box[::-1], strict=True))] = view
    # coordinates more than a box past an edge see only zeros: clip them to one box past it
    starts = [min(max(c, -b), d) + b for c, d, b in zip(coords[::-1], tmap.dims[::-1], tmap.box[::-1], strict=True)]
    return padded[tuple(slice(s, s + b) for s, b in zip(starts, tmap.box[::-1], strict=True))]


def unswizzle_table(tmap: TensorMap, start: int, threads: int) -> np.ndarray:
    """The local element each box position landed at (positions row-major, innermost fastest), padded to a whole
    number of passes of `threads` with position 0."""
    n, item = math.prod(tmap.box), tmap.dtype.itemsize
    table = [swizzled(start + p * item, tmap.swizzle) // item for p in range(n)]
    return np.array(table + [table[0]] * (-n % threads), np.int32)


def tile_bytes(tmap: TensorMap, start: int) -> int:
    """Local bytes for a box landing at byte `start`: its swizzled last row fits in whole 1024-byte blocks."""
    return start + -(-tmap.box_bytes // 1024) * 1024


class Box:
    """The UOps of a workgroup that copies boxes of `tmap` (parameter 1) into local memory with one thread, which
    inits the barrier (`arrivals`), announces the bytes and starts the copy; the table of where each box position
    lands is parameter 2, the output parameter 0."""

    def __init__(self, tmap: TensorMap, threads: int = 64, start: int = 0, arrivals: int = 1) -> None:
        self.tmap, self.threads, self.start, self.dt = tmap, threads, start, tmap.dtype
        self.passes = -(-math.prod(tmap.box) // threads)
        self.tensor, self.table = glob(1, self.dt, 1 << 20), glob(2, dtypes.int32, self.passes * threads)
        self.lid = UOp.special(threads, "lidx0")
        self.leader = self.lid < 1
        self.bars = UOp(Ops.DEFINE_LOCAL, dtypes.uint64.ptr(2, local=True), arg="bars")
        self.tile = UOp(Ops.DEFINE_LOCAL, self.dt.ptr(tile_bytes(tmap, start) // self.dt.itemsize, local=True), arg="t")
        self.bar = index(self.bars, i32(0))
        self.init = UOp(Ops.MBARRIER_INIT, dtypes.void, (self.bar, self.leader), arrivals)
        self.barrier = UOp(Ops.BARRIER, dtypes.void, (self.init,))
        self.loops = 0  # the reading loops so far (each its own RANGE)

    def expect(self, nbytes: int | None = None, *deps: UOp) -> UOp:
        n = self.tmap.box_bytes if nbytes is None else nbytes
        return UOp(Ops.MBARRIER_EXPECT, dtypes.void, (self.bar, self.leader, *deps), n)

    def load(self, coords: tuple[UOp, ...], *deps: UOp, tmap: TensorMap | None = None) -> UOp:
        dst = index(self.tile, i32(self.start // self.dt.itemsize))
        src = (dst, self.tensor, self.bar, self.leader, *coords, *deps)
        return UOp(Ops.TMA_LOAD, dtypes.void, src, tmap or self.tmap)

    def wait(self, parity: UOp, *deps: UOp) -> UOp:
        return UOp(Ops.MBARRIER_WAIT, dtypes.void, (self.bar, parity, *deps))

    def read(self, out: UOp, slot: int | UOp, after: UOp) -> list[UOp]:
        """Each thread copies its share of the box (un-swizzled by the table) to `out` from box number `slot` on."""
        self.loops += 1
        r = rng(self.passes, axis=self.loops)
        p = r * self.threads + self.lid
        value = UOp(Ops.LOAD, self.dt, (index(self.tile, UOp(Ops.LOAD, dtypes.int32, (index(self.table, p),))),))
        return [after, r, store(out, p + slot * (self.passes * self.threads), value), end(r)]

    def run(self, uops: list[UOp], buf: np.ndarray, slots: int = 1) -> np.ndarray:
        out = np.zeros(slots * self.passes * self.threads, buf.dtype)
        table = unswizzle_table(self.tmap, self.start, self.threads)
        got = run(uops, out, buf, table, local_size=(self.threads, 1, 1))[0]
        return got.reshape(slots, -1)[:, : math.prod(self.tmap.box)].reshape(slots, *self.tmap.box[::-1])

    def copy_once(self, coords: tuple[int, ...]) -> list[UOp]:
        """One copy: init, BARRIER, announce, copy, every thread waits for phase 0 and reads the box."""
        out = glob(0, self.dt, self.passes * self.threads)
        expect = self.expect(None, self.barrier)
        wait = self.wait(i32(0), self.load(tuple(i32(c) for c in coords), expect))
        return program(out, self.lid, self.barrier, *self.read(out, 0, wait))


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.float32], ids=lambda d: d.name)
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("coords", [(30, 96), (-8, -3), (0, 0), (80, 40)])
def test_a_box_lands_swizzled_with_zeros_past_the_tensor(dt: DType, swizzle: int, coords: tuple[int, int]) -> None:
    # a 100 x 70 tensor, rows padded to 72 elements; boxes of 8 rows, each a swizzled row wide (64 elements unswizzled)
    inner = swizzle // dt.itemsize or 64
    tmap = TensorMap(dt, 8, (70, 100), (1, 72), (inner, 8), swizzle)
    buf = tensor_bits(tmap, RNG)
    box = Box(tmap, start=128)
    got = box.run(box.copy_once(coords), buf)[0]
    np.testing.assert_array_equal(got, box_reference(tmap, buf, coords))
    if coords == (30, 96):  # part of it past both edges: zeros there
        assert not got[4:].any() and not got[:, 40:].any() and got[:4, :40].all()


@st.composite
def tensor_maps(draw: st.DrawFn) -> tuple[TensorMap, tuple[int, ...], int]:
    dt = draw(st.sampled_from([dtypes.float16, dtypes.bfloat16, dtypes.float32]))
    per16 = 16 // dt.itemsize
    swizzle = draw(st.sampled_from([0, 32, 64, 128]))
    rank = draw(st.integers(1, 3))
    dims = [draw(st.integers(1, 90))] + [draw(st.integers(1, 12)) for _ in range(rank - 1)]
    strides = [1] + [per16 * draw(st.integers(1, 12)) for _ in range(rank - 1)]
    inner = per16 * draw(st.integers(1, (swizzle or 128) // 16))
    box = [inner] + [draw(st.integers(1, 6)) for _ in range(rank - 1)]
    coords = tuple(draw(st.integers(-b - 2, d + 2)) for b, d in zip(box, dims, strict=True))
    tmap = TensorMap(dt, per16 * draw(st.integers(0, 3)), tuple(dims), tuple(strides), tuple(box), swizzle)
    return tmap, coords, 128 * draw(st.integers(0, 9))


@settings(max_examples=40, deadline=None)
@given(tensor_maps(), st.integers(0, 2**32 - 1))
def test_random_boxes_of_random_tensors_match_numpy(case: tuple[TensorMap, tuple[int, ...], int], seed: int) -> None:
    tmap, coords, start = case
    buf = tensor_bits(tmap, np.random.default_rng(seed))
    box = Box(tmap, start=start)
    np.testing.assert_array_equal(box.run(box.copy_once(coords), buf)[0], box_reference(tmap, buf, coords))


def test_phases_alternate_parity_over_a_loop_of_copies() -> None:
    # 3 steps, each: the leader announces and copies rows 8k..8k+7, every thread waits for parity k % 2, reads the
    # box, and a BARRIER keeps the next copy from landing before every warp has read
    steps, dt = 3, dtypes.float16
    tmap = TensorMap(dt, 0, (64, 24), (1, 64), (64, 8), 128)
    buf = tensor_bits(tmap, RNG)
    box = Box(tmap)
    out = glob(0, dt, steps * box.passes * box.threads)
    k = rng(steps, axis=0)
    expect = box.expect(None, box.barrier, k)
    wait = box.wait(k % 2, box.load((i32(0), k * 8), expect))
    *reads, end_r = box.read(out, k, wait)
    uops = program(out, box.lid, box.barrier, k, *reads, end_r, UOp(Ops.BARRIER, dtypes.void, (end_r,)), end(k))
    got = box.run(uops, buf, steps)
    for s in range(steps):
        np.testing.assert_array_equal(got[s], box_reference(tmap, buf, (0, 8 * s)))


def test_reads_before_the_wait_or_with_the_wrong_parity_see_the_old_contents() -> None:
    # one warp: a read before waiting, and one after a wait for parity 1 (the phase before phase 0, complete at
    # once), see local memory's zeros; a read after the wait for parity 0 sees the box
    tmap = TensorMap(dtypes.float32, 0, (32, 4), (1, 32), (32, 4), 128)
    buf = tensor_bits(tmap, RNG)
    box = Box(tmap, threads=32)
    out = glob(0, tmap.dtype, 3 * box.passes * box.threads)
    copy = box.load((i32(0), i32(0)), box.expect(None, box.barrier))
    early = box.read(out, 0, copy)
    wrong = box.read(out, 1, box.wait(i32(1), early[-1]))
    right = box.read(out, 2, box.wait(i32(0), wrong[-1]))
    got = box.run(program(out, box.lid, box.barrier, *early, *wrong, *right), buf, 3)
    assert not got[:2].any()
    np.testing.assert_array_equal(got[2], box_reference(tmap, buf, (0, 0)))


def _one_copy(
    tmap: TensorMap | None = None,
    nbytes: int | None = None,
    arrivals: int = 1,
    start: int = 0,
    tile: int | None = None,
    init_twice: bool = False,
    wait: bool = True,
    reinit: bool = False,
) -> tuple[Box, list[UOp]]:
    """A single copy (of a 64 x 8 fp16 box unless `tmap` says otherwise): `nbytes` announced (the box's by default),
    a barrier of `arrivals`, the box at local byte `start` of a tile of `tile` elements, a second init after the copy
    (`init_twice`), a wait or none, an init again after the wait and a BARRIER (`reinit`)."""
    tmap = tmap or TensorMap(dtypes.float16, 0, (64, 8), (1, 64), (64, 8), 128)
    box = Box(tmap, start=start, arrivals=arrivals)
    if tile is not None:
        box.tile = UOp(Ops.DEFINE_LOCAL, tmap.dtype.ptr(tile, local=True), arg="t")
    out = glob(0, tmap.dtype, box.passes * box.threads)
    last = box.load((i32(0), i32(0))[: len(tmap.dims)], box.expect(nbytes, box.barrier))
    if init_twice:
        last = UOp(Ops.MBARRIER_INIT, dtypes.void, (box.bar, box.leader, last), 1)
    if wait:
        last = box.wait(i32(0), last)
    if reinit:  # once every warp has waited
        last = UOp(Ops.MBARRIER_INIT, dtypes.void, (box.bar, box.leader, UOp(Ops.BARRIER, dtypes.void, (last,))), 1)
    return box, program(out, box.lid, box.barrier, *box.read(out, 0, last))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"nbytes": 1000}, r"phase 0 \(0 of 1 arrivals left, 1000 bytes expected, 1024 landed\) would hang"),
        ({"nbytes": 2048}, r"2048 bytes expected, 1024 landed\) would hang"),
        ({"arrivals": 2}, r"phase 0 \(1 of 2 arrivals left, 1024 bytes expected, 0 landed, 1024 more in flight\)"),
        ({"start": 64}, "local byte 64, is not 128-byte aligned"),
        ({"tile": 500}, "box of 1024 bytes from local byte 0 .* leaves the DEFINE_LOCAL's 1000 bytes"),
        # one 64-byte row at byte 512 lands swizzled at bytes 576 to 639: past a tile of 576 bytes
        (
            {"tmap": TensorMap(dtypes.float16, 0, (32,), (1,), (32,), 128), "nbytes": 64, "start": 512, "tile": 288},
            "box of 64 bytes from local byte 512 .* leaves the DEFINE_LOCAL's 576 bytes",
        ),
        ({"init_twice": True}, "MBARRIER_INIT of mbarrier 0 .* in the middle of a phase"),
        ({"wait": False}, "finished with TMA_LOAD copies to mbarrier 0 .* in flight: no thread waited"),
    ],
)
def test_what_would_hang_or_corrupt_on_hardware_raises(change: dict[str, Any], message: str) -> None:
    box, uops = _one_copy(**change)
    buf = tensor_bits(box.tmap, RNG)
    with pytest.raises(InterpreterError, match=message):
        box.run(uops, buf)


def test_a_completed_barrier_may_be_set_up_again() -> None:
    box, uops = _one_copy(reinit=True)
    buf = tensor_bits(box.tmap, RNG)
    np.testing.assert_array_equal(box.run(uops, buf)[0], box_reference(box.tmap, buf, (0, 0)))


def test_an_arrival_too_many_and_a_barrier_never_set_up_raise() -> None:
    tmap = TensorMap(dtypes.float16, 0, (64, 8), (1, 64), (64, 8), 128)
    box = Box(tmap)
    out = glob(0, tmap.dtype, box.passes * box.threads)
    # two announcements for a barrier of one arrival, nobody having waited in between
    twice = box.expect(None, box.load((i32(0), i32(0)), box.expect(None, box.barrier)))
    with pytest.raises(InterpreterError, match="which has all its arrivals"):
        box.run(program(out, box.lid, box.barrier, *box.read(out, 0, box.wait(i32(0), twice))), tensor_bits(tmap, RNG))
    copy = box.load((i32(0), i32(0)), box.expect(None, box.barrier))
    other = UOp(Ops.MBARRIER_WAIT, dtypes.void, (index(box.bars, i32(1)), i32(0), copy))
    with pytest.raises(InterpreterError, match=r"mbarrier 1 of DEFINE_LOCAL .* is used before an MBARRIER_INIT"):
        box.run(program(out, box.lid, box.barrier, *box.read(out, 0, other)), tensor_bits(tmap, RNG))


def test_an_announcement_of_no_bytes_completes_the_phase_at_once() -> None:
    # a barrier of one arrival that expects nothing: its phase completes at the arrival, so the next announcement
    # belongs to phase 1, and waits for parity 0 and then 1 return (one warp: a second one, waiting for parity 0
    # after the first completed phase 1, would wait for phase 2, forever)
    tmap = TensorMap(dtypes.float16, 0, (64, 8), (1, 64), (64, 8), 128)
    box = Box(tmap, threads=32)
    out = glob(0, tmap.dtype, box.passes * box.threads)
    first = box.wait(i32(0), box.expect(0, box.barrier))
    second = box.wait(i32(1), box.load((i32(0), i32(0)), box.expect(None, first)))
    buf = tensor_bits(tmap, RNG)
    got = box.run(program(out, box.lid, box.barrier, *box.read(out, 0, second)), buf)[0]
    np.testing.assert_array_equal(got, box_reference(tmap, buf, (0, 0)))


# *** the program text ***


def test_tensor_maps_and_the_new_ops_round_trip_through_the_program_text() -> None:
    tmap = TensorMap(dtypes.bfloat16, 8, (70, 100, 3), (1, 72, 7200), (64, 8, 2), 128)
    assert parse_arg(arg_text(tmap)) == tmap
    assert parse_arg(arg_text((tmap, 3))) == (tmap, 3)
    box = Box(tmap)
    uops = box.copy_once((-3, 90, 1))
    parsed = parse_program(render_program(uops))
    position = {u: i for i, u in enumerate(uops)}
    assert {u.op for u in uops} >= {Ops.MBARRIER_INIT, Ops.MBARRIER_EXPECT, Ops.TMA_LOAD, Ops.MBARRIER_WAIT}
    for u, x in zip(uops, parsed, strict=True):
        assert (x.op, x.dtype, x.src, x.arg) == (u.op, u.dtype, tuple(position[s] for s in u.src), u.arg)


@pytest.mark.parametrize(
    "text",
    [
        "TensorMap(dtype=float16, offset=0, dims=(70,), strides=(1,), box=(4,), swizzle=0)",  # a box of 8 bytes
        "TensorMap(dtype=float16, offset=0, dims=(70,), strides=(1,))",
        "TensorMap(dtype=1, offset=0, dims=(70,), strides=(1,), box=(8,), swizzle=0)",
        "TensorMap(float16, 0, (70,), (1,), (8,), 0)",
        "TensorMap(**kw)",
        "TensorMap(dtype=float16, offset=0, dims=(70,), strides=(1,), box=(8,), swizzle=__import__('os'))",
        "Fake(dtype=float16)",
    ],
)
def test_tensor_maps_parse_from_checked_literals_only(text: str) -> None:
    with pytest.raises(ProgramTextError):
        parse_arg(text)
