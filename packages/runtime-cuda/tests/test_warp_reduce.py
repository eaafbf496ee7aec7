"""Warp-level reductions on CUDA: grouped reductions that codegen combines with `__shfl_xor_sync` compile with NVRTC
for sm_80 and sm_90 (their PTX holds `shfl.sync.bfly` and assembles with ptxas), and the very linear programs the
CUDA renderer was given run on the PYTHON interpreter, which emulates the shuffles, against numpy. (Running them
on a GPU: test_gpu.py's machinery, where there is one.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_helpers import SCALARS, compile_everywhere, glob, linear, special, store

from lazygrad_codegen import Opt, OptOps, get_program
from lazygrad_codegen.kernel_ast import row_reduce
from lazygrad_cuda.renderer import CUDARenderer
from lazygrad_uop.dtype import DType, dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.uop import UOp

R = CUDARenderer("sm_80")
RNG = np.random.default_rng(9)


def run_on_python(spec, rows: int, x: np.ndarray) -> np.ndarray:
    """The linear program of `spec` (lowered for CUDA) run by the PYTHON interpreter."""
    py = pytest.importorskip("lazygrad_python")
    prg = py.PythonProgram(
        Device["PYTHON"], spec.name, py.PythonCompiler().compile(py.PythonRenderer().render(spec.uops))
    )
    out = memoryview(bytearray(rows * x.itemsize))
    prg(out, memoryview(bytearray(x.tobytes())), global_size=spec.global_size, local_size=spec.local_size)
    return np.frombuffer(bytes(out), x.dtype)


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
    # rows, n, opts (None: the heuristic), whether shared memory remains
    pytest.param(1, 4096, None, True, id="heuristic-1024"),
    pytest.param(1, 1000, None, True, id="heuristic-padded"),
    pytest.param(4, 96, [Opt(OptOps.GROUP, 0, 32)], False, id="group32"),
    pytest.param(2, 288, [Opt(OptOps.GROUP, 0, 96)], True, id="group96-loop"),
    pytest.param(4, 64, [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.GROUPTOP, 0, 16)], False, id="upcast2-group16"),
]


@pytest.mark.parametrize(("rows", "n", "opts", "shared"), CONFIGS)
def test_warp_reductions_compile_and_compute(rows: int, n: int, opts, shared: bool, tmp_path: Path) -> None:
    sources = []
    for kind in ("sum", "max", "min"):
        for dtype in (dtypes.float32, dtypes.int32, dtypes.float16):
            spec = get_program(row_reduce(kind, dtype, rows, n), R, opts)
            assert "__shfl_xor_sync(0xffffffffu, " in spec.src
            assert ("__shared__" in spec.src) is shared and ("__syncthreads" in spec.src) is shared
            x = data(dtype, (rows, n))
            np.testing.assert_array_equal(run_on_python(spec, rows, x.ravel()), reference(kind, x))
            sources.append(spec.src)
    # one NVRTC run per configuration: the kernels have distinct names, the preludes are include-guarded or equal
    src = _merge(sources)
    outs = compile_everywhere(src, f"warp_{rows}_{n}", tmp_path)
    for out in outs.values():
        assert b"shfl.sync.bfly" in out.ptx


def _merge(sources: list[str]) -> str:
    """One translation unit of several kernels: each helper line (includes, structs) kept once."""
    seen: set[str] = set()
    lines: list[str] = []
    for src in sources:
        head, _, body = src.partition('extern "C"')
        for line in head.splitlines():
            if line and line not in seen:
                seen.add(line)
                lines.append(line)
        lines.append('extern "C"' + body)
    includes = [ln for ln in lines if ln.startswith("#include")]
    return "\n".join(includes + [ln for ln in lines if not ln.startswith("#include")])


@pytest.mark.parametrize("dtype", SCALARS, ids=str)
def test_every_dtype_shuffles(dtype: DType, tmp_path: Path) -> None:
    # types __shfl_xor_sync has no overload for travel as int; the value comes back unchanged
    inp, out = glob(1, dtype, 32), glob(0, dtype, 32)
    lane = special("lidx0", 32)
    loaded = UOp(Ops.LOAD, dtype, (UOp(Ops.INDEX, inp.dtype, (inp, lane)),))
    shuffled = UOp(Ops.SHUFFLE_XOR, dtype, (loaded,), 16)
    uops = linear(f"shfl_{dtype.name.replace(' ', '_')}", store(out, lane, shuffled))
    src = R.render(uops)
    assert "__shfl_xor_sync" in src
    compile_everywhere(src, f"shfl_{dtype.name.replace(' ', '_')}", tmp_path)
    if dtype not in (dtypes.bfloat16,):
        py = pytest.importorskip("lazygrad_python")
        prg = py.PythonProgram(Device["PYTHON"], "k", py.PythonCompiler().compile(py.PythonRenderer().render(uops)))
        npdt = to_numpy_dtype(dtype)
        x = (np.arange(32) % 2 == 0) if dtype == dtypes.bool else (np.arange(32) - 7).astype(npdt)
        res = memoryview(bytearray(32 * x.itemsize))
        prg(res, memoryview(bytearray(x.tobytes())), local_size=(32, 1, 1))
        np.testing.assert_array_equal(np.frombuffer(bytes(res), x.dtype), x[np.arange(32) ^ 16])


def test_cuda_declares_32_thread_warps() -> None:
    assert CUDARenderer("sm_90").warp_size == 32
