"""Launches with more than 65,535 workgroups along y or z at the real limits of CUDA and AMDGPU ((2^31 - 1, 65535,
65535) workgroups): folded into x so that every dimension fits, rendered for each renderer that has the limit, and run
on the PYTHON device pretending to be a GPU with those limits, against numpy. (`test_reductions` checks the folding's
index arithmetic on every small launch.)"""

from __future__ import annotations

import numpy as np
import pytest
from codegen_cases import f32, load, run_python, sink, st, store

from lazygrad_codegen import get_program
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.uop import UOp

py = pytest.importorskip("lazygrad_python")

LIMITS = (2**31 - 1, 65535, 65535)


def transposed_double(shape: tuple[int, ...]) -> tuple[UOp, np.ndarray, np.ndarray]:
    """2 * x stored in `shape`, read from an input laid out with the axes reversed (so no two axes merge and each
    keeps a launch dimension: the longest, first, lands in the last one), with its input and numpy's result."""
    x = f32(*reversed(shape))
    order = tuple(reversed(range(len(shape))))
    ast = sink(store(0, load(1, dtypes.float32, st(*reversed(shape)).permute(order)) * 2.0, st(*shape)))
    return ast, x, (x.transpose(order) * 2).ravel()


def unfolded_size(ast: UOp) -> tuple[int, ...]:
    return tuple(get_program(ast, py.PythonRenderer(py.GPUTarget(name="NOLIMIT")), []).global_size)


@pytest.mark.parametrize("shape", [(70000, 2), (65600, 2, 2)], ids=["y", "z"])
def test_a_launch_past_65535_workgroups_is_folded_for_each_limited_renderer(shape: tuple[int, ...]) -> None:
    ast, _, _ = transposed_double(shape)
    assert max(unfolded_size(ast)[1:]) > 65535, "without a limit, the long axis is a y or z dimension over 65,535"
    renderers = [py.PythonRenderer(py.GPUTarget(name="CUDALIMITS", global_max=LIMITS))]
    try:
        from lazygrad_cuda.renderer import CUDARenderer

        renderers.append(CUDARenderer("sm_90"))
    except ImportError:
        pass
    try:
        from lazygrad_amd.amdgpu_renderer import AMDGPURenderer

        renderers.append(AMDGPURenderer("gfx1100"))
    except ImportError:
        pass
    for renderer in renderers:
        spec = get_program(ast, renderer, [])
        assert all(d <= lim for d, lim in zip(spec.global_size, LIMITS, strict=True)), (renderer, spec.global_size)
        assert np.prod(spec.global_size) * np.prod(spec.local_size) == np.prod(shape)


def test_a_launch_past_65535_workgroups_in_y_runs_right_on_python() -> None:
    ast, x, want = transposed_double((70000, 2))
    out, spec = run_python(ast, py.PythonRenderer(py.GPUTarget(name="CUDALIMITS", global_max=LIMITS)), [], {1: x})
    assert spec.global_size[1] <= 65535 and spec.global_size[2] <= 65535
    np.testing.assert_array_equal(out[0], want)
