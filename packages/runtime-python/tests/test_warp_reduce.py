"""Warp-level reductions: `SHUFFLE_XOR` run by the interpreter against numpy's view of lane exchange, and grouped
reductions that codegen combines by shuffles on a GPU target that declares a warp width, run end to end against
numpy for sums, maxima and minima of float32, int32 and float16 over sizes that are and are not multiples of the
group."""

from __future__ import annotations

import numpy as np
import pytest
from pyinterp_helpers import end, glob, index, load, program, run, store

from lazygrad_codegen.kernel_ast import row_reduce
from lazygrad_python import InterpreterError, PythonCompiler, PythonProgram, PythonRenderer
from lazygrad_python.device import GPUTarget
from lazygrad_uop import DType, Ops, UOp, dtypes
from lazygrad_uop.dtype import to_numpy_dtype
from lazygrad_uop.registry import Device

codegen = pytest.importorskip("lazygrad_codegen")
views = pytest.importorskip("lazygrad_uop.views")
Opt, OptOps = codegen.Opt, codegen.OptOps

RNG = np.random.default_rng(7)


def special(name: str, size: int) -> UOp:
    return UOp.special(size, name)


def shuffle(x: UOp, offset: int) -> UOp:
    return UOp(Ops.SHUFFLE_XOR, x.dtype, (x,), offset)


# *** the op itself ***


