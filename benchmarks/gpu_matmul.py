"""Compute-bound CUDA kernels against torch on the same GPU, in the same run, by kernel time: fp16 and bf16 matmuls
at 4096^3 and 8192^3, fp32 at 4096^3 (TF32 off on both sides), the three convolutions of a ResNet-18 3x3 layer
(64 -> 64 channels, 56x56, batch 64: forward, input gradient, weight gradient), and a BEAM=2 search of the fp16
4096^3 matmul (its search time, and the kernel it finds).

lazygrad's time is the sum of its kernels' GPU times (the program's own timing, `ExecItem.run(wait=True)`), median
of several runs after a warm-up that compiles them; torch's is CUDA-event time of the op (cuDNN/cuBLAS, cudnn
benchmark mode on). Targets (issue 14): fp16/bf16 >= 50% of torch by default and >= 70% with BEAM, fp32 >= 70%, each
convolution >= 50%. On an sm_90 GPU the fp16/bf16 matmuls and the search run again with `WGMMA=1` (Hopper's wgmma
tiles), last, each result checked against torch, and then the matmuls with `WGMMA=2` (their operands copied by the
tensor memory accelerator). Without an NVIDIA GPU the script says so and measures nothing. `benchmarks/gpu.py`
prints these rows too (not the WGMMA ones).

    python benchmarks/gpu_matmul.py [--runs 5] [--no-beam] [--beam-timeout 120] [--no-wgmma] [--beam-wgmma 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from lazygrad import Context, Tensor, dtypes
from lazygrad.engine import lower_schedule_item
from lazygrad_uop.registry import Device

TARGETS = {"matmul": 0.50, "matmul BEAM": 0.70, "fp32": 0.70, "conv": 0.50}
Row = tuple[str, float, float | None, float, str, float]
"""(name, lazygrad seconds, torch seconds or None, work in units, unit, target ratio), as benchmarks/gpu.py prints."""


def kernel_seconds(t: Tensor, runs: int, label: str | None = None) -> float:
    """Median GPU time of the kernels that compute `t` from its (realized) inputs, after a warm-up run; with `label`,
    one line with each kernel's name, launch and median time follows (a row that looks wrong can then be read)."""
    items = [lower_schedule_item(si) for si in t.schedule()]
    for ei in items:
        ei.run()
    per_run = [[ei.run(wait=True) for ei in items] for _ in range(runs)]
    if any(s is None for times in per_run for s in times):
        print(f"warning: a kernel of {label or 'a row'} returned no time; its row counts it as 0", file=sys.stderr)
    if label is not None:
        parts = []
        for n, ei in enumerate(items):
            spec = getattr(ei.runner, "spec", None)
            name = (
                f"{spec.name} g={spec.global_size} l={spec.local_size}"
                if spec is not None
                else type(ei.runner).__name__
            )
            parts.append(f"{name} {statistics.median(times[n] or 0.0 for times in per_run) * 1e6:.1f} us")
        print(f"  {label}: " + "; ".join(parts), flush=True)
    return statistics.median(sum(s or 0.0 for s in times) for times in per_run)


