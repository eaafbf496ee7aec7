"""Core path speed on the CPU: a fused reduction and a matmul, each against numpy in the same run.

Times are end to end per call (building the lazy graph, scheduling, running the kernel; compilation is excluded by a
warm-up call), median of several runs. Ratio = numpy time / lazygrad time: above 1 means lazygrad is faster.

The other benchmarks import their measuring helpers from here: `bench`, `kernel_launcher` and `kernel_seconds` (the
kernels alone), `Copier` (the machine's reference memory speed), `interleaved` (references measured alongside),
`others_cpu_seconds` (how much of the machine other processes took meanwhile).
"""

from __future__ import annotations

import gc
import itertools
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from lazygrad import Tensor
from lazygrad.engine import get_runner, run_schedule
from lazygrad_uop.ops import Ops


def bench(fn: Callable[[], object], runs: int, collect: bool = False) -> float:
    """Median seconds of `fn` after one warm-up call. With `collect`, the garbage collector runs before each call
    (untimed), so that memory freed by the previous call is back in the allocator's cache, as it is in a program
    whose tensors go out of scope."""
    fn()
    times = []
    for _ in range(runs):
        if collect:
            gc.collect()
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return statistics.median(times)


def kernel_launcher(make: Callable[[], Tensor]) -> Callable[[], float]:
    """A function that runs the kernels computing `make()` once and returns their seconds (each launch timed by the
    device): scheduled and compiled here, once, so that a call builds no graph and schedules nothing."""
    items = make().schedule()
    run_schedule(items)  # allocates the buffers and compiles the kernels
    launches = [(get_runner(si.bufs[0].device, si.ast), si.bufs) for si in items if si.ast.op is not Ops.COPY]
    return lambda: sum(runner(bufs, wait=True) or 0.0 for runner, bufs in launches)


def kernel_seconds(make: Callable[[], Tensor], runs: int) -> float:
    """Best seconds of `runs` runs of the kernels that compute `make()` (see `kernel_launcher`)."""
    launch = kernel_launcher(make)
    return min(launch() for _ in range(runs))


def interleaved(
    measures: dict[str, Callable[[], float]], runs: int, block: int = 1, settle: float = 0.0
) -> dict[str, float]:
    """The best of `runs` results of each function (each returns seconds), calling them in turn, `block` calls at a
    time, so that on a machine shared with other work each sees the same conditions as the others, and a reference
    measured this way is comparable with what it is the reference for. Before each block it waits `settle` seconds
    for what the previous function left running to stop (a BLAS's threads keep spinning for a while after a call,
    taking the cores from whatever runs next)."""
    best = dict.fromkeys(measures, float("inf"))
    for _ in range(max(1, -(-runs // block))):
        for name, fn in measures.items():
            time.sleep(settle)
            for _ in range(block):
                best[name] = min(best[name], fn())
    return best


def machine() -> str:
    """The cores this process may use, and the load on the machine: other processes running at the same time share
    the cores and the memory bandwidth, and every ratio here depends on them."""
    return f"{_cores()} cores" + (f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "")


def others_cpu_seconds() -> float | None:
    """CPU seconds that other processes (and other virtual machines, as steal time) have used so far: the machine's
    busy time since boot (Linux's /proc/stat) less this process's own; None where the OS doesn't report it. Its change
    over a measurement, divided by the measurement's wall time, is how many cores other work held meanwhile."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    # user, nice, system, idle, iowait, irq, softirq, steal: all but idle and iowait are busy
    busy = sum(fields) - fields[3] - fields[4]
    own = os.times()
    return busy / os.sysconf("SC_CLK_TCK") - (own.user + own.system)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Copier:
    """The machine's copy speed, the reference of memory-bound kernels: numpy copying `nbytes` between two
    arrays, on one thread (`one`) or split over all cores (`parallel`; numpy's copy releases the GIL). Each
    returns the seconds of one copy, which reads and writes `nbytes`."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.src = np.ones(nbytes // 4, np.float32)
        self.dst = np.zeros_like(self.src)
        cores = _cores()
        self.bounds = list(itertools.pairwise([self.src.size * i // cores for i in range(cores + 1)]))
        self.pool = ThreadPoolExecutor(cores)

    def one(self) -> float:
        return timed(lambda: np.copyto(self.dst, self.src))

    def parallel(self) -> float:
        def copy() -> None:
            parts = [self.pool.submit(np.copyto, self.dst[lo:hi], self.src[lo:hi]) for lo, hi in self.bounds]
            for part in parts:
                part.result()

        return timed(copy)

    def close(self) -> None:
        self.pool.shutdown()


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of `fn` takes."""
    st = time.perf_counter()
    fn()
    return time.perf_counter() - st


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
