"""Row reductions on the default device: softmax, log_softmax, layernorm, RMS norm and cross-entropy over the rows of a
float32 matrix, forward, backward (the input's gradient for a given incoming gradient) and a cross-entropy training
step (the loss and the logits' gradient realized together), against torch on the CPU in the same run.

Columns: `kernels`, the programs lazygrad launches; `rows read`, how many times those programs read row-sized buffers
(input, incoming gradient, target) in units of one such buffer, counted from their global loads (issue 15's bound:
two kernels, each row-sized buffer read at most twice); `kernel`, the kernels alone, best of several runs; `torch`,
torch's call on the CPU, best of as many runs interleaved with them; `ratio` torch's time over lazygrad's (above 1:
lazygrad faster). Other processes on the machine change both; the load average is printed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
from core import interleaved, kernel_launcher, machine

from lazygrad import Tensor
from lazygrad_codegen import get_program
from lazygrad_codegen.memory_traffic import global_load_bytes
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device


def rows_read(t: Tensor, numel: int) -> tuple[int, float]:
    """(kernels, reads of buffers of `numel` elements in units of one buffer) of `t`'s schedule."""
    kernels, reads = 0, 0.0
    for si in t.schedule():
        if si.ast.op is not Ops.SINK:
            continue
        kernels += 1
        spec = get_program(si.ast, Device[t.device].renderer)

        def kept(u) -> bool:
            index = u.src[0] if u.op is Ops.LOAD else None
            if index is None or index.op is not Ops.INDEX or index.src[0].op is not Ops.DEFINE_GLOBAL:
                return True
            return index.src[0].dtype.size == numel

        uops = [u for u in spec.uops if kept(u)]
        reads += global_load_bytes(uops, spec.global_size, spec.local_size) / (numel * 4)
    return kernels, reads


def cases(rows: int, width: int) -> dict[str, tuple[Callable[[], Tensor], Callable[[], object]]]:
    """name -> (the lazygrad tensor to realize, built afresh; torch's computation of the same)."""
    import torch

    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, width), dtype=np.float32)
    g = rng.standard_normal((rows, width), dtype=np.float32)
    labels = rng.integers(0, width, rows).astype(np.int32)
    x, gt, y = Tensor(a).realize(), Tensor(g).realize(), Tensor(labels).realize()
    ta, tg, ty = torch.tensor(a), torch.tensor(g), torch.tensor(labels, dtype=torch.int64)
    functional = torch.nn.functional

    def ours_grad(f: Callable[[Tensor], Tensor], seed: bool = True) -> Callable[[], Tensor]:
        def build() -> Tensor:
            # (a leaf of its own: `x.detach().requires_grad_()` adds a kernel copying x)
            t = Tensor(a, requires_grad=True)
            out = f(t)
            out.backward(gt if seed else None)
            return t.grad

        return build

    def theirs_grad(f: Callable, seed: bool = True) -> Callable[[], object]:
        def run() -> object:
            t = ta.detach().requires_grad_(True)
            out = f(t)
            out.backward(tg if seed else None)
            return t.grad

        return run

    ops = {
        "softmax": (lambda t: t.softmax(-1), lambda t: t.softmax(-1)),
        "log_softmax": (lambda t: t.log_softmax(-1), lambda t: t.log_softmax(-1)),
        "layernorm": (lambda t: t.layernorm(-1), lambda t: functional.layer_norm(t, (width,))),
        "rmsnorm": (lambda t: t.rmsnorm(-1), lambda t: functional.rms_norm(t, (width,), eps=1e-6)),
    }
    out: dict[str, tuple[Callable[[], Tensor], Callable[[], object]]] = {}
    for name, (ours, theirs) in ops.items():
        out[f"{name} forward"] = (lambda ours=ours: ours(x), lambda theirs=theirs: theirs(ta))
        out[f"{name} backward"] = (ours_grad(ours), theirs_grad(theirs))
    out["cross_entropy forward"] = (lambda: x.cross_entropy(y), lambda: functional.cross_entropy(ta, ty))
    out["cross_entropy backward"] = (
        ours_grad(lambda t: t.cross_entropy(y), seed=False),
        theirs_grad(lambda t: functional.cross_entropy(t, ty), seed=False),
    )
    return out


def main(rows: int, width: int, runs: int) -> None:
    print(f"device {Device.DEFAULT}, {machine()}; {rows} x {width} float32 ({rows * width * 4 / 2**20:.0f} MiB)")
    print(f"{'case':24s} {'kernels':>7s} {'rows read':>9s} {'kernel':>10s} {'torch':>10s} {'ratio':>6s}")
    for name, (ours, theirs) in cases(rows, width).items():
        kernels, reads = rows_read(ours(), rows * width)
        launch = kernel_launcher(ours)

        def torch_call(theirs=theirs) -> float:
            st = time.perf_counter()
            theirs()
            return time.perf_counter() - st

        best = interleaved({"ours": launch, "torch": torch_call}, runs)
        print(
            f"{name:24s} {kernels:7d} {reads:9.2f} {best['ours'] * 1e3:7.2f} ms {best['torch'] * 1e3:7.2f} ms "
            f"{best['torch'] / best['ours']:6.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=7)
    # (`nox -s bench -- ...` hands every benchmark the same arguments: the others' are ignored here)
    args = parser.parse_known_args()[0]
    main(args.rows, args.width, args.runs)
