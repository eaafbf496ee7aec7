"""Operand staging (the STAGE opt, `lazygrad_codegen.staging`) and the default multi-warp matmul tiles
(`lazygrad_codegen.tiling`): kernels lowered for a GPU-like PYTHON renderer (local memory, barriers, the CUDA
tensor cores) and run by the interpreter, which emulates a workgroup's warps between barriers, against numpy (and
torch for the convolution passes through the frontend), on shapes that are and are not multiples of the tiles."""

from __future__ import annotations

import math

import numpy as np
import pytest
from codegen_cases import Case, check, run_python
from hypothesis import example, given, settings
from hypothesis import strategies as st_

from lazygrad_codegen import Kernel, KernelOptError, Opt, OptOps, get_program, staging, tiling
from lazygrad_codegen.heuristic import hand_coded_optimizations
from lazygrad_codegen.kernel import AxisType
from lazygrad_codegen.kernel_ast import load, reduce, sink, st, store
from lazygrad_codegen.staging import LAUNCH_GROUPS, grouped_launch, plan
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.symbolic import sym_infer
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker, View

py = pytest.importorskip("lazygrad_python")
cuda_cores = pytest.importorskip("lazygrad_cuda.tensor_cores")

RNG = np.random.default_rng(14)
TC_GPU = py.PythonRenderer(py.GPUTarget(name="TCGPU", tensor_cores=cuda_cores.TENSOR_CORES["sm_80"], warp_size=32))
FMA_GPU = py.PythonRenderer(py.GPUTarget(name="FMAGPU", warp_size=32))
# copies into local memory by ASYNC_COPY/ASYNC_WAIT, as on CUDA sm_80+
ASYNC_TC_GPU = py.PythonRenderer(
    py.GPUTarget(name="ASYNCGPU", tensor_cores=cuda_cores.TENSOR_CORES["sm_80"], warp_size=32, async_copy=True)
)


def _encode(x: np.ndarray, dtype: DType) -> tuple[np.ndarray, np.ndarray]:
    """`x` stored as `dtype` (bfloat16 as its bits in uint16), and the values that holds, as float64."""
    if dtype == dtypes.bfloat16:
        bits = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    v = x.astype({dtypes.float16: np.float16, dtypes.float32: np.float32}[dtype])
    return v, v.astype(np.float64)


def bmm_ast(batch: int, m: int, n: int, k: int, dtype: DType) -> UOp:
    """The kernel of C[b] = A[b] @ B[b] with A (b, m, k) and B (b, k, n) row-major; fp32 accumulation."""
    x = load(1, dtype, st(batch, m, 1, k).expand((batch, m, n, k)))
    y = load(2, dtype, st(batch, 1, k, n).permute((0, 1, 3, 2)).expand((batch, m, n, k)))
    prod = x * y if dtype == dtypes.float32 else x.cast(dtypes.float32) * y.cast(dtypes.float32)
    return sink(store(0, reduce(prod, Ops.ADD, (3,)), st(batch, m, n, 1)))


def bmm(batch: int, m: int, n: int, k: int, dtype: DType) -> Case:
    """`bmm_ast` with random inputs and the numpy result."""
    a_store, a = _encode(RNG.standard_normal((batch, m, k)), dtype)
    b_store, b = _encode(RNG.standard_normal((batch, k, n)), dtype)
    ast = bmm_ast(batch, m, n, k, dtype)
    tol = 1e-4 if dtype == dtypes.float32 else 1e-3
    return Case(f"bmm_{batch}x{m}x{n}x{k}_{dtype.name}", ast, {1: a_store, 2: b_store}, {0: (a @ b).reshape(-1)}, tol)


def conv(batch: int, cin: int, cout: int, size: int, dtype: DType, pad: int = 1, kernel: int = 3) -> Case:
    """A 2D convolution (cross-correlation) over a padded input, (batch, cout, oh, ow) out; fp32 accumulation."""
    x_store, x = _encode(RNG.standard_normal((batch, cin, size, size)), dtype)
    w_store, w = _encode(RNG.standard_normal((cout, cin, kernel, kernel)), dtype)
    p, out = size + 2 * pad, size + 2 * pad - kernel + 1
    padded = st(batch, cin, size, size).pad(((0, 0), (0, 0), (pad, pad), (pad, pad))).reshape((batch * cin * p * p,))
    shape = (batch, cout, out, out, cin, kernel, kernel)
    window = ShapeTracker((*padded.views[:-1], View.create(shape, (cin * p * p, 0, p, 1, p * p, p, 1))))
    weight = st(1, cout, 1, 1, cin, kernel, kernel).expand(shape)
    a, b = load(1, dtype, window, size=x.size), load(2, dtype, weight)
    prod = a * b if dtype == dtypes.float32 else a.cast(dtypes.float32) * b.cast(dtypes.float32)
    ast = sink(store(0, reduce(prod, Ops.ADD, (4, 5, 6)), st(batch, cout, out, out, 1, 1, 1)))
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ref = np.zeros((batch, cout, out, out))
    for i in range(out):
        for j in range(out):
            ref[:, :, i, j] = np.einsum("nchw,ochw->no", xp[:, :, i : i + kernel, j : j + kernel], w)
    tol = 1e-4 if dtype == dtypes.float32 else 1e-3
    return Case(
        f"conv_{batch}x{cin}x{cout}x{size}_{dtype.name}", ast, {1: x_store, 2: w_store}, {0: ref.reshape(-1)}, tol
    )


def _ops(spec) -> list[Ops]:
    return [u.op for u in spec.uops]


def _loads_feeding(spec, op: Ops) -> set[Ops]:
    """The kinds of buffer (DEFINE_GLOBAL, DEFINE_LOCAL) that the loads feeding the `op`s of `spec` read, not
    looking past a BARRIER (what was stored before it)."""
    seen, kinds = set(), set()
    stack = [u for u in spec.uops if u.op is op]
    while stack:
        u = stack.pop()
        if u in seen or u.op is Ops.BARRIER:
            continue
        seen.add(u)
        if u.op is Ops.LOAD:
            kinds.add(u.src[0].src[0].op)
        stack.extend(u.src)
    return kinds


def _staged_run(case: Case, renderer, opts: list[Opt] | None):
    out, spec = run_python(case.ast, renderer, opts, case.inputs)
    check(case, out, f"{case.name} {spec.opts}")
    assert any(o.op is OptOps.STAGE for o in spec.opts), spec.opts
    assert Ops.DEFINE_LOCAL in _ops(spec) and Ops.BARRIER in _ops(spec)
    return spec


# *** tensor cores ***

