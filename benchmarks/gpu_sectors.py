"""Coalescing of ResNet-18's training step on a GPU, offline: every kernel of the step (batch 64, 224x224, TF32 by
default) built for CUDA sm_90 on the PYTHON device (no GPU needed), with the share of the 32-byte sectors its warps
touch that they use (`lazygrad_codegen.memory_traffic.sector_use`) and the bytes of its buffers; the kernels whose
unused sector bytes (buffers x (1 / share - 1), a rough weight) are largest first. A kernel near 1.0 reads and
writes whole sectors; one at 0.125 moves eight times the bytes it uses between the caches and memory.

    python benchmarks/gpu_sectors.py [--top 25] [--batch 64] [--tf32 0|1]
"""

from __future__ import annotations

import argparse
import os

from example_modules import example

from lazygrad import Context, Tensor
from lazygrad.nn.state import get_parameters, get_state_dict
from lazygrad_codegen.memory_traffic import sector_use
from lazygrad_codegen.program_cache import cached_program, generate_programs
from lazygrad_cuda.renderer import CUDARenderer
from lazygrad_cuda.tensor_cores import TENSOR_CORES
from lazygrad_python import PythonRenderer
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device


def step_kernels(batch: int, renderer: CUDARenderer) -> list:
    """The schedule items of one training step of ResNet-18 (parameters as empty buffers, nothing runs)."""
    device = Device["PYTHON"]
    device.use_renderer(PythonRenderer())
    model = example("resnet").resnet18(num_classes=1000)
    for name, t in get_state_dict(model).items():
        *path, leaf = name.split(".")
        owner = model
        for part in path:
            owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
        setattr(
            owner,
            leaf,
            Tensor.empty(*t.shape, dtype=t.dtype, device="PYTHON").requires_grad_(leaf in ("weight", "bias")),
        )
    device.use_renderer(renderer)
    Tensor.training = True
    loss = model(Tensor.empty(batch, 3, 224, 224, device="PYTHON")).sum()
    params = [p for p in get_parameters(model) if p.requires_grad]
    return [si for si in Tensor.schedule(*loss.gradient(*params)) if si.ast.op is Ops.SINK]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tf32", type=int, default=1)
    args = parser.parse_args()
    renderer = CUDARenderer("sm_90", TENSOR_CORES["sm_90"])
    with Context(TF32=args.tf32):
        items = step_kernels(args.batch, renderer)
        generate_programs(list({(si.ast, renderer): None for si in items}), os.cpu_count() or 1)
        rows = []
        for si in items:
            spec = cached_program(si.ast, renderer)
            moved = sum(b.nbytes for b in si.bufs)
            use = sector_use(spec.uops, spec.global_size, spec.local_size)
            rows.append((moved * (1 / use - 1), moved, use, spec.name, spec.local_size, spec.global_size))
    rows.sort(key=lambda r: -r[0])
    print(
        f"{len(rows)} kernels, {sum(r[1] for r in rows) / 1e9:.2f} GB of buffers, "
        f"{sum(r[0] for r in rows) / 1e9:.2f} GB of sector bytes unused"
    )
    print(f"{'unused MB':>9} {'buffers MB':>10} {'use':>5}  kernel")
    for unused, moved, use, name, local, launch in rows[: args.top]:
        print(f"{unused / 1e6:9.0f} {moved / 1e6:10.0f} {use:5.2f}  {name} {launch} x {local}")


if __name__ == "__main__":
    main()
