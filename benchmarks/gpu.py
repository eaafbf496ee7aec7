"""CUDA speed against torch on the same GPU, in the same run: an fp16 4096x4096x4096 matmul (TFLOPS) and an fp16
elementwise add of 2^26 elements (GB/s moved: two reads and a write); bandwidth-bound reductions (`bandwidth_rows`):
the float sum of 2^26 fp16 values, softmax and layernorm over the rows of a 4096x4096 float32 matrix (GB/s: the
input read once and the output written once, whatever the kernels move).

It then prints the kernel-time rows of `benchmarks/gpu_matmul.py` (fp16/bf16/fp32 matmuls, the ResNet 3x3
convolution passes at batch 64); BEAM's search time is measured by running that script itself.

Times are GPU times of whole calls, synchronised: lazygrad's `.realize()` of a fresh graph (scheduling included,
compilation excluded by a warm-up call) and torch's op, median of several runs. Targets: at least 50% of torch's
matmul TFLOPS and 80% of its elementwise bandwidth; the sum 80%, softmax and layernorm 70% of torch's. Without an
NVIDIA GPU the script says so and measures nothing.

    python benchmarks/gpu.py [--size 4096] [--elements 67108864]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from lazygrad import Tensor, dtypes
from lazygrad_uop.registry import Device

TARGETS = {"matmul": 0.50, "elementwise": 0.80}
BANDWIDTH_TARGETS = {"sum": 0.80, "softmax": 0.70, "layernorm": 0.70}


def bench(fn: Callable[[], object], sync: Callable[[], None], runs: int = 5) -> float:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096, help="matmul size n (n x n x n)")
    parser.add_argument("--elements", type=int, default=1 << 26, help="elements of the elementwise add")
    args = parser.parse_args()
    if (why := Device.usable("CUDA")) is not None:
        print(f"benchmarks/gpu.py: no GPU was available to measure on: {why}")
        return
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and not torch.cuda.is_available():
        torch = None
    gpu = Device["CUDA"]
    print(f"device CUDA ({gpu.arch}); torch {'on the same GPU' if torch else 'not available: no reference'}")

    n, count = args.size, args.elements
    rng = np.random.default_rng(0)
    a_np, b_np = (rng.standard_normal((n, n)).astype(np.float16) for _ in range(2))
    a, b = Tensor(a_np, device="CUDA").realize(), Tensor(b_np, device="CUDA").realize()
    x_np, y_np = (rng.standard_normal(count).astype(np.float16) for _ in range(2))
    x, y = Tensor(x_np, device="CUDA").realize(), Tensor(y_np, device="CUDA").realize()
    assert (a @ b).dtype == dtypes.float16

    rows = []
    t_mm = bench(lambda: (a @ b).realize(), gpu.synchronize)
    t_ew = bench(lambda: (x + y).realize(), gpu.synchronize)
    ref_mm = ref_ew = None
    if torch is not None:
        ta, tb = torch.from_numpy(a_np).cuda(), torch.from_numpy(b_np).cuda()
        tx, ty = torch.from_numpy(x_np).cuda(), torch.from_numpy(y_np).cuda()
        got = (a[:64] @ b).numpy().astype(np.float32)
        want = (ta[:64] @ tb).float().cpu().numpy()
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=0.5)
        np.testing.assert_array_equal((x + y).numpy(), (tx + ty).cpu().numpy())
        ref_mm = bench(lambda: ta @ tb, torch.cuda.synchronize)
        ref_ew = bench(lambda: tx + ty, torch.cuda.synchronize)
    flops, moved = 2 * n**3, 3 * count * 2
    rows.append((f"matmul fp16 {n}^3", t_mm, ref_mm, flops / 1e12, "TFLOPS", TARGETS["matmul"]))
    rows.append((f"add fp16 {count}", t_ew, ref_ew, moved / 1e9, "GB/s", TARGETS["elementwise"]))

    rows += bandwidth_rows(torch, gpu.synchronize, rng, count)

    from gpu_matmul import conv_rows, matmul_rows, print_rows

    matmul_conv = matmul_rows(torch, 5) + conv_rows(torch, 5)

    head = f"{'benchmark':24s} {'lazygrad':>16s} {'torch':>16s} {'lazygrad/torch':>15s} {'target':>7s}"
    print(head)
    for name, t_lg, t_ref, work, unit, target in rows:
        lg = f"{work / t_lg:9.2f} {unit:6s}"
        ref = f"{work / t_ref:9.2f} {unit:6s}" if t_ref else f"{'n/a':>16s}"
        ratio = f"{t_ref / t_lg:15.2%}" if t_ref else f"{'n/a':>15s}"
        print(f"{name:24s} {lg} {ref} {ratio} {target:7.0%}")
    # kernel-time rows of the compute-bound kernels (issue 14); BEAM's search: python benchmarks/gpu_matmul.py
    print_rows(matmul_conv)


def bandwidth_rows(
    torch: Any, sync: Callable[[], None], rng: np.random.Generator, count: int, device: str = "CUDA", rows_n: int = 4096
) -> list[tuple]:
    """Rows of (name, lazygrad seconds, torch seconds or None, GB moved, "GB/s", target) for the sum of `count` fp16
    values as float, and softmax and layernorm over the rows of a 4096x4096 float32 matrix; results checked against
    torch's."""
    h_np = rng.standard_normal(count).astype(np.float16)
    m_np = rng.standard_normal((rows_n, 4096)).astype(np.float32)
    h, m = Tensor(h_np, device=device).realize(), Tensor(m_np, device=device).realize()
    cases = {
        "sum": (lambda: h.float().sum().realize(), h_np.nbytes + 4),
        "softmax": (lambda: m.softmax(-1).realize(), 2 * m_np.nbytes),
        "layernorm": (lambda: m.layernorm().realize(), 2 * m_np.nbytes),
    }
    refs: dict[str, Callable[[], object]] = {}
    if torch is not None:
        th, tm = torch.from_numpy(h_np).cuda(), torch.from_numpy(m_np).cuda()
        refs = {
            "sum": lambda: th.float().sum(),
            "softmax": lambda: tm.softmax(-1),
            "layernorm": lambda: torch.nn.functional.layer_norm(tm, (4096,)),
        }
        for name, ref in refs.items():
            got, want = cases[name][0]().numpy(), ref().cpu().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg=name)
    rows = []
    for name, (fn, moved) in cases.items():
        t_ref = bench(refs[name], torch.cuda.synchronize) if name in refs else None
        label = f"{name} fp16 {count}" if name == "sum" else f"{name} {rows_n}x4096"
        rows.append((label, bench(fn, sync), t_ref, moved / 1e9, "GB/s", BANDWIDTH_TARGETS[name]))
    return rows


if __name__ == "__main__":
    main()