TC = [Opt(OptOps.TC, 0, (-1, 1))]


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize(
    ("batch", "m", "n", "k", "opts"),
    [
        # two warps along N, two M tiles per warp, K tile 32: a 32x16 workgroup tile over a 3-step reduce loop
        (1, 64, 32, 96, [*TC, Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.UNROLL, 0, 2)]),
        # not multiples of the core's tile: padded, the padding staged as zeros; an odd number of reduce steps
        (1, 40, 20, 40, [*TC, Opt(OptOps.LOCAL, 0, 3)]),
        # batched, warps along both N and M
        (3, 32, 32, 32, [*TC, Opt(OptOps.LOCAL, 2, 2), Opt(OptOps.LOCAL, 1, 2)]),
    ],
)
def test_tensor_core_matmul_from_local_memory(dtype: DType, batch: int, m: int, n: int, k: int, opts) -> None:
    case = bmm(batch, m, n, k, dtype)
    spec = _staged_run(case, TC_GPU, [*opts, Opt(OptOps.STAGE)])
    assert Ops.WMMA in _ops(spec)
    # every fragment the tensor cores read comes from local memory: no global load feeds a WMMA directly
    assert _loads_feeding(spec, Ops.WMMA) == {Ops.DEFINE_LOCAL}


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64, 64, 64), (2, 48, 40, 72)])
def test_default_tensor_core_tiles_are_staged(dtype: DType, shape: tuple[int, int, int, int]) -> None:
    spec = _staged_run(bmm(*shape, dtype), TC_GPU, None)
    # on tensor cores, after any padding of odd axes to whole tiles
    first = next(o for o in spec.opts if o.op is not OptOps.PADTO)
    assert first.op is OptOps.TC and spec.local_size[0] == 32


def _cuda_like_gpu() -> py.PythonRenderer:
    """An emulated GPU with CUDA's tensor cores, asynchronous copies, ldmatrix and CUDA's register budget (512)."""
    target = py.GPUTarget(
        name="CUDALIKE", tensor_cores=cuda_cores.TENSOR_CORES["sm_80"], warp_size=32, async_copy=True, ldmatrix=True
    )
    renderer = py.PythonRenderer(target)
    renderer.max_upcast = 512
    return renderer


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_default_warp_tile_with_a_long_reduction_step_matches_numpy(dtype: DType) -> None:
    # the default's warp tile on a long reduction (CUDA's budget): 64x64 outputs per warp, a 32-element step, four
    # stages of cp.async; one warp per workgroup over a 128x128x256 matmul, 8 steps wrapping the 4 slots, and over
    # 128x128x96 (3 steps, fewer than the stages: the copies past the end gated off)
    opts = [
        *TC,
        Opt(OptOps.UPCAST, 0, 4),
        Opt(OptOps.UPCAST, 1, 8),
        Opt(OptOps.UNROLL, 0, 2),
        Opt(OptOps.STAGE, None, 4),
    ]
    for shape in ((1, 128, 128, 256), (1, 128, 128, 96)):
        spec = _staged_run(bmm(*shape, dtype), _cuda_like_gpu(), opts)
        # copied by cp.async, the fragments read from local memory by ldmatrix alone
        assert Ops.ASYNC_COPY in _ops(spec) and Ops.LDMATRIX in _ops(spec)
        assert Ops.DEFINE_GLOBAL not in _loads_feeding(spec, Ops.WMMA)


def test_full_size_default_is_four_warps_on_a_128x128_tile() -> None:
    k = hand_coded_optimizations(Kernel(bmm_ast(1, 4096, 4096, 4096, dtypes.float16), TC_GPU))
    assert k.staged and k.workgroup_threads() == 128
    # A's tile is 128 rows of M by 16 of K, B's 16 of K by 128 of N: a 128x128 output tile per workgroup, 64x64 per warp
    a, b = plan(k)
    assert (a.tile, b.tile) == (128 * 16, 16 * 128)
    assert k.lanes(AxisType.UPCAST) == 32
    assert (a.vector, b.vector) == (8, 8)  # 128-bit copies


def _warps_along(k: Kernel, which: str) -> int:
    """The warps of `k`'s tile along M or N: its LOCAL axes that only A (M) or only B (N) reads."""
    a, b = tiling._operands(k)
    reads, other = (a, b) if which == "M" else (b, a)
    return math.prod(
        int(k.full_shape[ax])
        for ax in k.axes(AxisType.LOCAL)
        if tiling._varies(reads, ax) and not tiling._varies(other, ax)
    )


def test_short_m_gives_all_the_warps_to_n_and_matches_numpy() -> None:
    # M of 64 is one warp's 64 rows; the 4 warps go along N: a 64x256 workgroup tile
    case = bmm(1, 64, 512, 64, dtypes.float16)
    spec = _staged_run(case, _cuda_like_gpu(), None)
    k = hand_coded_optimizations(Kernel(case.ast, _cuda_like_gpu()))
    assert k.workgroup_threads() == 32 * tiling.TC_WARPS
    assert (_warps_along(k, "M"), _warps_along(k, "N")) == (1, tiling.TC_WARPS)
    assert tiling.tile_extents(k)["M"] == 64 and tiling.tile_extents(k)["N"] == 256
    assert Ops.WMMA in _ops(spec)


def test_a_convolution_at_7x7_takes_four_warps_along_its_channels() -> None:
    # ResNet-18's last 3x3 layers (batch 64, 512 channels, 7x7): M is the batch (the pixels' 7s take no tile), N the
    # output channels; the input channels of the reduction are 49 elements apart, so the step stays one core's
    k = hand_coded_optimizations(Kernel(conv(64, 512, 512, 7, dtypes.float16).ast, _cuda_like_gpu()))
    assert k.staged and k.tensor_core is not None
    assert (_warps_along(k, "M"), _warps_along(k, "N")) == (1, tiling.TC_WARPS)
    assert tiling.tile_extents(k) == {"M": 64, "N": 256, "K": k.tensor_core.dims[2]}
    assert not k.axes(AxisType.UNROLL)


def test_padded_rows_store_vectors_in_64_bit_kernels() -> None:
    # ResNet-18's last im2col matmul: 3136 rows padded to whole tiles, its stores gated by the row, in a kernel that
    # indexes in 64 bits (its padded views pass int32), where each lane's offset in the tile is a widened 32-bit sum:
    # neighbouring columns are still stored as one vector (split_offset sees through the widening)
    for dtype in (dtypes.float16, dtypes.float32):
        k = hand_coded_optimizations(Kernel(bmm_ast(1, 3136, 512, 4608, dtype), _cuda_like_gpu()))
        assert any(o.op is OptOps.PADTO for o in k.applied_opts)
        spec = get_program(k.ast, k.renderer, k.applied_opts)
        assert any(u.dtype == dtypes.int64 for u in spec.uops if u.op is Ops.RANGE)
        stores = [u for u in spec.uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_GLOBAL]
        assert stores and all(len(s.src) > 2 for s in stores)  # gated by the row
        assert all(s.src[1].dtype.count >= 2 for s in stores), [s.src[1].dtype for s in stores]


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_long_contiguous_reductions_take_two_core_steps(dtype: DType) -> None:
    # A reads K contiguously: on a long reduction the step is two cores' K (and one on a short one)
    for k_len, steps in ((2048, 2), (512, 1)):
        k = hand_coded_optimizations(Kernel(bmm_ast(1, 256, 256, k_len, dtype), _cuda_like_gpu()))
        assert tiling.tile_extents(k)["K"] == steps * k.tensor_core.dims[2], (k_len, k.applied_opts)


