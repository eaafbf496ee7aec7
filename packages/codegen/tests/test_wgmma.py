"""Tensor cores that read their operands from local memory themselves (`TensorCore.shared_operands`, Hopper's
`wgmma`): matmuls staged into swizzled shared layouts (`staging.SharedTile`) and run by the PYTHON interpreter, whose
WGMMA reads each element where the PTX ISA's descriptor layouts put it (`lazygrad_uop.device.SharedMatrix`), against
numpy: every operand orientation (K-major and MN-major A and B), fp16 and bf16, shapes that are and are not multiples
of the tiles, batches, several warpgroups and several tiles per warpgroup, synchronous and pipelined copies. Then
the CUDA side where NVRTC is installed: the default wgmma tiles compile for sm_90a without register spills."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_cases import Case, check, run_python
from hypothesis import assume, given, settings
from hypothesis import strategies as st_

from lazygrad_codegen import Kernel, KernelOptError, Opt, OptOps, get_program, tiling
from lazygrad_codegen.heuristic import hand_coded_optimizations
from lazygrad_codegen.kernel_ast import load, reduce, sink, st, store
from lazygrad_uop.config import Context
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops

py = pytest.importorskip("lazygrad_python")
cuda_cores = pytest.importorskip("lazygrad_cuda.tensor_cores")

RNG = np.random.default_rng(90)
CORES = cuda_cores.TENSOR_CORES["sm_90"]
# an emulated sm_90: mma.sync and wgmma cores, cp.async, ldmatrix, an H100's shared memory and CUDA's register budget
HOPPER = py.PythonRenderer(
    py.GPUTarget(name="HOPPER", tensor_cores=CORES, warp_size=32, async_copy=True, ldmatrix=True, shared_max=232448)
)
HOPPER.max_upcast = 512


def _select(n: int, dtype: DType) -> int:
    return next(i for i, tc in enumerate(CORES) if tc.shared_operands and tc.dims[0] == n and tc.dtype_in == dtype)


def _encode(x: np.ndarray, dtype: DType) -> tuple[np.ndarray, np.ndarray]:
    """`x` stored as `dtype` (bfloat16 as its bits in uint16), and the values that holds, as float64."""
    if dtype == dtypes.bfloat16:
        bits = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    v = x.astype(np.float16)
    return v, v.astype(np.float64)


def matmul(batch: int, m: int, n: int, k: int, dtype: DType, a_t: bool = False, b_t: bool = False) -> Case:
    """C[b] = A[b] @ B[b] in fp32, A stored (b, m, k) or, `a_t`, (b, k, m); B (b, k, n) or, `b_t`, (b, n, k): A
    K-major or M-major, B N-major or K-major in the wgmma's terms."""
    shape = (batch, m, n, k)
    a_view = st(batch, k, m, 1).permute((0, 2, 3, 1)) if a_t else st(batch, m, 1, k)
    b_view = st(batch, 1, n, k) if b_t else st(batch, 1, k, n).permute((0, 1, 3, 2))
    x, y = load(1, dtype, a_view.expand(shape)), load(2, dtype, b_view.expand(shape))
    ast = sink(store(0, reduce(x.cast(dtypes.float32) * y.cast(dtypes.float32), Ops.ADD, (3,)), st(batch, m, n, 1)))
    a_store, a = _encode(RNG.standard_normal((batch, k, m) if a_t else (batch, m, k)), dtype)
    b_store, b = _encode(RNG.standard_normal((batch, n, k) if b_t else (batch, k, n)), dtype)
    ref = (a.transpose(0, 2, 1) if a_t else a) @ (b.transpose(0, 2, 1) if b_t else b)
    name = f"mm_{batch}x{m}x{n}x{k}_{dtype.name}_{'T' if a_t else 'N'}{'T' if b_t else 'N'}"
    return Case(name, ast, {1: a_store, 2: b_store}, {0: ref.reshape(-1)}, 1e-3)


def _run(case: Case, opts: list[Opt]):
    out, spec = run_python(case.ast, HOPPER, opts, case.inputs)
    check(case, out, f"{case.name} {spec.opts}")
    uops = [u.op for u in spec.uops]
    assert Ops.WGMMA in uops and Ops.WMMA not in uops
    # the operands reach the tensor core only through local memory: no global load feeds a WGMMA (not looking past
    # the barrier, behind which the copies are)
    seen, stack = set(), [u for u in spec.uops if u.op is Ops.WGMMA]
    while stack:
        u = stack.pop()
        if u in seen or u.op is Ops.BARRIER:
            continue
        seen.add(u)
        assert not (u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_GLOBAL), u
        stack.extend(u.src)
    return spec


