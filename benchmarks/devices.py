"""The core benchmarks on every usable device side by side (CPU and CL, the OpenCL device, included), each against
numpy in the same run.

Times are end to end per call (building the lazy graph, scheduling, running the kernels and waiting for the device;
compilation is excluded by a warm-up call), median of several runs. Ratio = numpy time / device time: above 1 means
lazygrad on that device is faster than numpy on the CPU. A device that is not usable here is listed with the reason.

    python benchmarks/devices.py [--devices CPU,CL] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from lazygrad import Tensor
from lazygrad_uop.registry import Device


def median_seconds(fn: Callable[[], object], sync: Callable[[], None], runs: int) -> float:
    """Median seconds of `fn` followed by `sync`, after one warm-up call."""
    fn()
    sync()
    times = []
    for _ in range(runs):
        st = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - st)
    return statistics.median(times)


def benchmarks(
    rng: np.random.Generator,
) -> list[tuple[str, Callable[[str], Callable[[], object]], Callable[[], object]]]:
    """(name, lazygrad call on a device, the numpy call it is measured against), each checked once for equality."""
    x_np = rng.standard_normal(2**22).astype(np.float32)
    y_np = rng.standard_normal(2**22).astype(np.float32)
    n = 512
    a_np, b_np = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)

    def fused_reduce(dev: str) -> Callable[[], object]:
        x = Tensor(x_np, device=dev).realize()
        np.testing.assert_allclose((x * 2 + 1).sum().item(), (x_np * 2 + 1).sum(dtype=np.float64), rtol=1e-4)
        return lambda: (x * 2 + 1).sum().realize()

    def elementwise(dev: str) -> Callable[[], object]:
        x, y = Tensor(x_np, device=dev).realize(), Tensor(y_np, device=dev).realize()
        np.testing.assert_allclose((x * y + 1).numpy(), x_np * y_np + 1, rtol=1e-6, atol=1e-6)
        return lambda: (x * y + 1).realize()

    def matmul(dev: str) -> Callable[[], object]:
        a, b = Tensor(a_np, device=dev).realize(), Tensor(b_np, device=dev).realize()
        np.testing.assert_allclose((a @ b).numpy(), a_np @ b_np, rtol=1e-3, atol=1e-3)
        return lambda: (a @ b).realize()

    return [
        ("(x*2+1).sum(), 2^22 float32", fused_reduce, lambda: (x_np * 2 + 1).sum()),
        ("x*y+1, 2^22 float32", elementwise, lambda: x_np * y_np + 1),
        (f"matmul {n}x{n} float32", matmul, lambda: a_np @ b_np),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="CPU,CL", help="comma-separated devices to compare")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    devices = []
    for dev in args.devices.upper().split(","):
        why = Device.usable(dev) if dev in Device.installed() else "not installed"
        if why is None:
            devices.append(dev)
            print(f"{dev}: {Device[dev]!r}")
        else:
            print(f"{dev}: not measured ({why})")
    rng = np.random.default_rng(0)
    header = f"{'benchmark':30s} {'numpy':>10s}" + "".join(f" {d:>10s} {'ratio':>6s}" for d in devices)
    print(header)
    for name, make, reference in benchmarks(rng):
        t_np = median_seconds(reference, lambda: None, args.runs)
        row = f"{name:30s} {t_np * 1e3:7.2f} ms"
        for dev in devices:
            t = median_seconds(make(dev), Device[dev].synchronize, args.runs)
            row += f" {t * 1e3:7.2f} ms {t_np / t:6.2f}"
        print(row)


if __name__ == "__main__":
    main()