@pytest.mark.parametrize(
    ("renderer", "dtype", "shape", "opts"),
    [
        (ASYNC_TC_GPU, dtypes.float16, (1, 64, 32, 96), [*TC, Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 1, 2)]),
        (ASYNC_TC_GPU, dtypes.bfloat16, (2, 32, 64, 64), [*TC, Opt(OptOps.LOCAL, 2, 4), Opt(OptOps.UNROLL, 0, 2)]),
        # 5 reduce steps (odd), more threads than B's copies (some copy an element twice)
        (ASYNC_TC_GPU, dtypes.float16, (1, 32, 16, 80), [*TC, Opt(OptOps.LOCAL, 0, 2)]),
        # 2 reduce steps: fewer than three stages' worth, the copies past the end gated off
        (ASYNC_TC_GPU, dtypes.float16, (1, 32, 16, 32), [*TC]),
    ],
)
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_pipelined_asynchronous_copies(renderer, dtype: DType, shape, opts, stages: int) -> None:
    spec = _staged_run(bmm(*shape, dtype), renderer, [*opts, Opt(OptOps.STAGE, None, None if stages == 2 else stages)])
    ops = _ops(spec)
    # the copies of steps 0 .. stages-2 before the loop, those of stages-1 steps ahead inside it after a wait and a
    # barrier; each wait leaves stages-2 groups in flight (the PYTHON device lands a group no earlier than that)
    loop = ops.index(Ops.RANGE)
    # one barrier per step: the reads of local memory follow the copies with none between them
    assert ops[loop:].count(Ops.BARRIER) == 1
    last_copy = len(ops) - ops[::-1].index(Ops.ASYNC_COPY)
    local_reads = [i for i, u in enumerate(spec.uops) if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_LOCAL]
    assert local_reads and min(local_reads) > last_copy
    assert ops[:loop].count(Ops.ASYNC_WAIT) == stages - 2 and Ops.ASYNC_WAIT in ops[loop:]
    assert Ops.ASYNC_COPY in ops[:loop]
    loop_wait = loop + ops[loop:].index(Ops.ASYNC_WAIT)
    assert loop_wait < loop + ops[loop:].index(Ops.BARRIER) < len(ops) - ops[::-1].index(Ops.ASYNC_COPY)
    assert {int(u.arg or 0) for u in spec.uops if u.op is Ops.ASYNC_WAIT} == {stages - 2}
    # one slot per stage in each operand's buffer
    assert {u.dtype.size for u in spec.uops if u.op is Ops.DEFINE_LOCAL} == {
        o.slot * stages for o in plan(Kernel(bmm_ast(*shape, dtype), renderer).apply_opts(list(spec.opts)))
    }
    assert _loads_feeding(spec, Ops.WMMA) == {Ops.DEFINE_LOCAL}


@given(
    st_.integers(1, 2),
    st_.integers(9, 48),
    st_.integers(1, 6).map(lambda x: 8 * x),
    st_.integers(6, 20).map(lambda x: 8 * x),
    st_.sampled_from([dtypes.float16, dtypes.bfloat16]),
    st_.sampled_from([3, 4]),
    st_.booleans(),
)
@example(1, 32, 32, 128, dtypes.float16, 4, True)  # multiples of the tensor core's tile
@example(2, 40, 24, 72, dtypes.bfloat16, 3, False)  # padded M and N, an odd number of steps
@settings(max_examples=6, deadline=None)
def test_deep_pipelines_match_numpy_on_random_shapes(batch, m, n, k, dtype, stages, ldmatrix) -> None:
    # the default tile of the shape with its STAGE made 3 or 4 stages (where the buffers fit; else the tensor core
    # alone, staged so): the slots wrap around, the last stages-1 steps' copies are gated off, and one barrier a step
    # still keeps a slot from being overwritten while a warp reads it. Rows of whole 16-byte copies (N and K
    # multiples of 8), as cp.async needs; M, N and K are and are not multiples of the tiles
    renderer = LDMATRIX_GPU if ldmatrix else ASYNC_TC_GPU
    case = bmm(batch, m, n, k, dtype)
    default = hand_coded_optimizations(Kernel(case.ast, renderer)).applied_opts
    opts = [*(o for o in default if o.op is not OptOps.STAGE), Opt(OptOps.STAGE, None, stages)]
    try:
        Kernel(case.ast, renderer).apply_opts(opts)
    except KernelOptError:
        opts = [*TC, Opt(OptOps.STAGE, None, stages)]
    spec = _staged_run(case, renderer, opts)
    ops = _ops(spec)
    assert Ops.ASYNC_COPY in ops and ops[ops.index(Ops.RANGE) :].count(Ops.BARRIER) == 1
    assert {int(u.arg or 0) for u in spec.uops if u.op is Ops.ASYNC_WAIT} == {stages - 2}


def test_deep_pipelines_need_asynchronous_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiling, "DEEP_STAGES", (4, 3))  # the default tile's deep pipelines, where asked for
    # a convolution's window can't be copied in whole aligned vectors: its copies are synchronous, so more than two
    # slots would only take shared memory; STAGE refuses 3 and 4 stages and the default keeps 2
    case = conv(2, 16, 16, 8, dtypes.float16)
    spec = _staged_run(case, LDMATRIX_GPU, None)
    assert spec.opts[-1] == Opt(OptOps.STAGE) and Ops.ASYNC_COPY not in _ops(spec)
    for stages in (3, 4):
        with pytest.raises(KernelOptError, match=f"{stages} pipeline stages need asynchronous copies"):
            Kernel(case.ast, LDMATRIX_GPU).apply_opts([*spec.opts[:-1], Opt(OptOps.STAGE, None, stages)])
    # a matmul of whole 16-byte rows is pipelined over the most stages that fit
    mm = _staged_run(bmm(1, 64, 64, 128, dtypes.float16), LDMATRIX_GPU, None)
    assert mm.opts[-1] == Opt(OptOps.STAGE, None, 4) and Ops.ASYNC_COPY in _ops(mm)
    monkeypatch.setattr(tiling, "DEEP_STAGES", ())  # the default: two stages
    mm = _staged_run(bmm(1, 64, 64, 128, dtypes.float16), LDMATRIX_GPU, None)
    assert mm.opts[-1] == Opt(OptOps.STAGE) and Ops.ASYNC_COPY in _ops(mm)


