"""Dispatch overhead: what running a kernel costs beyond its work, for a chain of 100 small elementwise kernels.

The chain `x = x + 1` a hundred times on a 256-element float32 vector, each step its own kernel (`.contiguous()`),
run four ways in the same process: jitted with `TinyJit` (replayed through the device's graph: one native call for
the whole chain on the CPU; also with every call's result kept, so that each replay writes a new output buffer),
jitted without device graphs (`JIT=2`: one program call per kernel), un-jitted (the lazy graph built, scheduled and
run on every call; kernels compiled once by a warm-up call), and torch eager, the reference, on the same chain.
Times are medians per call divided by the 100 kernels.

Run:  python benchmarks/dispatch.py [--kernels 100] [--size 256] [--runs 200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from core import bench

from lazygrad import Context, Tensor, TinyJit


def chain(x: Tensor, kernels: int) -> Tensor:
    """`kernels` elementwise kernels in a row."""
    for _ in range(kernels):
        x = (x + 1.0).contiguous()
    return x


def lazygrad_times(kernels: int, size: int, runs: int) -> dict[str, float]:
    """Seconds per call of the chain: jitted with and without device graphs, and un-jitted."""
    x = Tensor(np.zeros(size, np.float32)).realize()
    want = np.full(size, kernels, np.float32)
    out: dict[str, float] = {}
    for name, jit_level in (("TinyJit (device graph)", 1), ("TinyJit (no graph, JIT=2)", 2)):
        with Context(JIT=jit_level):
            jitted = TinyJit(lambda t: chain(t, kernels))
            for _ in range(3):
                jitted(x)
            np.testing.assert_array_equal(jitted(x).numpy(), want)
            out[name] = bench(lambda j=jitted: j(x), runs)
            if jit_level == 1:
                # every result kept: each replay writes a new output buffer instead of the last call's
                kept: list[Tensor] = []
                out[name.replace(")", ", results kept)")] = bench(lambda j=jitted, k=kept: k.append(j(x)), runs)
                np.testing.assert_array_equal(kept[0].numpy(), want)
    np.testing.assert_array_equal(chain(x, kernels).numpy(), want)
    out["un-jitted"] = bench(lambda: chain(x, kernels).realize(), max(runs // 20, 5))
    return out


def torch_time(kernels: int, size: int, runs: int) -> float | None:
    """Seconds per call of the same chain in torch eager, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    x = torch.zeros(size, dtype=torch.float32)

    def run() -> torch.Tensor:
        y = x
        for _ in range(kernels):
            y = y + 1.0
        return y

    assert run()[0].item() == kernels
    return bench(run, runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    st = time.perf_counter()
    times = lazygrad_times(args.kernels, args.size, args.runs)
    ref = torch_time(args.kernels, args.size, args.runs)
    print(f"chain of {args.kernels} kernels on {args.size} float32 elements (CPU), median per kernel:\n")
    print(f"| {'path':36s} | {'µs per kernel':>13s} | {'torch eager / this':>18s} |")
    print(f"|{'-' * 38}|{'-' * 14}:|{'-' * 19}:|")
    rows = list(times.items()) + ([("torch eager", ref)] if ref is not None else [])
    for name, seconds in rows:
        per = seconds / args.kernels * 1e6
        ratio = f"{ref / seconds:18.2f}" if ref is not None else f"{'-':>18s}"
        print(f"| {name:36s} | {per:13.2f} | {ratio} |")
    print(f"\n(ratio above 1: faster than torch eager; measured in {time.perf_counter() - st:.0f} s)")


if __name__ == "__main__":
    main()