@pytest.mark.parametrize("offset", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32, dtypes.float16], ids=str)
def test_shuffle_xor_exchanges_lanes_of_one_warp(offset: int, dtype: DType) -> None:
    # 96 threads: three warps of 32, each exchanging only among its own lanes
    n = 96
    x = (RNG.integers(-1000, 1000, n) / 4).astype(to_numpy_dtype(dtype))
    out, inp = glob(0, dtype, n), glob(1, dtype, n)
    lid = special("lidx0", n)
    uops = program(store(out, lid, shuffle(load(inp, lid), offset)))
    (res, _) = run(uops, np.zeros(n, x.dtype), x, local_size=(n, 1, 1))
    lanes = np.arange(n)
    np.testing.assert_array_equal(res, x[(lanes // 32) * 32 + (lanes % 32 ^ offset)])


def test_shuffle_xor_lanes_count_x_fastest_over_two_dimensions() -> None:
    # a 16x4 workgroup: thread (x, y) has lane (16 * y + x) mod 32, so offset 16 swaps neighbouring rows
    out, inp = glob(0, dtypes.int32, 64), glob(1, dtypes.int32, 64)
    flat = special("lidx1", 4) * 16 + special("lidx0", 16)
    uops = program(store(out, flat, shuffle(load(inp, flat), 16)))
    (res, _) = run(uops, np.zeros(64, np.int32), np.arange(64, dtype=np.int32), local_size=(16, 4, 1))
    np.testing.assert_array_equal(res.reshape(4, 16), np.arange(64).reshape(4, 16)[[1, 0, 3, 2]])


def test_shuffle_xor_needs_every_thread_of_the_warp() -> None:
    out, inp = glob(0, dtypes.float32, 32), glob(1, dtypes.float32, 32)
    lid = special("lidx0", 32)
    # a loop whose trip count differs between threads: inside it, some threads are masked off
    r = UOp.range(lid % 2 + 1, 0)
    uops = program(r, store(out, lid, shuffle(load(inp, lid), 1)), end(r))
    with pytest.raises(InterpreterError, match="inactive"):
        run(uops, np.zeros(32, np.float32), np.zeros(32, np.float32), local_size=(32, 1, 1))
    # a workgroup of 24 threads is one partial warp: lane 7 has no partner at offset 16 (lane 23 does: 7)
    lid24 = special("lidx0", 24)
    uops = program(store(glob(0, dtypes.float32, 24), lid24, shuffle(load(glob(1, dtypes.float32, 24), lid24), 16)))
    with pytest.raises(InterpreterError, match="only 24 threads"):
        run(uops, np.zeros(24, np.float32), np.zeros(24, np.float32), local_size=(24, 1, 1))
    # offset 4 pairs lanes within runs of 8: fine in 24 threads
    uops = program(store(glob(0, dtypes.float32, 24), lid24, shuffle(load(glob(1, dtypes.float32, 24), lid24), 4)))
    (res, _) = run(uops, np.zeros(24, np.float32), np.arange(24, dtype=np.float32), local_size=(24, 1, 1))
    np.testing.assert_array_equal(res, np.arange(24) ^ 4)


@pytest.mark.parametrize("offset", [0, 3, 32, True])
def test_shuffle_xor_offsets_are_powers_of_two_inside_a_warp(offset: int) -> None:
    lid = special("lidx0", 32)
    uops = program(store(glob(0, dtypes.int32, 32), lid, shuffle(load(glob(1, dtypes.int32, 32), lid), offset)))
    with pytest.raises(ValueError, match="SHUFFLE_XOR"):
        run(uops, np.zeros(32, np.int32), np.zeros(32, np.int32), local_size=(32, 1, 1))


def test_butterfly_of_shuffles_gives_every_lane_the_warp_sum() -> None:
    # the reduction codegen builds, written by hand: five steps for 32 lanes, then thread 0 of each warp stores
    x = RNG.integers(-50, 50, 64).astype(np.int32)
    out, inp = glob(0, dtypes.int32, 2), glob(1, dtypes.int32, 64)
    lid = special("lidx0", 64)
    v = load(inp, lid)
    for offset in (16, 8, 4, 2, 1):
        v = v + shuffle(v, offset)
    lane0 = (lid % 32).eq(0)
    gated = UOp(Ops.STORE, dtypes.void, (index(out, lid // 32), v, lane0))
    (res, _) = run(program(gated), np.zeros(2, np.int32), x, local_size=(64, 1, 1))
    np.testing.assert_array_equal(res, x.reshape(2, 32).sum(1))


# *** grouped reductions lowered by codegen ***

WARP = GPUTarget(name="WARPGPU", warp_size=32)
NO_WARP = GPUTarget(name="GPU")


def st(*shape: int):
    return views.ShapeTracker.from_shape(shape)


def data(dtype: DType, shape: tuple[int, int]) -> np.ndarray:
    """Values whose sums are exact in `dtype` whatever the order of the additions, so any correct reduction gives
    numpy's result exactly: integers, and floats on a coarse grid (eighths for float16, whose partial sums stay
    below 256 here)."""
    if dtype == dtypes.int32:
        return RNG.integers(-1000, 1000, shape).astype(np.int32)
    if dtype == dtypes.float16:
        return (RNG.integers(-12, 13, shape) / 8).astype(np.float16)
    return (RNG.integers(-4096, 4096, shape) / 64).astype(np.float32)


def reference(kind: str, x: np.ndarray) -> np.ndarray:
    if kind == "sum":
        return x.astype(np.float64).sum(1).astype(x.dtype)
    return x.max(1) if kind == "max" else x.min(1)


def run_reduce(kind: str, dtype: DType, rows: int, n: int, opts: list | None, target: GPUTarget = WARP):
    """Compile the reduction for a PYTHON GPU target, run it, and return (result, reference, program spec)."""
    spec = codegen.get_program(row_reduce(kind, dtype, rows, n), PythonRenderer(target), opts)
    prg = PythonProgram(Device["PYTHON"], spec.name, PythonCompiler().compile(spec.src))
    x = data(dtype, (rows, n))
    (res, _) = run(prg, np.zeros(rows, x.dtype), x.ravel(), global_size=spec.global_size, local_size=spec.local_size)
    return res, reference(kind, x), spec


def ops_of(spec) -> set[Ops]:
    return {u.op for u in spec.uops}


CASES = [
    # (rows, n, opts, shared memory used): one warp per row, no shared memory
    pytest.param(4, 96, [Opt(OptOps.GROUP, 0, 32)], False, id="group32-3each"),
    # 8 warps per row; their 8 partials combined by shuffles again
    pytest.param(1, 1024, [Opt(OptOps.GROUPTOP, 0, 256)], True, id="grouptop256"),
    # 3 warps per row (not a power of two): their partials combined in a loop
    pytest.param(2, 288, [Opt(OptOps.GROUP, 0, 96)], True, id="group96-loop"),
    # groups of 8 inside a warp, with LOCAL rows: 4 groups per warp, 3 rows = 24 threads, a partial warp
    pytest.param(6, 40, [Opt(OptOps.GROUP, 0, 8), Opt(OptOps.LOCAL, 0, 3)], False, id="group8-local3"),
    # two outputs per thread: the vector of partials is shuffled lane by lane
    pytest.param(4, 64, [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.GROUPTOP, 0, 16)], False, id="upcast2-group16"),
    # a 64-thread group, 2 warps, two outputs per thread, LOCAL 2: 4 warps in the workgroup
    pytest.param(
        4, 192, [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.GROUP, 0, 64)], True, id="l2-g64"
    ),
]


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32, dtypes.float16], ids=str)
@pytest.mark.parametrize("kind", ["sum", "max", "min"])
@pytest.mark.parametrize(("rows", "n", "opts", "shared"), CASES)
def test_grouped_reductions_combine_within_warps(
    rows: int, n: int, opts: list, shared: bool, kind: str, dtype: DType
) -> None:
    res, ref, spec = run_reduce(kind, dtype, rows, n, opts)
    np.testing.assert_array_equal(res, ref)
    assert Ops.SHUFFLE_XOR in ops_of(spec)
    assert (Ops.DEFINE_LOCAL in ops_of(spec)) is shared and (Ops.BARRIER in ops_of(spec)) is shared


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32, dtypes.float16], ids=str)
@pytest.mark.parametrize("kind", ["sum", "max", "min"])
@pytest.mark.parametrize("n", [1000, 4099])
def test_lengths_no_group_divides_are_padded(n: int, kind: str, dtype: DType) -> None:
    res, ref, spec = run_reduce(kind, dtype, 1, n, None)
    np.testing.assert_array_equal(res, ref)
    assert spec.opts[0].op is OptOps.PADTO and spec.opts[1].op is OptOps.GROUPTOP
    assert spec.opts[1].arg % 32 == 0 and Ops.SHUFFLE_XOR in ops_of(spec)
    # a max or min can't read the padding as zeros: it reads the reduction's identity there
    assert (Ops.WHERE in ops_of(spec)) is (kind != "sum")


