"""The offline measure of global memory traffic (`lazygrad_codegen.memory_traffic`): checked against the loads the
PYTHON interpreter actually makes on a scaled-down launch and against the closed form of a tiled matmul, then applied
to the default fp16/bf16 4096^3 CUDA kernels, whose tiling must load at most 1/64 byte per FLOP."""

from __future__ import annotations

import math

import numpy as np
import pytest
from codegen_cases import run_python
from test_staging import ASYNC_TC_GPU, FMA_GPU, TC_GPU, bmm, bmm_ast

from lazygrad_codegen import Opt, OptOps, get_program, tiling
from lazygrad_codegen.memory_traffic import global_load_bytes
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

py = pytest.importorskip("lazygrad_python")
interpreter = pytest.importorskip("lazygrad_python.interpreter")


class _CountingMemory:
    """A global buffer of the interpreter that counts the elements read from it."""

    def __init__(self, mem, counter: list[int]) -> None:
        self.mem, self.counter = mem, counter

    def __getitem__(self, i):
        self.counter[0] += 1
        return self.mem[i]

    def __setitem__(self, i, v) -> None:
        self.mem[i] = v

    def __len__(self) -> int:
        return len(self.mem)


@pytest.mark.parametrize("renderer", [TC_GPU, ASYNC_TC_GPU], ids=["loads", "async_copies"])
def test_static_count_matches_the_interpreters_loads_and_the_tiled_matmul_formula(monkeypatch, renderer) -> None:
    m, n, k = 256, 128, 64
    case = bmm(1, m, n, k, dtypes.float16)
    reads = [0]
    real_memory = interpreter.memory
    spec = get_program(case.ast, renderer)
    assert any(o.op is OptOps.STAGE for o in spec.opts)
    assert (Ops.ASYNC_COPY in {u.op for u in spec.uops}) == (renderer is ASYNC_TC_GPU)

    def local_memory(self, dt):
        return real_memory(dt.base, memoryview(bytearray(max(dt.size, 1) * dt.base.itemsize)))

    # global buffers count their reads; local ones (made by `_new_local`) don't
    monkeypatch.setattr(interpreter, "memory", lambda dt, buf: _CountingMemory(real_memory(dt, buf), reads))
    monkeypatch.setattr(interpreter.Interpreter, "_new_local", local_memory)
    out, _ = run_python(case.ast, renderer, list(spec.opts), case.inputs)
    np.testing.assert_allclose(out[0], case.expected[0], rtol=1e-3, atol=1e-3 * np.abs(case.expected[0]).max())
    counted = reads[0] * 2  # fp16 elements
    static = global_load_bytes(spec.uops, spec.global_size, spec.local_size)
    # each 128x128 workgroup loads its 128 rows of A and 128 columns of B over the whole reduction, once
    tiles = (m // 128) * (n // 128)
    assert counted == static == tiles * (128 * k + k * 128) * 2


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_default_cuda_matmul_loads_at_most_a_64th_of_a_byte_per_flop(dtype) -> None:
    cuda = pytest.importorskip("lazygrad_cuda.renderer")
    cores = pytest.importorskip("lazygrad_cuda.tensor_cores")
    size = 4096
    spec = get_program(bmm_ast(1, size, size, size, dtype), cuda.CUDARenderer("sm_80", cores.TENSOR_CORES["sm_80"]))
    loaded = global_load_bytes(spec.uops, spec.global_size, spec.local_size)
    assert loaded * 64 <= 2 * size**3


@pytest.mark.parametrize(("m", "n", "k"), [(4095, 4096, 4097), (4095, 4097, 4096)])
def test_odd_sized_default_cuda_matmul_loads_about_a_64th_of_a_byte_per_flop(m: int, n: int, k: int) -> None:
    # no tile divides 4095 or 4097: padded to whole 128x128x32 tiles, each loaded value is still used ~128 times;
    # the padding is loaded as zeros and counted (4097 columns pad to 4224: 3% more)
    cuda = pytest.importorskip("lazygrad_cuda.renderer")
    cores = pytest.importorskip("lazygrad_cuda.tensor_cores")
    spec = get_program(bmm_ast(1, m, n, k, dtypes.float16), cuda.CUDARenderer("sm_80", cores.TENSOR_CORES["sm_80"]))
    loaded = global_load_bytes(spec.uops, spec.global_size, spec.local_size)
    assert loaded * 64 <= 2 * m * n * k * 1.04


def test_threads_past_the_end_of_a_copy_do_not_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # a 128x4 fp32 tile of A is 128 copies of 4 floats, made by the first 128 of 256 threads: the others are gated
    # off by their thread index, and the count is exactly the tiled matmul's (the full 8x8 register tile, which a
    # matmul this small would not get for parallelism: `tiling.fma_register_tile`)
    monkeypatch.setattr(tiling, "FMA_WARPS_PER_UNIT", 0)
    m = n = 256
    k = 64
    spec = get_program(bmm_ast(1, m, n, k, dtypes.float32), FMA_GPU)
    assert Opt(OptOps.STAGE) in spec.opts and math.prod(spec.local_size) == 256
    static = global_load_bytes(spec.uops, spec.global_size, spec.local_size)
    tiles = (m // 128) * (n // 128)
    assert static == tiles * (128 * k + k * 128) * 4


def test_symbolic_launches_are_refused() -> None:
    with pytest.raises(ValueError, match="must be ints"):
        global_load_bytes([], (UOp.variable("n", 1, 8), 1, 1), (1, 1, 1))
