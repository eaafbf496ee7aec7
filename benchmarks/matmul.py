"""float32 matmul throughput on the default device against numpy's `a @ b` (its BLAS, on all cores), measured in the
same run: 1024x1024 and 2048x2048, with codegen's default (hand-coded) optimisations and with `BEAM=2` search.

Columns: `kernel` is the best launch of the compiled kernel alone, `GFLOPS` = 2*n^3 / that time, `e2e` the median
`.realize()` of a fresh `a @ b` graph, `1st call` the first one (compiling, and searching with BEAM unless the disk
cache has the result); numpy's time is its best run, measured in turn with the kernel's runs so that both see the
same load from other processes, and `vs numpy` compares the two GFLOPS. The targets on a 2-core machine: at least
0.50 of numpy with BEAM, 0.25 without.
"""

from __future__ import annotations

import importlib.util
import time

import numpy as np
from core import bench, interleaved, kernel_launcher, machine, timed

from lazygrad import Tensor, engine
from lazygrad_uop.config import Context
from lazygrad_uop.registry import Device

TARGETS = {"default": 0.25, "BEAM=2": 0.50}
# slow configurations run fewer times: about this many seconds of measurement each
BUDGET_SECONDS = 4.0


def beam_missing() -> str | None:
    """Why `BEAM` can't be measured here, or None when codegen has a BEAM search."""
    if importlib.util.find_spec("lazygrad_codegen.search") is None:
        return "codegen has no BEAM search yet (lazygrad_codegen.search)"
    return None


def runs_for(seconds: float) -> int:
    return max(1, min(10, int(BUDGET_SECONDS / max(seconds, 1e-9))))


def measure(a: Tensor, b: Tensor, a_np: np.ndarray, b_np: np.ndarray) -> tuple[float, float, float, float]:
    """(kernel seconds, numpy seconds, both best of runs taken in turn; end-to-end seconds; seconds of the first
    call, which compiles and maybe searches)."""
    start = time.perf_counter()
    got = (a @ b).numpy()
    first = time.perf_counter() - start
    np.testing.assert_allclose(got, a_np @ b_np, rtol=1e-3, atol=1e-3 * np.sqrt(a.shape[1]))
    launch = kernel_launcher(lambda: a @ b)
    runs = runs_for(launch())
    measures = {"kernel": launch, "numpy": lambda: timed(lambda: a_np @ b_np)}
    best = interleaved(measures, max(runs, 6), block=3, settle=0.3)
    time.sleep(0.3)  # numpy's BLAS threads spin a while after its last call
    e2e = bench(lambda: (a @ b).realize(), runs, collect=True)
    return best["kernel"], best["numpy"], e2e, first


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"device {Device.DEFAULT}, {machine()}; numpy {np.__version__}")
    print(
        f"{'size':>9s} {'opts':>8s} {'kernel':>11s} {'GFLOPS':>8s} {'e2e':>11s} {'1st call':>9s} {'numpy':>10s} "
        f"{'numpy GF':>9s} {'vs numpy':>8s} {'target':>7s}"
    )
    missing = beam_missing()
    for n in (1024, 2048):
        a_np, b_np = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
        a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
        for opts, overrides in (("default", {}), ("BEAM=2", {"BEAM": 2})):
            if opts == "BEAM=2" and missing is not None:
                print(f"{n:4d}x{n:<4d} {opts:>8s} {'n/a':>11s} {'n/a':>8s} {'':51s} {'n/a':>8s} {'n/a':>7s}")
                continue
            # the engine keeps one compiled program per kernel whatever the settings: forget the other
            # configuration's, so that this one is optimised (and searched) under its own settings
            engine._runners.clear()
            with Context(**overrides):
                kernel, t_np, e2e, first = measure(a, b, a_np, b_np)
            gflops, np_gflops = 2 * n**3 / kernel / 1e9, 2 * n**3 / t_np / 1e9
            ratio = gflops / np_gflops
            print(
                f"{n:4d}x{n:<4d} {opts:>8s} {kernel * 1e3:8.2f} ms {gflops:8.2f} {e2e * 1e3:8.2f} ms "
                f"{first:8.2f}s {t_np * 1e3:7.2f} ms {np_gflops:9.2f} {ratio:8.3f} "
                f"{'met' if ratio >= TARGETS[opts] else 'MISSED':>7s}"
            )
    if missing is not None:
        print(f"\nBEAM=2: n/a, {missing}")


if __name__ == "__main__":
    main()
