"""CUDA speed against torch on the same GPU, in the same run: an fp16 4096x4096x4096 matmul (TFLOPS) and an fp16
elementwise add of 2^26 elements (GB/s moved: two reads and a write); bandwidth-bound reductions (`bandwidth_rows`):
the float sum of 2^26 fp16 values, softmax and layernorm over the rows of a 4096x4096 float32 matrix (GB/s: the
input read once and the output written once, whatever the kernels move).

It then prints the kernel-time rows of `benchmarks/gpu_matmul.py` (fp16/bf16/fp32 matmuls, the ResNet 3x3
convolution passes at batch 64); BEAM's search time is measured by running that script itself.

Three lazygrad times per row, each synchronised and the median of several runs after warm-up calls that compile:
`jit call`, a `TinyJit`-wrapped function computing the op (its third call on replays the captured kernels, as a
training step or a decoding loop does: the issue's measure, and the one the ratio and the target use); `kernel`, its
kernels' GPU time alone (`ExecItem.run(wait=True)`); `realize`, `.realize()` of a freshly built graph (scheduling and
lowering included each call: what eager code pays). torch's time is the op's, eager. Targets: at least 50% of torch's
matmul TFLOPS and 85% of its elementwise bandwidth; the sum 80%, softmax and layernorm 70% of torch's. Without an
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
from gpu_matmul import kernel_seconds

from lazygrad import Tensor, TinyJit, dtypes
from lazygrad_uop.registry import Device

TARGETS = {"matmul": 0.50, "elementwise": 0.85}
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


def measures(build: Callable[..., Tensor], inputs: tuple[Tensor, ...], sync: Callable[[], None]) -> dict[str, float]:
    """The three lazygrad times of `build(*inputs)` (see the module docstring): jit call, kernel, realize."""
    jitted = TinyJit(lambda *xs: build(*xs).realize())
    # the first call runs plainly and the second captures (`bench` warms up with one more): only replays are timed
    jitted(*inputs)
    jitted(*inputs)
    return {
        "jit": bench(lambda: jitted(*inputs), sync, runs=7),
        "kernel": kernel_seconds(build(*inputs), 5),
        "realize": bench(lambda: build(*inputs).realize(), sync),
    }


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
    t_mm = measures(lambda p, q: p @ q, (a, b), gpu.synchronize)
    t_ew = measures(lambda p, q: p + q, (x, y), gpu.synchronize)
    ref_mm = ref_ew = None
    if torch is not None:
        ta, tb = torch.from_numpy(a_np).cuda(), torch.from_numpy(b_np).cuda()
        tx, ty = torch.from_numpy(x_np).cuda(), torch.from_numpy(y_np).cuda()
        got = (a @ b).numpy().astype(np.float32)
        want = (ta @ tb).float().cpu().numpy()
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

    cols = ("jit call", "kernel", "realize", "torch")
    print(f"{'benchmark':24s} " + " ".join(f"{c:>16s}" for c in cols) + f" {'jit/torch':>10s} {'target':>7s}")
    for name, t_lg, t_ref, work, unit, target in rows:
        cells = [f"{work / t_lg[k]:9.2f} {unit:6s}" for k in ("jit", "kernel", "realize")]
        cells.append(f"{work / t_ref:9.2f} {unit:6s}" if t_ref else f"{'n/a':>16s}")
        ratio = f"{t_ref / t_lg['jit']:10.2%}" if t_ref else f"{'n/a':>10s}"
        print(f"{name:24s} " + " ".join(cells) + f" {ratio} {target:7.0%}")
    # kernel-time rows of the compute-bound kernels (issue 14); BEAM's search: python benchmarks/gpu_matmul.py
    print_rows(matmul_conv)


def bandwidth_rows(
    torch: Any, sync: Callable[[], None], rng: np.random.Generator, count: int, device: str = "CUDA", rows_n: int = 4096
) -> list[tuple]:
    """Rows of (name, lazygrad `measures`, torch seconds or None, GB moved, "GB/s", target) for the sum of `count` fp16
    values as float, and softmax and layernorm over the rows of a 4096x4096 float32 matrix; results checked against
    torch's."""
    h_np = rng.standard_normal(count).astype(np.float16)
    m_np = rng.standard_normal((rows_n, 4096)).astype(np.float32)
    h, m = Tensor(h_np, device=device).realize(), Tensor(m_np, device=device).realize()
    cases: dict[str, tuple[Callable[[Tensor], Tensor], Tensor, int]] = {
        "sum": (lambda v: v.float().sum(), h, h_np.nbytes + 4),
        "softmax": (lambda v: v.softmax(-1), m, 2 * m_np.nbytes),
        "layernorm": (lambda v: v.layernorm(), m, 2 * m_np.nbytes),
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
            fn, v, _ = cases[name]
            got, want = fn(v).numpy(), ref().cpu().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg=name)
    rows = []
    for name, (fn, v, moved) in cases.items():
        t_ref = bench(refs[name], torch.cuda.synchronize) if name in refs else None
        label = f"{name} fp16 {count}" if name == "sum" else f"{name} {rows_n}x4096"
        rows.append((label, measures(fn, (v,), sync), t_ref, moved / 1e9, "GB/s", BANDWIDTH_TARGETS[name]))
    return rows


if __name__ == "__main__":
    main()
