"""The default program of a short sum across rows to many outputs on a GPU (the second kernel of a split-K matmul,
which adds its parts: `heuristic._short_column_sums`): a thread per output (or per vector of outputs where there are
enough), workgroups of two to eight warps spread over every compute unit, padded where none divides; emulated on the
PYTHON device against numpy, and the full-size ResNet-18 stem's part sum checked for its launch on CUDA."""

from __future__ import annotations

import math

import numpy as np
import pytest
from codegen_cases import column_sum, run_python

from lazygrad_codegen import Kernel, OptOps
from lazygrad_codegen.heuristic import SHORT_SUM_ROWS, hand_coded_optimizations
from lazygrad_codegen.kernel import AxisType

py = pytest.importorskip("lazygrad_python")

GPU = py.PythonRenderer(py.GPUTarget(name="SUMGPU", warp_size=32, compute_units=4))


@pytest.mark.parametrize(("rows", "cols"), [(14, 4100), (5, 8192), (SHORT_SUM_ROWS, 4096)])
def test_part_sums_get_a_thread_per_output_and_match_numpy(rows: int, cols: int) -> None:
    case = column_sum(rows, cols)
    out, spec = run_python(case.ast, GPU, None, case.inputs)
    np.testing.assert_allclose(out[0], case.expected[0], rtol=1e-5, atol=1e-5)
    threads = math.prod(spec.local_size)
    assert 64 <= threads <= 256, spec.opts
    # every output once, no workgroup of threads along the rows: each thread adds its own column
    assert not any(o.op in (OptOps.GROUP, OptOps.GROUPTOP) for o in spec.opts), spec.opts
    outputs = (
        math.prod(spec.global_size) * threads * max((o.arg for o in spec.opts if o.op is OptOps.UPCAST), default=1)
    )
    assert cols <= outputs < cols + threads * 4


def test_the_stems_part_sum_spreads_over_every_multiprocessor() -> None:
    # ResNet-18's 7x7 stem: 64 x 3 x 7 x 7 = 9408 weights, each the sum of 14 parts (fp16) on an H100's 132 SMs; it had
    # 4-thread workgroups of 16 outputs per thread (588 threads in all)
    cuda = pytest.importorskip("lazygrad_cuda.renderer")
    renderer = cuda.CUDARenderer("sm_80")
    k = hand_coded_optimizations(Kernel(column_sum(14, 9408).ast, renderer))
    workgroups = math.prod(int(s) for s in k.sizes(AxisType.GLOBAL))
    assert workgroups >= renderer.compute_units == 132
    assert k.workgroup_threads() >= 64
