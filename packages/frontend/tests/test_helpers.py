"""lazygrad.helpers (what tinygrad programs import from tinygrad.helpers) and GlobalCounters fed by the engine."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad import Tensor, TinyJit
from lazygrad.helpers import Context, GlobalCounters, Timing, colored, getenv, tqdm, trange
from lazygrad_uop.config import DEBUG


def test_getenv_converts_to_the_default_type(monkeypatch) -> None:
    monkeypatch.setenv("LG_TEST_INT", "12")
    monkeypatch.setenv("LG_TEST_FLOAT", "0.25")
    monkeypatch.setenv("LG_TEST_STR", "abc")
    assert getenv("LG_TEST_INT") == 12 and getenv("LG_TEST_FLOAT", 0.0) == 0.25 and getenv("LG_TEST_STR", "") == "abc"
    assert getenv("LG_TEST_UNSET", 7) == 7


@pytest.mark.parametrize(("color", "code"), [("red", 31), ("green", 32), ("BLUE", 94), ("white", 37)])
def test_colored_uses_the_ansi_codes(color: str, code: int) -> None:
    # ANSI SGR: 30-37 foreground, 90-97 bright foreground, 40-47 background, 0 reset
    assert colored("hi", color) == f"\x1b[{code}mhi\x1b[0m"
    assert colored("hi", color, background=True) == f"\x1b[{code + 10}mhi\x1b[0m"
    assert colored("hi", None) == "hi"
    with pytest.raises(ValueError, match="unknown color"):
        colored("hi", "purple")


def test_timing_prints_the_prefix_and_milliseconds(capsys) -> None:
    with Timing("step ", on_exit=lambda ns: f" ({ns} ns)") as t:
        sum(range(1000))
    out = capsys.readouterr().out.strip()
    assert out.startswith("step ") and out.endswith(f" ms ({t.et} ns)") and t.et > 0
    ms = float(out[len("step ") :].split(" ms")[0])
    assert ms == pytest.approx(t.et * 1e-6, abs=0.01)
    with Timing("quiet ", enabled=False):
        pass
    assert capsys.readouterr().out == ""


def test_trange_and_tqdm_are_tqdms() -> None:
    real = pytest.importorskip("tqdm")
    assert trange is real.trange and tqdm is real.tqdm


def test_context_training_is_tensor_train() -> None:
    assert Tensor.training is False
    with Context(TRAINING=1):
        assert Tensor.training is True
        with Context(TRAINING=0, DEBUG=0):
            assert Tensor.training is False
        assert Tensor.training is True
    assert Tensor.training is False

    @Context(TRAINING=1)
    def f() -> bool:
        return Tensor.training

    assert f() is True and Tensor.training is False


def test_context_restores_settings_even_on_error() -> None:
    before = DEBUG.value
    with pytest.raises(RuntimeError), Context(DEBUG=before + 3, TRAINING=True):
        assert DEBUG.value == before + 3 and Tensor.training
        raise RuntimeError("boom")
    assert DEBUG.value == before and Tensor.training is False
    with pytest.raises(KeyError, match="unknown setting"), Context(NOT_A_SETTING=1):
        pass


def test_global_counters_count_kernels_ops_and_bytes() -> None:
    n = 1000
    a, b = Tensor(np.arange(n, dtype=np.float32)), Tensor(np.ones(n, dtype=np.float32))
    Tensor.realize(a, b)
    GlobalCounters.reset()
    c = (a + b).realize()
    # one elementwise kernel: n additions, reading two float32 vectors and writing one
    assert GlobalCounters.kernel_count == 1
    assert GlobalCounters.global_ops == n
    assert GlobalCounters.global_mem == 3 * 4 * n
    np.testing.assert_array_equal(c.numpy(), np.arange(n) + 1)
    GlobalCounters.reset()
    assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem) == (0, 0, 0)


def test_global_counters_mem_used_follows_allocations() -> None:
    before = GlobalCounters.mem_used
    t = Tensor(np.zeros(4096, dtype=np.float32)).realize()
    assert GlobalCounters.mem_used - before >= 4096 * 4
    del t


def test_global_counters_time_kernels_when_timed() -> None:
    x = Tensor(np.ones((64, 64), dtype=np.float32)).realize()
    GlobalCounters.reset()
    with Context(DEBUG=2):
        (x @ x).realize()
    assert GlobalCounters.kernel_count == 1 and GlobalCounters.time_sum_s > 0
    assert GlobalCounters.global_ops >= 2 * 64**3 - 64 * 64  # multiply-adds of a 64x64 matmul


def test_global_counters_count_jit_replays() -> None:
    @TinyJit
    def step(x: Tensor) -> Tensor:
        return (x * 2 + 1).realize()

    counts = []
    for i in range(4):
        GlobalCounters.reset()
        out = step(Tensor(np.full(16, i, dtype=np.float32)))
        counts.append(GlobalCounters.kernel_count)
        np.testing.assert_array_equal(out.numpy(), np.full(16, 2 * i + 1))
    # every call runs the kernel once, whether it is captured, replayed or run plainly
    assert counts[2:] == [counts[1]] * 2 and counts[2] >= 1
