"""Core path speed on the CPU: a fused reduction and a matmul, each against numpy in the same run.

Times are end to end per call (building the lazy graph, scheduling, running the kernel; compilation is excluded by a
warm-up call), median of several runs. Ratio = numpy time / lazygrad time: above 1 means lazygrad is faster.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from lazygrad import Tensor


def bench(fn: Callable[[], object], runs: int) -> float:
    """Median seconds of `fn` after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return statistics.median(times)


def main() -> None:
    rng = np.random.default_rng(0)
    rows = []

    x_np = rng.standard_normal(2**24).astype(np.float32)
    x = Tensor(x_np).realize()
    got = (x * 2 + 1).sum().item()
    np.testing.assert_allclose(got, (x_np * 2 + 1).sum(dtype=np.float64), rtol=1e-4)
    t_lg = bench(lambda: (x * 2 + 1).sum().item(), 10)
    t_np = bench(lambda: (x_np * 2 + 1).sum(), 10)
    rows.append(("(x*2+1).sum(), 2^24 float32", t_lg, t_np, 2 * 2**24 / t_lg / 1e9, 4 * 2**24 / t_lg / 1e9))

    n = 1024
    a_np, b_np = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
    np.testing.assert_allclose((a @ b).numpy(), a_np @ b_np, rtol=1e-3, atol=1e-3)
    t_lg = bench(lambda: (a @ b).realize(), 3)
    t_np = bench(lambda: a_np @ b_np, 10)
    rows.append(("matmul 1024x1024 float32", t_lg, t_np, 2 * n**3 / t_lg / 1e9, 3 * 4 * n * n / t_lg / 1e9))

    print(f"{'benchmark':32s} {'lazygrad':>12s} {'numpy':>12s} {'numpy/lazygrad':>15s} {'GFLOPS':>8s} {'GB/s':>7s}")
    for name, t_lg, t_np, gflops, gbs in rows:
        print(f"{name:32s} {t_lg * 1e3:9.2f} ms {t_np * 1e3:9.2f} ms {t_np / t_lg:15.2f} {gflops:8.2f} {gbs:7.2f}")


if __name__ == "__main__":
    main()