def _tc(n: int, dtype: DType, pad: int = 0) -> Opt:
    return Opt(OptOps.TC, 0, (_select(n, dtype), pad))


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize(("a_t", "b_t"), [(False, False), (True, False), (False, True), (True, True)])
def test_every_operand_orientation_matches_numpy(dtype: DType, a_t: bool, b_t: bool) -> None:
    # a 64-element K step (128-byte swizzled rows), two steps through a two-slot pipeline of cp.async
    case = matmul(1, 64, 64, 128, dtype, a_t, b_t)
    spec = _run(case, [_tc(64, dtype), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.STAGE, None, 2)])
    assert Ops.ASYNC_COPY in [u.op for u in spec.uops]
    majors = next(u.arg[5:] for u in spec.uops if u.op is Ops.WGMMA)
    assert [m[0] for m in majors] == ["mn" if a_t else "k", "k" if b_t else "mn"]


TILES = [
    # one warpgroup with two 64x128 tiles, four stages over a 2-step loop (copies past the end gated off)
    ((1, 128, 128, 128), 128, [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.STAGE, None, 4)]),
    # two warpgroups along M, a batch of two, three stages
    ((2, 128, 64, 128), 64, [Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.STAGE, None, 3)]),
    # a 16-element step: 32-byte swizzled rows of A; synchronous copies, one barrier per step
    ((1, 64, 128, 48), 64, [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.STAGE, None, 1)]),
    # a 32-element step: 64-byte rows
    ((1, 64, 64, 96), 64, [Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.STAGE, None, 2)]),
    # 256 x 128: two warpgroups of two 64 x 128 tiles each (the last of tiling.WGMMA_TILES)
    (
        (1, 256, 128, 128),
        128,
        [Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.STAGE, None, 4)],
    ),
]
"""(shape, the core's N, opts after TC) of tiles and pipelines that every way of copying the operands runs."""


@pytest.mark.parametrize(("shape", "n", "opts"), TILES)
def test_tiles_and_pipelines_match_numpy(shape: tuple[int, int, int, int], n: int, opts: list[Opt]) -> None:
    spec = _run(matmul(*shape, dtypes.float16), [_tc(n, dtypes.float16), *opts])
    # the program's FLOP estimate counts each instruction's 64 x N x 16 products once per warpgroup
    batch, m, n_, k = shape
    assert spec.estimates.ops == 2 * batch * m * n_ * k


def test_padded_shapes_stage_their_padding_as_zeros() -> None:
    # 100 x 70 x 96 padded to whole instructions: B's rows of 70 halves are not 16-byte aligned, so copied a half
    # at a time into the swizzled layout; the padding reads zeros, its outputs are not stored
    _run(
        matmul(1, 100, 70, 96, dtypes.float16),
        [_tc(64, dtypes.float16, 1), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.STAGE)],
    )


@settings(max_examples=6, deadline=None)
@given(
    m=st_.integers(1, 3),
    n=st_.integers(1, 2),
    k=st_.integers(2, 4),
    dtype=st_.sampled_from([dtypes.float16, dtypes.bfloat16]),
    a_t=st_.booleans(),
    b_t=st_.booleans(),
    stages=st_.sampled_from([1, 2, 3]),
    ragged=st_.booleans(),
)
def test_random_shapes_match_numpy(
    m: int, n: int, k: int, dtype: DType, a_t: bool, b_t: bool, stages: int, ragged: bool
) -> None:
    # whole 64-row, 64-column instructions and 32-element steps, or (ragged) sizes a few short of them, padded
    cut = (5, 3, 8) if ragged else (0, 0, 0)
    case = matmul(1, 64 * m - cut[0], 64 * n - cut[1], 32 * k - cut[2], dtype, a_t, b_t)
    try:
        spec = get_program(
            case.ast, HOPPER, [_tc(64, dtype, 1), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.STAGE, None, stages)]
        )
    except KernelOptError:
        assume(False)
    assert spec is not None
    _run(case, list(spec.opts))


def test_a_layout_the_hardware_would_read_otherwise_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # the interpreter reads A and B by the descriptor's layout, written apart from the code generator's tiles: with
    # the swizzle switched off on the reading side only, the same kernel's result is wrong
    from lazygrad_uop import device

    case = matmul(1, 64, 64, 128, dtypes.float16)
    opts = [_tc(64, dtypes.float16), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.STAGE, None, 2)]
    _run(case, opts)
    monkeypatch.setattr(device, "swizzled", lambda address, swizzle: address)
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        _run(case, opts)