# *** ldmatrix ***

# CUDA sm_80's tensor cores, cp.async and ldmatrix
LDMATRIX_GPU = py.PythonRenderer(
    py.GPUTarget(
        name="LDMGPU", tensor_cores=cuda_cores.TENSOR_CORES["sm_80"], warp_size=32, async_copy=True, ldmatrix=True
    )
)


def bmm_transposed_a(m: int, n: int, k: int, dtype: DType) -> Case:
    """C = A @ B with A stored as (k, m), so its fragments need the transposing form of ldmatrix too."""
    a_store, a = _encode(RNG.standard_normal((k, m)), dtype)
    b_store, b = _encode(RNG.standard_normal((k, n)), dtype)
    x = load(1, dtype, st(1, k, m).permute((2, 0, 1)).expand((m, n, k)))
    y = load(2, dtype, st(1, k, n).permute((0, 2, 1)).expand((m, n, k)))
    ast = sink(store(0, reduce(x.cast(dtypes.float32) * y.cast(dtypes.float32), Ops.ADD, (2,)), st(m, n, 1)))
    return Case(f"atb_{m}x{n}x{k}_{dtype.name}", ast, {1: a_store, 2: b_store}, {0: (a.T @ b).reshape(-1)}, 1e-3)


def _ldmatrix_forms(spec) -> set[tuple[int, bool]]:
    return {u.arg for u in spec.uops if u.op is Ops.LDMATRIX}


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize(
    ("shape", "opts"),
    [
        # the default tiles (multiples of the tensor core, not of the 128x128 tile; padded M and N)
        ((1, 64, 64, 64), None),
        ((2, 48, 40, 72), None),
        # two M tiles per warp, two warps, K step 32 over 3 steps
        ((1, 64, 32, 96), [*TC, Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.UNROLL, 0, 2)]),
        # padded to the core, an odd number of reduce steps
        ((1, 40, 20, 40), [*TC, Opt(OptOps.LOCAL, 0, 3)]),
    ],
)
def test_ldmatrix_fragments_match_numpy(dtype: DType, shape, opts) -> None:
    spec = _staged_run(bmm(*shape, dtype), LDMATRIX_GPU, None if opts is None else [*opts, Opt(OptOps.STAGE)])
    # every fragment comes from an LDMATRIX: no plain load of local memory feeds a WMMA; A (K contiguous in local
    # memory) loads its 4 matrices without transposing
    assert _loads_feeding(spec, Ops.WMMA) == set()
    forms = _ldmatrix_forms(spec)
    assert (4, False) in forms
    if shape[1:] == (64, 64, 64):
        # B's tile keeps N contiguous (an unpadded view): read transposed
        assert any(trans for _, trans in forms)


def test_ldmatrix_transposes_a_column_major_a() -> None:
    spec = _staged_run(bmm_transposed_a(64, 32, 48, dtypes.float16), LDMATRIX_GPU, None)
    assert _loads_feeding(spec, Ops.WMMA) == set()
    assert _ldmatrix_forms(spec) and all(trans for _, trans in _ldmatrix_forms(spec))


def test_ldmatrix_convolution_matches_numpy() -> None:
    spec = _staged_run(conv(2, 16, 16, 8, dtypes.float16), LDMATRIX_GPU, None)
    assert Ops.LDMATRIX in _ops(spec)


