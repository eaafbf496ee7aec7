"""Memory planning seen from the Tensor API: a deep chain of kernels runs in a few activations of memory, tensors
that are still alive keep their buffers, the JIT overlaps its intermediates, and DEBUG=2 reports peak memory.
Values are checked against numpy."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np

from lazygrad import Tensor, TinyJit
from lazygrad.engine import run_schedule
from lazygrad_uop.device import MemoryUse

N = 256 * 1024  # elements of one activation: 1 MiB of float32
ACT = N * 4
DEPTH = 24


def _chain(x: Tensor) -> Tensor:
    for i in range(DEPTH):
        x = (x * 0.5 + i).contiguous()  # contiguous: each step is its own kernel with its own output buffer
    return x


def _chain_ref(x: np.ndarray) -> np.ndarray:
    for i in range(DEPTH):
        x = x * np.float32(0.5) + np.float32(i)
    return x


def _peak_while(fn) -> int:
    """Bytes the CPU device held at most while `fn` ran, beyond what it held before."""
    MemoryUse.reset_peak()
    before = MemoryUse.used.get("CPU", 0)
    fn()
    return MemoryUse.peak.get("CPU", 0) - before


def test_deep_elementwise_chain_stays_within_a_few_activations() -> None:
    x_np = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    x = Tensor(x_np).realize()
    out = _chain(x)
    peak = _peak_while(out.realize)
    # the output, and the intermediates in two blocks that take turns
    assert peak <= 3 * ACT, f"peak {peak / ACT:.1f} activations"
    np.testing.assert_allclose(out.numpy(), _chain_ref(x_np), rtol=1e-5)


def test_without_planning_the_same_chain_holds_every_intermediate() -> None:
    """The measurement itself: run the same schedule with no intermediates declared."""
    x = Tensor(np.ones(N, np.float32)).realize()
    items = _chain(x).schedule()
    assert _peak_while(lambda: run_schedule(items)) >= DEPTH * ACT


def test_tensors_still_alive_keep_their_values() -> None:
    x_np = np.arange(64, dtype=np.float32)
    x = Tensor(x_np).realize()
    kept = []
    y = x
    for i in range(8):
        y = (y + i).contiguous()
        if i % 3 == 0:
            kept.append((i, y))
    out = (y * 2).realize()
    ref, refs = x_np.copy(), {}
    for i in range(8):
        ref = ref + i
        refs[i] = ref.copy()
    np.testing.assert_array_equal(out.numpy(), ref * 2)
    for i, t in kept:  # realized in the same schedule, read afterwards: not overwritten by later intermediates
        np.testing.assert_array_equal(t.numpy(), refs[i])


def test_lazy_tensor_reading_an_intermediate_keeps_it() -> None:
    a = Tensor(np.arange(16, dtype=np.float32)).realize()
    mid = (a * 3).contiguous()
    later = mid + 1  # not realized now: its graph reads mid's buffer after the schedule below ran
    out = ((mid * 2).contiguous() + 5).realize()
    np.testing.assert_array_equal(out.numpy(), np.arange(16) * 6 + 5)
    np.testing.assert_array_equal(later.numpy(), np.arange(16) * 3 + 1)


def test_jit_intermediates_share_memory() -> None:
    chain = TinyJit(_chain)
    x_np = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    for _ in range(3):
        out = chain(Tensor(x_np))
    np.testing.assert_allclose(out.numpy(), _chain_ref(x_np), rtol=1e-5)
    bases = {id(b.base if b.base is not None else b) for ei in chain.jit_cache for b in ei.bufs}
    # the input, the output and a couple of blocks, not one buffer per kernel
    assert len(bases) <= 4, len(bases)
    # a replay allocates nothing
    assert _peak_while(lambda: chain(Tensor(x_np).realize()).numpy()) <= 2 * ACT


def test_jit_capture_needs_no_more_memory_than_a_plain_call() -> None:
    """The capturing (second) call plans its intermediates as a plain call does: a model's first steps must fit
    where its replays fit, and the replays still share memory the JIT's own way."""
    chain = TinyJit(_chain)
    x_np = np.random.default_rng(2).standard_normal(N).astype(np.float32)
    peaks = []
    for _ in range(4):
        x = Tensor(x_np).realize()
        peaks.append(_peak_while(lambda x=x: chain(x).numpy()))
    plain, capture, *replays = peaks
    assert plain <= 3 * ACT, f"plain call: {plain / ACT:.1f} activations"
    assert capture <= plain, f"capture {capture / ACT:.1f} activations against {plain / ACT:.1f} for a plain call"
    assert all(r <= 2 * ACT for r in replays), [r / ACT for r in replays]
    np.testing.assert_allclose(chain(Tensor(x_np)).numpy(), _chain_ref(x_np), rtol=1e-5)
    bases = {id(b.base if b.base is not None else b) for ei in chain.jit_cache for b in ei.bufs}
    assert len(bases) <= 4, len(bases)


def test_debug2_reports_peak_memory() -> None:
    script = "from lazygrad import Tensor\nx = Tensor.ones(1024).contiguous()\n((x + 1).contiguous() * 2).realize()\n"
    env = {**os.environ, "DEBUG": "2", "DEV": "CPU"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.search(r"\*\*\* CPU .* mem +[\d.]+ MB", out.stdout), out.stdout
    assert re.search(r"peak memory CPU [\d.]+ MB", out.stdout), out.stdout


def test_dropped_tensors_return_their_memory_without_the_cycle_collector() -> None:
    """Reference counting alone gives a realized tensor's buffer back when the tensor goes: a training loop must not
    hold every step's buffers until Python's cycle collector happens to run."""
    import gc

    x_np = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    x = Tensor(x_np).realize()
    gc.collect()
    gc.disable()
    try:
        before = MemoryUse.used.get("CPU", 0)
        for _ in range(3):
            y = (x * 2 + 1).realize()
            z = (y * y).sum()
            np.testing.assert_allclose(z.item(), ((x_np * 2 + 1) ** 2).sum(), rtol=1e-4)
            del y, z
        assert MemoryUse.used.get("CPU", 0) - before < ACT, "dropped tensors still hold their buffers"
    finally:
        gc.enable()