def test_shared_cores_need_stage_and_are_never_taken_by_default() -> None:
    case = matmul(1, 64, 64, 128, dtypes.float16)
    with pytest.raises(ValueError, match="STAGE"):
        get_program(case.ast, HOPPER, [_tc(64, dtypes.float16), Opt(OptOps.UNROLL, 0, 4)])
    # TC with select -1 (any core) takes an mma.sync core; the default tiles take wgmma only with WGMMA=1
    k = Kernel(case.ast, HOPPER)
    k.apply_opt(Opt(OptOps.TC, 0, (-1, 1)))
    assert k.tensor_core is not None and not k.tensor_core.shared_operands
    assert not hand_coded_optimizations(Kernel(case.ast, HOPPER)).tensor_core.shared_operands


def test_wgmma_default_tile_is_two_warpgroups_of_64x256() -> None:
    big = matmul(1, 4096, 4096, 4096, dtypes.float16).ast
    with Context(WGMMA=1):
        k = hand_coded_optimizations(Kernel(big, HOPPER))
        assert k.tensor_core is not None and k.tensor_core.shared_operands and k.tensor_core.dims == (256, 64, 16)
        assert k.workgroup_threads() == 256 and tiling.tile_extents(k) == {"M": 128, "N": 256, "K": 64}
        assert k.stages == 4
        # BEAM's candidates include the wgmma tiles
        assert any(t.tensor_core.shared_operands for t in tiling.staged_tiles(Kernel(big, HOPPER)))
        # a smaller matmul takes the same kind of tile where it divides, and runs right
        case = matmul(1, 128, 256, 128, dtypes.bfloat16)
        k = hand_coded_optimizations(Kernel(case.ast, HOPPER))
        assert k.tensor_core.shared_operands
        _run(case, k.applied_opts)


def test_interpreter_rejects_a_group_that_disagrees_on_its_origin() -> None:
    from lazygrad_python.tensor_cores import shared_wgmma_function

    tc = CORES[_select(64, dtypes.float16)]
    fn = shared_wgmma_function(
        (
            (64, 64, 16),
            dtypes.float16,
            dtypes.float32,
            128,
            tc.swizzle[2],
            ("k", 16, 1024, 128),
            ("mn", 2048, 1024, 128),
        )
    )
    mem = [0.0] * 8192
    c = [(0.0,) * 32] * 128
    with pytest.raises(ValueError, match="different origins"):
        fn(mem, [0] * 127 + [64], mem, [0] * 128, c)
    with pytest.raises(ValueError, match="16-byte aligned"):
        fn(mem, [4] * 128, mem, [0] * 128, c)


# *** CUDA ***


def _nvrtc() -> bool:
    try:
        from lazygrad_cuda.compiler import nvrtc_version

        nvrtc_version()
        return True
    except Exception:  # noqa: BLE001 - any failure to load NVRTC means there is none
        return False


@pytest.mark.skipif(not _nvrtc(), reason="needs NVRTC")
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("size", [4096, 8192])
def test_default_wgmma_tiles_compile_for_sm90a_without_spills(dtype: DType, size: int) -> None:
    from lazygrad_cuda.compiler import ptxas_usage
    from lazygrad_cuda.renderer import CUDARenderer

    r = CUDARenderer("sm_90", CORES)
    with Context(WGMMA=1):
        k = hand_coded_optimizations(Kernel(matmul(1, size, size, size, dtype).ast, r))
    assert k.tensor_core is not None and k.tensor_core.shared_operands
    spec = get_program(k.ast, r, k.applied_opts)
    assert f"wgmma.mma_async.sync.aligned.m64n256k16.f32.{'bf16' if dtype == dtypes.bfloat16 else 'f16'}" in spec.src
    usage = ptxas_usage(spec.src, "sm_90", spec.function_name)
    assert usage.spills == 0 and usage.registers <= 255, usage