@given(
    st_.lists(st_.integers(0, 63), min_size=8, max_size=8, unique=True),
    st_.booleans(),
    st_.integers(0, 3).map(lambda s: 8 * s),
)
@settings(max_examples=60, deadline=None)
def test_ldmatrix_plan_recovers_the_rows_of_a_fragment(rows: list[int], trans: bool, shift: int) -> None:
    # the element offsets of one matrix as the PTX ISA hands it out (lane l: row l // 4, columns 2(l % 4) and the
    # next, or the transpose), rows at 16-element steps: the plan finds the 8 row offsets; an offset moved by one
    # element breaks the distribution and is refused
    starts = [16 * r + shift for r in rows]
    if trans:
        first = tuple(starts[2 * (t % 4)] + t // 4 for t in range(32))
        second = tuple(starts[2 * (t % 4) + 1] + t // 4 for t in range(32))
    else:
        first = tuple(starts[t // 4] + 2 * (t % 4) for t in range(32))
        second = tuple(f + 1 for f in first)
    assert staging.ldmatrix_plan([first, second]) == [(trans, [(((0,), (1,)), tuple(starts))])]
    assert staging.ldmatrix_plan([first, tuple(s + 1 for s in second)]) is None


# *** BEAM over staged tiles ***


def test_staged_tiles_vary_warps_register_tile_k_step_and_stages() -> None:
    ast = bmm_ast(1, 4096, 4096, 4096, dtypes.float16)
    tiles = tiling.staged_tiles(Kernel(ast, ASYNC_TC_GPU))
    opts = [tuple(t.applied_opts) for t in tiles]
    assert len(set(opts)) == len(opts), "no tile is offered twice"
    assert all(t.staged and t.tensor_core is not None for t in tiles)
    # every one fits the renderer's shared memory and threads: STAGE and LOCAL checked them before compiling
    assert all(sum(o.bytes for o in plan(t)) <= ASYNC_TC_GPU.shared_max for t in tiles)
    assert all(t.workgroup_threads() <= ASYNC_TC_GPU.max_workgroup_threads for t in tiles)
    # the default tile is one of them; around it, 4 and 8 warps, 2x2 to 4x8 mma tiles per warp, K steps of 16 and 32
    default = tuple(hand_coded_optimizations(Kernel(ast, ASYNC_TC_GPU)).applied_opts)
    assert default in opts
    assert {t.workgroup_threads() // 32 for t in tiles} == {4, 8}
    assert {t.lanes(AxisType.UPCAST) for t in tiles} == {4, 8, 16, 32}
    assert {16 * t.lanes(AxisType.UNROLL) for t in tiles} == {16, 32}
    assert {t.stages for t in tiles} == {1, 2, 3, 4}
    # the default takes the deepest pipeline its buffers fit (four stages of 8 KB); the largest tiles (256 rows of A
    # over 4 warps along M, a K step of 32: 16 KB a stage) don't fit four stages in 48 KB: not offered
    assert default[-1] == Opt(OptOps.STAGE, None, 4)
    assert len(tiles) < 2 * 3 * 5 * 2 * 4
    assert not any(t.stages == 4 and sum(o.bytes for o in plan(t)) > 48 * 1024 for t in tiles)
    # not matmul-like, or with opts already: nothing to offer
    assert tiling.staged_tiles(Kernel(ast, ASYNC_TC_GPU).apply_opts([Opt(OptOps.UPCAST, 0, 2)])) == []


def test_one_stage_keeps_synchronous_copies() -> None:
    case = bmm(1, 64, 32, 96, dtypes.float16)
    spec = _staged_run(case, ASYNC_TC_GPU, [*TC, Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.STAGE, None, 1)])
    assert Ops.ASYNC_COPY not in _ops(spec) and Ops.ASYNC_WAIT not in _ops(spec)
    with pytest.raises(KernelOptError, match="1 to 4 pipeline stages"):
        Kernel(case.ast, ASYNC_TC_GPU).apply_opts([*TC, Opt(OptOps.STAGE, None, 5)])
    # a third or fourth stage only pipelines asynchronous copies
    for stages in (3, 4):
        with pytest.raises(KernelOptError, match=f"{stages} pipeline stages need asynchronous copies"):
            Kernel(case.ast, TC_GPU).apply_opts([*TC, Opt(OptOps.STAGE, None, stages)])


def test_beam_times_the_staged_tiles_and_returns_a_correct_cached_program(tmp_path, monkeypatch) -> None:
    from lazygrad_codegen import search
    from lazygrad_uop.config import Context

    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    # the generic actions are covered elsewhere; here only SWAP may extend a kernel, to keep the emulated search short
    monkeypatch.setattr(search, "ACTIONS", [Opt(OptOps.SWAP, 0, 1)])
    case = bmm(1, 64, 32, 32, dtypes.float16)
    tiles = {tuple(t.applied_opts) for t in tiling.staged_tiles(Kernel(case.ast, LDMATRIX_GPU))}
    assert len(tiles) >= 2
    timed: set[tuple] = set()
    evaluate = search._evaluate

    def recording(*args, **kwargs):
        out = evaluate(*args, **kwargs)
        timed.update(tuple(k.applied_opts) for k, _ in out)
        return out

    monkeypatch.setattr(search, "_evaluate", recording)
    with Context(BEAM=1):
        out, spec = run_python(case.ast, LDMATRIX_GPU, None, case.inputs)
    check(case, out, f"BEAM opts {spec.opts}")
    # every staged tile compiled, ran and matched the unoptimised kernel's outputs (wrong ones are dropped)
    assert tiles <= timed
    monkeypatch.setattr(search, "_search", lambda *a, **k: pytest.fail("the second search must come from the cache"))
    with Context(BEAM=1):
        assert get_program(case.ast, LDMATRIX_GPU).opts == spec.opts


# *** FMA units ***


@pytest.mark.parametrize(
    ("shape", "opts"),
    [
        ((1, 32, 32, 24), [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 0, 4)]),
        # a reduction not a multiple of the unroll: padded and staged as zeros
        ((1, 24, 40, 30), [Opt(OptOps.PADTO, 2, 4), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.LOCAL, 1, 8)]),
        ((2, 16, 24, 20), [Opt(OptOps.LOCAL, 1, 8), Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.UNROLL, 0, 2)]),
        # a 16x6 grid of workgroups: launched in bands of 8 rows
        ((1, 64, 48, 8), [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 1, 8)]),
    ],
)
def test_fma_matmul_from_local_memory(shape: tuple[int, int, int, int], opts) -> None:
    _staged_run(bmm(*shape, dtypes.float32), FMA_GPU, [*opts, Opt(OptOps.STAGE)])


def test_fma_tile_with_an_eight_element_step_matches_numpy() -> None:
    # the fp32 default under CUDA's register budget (512): 8x8 outputs per thread and an 8-element reduction step
    renderer = py.PythonRenderer(py.GPUTarget(name="FMA512", warp_size=32))
    renderer.max_upcast = 512
    opts = [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 1, 4)]
    for shape in ((1, 64, 64, 64), (1, 64, 32, 40)):
        _staged_run(bmm(*shape, dtypes.float32), renderer, [*opts, Opt(OptOps.UNROLL, 0, 8), Opt(OptOps.STAGE)])


@pytest.mark.parametrize("shape", [(1, 64, 64, 32), (1, 36, 50, 20)])
def test_default_fma_tiles_are_staged(shape: tuple[int, int, int, int]) -> None:
    _staged_run(bmm(*shape, dtypes.float32), FMA_GPU, None)


# *** odd shapes: padded to whole tiles ***


