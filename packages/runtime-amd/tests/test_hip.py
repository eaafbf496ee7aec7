"""The HIP launcher: argument passing checked without a GPU; loading and running a code object where ROCm's
libamdhip64, an AMD GPU and ld.lld are all present (skipped with the reason elsewhere)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from lazygrad_amd import plugin
from lazygrad_amd.hip import HIPBuffer, hip_reason, kernel_arguments


def test_kernel_arguments_point_at_each_value_in_order() -> None:
    params, keep = kernel_arguments((HIPBuffer(0x1000, 16), HIPBuffer(0x2000, 8)), (7, -3))
    assert len(params) == 4
    assert ctypes.c_void_p.from_address(params[0]).value == 0x1000
    assert ctypes.c_void_p.from_address(params[1]).value == 0x2000
    assert ctypes.c_int32.from_address(params[2]).value == 7
    assert ctypes.c_int32.from_address(params[3]).value == -3
    assert len(keep) == 4


def test_hip_reason_is_none_or_says_why() -> None:
    reason = hip_reason()
    assert reason is None or (isinstance(reason, str) and reason)


def test_kernels_run_on_a_gpu() -> None:
    if (reason := plugin.hip_usable()) is not None:
        pytest.skip(f"HIP device unavailable: {reason}")
    lazygrad = pytest.importorskip("lazygrad", reason="runs Tensor graphs: needs the lazygrad frontend")
    x = np.arange(-8, 8, dtype=np.float32).reshape(4, 4)
    t = lazygrad.Tensor(x, device="HIP")
    np.testing.assert_allclose((t * 2 + 1).numpy(), x * 2 + 1)
    np.testing.assert_allclose((t @ t).sum(axis=1).numpy(), (x @ x).sum(axis=1), rtol=1e-5)
