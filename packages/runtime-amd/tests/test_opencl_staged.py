"""Kernels staged through `__local` memory (the STAGE opt, `lazygrad_codegen.staging`: `barrier(CLK_LOCAL_MEM_FENCE)`
once per reduce step, vector copies) on the CL device, on whatever OpenCL platform this machine has (PoCL in CI),
against numpy: matmuls (fp32, fp16, shapes that are and are not multiples of the tiles) and a convolution. Skips with
the reason where no OpenCL platform exists. The default heuristics don't stage on a generic OpenCL target (it may be
a CPU), so the opts are given."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad_amd import plugin

if (REASON := plugin.cl_usable()) is not None:
    pytest.skip(f"no usable OpenCL device: {REASON}", allow_module_level=True)

from lazygrad_amd.opencl import CLDevice, cl_devices
from lazygrad_codegen import Opt, OptOps, get_program
from lazygrad_codegen.kernel_ast import load, reduce, sink, st, store
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.views import ShapeTracker, View

RNG = np.random.default_rng(14)


@pytest.fixture(scope="module")
def dev() -> CLDevice:
    return CLDevice("CL", cl_devices()[0])


def _run(dev: CLDevice, ast, opts: list[Opt], inputs: dict[int, np.ndarray], out: np.ndarray) -> np.ndarray:
    spec = get_program(ast, dev.renderer, opts)
    assert Ops.BARRIER in {u.op for u in spec.uops} and "__local" in spec.src
    prg = dev.load_program(spec.name, dev.compiler.compile(spec.src))
    arrays = {0: out, **inputs}
    bufs = {}
    for slot, a in arrays.items():
        bufs[slot] = dev.allocator.alloc(max(a.nbytes, 1))
        dev.allocator.copyin(bufs[slot], memoryview(np.ascontiguousarray(a)).cast("B"))
    prg(*(bufs[s] for s in spec.globals), global_size=spec.global_size, local_size=spec.local_size)
    result = np.empty_like(out)
    dev.allocator.copyout(memoryview(result).cast("B"), bufs[0])
    return result


@pytest.mark.parametrize(
    ("m", "n", "k", "opts"),
    [
        (64, 64, 64, [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 0, 4)]),
        # padded reduction (zeros staged), workgroups along both axes
        (40, 24, 30, [Opt(OptOps.PADTO, 2, 4), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.LOCAL, 0, 8)]),
    ],
)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16])
def test_staged_matmul_on_cl(dev: CLDevice, m: int, n: int, k: int, opts: list[Opt], dtype) -> None:
    npdt = np.float32 if dtype == dtypes.float32 else np.float16
    a, b = RNG.standard_normal((m, k)).astype(npdt), RNG.standard_normal((k, n)).astype(npdt)
    x = load(1, dtype, st(m, 1, k).expand((m, n, k)))
    y = load(2, dtype, st(1, k, n).permute((0, 2, 1)).expand((m, n, k)))
    ast = sink(store(0, reduce(x.cast(dtypes.float32) * y.cast(dtypes.float32), Ops.ADD, (2,)), st(m, n, 1)))
    got = _run(dev, ast, [*opts, Opt(OptOps.STAGE)], {1: a, 2: b}, np.zeros((m, n), np.float32))
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_staged_convolution_on_cl(dev: CLDevice) -> None:
    cin, cout, size = 8, 16, 6
    x = RNG.standard_normal((cin, size, size)).astype(np.float32)
    w = RNG.standard_normal((cout, cin, 3, 3)).astype(np.float32)
    p = size + 2
    padded = st(cin, size, size).pad(((0, 0), (1, 1), (1, 1))).reshape((cin * p * p,))
    shape = (cout, size, size, cin, 3, 3)
    window = ShapeTracker((*padded.views[:-1], View.create(shape, (0, p, 1, p * p, p, 1))))
    prod = load(1, dtypes.float32, window, size=x.size) * load(
        2, dtypes.float32, st(cout, 1, 1, cin, 3, 3).expand(shape)
    )
    ast = sink(store(0, reduce(prod, Ops.ADD, (3, 4, 5)), st(cout, size, size, 1, 1, 1)))
    opts = [Opt(OptOps.UPCAST, 2, 2), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.STAGE)]
    got = _run(dev, ast, opts, {1: x, 2: w}, np.zeros((cout, size, size), np.float32))
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1))).astype(np.float64)
    want = np.zeros((cout, size, size))
    for i in range(size):
        for j in range(size):
            want[:, i, j] = np.einsum("chw,ochw->o", xp[:, i : i + 3, j : j + 3], w)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
