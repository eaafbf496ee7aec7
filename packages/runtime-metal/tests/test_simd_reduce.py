"""SIMD-group reductions on Metal: grouped reductions that codegen combines with `simd_shuffle_xor` pass the MSL check
(msl_header declares simd_shuffle_xor for exactly the types Metal has it for), and the linear programs the Metal
renderer was given run on the PYTHON interpreter, which emulates the shuffles, against numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from msl_check import check_msl, cxx

from lazygrad_codegen import Opt, OptOps, get_program
from lazygrad_codegen.kernel_ast import row_reduce
from lazygrad_metal.renderer import SIMD_WIDTH, MetalRenderer
from lazygrad_testkit.dtypes import SCALARS
from lazygrad_uop.dtype import DType, dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.uop import UOp

RNG = np.random.default_rng(13)


@pytest.fixture
def msl(tmp_path: Path):
    """Checks MSL sources with the C++ compiler (skips where there is none)."""
    if cxx() is None:
        pytest.skip("no C++ compiler (c++) on PATH to check the MSL with")
    return lambda *sources: check_msl(list(sources), tmp_path)


def run_python(uops: list[UOp], out: np.ndarray, *ins: np.ndarray, global_size=(1, 1, 1), local_size=(1, 1, 1)):
    lp = pytest.importorskip("lazygrad_python", reason="running linear programs needs lazygrad-runtime-python")
    prg = lp.PythonProgram(Device["PYTHON"], "kernel", lp.PythonCompiler().compile(lp.PythonRenderer().render(uops)))
    mems = [memoryview(bytearray(np.ascontiguousarray(a).tobytes())) for a in (out, *ins)]
    prg(*mems, global_size=global_size, local_size=local_size)
    return np.frombuffer(bytes(mems[0]), out.dtype)


def data(dtype: DType, shape: tuple[int, int]) -> np.ndarray:
    # integers, and floats on grids whose sums are exact in any order: numpy's result is the only right answer
    if dtype == dtypes.int32:
        return RNG.integers(-1000, 1000, shape).astype(np.int32)
    if dtype == dtypes.float16:
        return (RNG.integers(-12, 13, shape) / 8).astype(np.float16)
    return (RNG.integers(-4096, 4096, shape) / 64).astype(np.float32)


def reference(kind: str, x: np.ndarray) -> np.ndarray:
    if kind == "sum":
        return x.astype(np.float64).sum(1).astype(x.dtype)
    return x.max(1) if kind == "max" else x.min(1)


CONFIGS = [
    # rows, n, opts (None: the heuristic), whether threadgroup memory remains
    pytest.param(1, 4096, None, True, id="heuristic-1024"),
    pytest.param(1, 1000, None, True, id="heuristic-padded"),
    pytest.param(4, 96, [Opt(OptOps.GROUP, 0, 32)], False, id="group32"),
    pytest.param(2, 288, [Opt(OptOps.GROUP, 0, 96)], True, id="group96-loop"),
    pytest.param(6, 40, [Opt(OptOps.GROUP, 0, 8), Opt(OptOps.LOCAL, 0, 3)], False, id="group8-local3"),
]


@pytest.mark.parametrize(("rows", "n", "opts", "shared"), CONFIGS)
def test_simd_reductions_check_and_compute(rows: int, n: int, opts, shared: bool, msl) -> None:
    sources = []
    for kind in ("sum", "max", "min"):
        for dtype in (dtypes.float32, dtypes.int32, dtypes.float16):
            spec = get_program(row_reduce(kind, dtype, rows, n), MetalRenderer(), opts)
            assert "simd_shuffle_xor(" in spec.src
            assert ("threadgroup_barrier" in spec.src) is shared
            x = data(dtype, (rows, n))
            launch = {"global_size": spec.global_size, "local_size": spec.local_size}
            res = run_python(spec.uops, np.zeros(rows, x.dtype), x.ravel(), **launch)
            np.testing.assert_array_equal(res, reference(kind, x))
            sources.append(spec.src)
    msl(*sources)


SHUFFLED = [d for d in SCALARS if d != dtypes.float64]  # no float64 on Apple GPUs


def test_every_dtype_shuffles(msl) -> None:
    # types simd_shuffle_xor has no overload for travel as the unsigned integers of their size, bit for bit
    sources = []
    for dtype in SHUFFLED:
        inp, out = (UOp(Ops.DEFINE_GLOBAL, dtype.ptr(32), arg=slot) for slot in (1, 0))
        lane = UOp(Ops.SPECIAL, dtypes.int32, (), ("lidx0", 32))
        loaded = UOp(Ops.LOAD, dtype, (UOp(Ops.INDEX, inp.dtype, (inp, lane)),))
        shuffled = UOp(Ops.SHUFFLE_XOR, dtype, (loaded,), 16)
        st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, lane)), shuffled))
        uops = [
            out,
            inp,
            lane,
            loaded.src[0],
            loaded,
            shuffled,
            st.src[0],
            st,
            UOp(Ops.SINK, arg=f"shfl_{dtype.name.replace(' ', '_')}"),
        ]
        sources.append(MetalRenderer().render(uops))
        assert "simd_shuffle_xor" in sources[-1]
        if dtype != dtypes.bfloat16:
            npdt = to_numpy_dtype(dtype)
            x = (np.arange(32) % 3 == 0) if dtype == dtypes.bool else (np.arange(32) - 7).astype(npdt)
            res = run_python(uops, np.zeros(32, x.dtype), x, local_size=(32, 1, 1))
            np.testing.assert_array_equal(res, x[np.arange(32) ^ 16])
    msl(*sources)


def test_metal_declares_its_simd_width() -> None:
    assert MetalRenderer().warp_size == SIMD_WIDTH == 32
