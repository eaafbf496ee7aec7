"""What DEBUG prints, and numpy() sharing memory with the device safely."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys

import numpy as np

from lazygrad import Tensor

SCRIPT = """
import numpy as np
from lazygrad import Tensor
x = Tensor(np.arange(4096, dtype=np.float32).reshape(64, 64))
(x * 2 + 1).sum(axis=1).realize()
(x @ x).realize()
"""


def run_with_debug(level: int) -> str:
    env = {**os.environ, "DEBUG": str(level), "DEV": "CPU"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_debug2_prints_each_kernel_and_a_summary() -> None:
    out = run_with_debug(2)
    lines = [ln for ln in out.splitlines() if ln.startswith("*** CPU")]
    assert len(lines) >= 2
    # the name shows the kernel's shape, then time, GFLOPS and GB/s
    assert any(re.search(r"r_64_64 .* ms .* GFLOPS .* GB/s", ln) for ln in lines), lines
    assert any(re.search(r"r_64_64_64 .* ms .* GFLOPS .* GB/s", ln) for ln in lines), lines
    assert re.search(r"\*\*\* total: \d+ kernels in [\d.]+ ms", out), out


def test_debug4_prints_source() -> None:
    out = run_with_debug(4)
    assert "define" in out  # LLVM IR of the kernels


def test_debug0_prints_nothing() -> None:
    assert run_with_debug(0) == ""


def test_numpy_shares_memory_read_only_and_outlives_the_tensor() -> None:
    t = (Tensor(np.arange(8, dtype=np.float32)) * 3).realize()
    arr = t.numpy()
    assert not arr.flags.writeable and not arr.flags.owndata
    assert np.shares_memory(arr, t.numpy())
    del t
    gc.collect()
    # new allocations of the same size must not reuse the memory the array still shows
    others = [(Tensor(np.full(8, 9, np.float32)) + 1).realize() for _ in range(4)]
    np.testing.assert_array_equal(arr, np.arange(8, dtype=np.float32) * 3)
    assert all((o.numpy() == 10).all() for o in others)


def test_numpy_of_a_view_copies() -> None:
    t = Tensor(np.arange(6, dtype=np.int32).reshape(2, 3)).realize()
    np.testing.assert_array_equal(t.T.numpy(), np.arange(6, dtype=np.int32).reshape(2, 3).T)