def test_wgmma_cores_only_on_sm90() -> None:
    from lazygrad_cuda.renderer import CUDARenderer

    assert any(tc.shared_operands for tc in CUDARenderer("sm_90", CORES).tensor_cores)
    # a later GPU runs sm_90's mma.sync, not its wgmma (an `a` feature of sm_90 alone)
    later = CUDARenderer("sm_100", CORES)
    assert later.tensor_cores and not any(tc.shared_operands for tc in later.tensor_cores)
    why = CUDARenderer("sm_90").tensor_core_problem(CORES[_select(128, dtypes.float16)], "sm_100")
    assert why is not None and "sm_90" in why


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_three_or_more_stages_leave_a_step_running_into_the_next(stages: int) -> None:
    # with 3+ stages each step's group of instructions runs on past the loop's barrier: the accumulators stay in
    # the instructions' registers (one array per output tile, never copied), the end of a step waits only for the
    # step before, and the copies go stages - 2 steps ahead, so that they never overwrite the slot still being read
    from lazygrad_codegen import staging
    from lazygrad_cuda.renderer import CUDARenderer

    r = CUDARenderer("sm_90", CORES)
    case = matmul(1, 256, 256, 512, dtypes.float16)
    opts = [
        _tc(128, dtypes.float16),
        Opt(OptOps.UPCAST, 0, 2),
        Opt(OptOps.UNROLL, 0, 4),
        Opt(OptOps.STAGE, None, stages),
    ]
    spec = get_program(case.ast, r, opts)
    k = Kernel(case.ast, r)
    k.apply_opts(opts)
    running = staging.in_flight(k)
    assert running == (stages >= 3)
    loop = spec.src.index("for (")
    head, body = spec.src[:loop], spec.src[loop:]
    # the copies go stages - 1 - running steps ahead: started before the loop, each step's a group of its own (the
    # last of them committed by the loop's first wait)
    assert head.count("cp.async.commit_group") == stages - 2 - running
    if running:
        assert "float acc0[64]" in head and "wgmma.wait_group.sync.aligned 1;" in body
        end = body.index("wgmma.wait_group.sync.aligned 1;")
        assert "wgmma.wait_group.sync.aligned 0;" in body[end:]
        assert "wgmma.wait_group.sync.aligned 0;" not in body[:end]
    else:
        assert "wgmma.wait_group.sync.aligned 1;" not in spec.src
    # one commit per step for every chain of it
    assert body.count("wgmma.commit_group") == 1
    # and the PYTHON device's result is numpy's
    _run(matmul(1, 128, 128, 256, dtypes.bfloat16), [_tc(128, dtypes.bfloat16), *opts[1:]])


def test_wgmma_default_loads_under_a_64th_of_a_byte_per_flop() -> None:
    # the offline tiling measure of issue 14 on the wgmma default tile (fp16 4096^3 on sm_90): each element loaded
    # from global memory is used 128 (A) or 256 (B) times, 1/85 byte per FLOP
    from lazygrad_codegen.memory_traffic import global_load_bytes
    from lazygrad_cuda.renderer import CUDARenderer

    n = 4096
    r = CUDARenderer("sm_90", CORES)
    with Context(WGMMA=1):
        k = hand_coded_optimizations(Kernel(matmul(1, n, n, n, dtypes.float16).ast, r))
    spec = get_program(k.ast, r, k.applied_opts)
    assert Ops.WGMMA in [u.op for u in spec.uops]
    loaded = global_load_bytes(spec.uops, spec.global_size, spec.local_size)
    assert loaded == (n * n * n // 256 + n * n * n // 128) * 2  # A once per column of tiles, B once per row
    assert loaded / (2 * n**3) <= 1 / 64


@settings(max_examples=5, deadline=None)
@given(
    m=st_.sampled_from([64, 128, 192, 256]),
    n=st_.sampled_from([64, 128, 256, 200]),
    k=st_.sampled_from([64, 128, 192, 80]),
    batch=st_.integers(1, 2),
    dtype=st_.sampled_from([dtypes.float16, dtypes.bfloat16]),
    a_t=st_.booleans(),
    b_t=st_.booleans(),
)
def test_default_tiles_with_wgmma_on_random_shapes_match_numpy(
    m: int, n: int, k: int, batch: int, dtype: DType, a_t: bool, b_t: bool
) -> None:
    # whatever tile WGMMA=1's default takes (wgmma where one fits, mma.sync otherwise), the result is numpy's
    case = matmul(batch, m, n, k, dtype, a_t, b_t)
    with Context(WGMMA=1):
        k_ = hand_coded_optimizations(Kernel(case.ast, HOPPER))
    out, spec = run_python(case.ast, HOPPER, k_.applied_opts, case.inputs)
    check(case, out, f"{case.name} {spec.opts}")
