"""Hopper's tensor memory accelerator (TMA) feeding wgmma (`WGMMA=2`): each staged operand that is a plain strided
tensor becomes a `TensorMap` and a few boxes per step (`staging.tma_plan`), copied by one thread and counted on a
barrier per pipeline stage (`TMA_LOAD`, `MBARRIER_*`). The PYTHON interpreter runs them (boxes land only when a
wait needs them, rows swizzled by shared address) against numpy, for every operand orientation, fp16 and bf16,
batches, several tiles, pipelines of two to four stages; operands TMA can't describe (padding, odd strides) stay on
cp.async. Then the CUDA side where NVRTC is installed: the kernels compile for sm_90a without spills, and the
tensor-map table the runtime encodes from says what the maps say."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_cases import check, run_python
from hypothesis import given, settings
from hypothesis import strategies as st_
from test_wgmma import CORES, TILES, matmul

from lazygrad_codegen import Kernel, Opt, OptOps, get_program
from lazygrad_codegen.heuristic import hand_coded_optimizations
from lazygrad_codegen.staging import plan, tma_plan
from lazygrad_uop.config import Context
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops

py = pytest.importorskip("lazygrad_python")

# the emulated sm_90 of test_wgmma, with the tensor memory accelerator
TMA = py.PythonRenderer(
    py.GPUTarget(
        name="HOPPER", tensor_cores=CORES, warp_size=32, async_copy=True, ldmatrix=True, tma=True, shared_max=232448
    )
)
TMA.max_upcast = 512


def _select(n: int, dtype: DType) -> int:
    return next(i for i, tc in enumerate(CORES) if tc.shared_operands and tc.dims[0] == n and tc.dtype_in == dtype)


def _tc(n: int, dtype: DType, pad: int = 0) -> Opt:
    return Opt(OptOps.TC, 0, (_select(n, dtype), pad))


def _run(case, opts: list[Opt], tma: bool = True):
    with Context(WGMMA=2):
        out, spec = run_python(case.ast, TMA, opts, case.inputs)
    check(case, out, f"{case.name} {spec.opts}")
    ops = [u.op for u in spec.uops]
    assert Ops.WGMMA in ops
    assert (Ops.TMA_LOAD in ops) == tma and not (tma and Ops.ASYNC_COPY in ops), spec.opts
    return spec


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize(("a_t", "b_t"), [(False, False), (True, False), (False, True), (True, True)])
def test_every_operand_orientation_matches_numpy(dtype: DType, a_t: bool, b_t: bool) -> None:
    # 64-element steps (128-byte rows), three steps through four stages with the instructions left running
    case = matmul(1, 64, 128, 192, dtype, a_t, b_t)
    spec = _run(case, [_tc(128, dtype), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.STAGE, None, 4)])
    majors = next(u.arg[5:7] for u in spec.uops if u.op is Ops.WGMMA)
    assert [m[0] for m in majors] == ["mn" if a_t else "k", "k" if b_t else "mn"]


@pytest.mark.parametrize(
    ("shape", "n", "opts"),
    [
        *TILES,
        # a 16-element step (32-byte rows of A), N = 256 in four boxes of B
        ((1, 64, 256, 64), 256, [Opt(OptOps.STAGE, None, 3)]),
    ],
)
def test_tiles_and_pipelines_match_numpy(shape: tuple[int, int, int, int], n: int, opts: list[Opt]) -> None:
    # test_wgmma's tiles: those that pipeline (two stages or more) by TMA, the batch a coordinate of the maps
    stages = opts[-1].arg
    _run(matmul(*shape, dtypes.float16), [_tc(n, dtypes.float16), *opts], tma=stages is None or stages > 1)


def test_the_default_tile_takes_tma_and_matches_numpy() -> None:
    case = matmul(1, 128, 256, 256, dtypes.bfloat16)
    with Context(WGMMA=2):
        k = hand_coded_optimizations(Kernel(case.ast, TMA))
    assert k.tensor_core is not None and k.tensor_core.shared_operands and k.stages == 4
    spec = _run(case, k.applied_opts)
    # one thread starts the copies: each step announces all its bytes on one barrier
    expects = {u.arg for u in spec.uops if u.op is Ops.MBARRIER_EXPECT}
    assert expects == {(128 * 64 + 64 * 256) * 2}


def test_operands_tma_cannot_describe_stay_on_cp_async() -> None:
    # padded to whole instructions: the boxes would read the padding
    _run(
        matmul(1, 100, 70, 96, dtypes.float16),
        [_tc(64, dtypes.float16, 1), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.STAGE)],
        tma=False,
    )
    # one stage: synchronous copies, nothing to pipeline
    _run(matmul(1, 64, 64, 64, dtypes.float16), [_tc(64, dtypes.float16), Opt(OptOps.STAGE, None, 1)], tma=False)
    # WGMMA=1 keeps cp.async everywhere
    case = matmul(1, 64, 64, 128, dtypes.float16)
    with Context(WGMMA=1):
        spec = get_program(
            case.ast, TMA, [_tc(64, dtypes.float16), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.STAGE, None, 2)]
        )
    assert Ops.TMA_LOAD not in [u.op for u in spec.uops]


@settings(max_examples=6, deadline=None)
@given(
    batch=st_.integers(1, 2),
    m=st_.integers(1, 2),
    n=st_.integers(1, 2),
    k=st_.integers(2, 4),
    dtype=st_.sampled_from([dtypes.float16, dtypes.bfloat16]),
    a_t=st_.booleans(),
    b_t=st_.booleans(),
    stages=st_.sampled_from([2, 3, 4]),
)
def test_random_shapes_match_numpy(
    batch: int, m: int, n: int, k: int, dtype: DType, a_t: bool, b_t: bool, stages: int
) -> None:
    case = matmul(batch, 64 * m, 64 * n, 32 * k, dtype, a_t, b_t)
    _run(case, [_tc(64, dtype), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.STAGE, None, stages)])


@pytest.mark.parametrize(("a_t", "b_t"), [(False, False), (True, False), (False, True), (True, True)])
def test_plans_describe_the_operands(a_t: bool, b_t: bool) -> None:
    """Each map reads its operand as numpy lays it out: its dims, by their strides, reach every element of the stored
    array exactly once (innermost contiguous), and the boxes of one step cover its tile exactly once."""
    case = matmul(1, 4096, 2048, 1024, dtypes.float16, a_t, b_t)
    with Context(WGMMA=2):
        k = hand_coded_optimizations(Kernel(case.ast, TMA))
    for o, stored in zip(plan(k), (case.inputs[1], case.inputs[2]), strict=True):
        p = tma_plan(k, o)
        assert p is not None
        reached = np.zeros((), np.int64)
        for n, stride in zip(p.tmap.dims, p.tmap.strides, strict=True):
            reached = np.add.outer(np.arange(n) * stride, reached)
        np.testing.assert_array_equal(np.sort(reached.reshape(-1)), np.arange(stored.size))
        assert p.tmap.strides[0] == 1 and p.tmap.swizzle == 128 and p.tmap.box[0] == 64
        assert len(p.boxes) * int(np.prod(p.tmap.box)) == o.tile


def test_cuda_kernels_compile_without_spills() -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    from lazygrad_cuda.compiler import ptxas_usage
    from lazygrad_cuda.renderer import TENSOR_MAP_WORDS, CUDARenderer, tensor_map_table
    from lazygrad_cuda.tensor_cores import TENSOR_CORES

    r = CUDARenderer("sm_90", TENSOR_CORES["sm_90"])
    assert r.has_tma and not CUDARenderer("sm_80", TENSOR_CORES["sm_80"]).has_tma
    for dtype, (b, m, n, kk) in [(dtypes.float16, (1, 4096, 4096, 4096)), (dtypes.bfloat16, (4, 1024, 2048, 512))]:
        case = matmul(b, m, n, kk, dtype)
        with Context(WGMMA=2):
            k = hand_coded_optimizations(Kernel(case.ast, r))
            spec = get_program(k.ast, r, k.applied_opts)
        assert "cp.async.bulk.tensor.2d" in spec.src and "cp.async.cg" not in spec.src
        usage = ptxas_usage(spec.src, "sm_90", spec.function_name)
        assert usage.spill_stores == usage.spill_loads == 0, usage
        # the table: two maps (A then B), each its buffer, element size, rank 2, 128-byte swizzle, and the shapes
        table = tensor_map_table(spec.uops)
        assert table[0] == 2 and len(table) == 1 + 2 * TENSOR_MAP_WORDS
        for i, (buf, inner) in enumerate(((1, kk), (2, n))):
            words = table[1 + i * TENSOR_MAP_WORDS : 1 + (i + 1) * TENSOR_MAP_WORDS]
            assert words[:5] == [buf, 1, 2, 128, 0]
            assert words[5:7] == [inner, (m if buf == 1 else kk) * b] and words[10:12] == [2, inner * 2]