@pytest.mark.parametrize("target", [WARP, NO_WARP], ids=["warp", "no-warp"])
@pytest.mark.parametrize("kind", ["max", "min"])
def test_padded_max_and_min_with_chosen_opts(kind: str, target: GPUTarget) -> None:
    # negative data: padding read as 0 would win a max; positive: it would win a min
    for sign in (-1, 1):
        spec = codegen.get_program(
            row_reduce(kind, dtypes.float32, 3, 50),
            PythonRenderer(target),
            [Opt(OptOps.PADTO, 1, 16), Opt(OptOps.GROUP, 0, 16), Opt(OptOps.LOCAL, 0, 3)],
        )
        prg = PythonProgram(Device["PYTHON"], spec.name, PythonCompiler().compile(spec.src))
        x = (sign * (RNG.random((3, 50)) + 0.5)).astype(np.float32)
        launch = {"global_size": spec.global_size, "local_size": spec.local_size}
        (res, _) = run(prg, np.zeros(3, np.float32), x.ravel(), **launch)
        np.testing.assert_array_equal(res, reference(kind, x))


@pytest.mark.parametrize("kind", ["sum", "max", "min"])
def test_heuristic_gives_single_outputs_a_large_workgroup_of_warps(kind: str) -> None:
    res, ref, spec = run_reduce(kind, dtypes.float32, 1, 4096, None)
    np.testing.assert_array_equal(res, ref)
    assert spec.opts[0] == Opt(OptOps.GROUPTOP, 0, 1024) and spec.local_size == (1024, 1, 1)
    assert Ops.SHUFFLE_XOR in ops_of(spec)
    # without warps the same kernel keeps the 256-thread group through local memory
    res, ref, spec = run_reduce(kind, dtypes.float32, 1, 4096, None, NO_WARP)
    np.testing.assert_array_equal(res, ref)
    assert spec.opts[0] == Opt(OptOps.GROUPTOP, 0, 256) and Ops.SHUFFLE_XOR not in ops_of(spec)


