"""float32 matmul throughput on the default device against numpy's `a @ b` (its BLAS, on all cores), measured in the
same run: 1024x1024 and 2048x2048, with codegen's default (hand-coded) optimisations and with `BEAM=2` search.

Columns: `kernel` is the best launch of the compiled kernel alone, `GFLOPS` = 2*n^3 / that time, `e2e` the median
`.realize()` of a fresh `a @ b` graph, `1st call` the first one (compiling, and searching with BEAM unless the disk
cache has the result); numpy's time is its best run, measured in turn with the kernel's runs so that both see the
same load from other processes, and `vs numpy` compares the two GFLOPS. The targets on a 2-core machine: at least
0.50 of numpy with BEAM, 0.25 without.

A second table (default opts only) has matmuls whose inputs are stored transposed, each next to the same product
with contiguous inputs: `x @ W.T` of an `nn.Linear` (W stored (out, in)), `x.T @ W`, a decode GEMV `x @ W.T` with
one row, attention scores `q @ k^T` of 12 heads; `vs contig` is the kernel's GFLOPS over its contiguous twin's.
`python benchmarks/matmul.py --transposed` prints only that table.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

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


def measure(
    a: Tensor,
    b: Tensor,
    a_np: np.ndarray,
    b_np: np.ndarray,
    product: Callable[[Tensor, Tensor], Tensor] = lambda x, y: x @ y,
    product_np: Callable[[np.ndarray, np.ndarray], np.ndarray] = lambda x, y: x @ y,
    reduce: int | None = None,
) -> tuple[float, float, float, float]:
    """(kernel seconds, numpy seconds, both best of runs taken in turn; end-to-end seconds; seconds of the first
    call, which compiles and maybe searches) of `product(a, b)`, and numpy's `product_np(a_np, b_np)`, which
    reduce over `reduce` elements (by default `a`'s last axis)."""
    start = time.perf_counter()
    got = product(a, b).numpy()
    first = time.perf_counter() - start
    np.testing.assert_allclose(got, product_np(a_np, b_np), rtol=1e-3, atol=1e-3 * np.sqrt(reduce or a.shape[-1]))
    launch = kernel_launcher(lambda: product(a, b))
    runs = runs_for(launch())
    measures = {"kernel": launch, "numpy": lambda: timed(lambda: product_np(a_np, b_np))}
    best = interleaved(measures, max(runs, 6), block=3, settle=0.3)
    time.sleep(0.3)  # numpy's BLAS threads spin a while after its last call
    e2e = bench(lambda: product(a, b).realize(), runs, collect=True)
    return best["kernel"], best["numpy"], e2e, first


@dataclass(frozen=True)
class Layout:
    """A matmul of two inputs of the given stored shapes, reducing `reduce` elements per output: `product` on
    Tensors, `product_np` on numpy arrays."""

    name: str
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    reduce: int
    product: Callable[[Tensor, Tensor], Tensor]
    product_np: Callable[[np.ndarray, np.ndarray], np.ndarray]


def _t(x: Tensor) -> Tensor:
    return x.transpose(-1, -2)


def _t_np(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


# each transposed layout after its contiguous twin (same product, same flops)
LAYOUTS: list[tuple[Layout, Layout]] = [
    (
        Layout("x @ W", (1024, 1536), (1536, 384), 1536, lambda x, w: x @ w, lambda x, w: x @ w),
        Layout("x @ W.T", (1024, 1536), (384, 1536), 1536, lambda x, w: x @ _t(w), lambda x, w: x @ _t_np(w)),
    ),
    (
        Layout("x @ W", (1024, 1536), (1536, 384), 1536, lambda x, w: x @ w, lambda x, w: x @ w),
        Layout("x.T @ W", (1536, 1024), (1536, 384), 1536, lambda x, w: _t(x) @ w, lambda x, w: _t_np(x) @ w),
    ),
    (
        Layout("gemv x @ W", (1, 768), (768, 3072), 768, lambda x, w: x @ w, lambda x, w: x @ w),
        Layout("gemv x @ W.T", (1, 768), (3072, 768), 768, lambda x, w: x @ _t(w), lambda x, w: x @ _t_np(w)),
    ),
    (
        Layout("q @ k", (12, 128, 64), (12, 64, 128), 64, lambda q, k: q @ k, lambda q, k: q @ k),
        Layout("q @ k^T", (12, 128, 64), (12, 128, 64), 64, lambda q, k: q @ _t(k), lambda q, k: q @ _t_np(k)),
    ),
]


def transposed_table(rng: np.random.Generator) -> None:
    """The second table: transposed inputs next to their contiguous twins, default opts."""
    print("\ntransposed inputs, default opts")
    print(
        f"{'product':>13s} {'A':>12s} {'B':>12s} {'kernel':>11s} {'GFLOPS':>8s} {'numpy':>10s} {'numpy GF':>9s} "
        f"{'vs numpy':>8s} {'vs contig':>9s}"
    )
    contiguous_gflops: dict[str, float] = {}
    for pair in LAYOUTS:
        for layout in pair:
            a_np = rng.standard_normal(layout.a_shape, dtype=np.float32)
            b_np = rng.standard_normal(layout.b_shape, dtype=np.float32)
            a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
            engine._runners.clear()
            kernel, t_np, _, _ = measure(a, b, a_np, b_np, layout.product, layout.product_np, layout.reduce)
            flops = 2 * layout.product_np(a_np, b_np).size * layout.reduce
            gflops, np_gflops = flops / kernel / 1e9, flops / t_np / 1e9
            twin = "" if layout is pair[0] else f"{gflops / contiguous_gflops[pair[0].name]:9.3f}"
            if layout is pair[0]:
                contiguous_gflops[layout.name] = gflops
            shape_a, shape_b = "x".join(map(str, layout.a_shape)), "x".join(map(str, layout.b_shape))
            print(
                f"{layout.name:>13s} {shape_a:>12s} {shape_b:>12s} {kernel * 1e3:8.3f} ms {gflops:8.2f} "
                f"{t_np * 1e3:7.3f} ms {np_gflops:9.2f} {gflops / np_gflops:8.3f} {twin:>9s}"
            )


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"device {Device.DEFAULT}, {machine()}; numpy {np.__version__}")
    if "--transposed" in sys.argv[1:]:
        transposed_table(rng)
        return
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
    transposed_table(rng)


if __name__ == "__main__":
    main()
