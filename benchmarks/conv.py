"""The three passes of ResNet-ish 3x3 convolutions on the default device (the CPU unless `DEV` says otherwise):
forward, input gradient and weight gradient, against torch on the CPU (`torch.nn.functional.conv2d`,
`torch.nn.grad.conv2d_input`, `torch.nn.grad.conv2d_weight`, on all cores), measured in the same run.

Columns: `kernels` the kernels a pass launches and `between` the bytes one of them stores for another to read (the
input gradient used to store the product of the gradient and the weight at every window position, 9x the input, and
sum it in a second kernel); `lazygrad` the median time of those kernels alone (compiled once, launched directly);
`torch` torch's median, measured in turn with lazygrad's runs so that both see the same load from other processes;
`GFLOPS` is 2 * N * C_out * C_in/groups * KH * KW * OH * OW over lazygrad's time, `vs torch` torch's time over
lazygrad's. The machine's cores and load are printed first: on a shared machine every number moves with them.

    python benchmarks/conv.py [--runs 5] [--batch 8]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from core import kernel_launcher, machine, timed

from lazygrad import Tensor
from lazygrad_uop.registry import Device

LAYERS = [
    # (channels in, channels out, input size, stride): ResNet-18's 3x3 layers
    (64, 64, 56, 1),
    (64, 128, 56, 2),
    (128, 128, 28, 1),
    (256, 256, 14, 1),
]


def _between(items: list) -> int:
    """Bytes of the buffers one kernel of `items` writes and a later one reads."""
    written: dict[int, int] = {}
    total = 0
    for si in items:
        for b in si.bufs[1:]:
            total += written.pop(id(b), 0)
        written[id(si.bufs[0])] = si.bufs[0].size * si.bufs[0].dtype.itemsize
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    import torch

    rng = np.random.default_rng(0)
    print(f"device {Device.DEFAULT}, {machine()}, batch {args.batch}")
    print(
        f"{'pass':34s} {'kernels':>7s} {'between':>10s} {'lazygrad':>10s} {'torch':>10s} "
        f"{'GFLOPS':>8s} {'vs torch':>8s}"
    )
    for cin, cout, size, stride in LAYERS:
        out_size = (size + 2 - 3) // stride + 1
        x_np = rng.standard_normal((args.batch, cin, size, size)).astype(np.float32)
        w_np = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
        g_np = rng.standard_normal((args.batch, cout, out_size, out_size)).astype(np.float32)
        x, w = (Tensor(v, requires_grad=True).realize() for v in (x_np, w_np))
        g = Tensor(g_np).realize()
        tx, tw, tg = (torch.from_numpy(v) for v in (x_np, w_np, g_np))

        def passes(x=x, w=w, g=g, stride=stride) -> dict[str, Tensor]:
            out = x.conv2d(w, padding=1, stride=stride)
            dx, dw = out.gradient(x, w, gradient=g)
            return {"forward": out, "input grad": dx, "weight grad": dw}

        refs = {
            "forward": lambda tx=tx, tw=tw, s=stride: torch.nn.functional.conv2d(tx, tw, padding=1, stride=s),
            "input grad": lambda tx=tx, tw=tw, tg=tg, s=stride: torch.nn.grad.conv2d_input(
                tx.shape, tw, tg, padding=1, stride=s
            ),
            "weight grad": lambda tx=tx, tw=tw, tg=tg, s=stride: torch.nn.grad.conv2d_weight(
                tx, tw.shape, tg, padding=1, stride=s
            ),
        }
        flops = 2 * args.batch * cout * cin * 9 * out_size * out_size
        for name in refs:
            t = passes()[name]
            want = refs[name]().numpy()
            np.testing.assert_allclose(t.numpy(), want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))
            items = passes()[name].schedule()
            launch = kernel_launcher(lambda name=name: passes()[name])
            ours, theirs = [], []
            for _ in range(args.runs):
                ours.append(launch())
                with torch.no_grad():
                    theirs.append(timed(refs[name]))
            t_lg, t_ref = statistics.median(ours), statistics.median(theirs)
            label = f"{cin}->{cout} {size}x{size} s{stride} {name}"
            print(
                f"{label:34s} {len(items):7d} {_between(items) / 2**20:8.1f}Mi "
                f"{t_lg * 1e3:8.1f}ms {t_ref * 1e3:8.1f}ms "
                f"{flops / t_lg / 1e9:8.1f} {t_ref / t_lg:8.2f}"
            )


if __name__ == "__main__":
    main()