@settings(max_examples=5, deadline=None)
@given(
    batch=st_.integers(1, 2),
    m=st_.integers(16, 100),
    n=st_.integers(16, 100),
    k=st_.integers(33, 72),  # two reduction steps at least: a single step leaves no loop to stage
    kind=st_.sampled_from(["fp16", "bf16", "fp32", "fp16_async"]),
)
def test_default_tiles_of_any_shape_match_numpy(batch: int, m: int, n: int, k: int, kind: str) -> None:
    dtype = {"fp16": dtypes.float16, "bf16": dtypes.bfloat16, "fp32": dtypes.float32, "fp16_async": dtypes.float16}
    renderer = {"fp16": TC_GPU, "bf16": TC_GPU, "fp32": FMA_GPU, "fp16_async": LDMATRIX_GPU}[kind]
    case = bmm(batch, m, n, k, dtype[kind])
    spec = _staged_run(case, renderer, None)
    # an axis no tile divides is padded (the padding staged as zeros, its outputs not stored): the reduction by at
    # most an eighth, an output axis at most doubled
    kernel = Kernel(case.ast, renderer)
    for o in spec.opts:
        if o.op is OptOps.PADTO:
            axes = kernel.axes(AxisType.GLOBAL) + kernel.axes(AxisType.REDUCE)
            size, padded = kernel.full_shape[axes[o.axis]], -(-kernel.full_shape[axes[o.axis]] // o.arg) * o.arg
            if kernel.axis_types[axes[o.axis]] is AxisType.REDUCE:
                assert padded * tiling.PAD_WASTE <= size * (tiling.PAD_WASTE + 1), spec.opts
            assert padded <= 2 * size, spec.opts
            kernel.apply_opt(o)


@pytest.mark.parametrize(
    ("dtype", "renderer"), [(dtypes.float16, TC_GPU), (dtypes.bfloat16, LDMATRIX_GPU), (dtypes.float32, FMA_GPU)]
)
def test_odd_shape_is_padded_to_the_full_tile(dtype: DType, renderer, monkeypatch: pytest.MonkeyPatch) -> None:
    # 250 x 125 x 70: no 128-row tile divides M or N; padded, the default is the full 128x128 tile of 4 warps (256
    # FMA threads) over 2x1 workgroups, as on a multiple of the tile (whatever the parallelism: a kernel this small
    # would otherwise get a smaller FMA register tile, `tiling.fma_register_tile`)
    monkeypatch.setattr(tiling, "FMA_WARPS_PER_UNIT", 0)
    case = bmm(1, 250, 125, 70, dtype)
    spec = _staged_run(case, renderer, None)
    k = Kernel(case.ast, renderer).apply_opts(list(spec.opts))
    assert tiling.tile_extents(k)["M"] * tiling.tile_extents(k)["N"] == 128 * 128
    assert k.workgroup_threads() == (256 if dtype == dtypes.float32 else 32 * tiling.TC_WARPS)
    # by PADTO, or by the tensor core's own padding to its 16x8 tile
    assert math.prod(k.full_shape) > 250 * 125 * 70


@pytest.mark.parametrize(
    ("shape", "vectors"),
    [
        # M (and N) padded: the masks lie across rows, every 16-byte run of a row is valid or not as a whole
        ((1, 100, 64, 64), (8, 8)),
        ((1, 120, 120, 40), (8, 8)),
        # K padded at 36: A's rows end 4 halves into a run of 8, so A is copied 8 bytes at a time
        ((1, 64, 64, 36), (4, 8)),
    ],
)
def test_padded_operands_are_copied_in_vectors_that_the_masks_keep_whole(shape, vectors) -> None:
    case = bmm(*shape, dtypes.float16)
    spec = _staged_run(case, LDMATRIX_GPU, None)
    k = Kernel(case.ast, LDMATRIX_GPU).apply_opts(list(spec.opts))
    assert tuple(o.vector for o in plan(k)) == vectors, spec.opts
    assert Ops.ASYNC_COPY in _ops(spec)


@settings(max_examples=40, deadline=None)
@given(
    m=st_.integers(1, 6),
    k=st_.integers(1, 20),
    extra=st_.integers(0, 6),
    pad_m=st_.integers(0, 4),
    pad_k=st_.integers(0, 12),
    split=st_.sampled_from([2, 4, 8]),
    v=st_.sampled_from([2, 4, 8]),
)
def test_vector_copies_keep_masks_whole_against_brute_force(m, k, extra, pad_m, pad_k, split, v) -> None:
    # rows of k elements `k + extra` apart, padded (as PADTO does) and the row axis split in tiles of `split`: where
    # the staging rule allows a copy of v elements, every aligned run of v along the axis is all valid or all masked
    from hypothesis import assume

    width = k + pad_k
    assume(width % split == 0)
    base = ShapeTracker.from_shape((m, k + extra)).shrink(((0, m), (0, k)))
    st = base.pad(((0, pad_m), (0, pad_k))).reshape((m + pad_m, width // split, split))
    for axis in (1, 2):
        if st.shape[axis] % v or not staging._valid_by_vectors(st, axis, v):
            continue
        for row in range(m + pad_m):
            for rest in range(st.shape[3 - axis]):
                for start in range(0, st.shape[axis], v):
                    seen = set()
                    for j in range(start, start + v):
                        coords = [row, j, rest] if axis == 1 else [row, rest, j]
                        _, valid = st.to_indexed_uops([UOp.const(dtypes.int32, c) for c in coords])
                        seen.add(bool(sym_infer(valid, {})))
                    assert len(seen) == 1, (st, axis, row, rest, start)


def test_full_size_odd_shapes_get_the_round_shapes_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fp32 4095x4097x1000 matmul had one-thread workgroups: no tile divided 4095 or 4097 (the full FMA register
    # tile whatever the parallelism, which would shrink it at 1000^3 on 32 units: `tiling.fma_register_tile`)
    monkeypatch.setattr(tiling, "FMA_WARPS_PER_UNIT", 0)
    for dtype, renderer in ((dtypes.float32, FMA_GPU), (dtypes.float16, TC_GPU)):
        for m, n, kk in ((4095, 1000, 4097), (4095, 4096, 4097), (1000, 1000, 1000)):
            k = hand_coded_optimizations(Kernel(bmm_ast(1, m, n, kk, dtype), renderer))
            round_ = hand_coded_optimizations(Kernel(bmm_ast(1, 4096, 4096, 4096, dtype), renderer))
            threads = 256 if dtype == dtypes.float32 else 32 * tiling.TC_WARPS
            assert k.staged and k.workgroup_threads() == round_.workgroup_threads() == threads
            assert tiling.tile_extents(k) == tiling.tile_extents(round_), (dtype, m, n, kk, k.applied_opts)


def test_padding_keeps_broadcast_operands_unmasked() -> None:
    # padding M masks A (which moves along M) but not B (stride 0 along M): B's staged tile stays K x N
    k = Kernel(bmm_ast(1, 100, 64, 64, dtypes.float32), FMA_GPU)
    k.apply_opt(Opt(OptOps.PADTO, 0, 128))
    a, b = (k.views[ld.src[1]] for ld in staging.staged_loads(k))
    assert a.views[-1].mask is not None and b.views[-1].mask is None
    k.apply_opts([Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.STAGE)])
    pa, pb = plan(k)
    assert (pa.tile, pb.tile) == (128, 8)


# *** convolutions (implicit GEMM) ***


@pytest.mark.parametrize(
    ("dtype", "renderer"), [(dtypes.float32, FMA_GPU), (dtypes.float16, TC_GPU), (dtypes.bfloat16, TC_GPU)]
)
def test_convolution_from_local_memory(dtype: DType, renderer) -> None:
    # 8x8 pixels pad to the core's 16 rows at most doubled, so fp16/bf16 run on tensor cores
    spec = _staged_run(conv(1, 16, 16, 8, dtype), renderer, None)
    assert (Ops.WMMA in _ops(spec)) == (renderer is TC_GPU)


@pytest.mark.parametrize(
    ("dtype", "renderer"), [(dtypes.float32, FMA_GPU), (dtypes.float16, TC_GPU), (dtypes.bfloat16, LDMATRIX_GPU)]
)
@pytest.mark.parametrize(("batch", "cin", "cout", "size"), [(3, 5, 20, 7)])
def test_odd_channel_and_pixel_convolutions_match_numpy(dtype: DType, renderer, batch, cin, cout, size) -> None:
    # odd channels, pixels and batch: no tile divides them; the default pads where that pays and matches numpy
    case = conv(batch, cin, cout, size, dtype)
    out, spec = run_python(case.ast, renderer, None, case.inputs)
    check(case, out, f"{case.name} {spec.opts}")
    assert Opt(OptOps.STAGE) in spec.opts, spec.opts


# *** what STAGE refuses ***


def test_stage_is_refused_where_it_cannot_work() -> None:
    case = bmm(1, 32, 32, 64, dtypes.float32)
    with pytest.raises(KernelOptError, match="local dimensions and shared memory"):
        Kernel(case.ast, py.PythonRenderer()).apply_opt(Opt(OptOps.STAGE))
    k = Kernel(case.ast, FMA_GPU)
    k.apply_opt(Opt(OptOps.STAGE))
    with pytest.raises(KernelOptError, match="only SWAP may follow"):
        k.apply_opt(Opt(OptOps.UPCAST, 0, 2))
    fully_unrolled = Kernel(case.ast, FMA_GPU).apply_opts([Opt(OptOps.UNROLL, 0, 0)])
    with pytest.raises(KernelOptError, match="no reduce loop"):
        fully_unrolled.apply_opt(Opt(OptOps.STAGE))
    grouped = Kernel(case.ast, FMA_GPU).apply_opts([Opt(OptOps.GROUP, 0, 4)])
    with pytest.raises(KernelOptError, match="grouped reduction"):
        grouped.apply_opt(Opt(OptOps.STAGE))


def test_stage_is_refused_when_the_tiles_overflow_shared_memory() -> None:
    small = py.PythonRenderer(py.GPUTarget(name="SMALLSHARED", shared_max=1024))
    k = Kernel(bmm(1, 64, 64, 64, dtypes.float32).ast, small).apply_opts(
        [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.LOCAL, 0, 8)]
        + [Opt(OptOps.UNROLL, 0, 4)]
    )
    with pytest.raises(KernelOptError, match="over the renderer's shared_max"):
        k.apply_opt(Opt(OptOps.STAGE))


def test_cpu_kernels_are_not_staged() -> None:
    spec = get_program(bmm(1, 64, 64, 64, dtypes.float32).ast, py.PythonRenderer())
    assert Opt(OptOps.STAGE) not in spec.opts and Ops.BARRIER not in _ops(spec)


# *** grouped launch order ***


@given(st_.integers(1, 24), st_.integers(1, 24), st_.integers(0, 2))
@settings(max_examples=60, deadline=None)
def test_grouped_launch_order_is_a_permutation_of_the_tiles_in_bands(rows: int, cols: int, batch: int) -> None:
    # the hardware indices as hardware_indices gives them: an optional outer (batch) axis, then rows, then cols
    idxs = [UOp.variable(f"g{n}", 0, 1000) for n in range(batch)] + [UOp.variable("r", 0, rows - 1)]
    idxs.append(UOp.variable("c", 0, cols - 1))
    new = grouped_launch(idxs, [5] * batch + [rows, cols])
    assert new[:batch] == idxs[:batch]
    group = next((g for g in LAUNCH_GROUPS if rows % g == 0 and g < rows), None)
    seen = []
    for launched in range(rows * cols):  # the order the hardware starts workgroups in: c fastest
        env = {"r": launched // cols, "c": launched % cols}
        seen.append((sym_infer(new[-2], env), sym_infer(new[-1], env)))
    assert sorted(seen) == [(r, c) for r in range(rows) for c in range(cols)]
    if group is not None and cols > 1:
        # each run of group*cols consecutive workgroups covers one band of `group` rows, going down columns
        for start in range(0, rows * cols, group * cols):
            band = seen[start : start + group * cols]
            assert {r // group for r, _ in band} == {start // (group * cols)}
            assert band[:group] == [(start // cols + i, 0) for i in range(group)]


# *** through the frontend: a convolution's three passes ***


@pytest.fixture
def emulated_gpu():
    """The PYTHON device rendering for a GPU with CUDA's tensor cores; programs compiled for it are forgotten after."""
    pytest.importorskip("lazygrad")
    from lazygrad import engine
    from lazygrad_uop.registry import Device

    dev = Device["PYTHON"]
    before = dev.renderer
    engine._runners.clear()
    dev.use_renderer(TC_GPU)
    yield dev
    dev.use_renderer(before)
    engine._runners.clear()


def _conv_passes_match_torch(x_np: np.ndarray, w_np: np.ndarray, dtype: DType, **conv: int) -> None:
    """conv2d's forward, input gradient and weight gradient on the emulated GPU in `dtype` against torch's in float64
    from the same (rounded) values; the gradient flowing in is random."""
    torch = pytest.importorskip("torch")
    from lazygrad import Tensor

    x, w = (Tensor(v, device="PYTHON").cast(dtype) for v in (x_np, w_np))
    x.requires_grad_()
    w.requires_grad_()
    out = x.conv2d(w, **conv)
    g_np = RNG.standard_normal(out.shape).astype(np.float32)
    dx, dw = out.gradient(x, w, gradient=Tensor(g_np, device="PYTHON").cast(dtype))
    tdt = torch.float32 if dtype == dtypes.float32 else torch.float16
    tx, tw, tg = (torch.from_numpy(v).to(tdt).double().requires_grad_() for v in (x_np, w_np, g_np))
    t_out = torch.nn.functional.conv2d(tx, tw, **conv)
    t_dx, t_dw = torch.autograd.grad(t_out, (tx, tw), tg.detach())
    tol = 1e-4 if dtype == dtypes.float32 else 2e-2
    for got, want in ((out, t_out), (dx, t_dx), (dw, t_dw)):
        want_np = want.detach().numpy()
        np.testing.assert_allclose(
            got.cast(dtypes.float32).numpy(), want_np, rtol=tol, atol=tol * np.abs(want_np).max()
        )


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16])
def test_convolution_passes_through_the_frontend_match_torch(emulated_gpu, dtype: DType, channels_last: int) -> None:
    from lazygrad import engine
    from lazygrad_uop.config import Context

    x_np = RNG.standard_normal((2, 16, 4, 4)).astype(np.float32)
    w_np = (RNG.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    with Context(CONV_CHANNELS_LAST=channels_last):
        _conv_passes_match_torch(x_np, w_np, dtype, padding=1)
    # the forward and both gradients ran a staged kernel (too small for tensor cores, which would more than double
    # these axes: test_convolution_from_local_memory has them); read channels-last (fp16 on this GPU's tensor
    # cores), the forward and the input gradient are one kernel, of the same shapes and layouts
    staged = len([r for r in engine._runners.values() if Opt(OptOps.STAGE) in r.spec.opts])
    assert staged >= (2 if channels_last and dtype == dtypes.float16 else 3)


@pytest.mark.parametrize("dtype", [dtypes.float32])
def test_stem_like_convolution_passes_match_torch(emulated_gpu, dtype: DType) -> None:
    # a 7x7 window at stride 2 over 3 channels (ResNet's stem, scaled down): the weight gradient's 3 x 7 x 7 axes
    # have no tile; its taps are padded to 8 where that pays, and every pass matches torch
    from lazygrad import engine

    x_np = RNG.standard_normal((1, 3, 11, 11)).astype(np.float32)
    w_np = (RNG.standard_normal((16, 3, 7, 7)) * 0.2).astype(np.float32)
    _conv_passes_match_torch(x_np, w_np, dtype, stride=2, padding=3)
    # the weight gradient's taps were padded to whole tiles
    assert any(
        o.op is OptOps.PADTO for r in engine._runners.values() for o in r.spec.opts if Opt(OptOps.STAGE) in r.spec.opts
    )


# *** shared-memory banks ***


def _worst_bank_conflict(spec) -> int:
    """The most distinct 4-byte words any of 32 banks serves at once for one warp (lidx0 = lane 0..31, everything else
    0) over the local-memory reads in `spec`: 1 means conflict-free. A read of 8 or 16 bytes per lane is served for
    128 bytes of lanes at a time (16 or 8 lanes)."""
    worst = 1
    for u in spec.uops:
        if u.op is Ops.LDMATRIX:
            worst = max(worst, _ldmatrix_bank_conflict(u))
            continue
        if u.op is not Ops.LOAD or u.src[0].src[0].op is not Ops.DEFINE_LOCAL:
            continue
        idx = u.src[0].src[1]
        env = {n: 0 for n in idx.toposort if n.op in (Ops.RANGE, Ops.SPECIAL)}
        width = max(1, u.dtype.itemsize // 4)
        starts = []
        for lane in range(32):
            env.update({n: lane for n in env if n.op is Ops.SPECIAL and n.arg[0] == "lidx0"})
            starts.append(sym_infer(idx, env) * u.src[0].src[0].dtype.base.itemsize // 4)
        for first in range(0, 32, 32 // width):
            words: dict[int, set[int]] = {}
            for start in starts[first : first + 32 // width]:
                for word in range(start, start + width):
                    words.setdefault(word % 32, set()).add(word)
            worst = max(worst, *(len(w) for w in words.values()))
    return worst


def _ldmatrix_bank_conflict(u: UOp) -> int:
    """The same for one LDMATRIX, which reads each 8x8 matrix in one pass: 8 rows of 16 bytes (4 words), row r's
    address given by lane 8i + r for matrix i."""
    idx = u.src[0].src[1]
    env = {n: 0 for n in idx.toposort if n.op in (Ops.RANGE, Ops.SPECIAL)}
    worst = 1
    for i in range(u.arg[0]):
        words: dict[int, set[int]] = {}
        for lane in range(8 * i, 8 * i + 8):
            env.update({n: lane for n in env if n.op is Ops.SPECIAL and n.arg[0] == "lidx0"})
            first = sym_infer(idx, env) * 2 // 4
            for word in range(first, first + 4):
                words.setdefault(word % 32, set()).add(word)
        worst = max(worst, *(len(w) for w in words.values()))
    return worst


def test_tensor_core_fragments_read_local_memory_without_bank_conflicts(monkeypatch) -> None:
    cuda = pytest.importorskip("lazygrad_cuda.renderer")
    renderer = cuda.CUDARenderer("sm_80", cuda_cores.TENSOR_CORES["sm_80"])
    ast = bmm_ast(1, 4096, 4096, 4096, dtypes.float16)
    spec = get_program(ast, renderer)
    assert Ops.LDMATRIX in _ops(spec) and _worst_bank_conflict(spec) == 1
    # without the padding of the rows, the fragments of A (8 rows of 64 bytes) and B collide
    monkeypatch.setattr(staging, "PAD_FROM_BYTES", 1 << 30)
    assert _worst_bank_conflict(get_program(ast, renderer)) > 1


def test_tf32_fragments_read_local_memory_without_bank_conflicts(monkeypatch) -> None:
    from lazygrad_uop.config import Context

    cuda = pytest.importorskip("lazygrad_cuda.renderer")
    renderer = cuda.CUDARenderer("sm_80", cuda_cores.TENSOR_CORES["sm_80"])
    ast = bmm_ast(1, 4096, 4096, 4096, dtypes.float32)
    with Context(TF32=1):
        spec = get_program(ast, renderer)
        # 4-byte fragments: one plain load per register, no ldmatrix (it moves 16-bit elements)
        assert Ops.WMMA in _ops(spec) and Ops.LDMATRIX not in _ops(spec)
        assert _worst_bank_conflict(spec) == 1
        # ResNet-18's 3x3 convolution at batch 64: its fragments of A met 4 to a bank in the copy's order
        conv_spec = get_program(conv(64, 64, 64, 56, dtypes.float32).ast, renderer)
        assert Ops.WMMA in _ops(conv_spec) and _worst_bank_conflict(conv_spec) == 1

        # the copy's order with 16 bytes of padding, as for 16-bit elements: B's fragment (8 columns of 4 rows of 128
        # floats) meets 2 rows to a bank
        def copy_order(k, operand, copy, sizes, vector):
            return list(copy), {staging._row(k, list(copy), sizes)[0]: staging.COPY_BYTES // 4}

        monkeypatch.setattr(staging, "_fragment_layout", copy_order)
        assert _worst_bank_conflict(get_program(ast, renderer)) == 2


def test_tf32_weight_gradient_fragments_read_local_memory_without_bank_conflicts(monkeypatch) -> None:
    """ResNet-18's 3x3 weight gradient (64 channels, 56x56, batch 64) read in NCHW: its A fragments are float2
    reads with TC_K 128 floats apart, 4 to a bank in every layout until that stride is padded."""
    pytest.importorskip("lazygrad")
    cuda = pytest.importorskip("lazygrad_cuda.renderer")
    from lazygrad import Tensor
    from lazygrad_uop.config import Context
    from lazygrad_uop.registry import Device

    renderer = cuda.CUDARenderer("sm_80", cuda_cores.TENSOR_CORES["sm_80"])
    dev = Device["PYTHON"]
    before = dev.renderer
    dev.use_renderer(renderer)  # the frontend splits the weight gradient for the renderer's compute units
    try:
        with Context(TF32=1, CONV_CHANNELS_LAST=0, IM2COL_WEIGHT_GRADIENT=0):
            x = Tensor.empty(64, 64, 56, 56, device="PYTHON").requires_grad_()
            w = Tensor.empty(64, 64, 3, 3, device="PYTHON").requires_grad_()
            (dw,) = x.conv2d(w, padding=1).gradient(w, gradient=Tensor.empty(64, 64, 56, 56, device="PYTHON"))
            parts = dw.schedule()[0].ast
            spec = get_program(parts, renderer)
            assert Ops.WMMA in _ops(spec) and _worst_bank_conflict(spec) == 1
            unpadded = staging._fragment_layout

            def rows_only(k, operand, copy, sizes, vector):
                layout, pads = unpadded(k, operand, copy, sizes, vector)
                inner = staging._row(k, layout, sizes)[0]
                return layout, {n: p for n, p in pads.items() if n == inner}

            monkeypatch.setattr(staging, "_fragment_layout", rows_only)
            assert _worst_bank_conflict(get_program(parts, renderer)) == 4
    finally:
        dev.use_renderer(before)