@pytest.mark.parametrize("width", [8, 16])
def test_narrower_declared_warps_run_in_the_interpreters_wider_ones(width: int) -> None:
    # a warp of 32 holds whole runs of `width` lanes, so shuffles within each run stay inside it
    target = GPUTarget(name=f"W{width}", warp_size=width)
    res, ref, spec = run_reduce("sum", dtypes.int32, 3, 256, [Opt(OptOps.GROUP, 0, 64)], target)
    np.testing.assert_array_equal(res, ref)
    offsets = {u.arg for u in spec.uops if u.op is Ops.SHUFFLE_XOR}
    assert max(offsets) == width // 2


def test_group_sizes_that_fit_no_warp_keep_local_memory() -> None:
    # 12 threads: neither a multiple of 32 nor a divisor of it
    res, ref, spec = run_reduce("sum", dtypes.int32, 2, 48, [Opt(OptOps.GROUP, 0, 12)])
    np.testing.assert_array_equal(res, ref)
    assert Ops.SHUFFLE_XOR not in ops_of(spec) and Ops.DEFINE_LOCAL in ops_of(spec)


def test_gpu_target_checks_its_warp_width() -> None:
    with pytest.raises(ValueError, match="warp_size"):
        GPUTarget(warp_size=24)
    with pytest.raises(ValueError, match="warp_size"):
        GPUTarget(warp_size=64)


def test_reduction_of_a_constant_needs_no_shuffle() -> None:
    c = UOp(Ops.CONST, dtypes.int32, (UOp(Ops.VIEW, arg=st(2, 64)),), 3)
    red = UOp(Ops.REDUCE_AXIS, dtypes.int32, (c,), (Ops.MAX, (1,)))
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.int32.ptr(2), arg=0)
    ast = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (out, UOp(Ops.VIEW, arg=st(2, 1)), red)),))
    spec = codegen.get_program(ast, PythonRenderer(WARP), [Opt(OptOps.GROUP, 0, 32)])
    prg = PythonProgram(Device["PYTHON"], spec.name, PythonCompiler().compile(spec.src))
    (res,) = run(prg, np.zeros(2, np.int32), global_size=spec.global_size, local_size=spec.local_size)
    np.testing.assert_array_equal(res, [3, 3])


@pytest.mark.parametrize(
    "opts",
    [
        [Opt(OptOps.GROUP, 0, 4), Opt(OptOps.GROUP, 1, 8)],  # 32 threads over two group axes: one warp
        [Opt(OptOps.GROUP, 0, 8), Opt(OptOps.GROUPTOP, 1, 8)],  # 64: two warps
        [Opt(OptOps.GROUP, 0, 2), Opt(OptOps.GROUP, 1, 4), Opt(OptOps.LOCAL, 0, 2)],  # groups of 8, two per warp
    ],
    ids=["g4xg8", "g8xgt8", "g2xg4-l2"],
)
def test_groups_over_two_reduce_axes_number_lanes_row_major(opts: list) -> None:
    # a permuted input keeps the two reduce axes apart, so each can be grouped
    rows = 4
    a = RNG.integers(-1000, 1000, (rows, 8, 16)).astype(np.int32)
    view = views.ShapeTracker.from_shape((rows, 8, 16)).permute((0, 2, 1))
    x = UOp(Ops.LOAD, dtypes.int32, (UOp(Ops.DEFINE_GLOBAL, dtypes.int32.ptr(a.size), arg=1), UOp(Ops.VIEW, arg=view)))
    red = UOp(Ops.REDUCE_AXIS, dtypes.int32, (x,), (Ops.ADD, (1, 2)))
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.int32.ptr(rows), arg=0)
    ast = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (out, UOp(Ops.VIEW, arg=st(rows, 1, 1)), red)),))
    spec = codegen.get_program(ast, PythonRenderer(WARP), opts)
    prg = PythonProgram(Device["PYTHON"], spec.name, PythonCompiler().compile(spec.src))
    launch = {"global_size": spec.global_size, "local_size": spec.local_size}
    (res, _) = run(prg, np.zeros(rows, np.int32), a.ravel(), **launch)
    np.testing.assert_array_equal(res, a.sum((1, 2)))
    assert Ops.SHUFFLE_XOR in ops_of(spec)