def torch_seconds(torch, fn: Callable[[], object], runs: int) -> float:
    """Median CUDA-event time of `fn` after a warm-up call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _tensor(x: np.ndarray, dtype) -> Tensor:
    return Tensor(x, device="CUDA").cast(dtype).realize()


def _torch_dtype(torch, dtype):
    return {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16, dtypes.float32: torch.float32}[dtype]


def matmul_rows(torch, runs: int) -> list[Row]:
    """fp16/bf16 at 4096^3 and 8192^3, fp32 at 4096^3."""
    rows: list[Row] = []
    rng = np.random.default_rng(0)
    for dtype, n in ((dtypes.float16, 4096), (dtypes.bfloat16, 4096), (dtypes.float16, 8192), (dtypes.bfloat16, 8192)):
        rows.append(_matmul_row(torch, rng, dtype, n, runs, TARGETS["matmul"]))
    rows.append(_matmul_row(torch, rng, dtypes.float32, 4096, runs, TARGETS["fp32"]))
    return rows


def _matmul_row(torch, rng, dtype, n: int, runs: int, target: float, label: str = "") -> Row:
    a_np, b_np = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    a, b = _tensor(a_np, dtype), _tensor(b_np, dtype)
    t_lg = kernel_seconds(a @ b, runs, f"matmul {dtype.name} {n}^3 {label}" if label else None)
    t_ref = None
    if torch is not None:
        tdt = _torch_dtype(torch, dtype)
        ta, tb = torch.from_numpy(a_np).cuda().to(tdt), torch.from_numpy(b_np).cuda().to(tdt)
        # the whole product, realized as timed (a slice, or a cast fused into it, would be another kernel, maybe on
        # other tiles)
        got = (a @ b).realize().cast(dtypes.float32).numpy()
        np.testing.assert_allclose(got, (ta @ tb).float().cpu().numpy(), rtol=3e-2, atol=1.0)
        t_ref = torch_seconds(torch, lambda: ta @ tb, runs)
    return (f"matmul {dtype.name} {n}^3{' ' + label if label else ''}", t_lg, t_ref, 2 * n**3 / 1e12, "TFLOPS", target)


def wgmma_rows(torch, runs: int, level: int = 1) -> list[Row]:
    """The fp16/bf16 matmuls again with `WGMMA=level` (Hopper's wgmma tiles, sm_90 only; 2: their operands copied by
    the tensor memory accelerator), each checked against torch first: a wrong result prints and drops its row rather
    than ending the run. Last of all, since a kernel that faults leaves the CUDA context unusable."""
    if Device["CUDA"].arch != "sm_90":
        print(f"wgmma rows: wgmma is an sm_90 instruction; this GPU is {Device['CUDA'].arch}", flush=True)
        return []
    rows: list[Row] = []
    rng = np.random.default_rng(1)
    with Context(WGMMA=level):
        for dtype, n in (
            (dtypes.float16, 4096),
            (dtypes.bfloat16, 4096),
            (dtypes.float16, 8192),
            (dtypes.bfloat16, 8192),
        ):
            try:
                rows.append(_matmul_row(torch, rng, dtype, n, runs, TARGETS["matmul"], f"WGMMA={level}"))
            except AssertionError as exc:
                print(f"WGMMA={level} matmul {dtype.name} {n}^3 gives WRONG results: {str(exc)[:400]}", flush=True)
    return rows


def conv_rows(torch, runs: int, batch: int = 64, dtype=dtypes.float16) -> list[Row]:
    """The forward, input-gradient and weight-gradient convolutions of a ResNet-18 3x3 layer (64 channels, 56x56)."""
    rng = np.random.default_rng(1)
    c, size = 64, 56
    x_np = rng.standard_normal((batch, c, size, size)).astype(np.float32)
    w_np = (rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32)
    g_np = rng.standard_normal((batch, c, size, size)).astype(np.float32)
    x, w, g = (_tensor(v, dtype) for v in (x_np, w_np, g_np))
    x.requires_grad_()
    w.requires_grad_()

    def passes() -> dict[str, Tensor]:
        # a fresh graph each time: a pass checked (realized) once would schedule only what is left of it
        out = x.conv2d(w, padding=1)
        dx, dw = out.gradient(x, w, gradient=g)
        return {"forward": out, "input grad": dx, "weight grad": dw}

    flops = 2 * batch * c * size * size * c * 9 / 1e12
    names = ("forward", "input grad", "weight grad")
    # (row, pass, settings): the defaults; the weight gradient's direct kernel read in NCHW, as before the window
    # matrix's (lazygrad.functional.IM2COL_WEIGHT_GRADIENT); the three passes read in NCHW, as before the
    # channels-last copies (lazygrad.functional.CONV_CHANNELS_LAST), the weight gradient over the window matrix
    variants = [
        *((name, name, {}) for name in names),
        ("weight grad, NCHW direct", "weight grad", {"IM2COL_WEIGHT_GRADIENT": 0, "CONV_CHANNELS_LAST": 0}),
        *((f"{name}, NCHW", name, {"CONV_CHANNELS_LAST": 0}) for name in names),
    ]
    times = {}
    for row, name, settings in variants:
        with Context(**settings):
            times[row] = kernel_seconds(passes()[name], runs, f"conv {row}")
    refs: dict[str, float | None] = dict.fromkeys(times)
    if torch is not None:
        torch.backends.cudnn.benchmark = True
        tdt = _torch_dtype(torch, dtype)
        tx, tw, tg = (torch.from_numpy(v).cuda().to(tdt) for v in (x_np, w_np, g_np))
        fns = {
            "forward": lambda: torch.nn.functional.conv2d(tx, tw, padding=1),
            "input grad": lambda: torch.nn.grad.conv2d_input(tx.shape, tw, tg, padding=1),
            "weight grad": lambda: torch.nn.grad.conv2d_weight(tx, tw.shape, tg, padding=1),
        }
        seconds = {name: torch_seconds(torch, fns[name], runs) for name in names}
        # every row checked against cuDNN, and timed against its pass
        for row, name, settings in variants:
            with Context(**settings):
                got = passes()[name].cast(dtypes.float32).numpy()
            want = fns[name]().float().cpu().numpy()
            np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2 * float(np.abs(want).max()))
            refs[row] = seconds[name]
    return [
        (f"conv3x3 {name} {dtype.name} b{batch}", seconds, refs[name], flops, "TFLOPS", TARGETS["conv"])
        for name, seconds in times.items()
    ]


def beam_rows(torch, runs: int, timeout_s: float, wgmma: int = 0) -> list[Row]:
    """A BEAM=2 search of the fp16 4096^3 matmul from an empty cache: the kernel it finds, and its search time; with
    `wgmma`, under `WGMMA=wgmma` (its candidates include the wgmma tiles, each checked against the default's result;
    2: fed by TMA)."""
    rng = np.random.default_rng(2)
    n = 4096
    a_np, b_np = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    a, b = _tensor(a_np, dtypes.float16), _tensor(b_np, dtypes.float16)
    # the cache off, so the search is timed rather than read back (BEAM_TIMEOUT is defined by codegen's search)
    from lazygrad_codegen import search

    print(f"BEAM=2 search of the fp16 {n}^3 matmul (budget {timeout_s:.0f} s)...", flush=True)
    search.SEARCHES.clear()
    with Context(BEAM=2, BEAM_TIMEOUT=timeout_s, CACHELEVEL=0, WGMMA=wgmma):
        st = time.perf_counter()
        items = [lower_schedule_item(si) for si in (a @ b).schedule()]
        searched = time.perf_counter() - st
    # every kernel searched (the matmul, and any cast around it), with what its search did
    for summary in search.SEARCHES:
        print(f"  {summary}", flush=True)
    if not search.SEARCHES:
        end = "nothing searched"
    else:
        end = "converged" if all(s.converged for s in search.SEARCHES) else "stopped by its budget"
    for ei in items:
        ei.run()
    t_lg = statistics.median(sum(ei.run(wait=True) or 0.0 for ei in items) for _ in range(runs))
    t_ref = None
    if torch is not None:
        ta, tb = (torch.from_numpy(v).cuda().half() for v in (a_np, b_np))
        t_ref = torch_seconds(torch, lambda: ta @ tb, runs)
    print(
        f"BEAM=2 search of the fp16 {n}^3 matmul: {searched:.1f} s, {end} (budget {timeout_s:.0f} s, target <= 60 s)",
        flush=True,
    )
    name = f"matmul float16 {n}^3 BEAM=2{f' WGMMA={wgmma}' if wgmma else ''}"
    return [(name, t_lg, t_ref, 2 * n**3 / 1e12, "TFLOPS", TARGETS["matmul BEAM"])]


def print_rows(rows: list[Row]) -> None:
    """The table benchmarks/gpu.py prints."""
    print(f"{'benchmark':34s} {'lazygrad':>16s} {'torch':>16s} {'lazygrad/torch':>15s} {'target':>7s}")
    for name, t_lg, t_ref, work, unit, target in rows:
        lg = f"{work / t_lg:9.2f} {unit:6s}"
        ref = f"{work / t_ref:9.2f} {unit:6s}" if t_ref else f"{'n/a':>16s}"
        ratio = f"{t_ref / t_lg:15.2%}" if t_ref else f"{'n/a':>15s}"
        print(f"{name:34s} {lg} {ref} {ratio} {target:7.0%}")


def torch_on_gpu():
    """torch with CUDA (TF32 off), or None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per kernel (median)")
    parser.add_argument("--no-beam", action="store_true", help="skip the BEAM search")
    parser.add_argument("--beam-timeout", type=float, default=120.0, help="BEAM_TIMEOUT for the search (s)")
    parser.add_argument("--no-wgmma", action="store_true", help="skip the WGMMA=1 and WGMMA=2 rows (sm_90)")
    parser.add_argument(
        "--beam-wgmma", type=int, choices=(1, 2), default=1, help="the WGMMA setting of the second search (sm_90)"
    )
    args = parser.parse_args()
    if (why := Device.usable("CUDA")) is not None:
        print(f"benchmarks/gpu_matmul.py: no GPU was available to measure on: {why}")
        return
    torch = torch_on_gpu()
    print(f"device CUDA ({Device['CUDA'].arch}); torch {'on the same GPU' if torch else 'not available: no reference'}")
    rows = matmul_rows(torch, args.runs) + conv_rows(torch, args.runs)
    if not args.no_beam:
        rows += beam_rows(torch, args.runs, args.beam_timeout)
    if not args.no_wgmma:
        rows += wgmma_rows(torch, args.runs)
        if not args.no_beam and Device["CUDA"].arch == "sm_90":
            rows += beam_rows(torch, args.runs, args.beam_timeout, wgmma=args.beam_wgmma)
        # the tensor memory accelerator's copies last: a kernel that traps ends the run's use of the GPU
        rows += wgmma_rows(torch, args.runs, level=2)
    print_rows(rows)


if __name__ == "__main__":
    main()
