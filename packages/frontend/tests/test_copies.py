"""Copies between devices: two devices of a kind whose allocator has `_transfer` copy with it, not through the host;
others copy through host memory. Values against numpy either way."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad import Tensor

python_device = pytest.importorskip("lazygrad_python.device")


def test_devices_of_one_kind_copy_with_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = python_device.PythonAllocator._transfer

    def counting(self, dest, src, size, src_device, dest_device):
        calls.append(size)
        return real(self, dest, src, size, src_device, dest_device)

    monkeypatch.setattr(python_device.PythonAllocator, "_transfer", counting)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    moved = (Tensor(x, device="PYTHON") * 2).to("PYTHON:1")
    np.testing.assert_array_equal(moved.numpy(), x * 2)
    assert calls == [x.nbytes]


def test_devices_of_other_kinds_copy_through_the_host() -> None:
    x = np.arange(10, dtype=np.int32)
    there = (Tensor(x, device="PYTHON") + 1).to("CPU")
    np.testing.assert_array_equal(there.numpy(), x + 1)
