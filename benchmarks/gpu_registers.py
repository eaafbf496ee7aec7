"""Registers and spills of every default CUDA program of the GPU benchmark set, as ptxas (run by NVRTC,
`--ptxas-options=-v`) reports them for sm_80 and sm_90. No GPU needed: the kernels are built on the PYTHON device
with the CUDA renderer (132 multiprocessors, as on an H100) and only compiled.

The set: fp16, bf16 and fp32 matmuls at 4096^3 and 8192^3 and at odd 4095x4097 @ 4097x1000 and 4097x4096, a
batched fp16 and fp32 matmul (16 x 1024 x 1024 x 1024), and every convolution of ResNet-18 at batch 64 (the 7x7 stem,
the 3x3 layers, the 1x1 downsampling ones) forward, input gradient and weight gradient, in fp16 and fp32. Every
program those schedules launch is compiled (sums of split-K parts, casts, and the like included). Columns: the
workgroup's threads, its local (shared) memory in bytes and pipeline stages (STAGE's), registers per thread / bytes of
spill stores and loads together. Target (issue 14): zero spills on both architectures. `--wgmma` renders for sm_90
with `WGMMA=1` (Hopper's wgmma tiles where they fit; the `wgmma` column says which, "tma" where the tensor memory
accelerator copies their operands: `--wgmma 2`) and compiles for sm_90 alone.
`packages/runtime-cuda/tests/test_staged_kernels.py` checks a representative part of the set in the test suite.

    python benchmarks/gpu_registers.py [--only SUBSTRING] [--arch sm_80 --arch sm_90] [--wgmma [2]]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator

from lazygrad import Tensor, dtypes
from lazygrad_codegen import OptOps, get_program
from lazygrad_cuda.compiler import ptxas_usage
from lazygrad_cuda.renderer import CUDARenderer
from lazygrad_cuda.tensor_cores import TENSOR_CORES
from lazygrad_uop.config import Context
from lazygrad_uop.dtype import DType
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device

CONVS = [
    # (channels in, channels out, kernel, stride, padding, input size): ResNet-18's distinct convolutions
    (3, 64, 7, 2, 3, 224),
    (64, 64, 3, 1, 1, 56),
    (64, 128, 3, 2, 1, 56),
    (64, 128, 1, 2, 0, 56),
    (128, 128, 3, 1, 1, 28),
    (128, 256, 3, 2, 1, 28),
    (128, 256, 1, 2, 0, 28),
    (256, 256, 3, 1, 1, 14),
    (256, 512, 3, 2, 1, 14),
    (256, 512, 1, 2, 0, 14),
    (512, 512, 3, 1, 1, 7),
]
BATCH = 64


def _t(*shape: int, dtype: DType) -> Tensor:
    return Tensor.empty(*shape, dtype=dtype, device="PYTHON")


def workloads() -> Iterator[tuple[str, Callable[[], Tensor]]]:
    """(name, build) of each tensor whose schedule is compiled."""
    for dtype in (dtypes.float16, dtypes.bfloat16, dtypes.float32):
        for m, k, n in ((4096, 4096, 4096), (8192, 8192, 8192), (4095, 4097, 1000), (4095, 4097, 4096)):
            yield (
                f"matmul {dtype.name} {m}x{k}x{n}",
                lambda m=m, k=k, n=n, d=dtype: _t(m, k, dtype=d) @ _t(k, n, dtype=d),
            )
    for dtype in (dtypes.float16, dtypes.float32):
        yield f"bmm {dtype.name} 16x1024^3", lambda d=dtype: _t(16, 1024, 1024, dtype=d) @ _t(16, 1024, 1024, dtype=d)
    for dtype in (dtypes.float16, dtypes.float32):
        for cin, cout, k, s, p, size in CONVS:
            label = f"conv {dtype.name} {cin}->{cout} k{k} s{s} {size}"

            def passes(cin=cin, cout=cout, k=k, s=s, p=p, size=size, d=dtype) -> tuple[Tensor, Tensor, Tensor]:
                x = _t(BATCH, cin, size, size, dtype=d)
                w = _t(cout, cin, k, k, dtype=d)
                y = x.requires_grad_().conv2d(w.requires_grad_(), stride=s, padding=p)
                dx, dw = y.gradient(x, w, gradient=_t(*y.shape, dtype=d))
                return y, dx, dw

            for i, name in enumerate(("forward", "input grad", "weight grad")):
                yield f"{label} {name}", lambda passes=passes, i=i: passes()[i]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="only the workloads whose name contains this")
    parser.add_argument("--arch", action="append", help="architectures (default sm_80 and sm_90)")
    parser.add_argument(
        "--wgmma", type=int, nargs="?", const=1, default=0, help="sm_90 with WGMMA=1 (Hopper's wgmma tiles), or 2"
    )
    # `nox -s bench` passes its arguments to every script: the ones meant for the others are ignored
    args, _ = parser.parse_known_args()
    archs = ["sm_90"] if args.wgmma else args.arch or ["sm_80", "sm_90"]
    dev = Device["PYTHON"]
    renderer = (
        CUDARenderer("sm_90", TENSOR_CORES["sm_90"]) if args.wgmma else CUDARenderer("sm_80", TENSOR_CORES["sm_80"])
    )
    dev.use_renderer(renderer)
    print(
        f"{'workload':44s} {'program':40s} {'local':>10s} {'smem':>7s} {'stages':>6s} {'wgmma':>5s} "
        + " ".join(f"{a + ' regs/spill':>17s}" for a in archs)
    )
    with Context(WGMMA=args.wgmma):
        _report(args, archs, renderer)


def _report(args: argparse.Namespace, archs: list[str], renderer: CUDARenderer) -> None:
    """One row per program of the workloads `args.only` selects, compiled for `archs`."""
    spilled, programs, st = 0, 0, time.perf_counter()
    for name, build in workloads():
        if args.only not in name:
            continue
        for si in build().schedule():
            if si.ast.op is not Ops.SINK:
                continue
            spec = get_program(si.ast, renderer)
            cells = []
            for arch in archs:
                use = ptxas_usage(spec.src, arch, spec.name)
                spilled += use.spills > 0
                cells.append(f"{use.registers:>10d}/{use.spills:<6d}")
            programs += 1
            local = "x".join(map(str, spec.local_size)) if spec.local_size else "-"
            smem = sum(u.dtype.size * u.dtype.base.itemsize for u in spec.uops if u.op is Ops.DEFINE_LOCAL)
            staged = [o for o in spec.opts if o.op is OptOps.STAGE]
            stages = "-" if not staged else str(staged[-1].arg or 2)
            wgmma = "yes" if any(u.op is Ops.WGMMA for u in spec.uops) else "-"
            wgmma = "tma" if any(u.op is Ops.TMA_LOAD for u in spec.uops) else wgmma
            row = f"{name:44s} {spec.name[:40]:40s} {local:>10s} {smem:>7d} {stages:>6s} {wgmma:>5s} "
            print(row + " ".join(cells), flush=True)
    print(f"{programs} programs, {spilled} (program, arch) pairs with spills, {time.perf_counter() - st:.0f} s")


if __name__ == "__main__":
    main()
