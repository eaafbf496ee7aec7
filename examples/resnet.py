"""ResNet-18 (He et al., "Deep Residual Learning for Image Recognition", 2015) and its SGD training step under TinyJit,
on random images, printing the loss per step and the steady-state step time.

The defaults are the real ResNet-18: 64 channels after the stem, 224x224 RGB inputs, 1000 classes. `--width` scales
every layer's channels (width, 2*width, 4*width, 8*width) and `--size` sets the image side, to try it small.

Run:  python examples/resnet.py --batch 8 --size 224 --steps 10       (DEV=..., DEBUG=2 work as everywhere)
      python examples/resnet.py --width 16 --size 64 --torch           (also times the same net in torch, eager)
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lazygrad import Device, Tensor, TinyJit, nn
from lazygrad.nn.optim import SGD
from lazygrad.nn.state import get_parameters, get_state_dict

# the usual ImageNet recipe's SGD settings; make_train_step and torch_reference share them as defaults
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-4


def _conv(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> nn.Conv2d:
    """A bias-free conv (the BatchNorm after it has the bias) with "same" padding for odd kernels, He-initialised
    for the fan-out as in the paper: std sqrt(2 / (out_channels * k * k))."""
    conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=kernel_size // 2, bias=False)
    std = math.sqrt(2.0 / (out_channels * kernel_size * kernel_size))
    conv.weight = Tensor.normal(out_channels, in_channels, kernel_size, kernel_size, std=std)
    return conv


class BasicBlock:
    """Two 3x3 conv + BatchNorm layers and a shortcut: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)). The
    shortcut is the identity, or a strided 1x1 conv + BatchNorm where the block changes the shape."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        self.conv1 = _conv(in_channels, channels, 3, stride)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = _conv(channels, channels, 3)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample: list[Callable[[Tensor], Tensor]] = (
            [_conv(in_channels, channels, 1, stride), nn.BatchNorm2d(channels)]
            if stride != 1 or in_channels != channels
            else []
        )

    def __call__(self, x: Tensor) -> Tensor:
        out = self.bn1(self.conv1(x)).relu()
        out = self.bn2(self.conv2(out))
        return (out + x.sequential(self.downsample)).relu()


class ResNet:
    """A ResNet of BasicBlocks on (N, in_channels, H, W) images, returning (N, num_classes) logits: a 7x7 stride-2
    stem conv + BatchNorm + relu, a 3x3 stride-2 max pool, four stages of `blocks[i]` blocks with width * 2**i
    channels (each stage after the first starts with stride 2), a global average pool and a linear classifier.

    Parameter names follow torchvision's (`conv1.weight`, `layer2.0.downsample.1.running_mean`, `fc.bias`, ...), so
    `get_state_dict` of this model and `state_dict()` of torchvision's resnet18 have the same keys.
    """

    def __init__(
        self, num_classes: int = 1000, width: int = 64, blocks: Sequence[int] = (2, 2, 2, 2), in_channels: int = 3
    ) -> None:
        if width < 1 or num_classes < 1 or len(blocks) != 4 or min(blocks) < 1:
            raise ValueError(
                f"ResNet needs width >= 1, num_classes >= 1 and four stages of at least one block each; got "
                f"width={width}, num_classes={num_classes}, blocks={tuple(blocks)}"
            )
        self.conv1 = _conv(in_channels, width, 7, stride=2)
        self.bn1 = nn.BatchNorm2d(width)
        channels = width
        for i, n in enumerate(blocks):
            out = width * 2**i
            stage = [BasicBlock(channels, out, 1 if i == 0 else 2)] + [BasicBlock(out, out) for _ in range(n - 1)]
            setattr(self, f"layer{i + 1}", stage)
            channels = out
        self.fc = nn.Linear(channels, num_classes)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn1(self.conv1(x)).relu().max_pool2d(kernel_size=3, stride=2, padding=1)
        for i in range(4):
            x = x.sequential(getattr(self, f"layer{i + 1}"))
        return self.fc(x.mean(axis=(2, 3)))


def resnet18(num_classes: int = 1000, width: int = 64, in_channels: int = 3) -> ResNet:
    """ResNet-18: two BasicBlocks per stage. The defaults are the network of the paper (11.7M parameters)."""
    return ResNet(num_classes, width, (2, 2, 2, 2), in_channels)


def make_train_step(
    model: ResNet, lr: float = LR, momentum: float = MOMENTUM, weight_decay: float = WEIGHT_DECAY
) -> Callable[[Tensor, Tensor], Tensor]:
    """A jitted training step `step(images, labels) -> loss`: forward in training mode (BatchNorm on batch
    statistics, updating its running statistics), mean cross-entropy against the integer labels, backward, and one
    SGD step with momentum and weight decay (torch.optim.SGD's update). From the third call on it replays the
    captured kernels, so every call must pass tensors of the same shapes and dtypes."""
    opt = SGD(get_parameters(model), lr=lr, momentum=momentum, weight_decay=weight_decay)

    @TinyJit
    @Tensor.train()
    def train_step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        opt.step()
        return loss

    return train_step


def torch_reference(
    model: ResNet,
    lr: float = LR,
    momentum: float = MOMENTUM,
    weight_decay: float = WEIGHT_DECAY,
    device: str = "cpu",
) -> tuple[Any, Callable[[Any, Any], Any]]:
    """The same network written in torch (needs torch), with `model`'s current weights and BatchNorm statistics
    copied in (call it before training `model` to start both from the same point), and its training step
    `torch_step(images, labels) -> loss`, which takes torch tensors (float32 images, int64 labels) on `device` and
    uses torch.optim.SGD with the same settings as `make_train_step`."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's conventional name

    def conv(cin: int, cout: int, k: int, stride: int = 1) -> torch.nn.Conv2d:
        return torch.nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)

    class Block(torch.nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = conv(cin, cout, 3, stride), torch.nn.BatchNorm2d(cout)
            self.conv2, self.bn2 = conv(cout, cout, 3), torch.nn.BatchNorm2d(cout)
            self.downsample = (
                torch.nn.Sequential(conv(cin, cout, 1, stride), torch.nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else None
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return F.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            cin, width = model.conv1.weight.shape[1], model.conv1.weight.shape[0]
            self.conv1, self.bn1 = conv(cin, width, 7, 2), torch.nn.BatchNorm2d(width)
            channels = width
            for i in range(4):
                n, out = len(getattr(model, f"layer{i + 1}")), width * 2**i
                stage = [Block(channels, out, 1 if i == 0 else 2)] + [Block(out, out, 1) for _ in range(n - 1)]
                setattr(self, f"layer{i + 1}", torch.nn.Sequential(*stage))
                channels = out
            self.fc = torch.nn.Linear(channels, model.fc.weight.shape[0])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), kernel_size=3, stride=2, padding=1)
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(x.mean(dim=(2, 3)))

    net = Net()
    net.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in get_state_dict(model).items()})
    net = net.to(device).train()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)

    def torch_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return net, torch_step


def random_batches(
    n: int, batch: int, size: int, num_classes: int, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """`n` seeded batches of standard-normal (batch, 3, size, size) float32 images and int32 labels."""
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((batch, 3, size, size), dtype=np.float32),
            rng.integers(0, num_classes, batch).astype(np.int32),
        )
        for _ in range(n)
    ]


def _steady(times: list[float]) -> str:
    # the first two calls build, compile and capture; the rest replay
    return f"{statistics.median(times[2:]) * 1e3:.1f} ms" if len(times) > 2 else "n/a (needs --steps 3 or more)"


def main() -> None:
    """Train on random data for --steps steps, printing each loss and the steady-state step time."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8, help="images per step")
    parser.add_argument("--size", type=int, default=224, help="image side in pixels")
    parser.add_argument("--steps", type=int, default=10, help="training steps (the first two compile and capture)")
    parser.add_argument("--width", type=int, default=64, help="channels after the stem (64: ResNet-18)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument(
        "--lr", type=float, default=None, help=f"learning rate (default {LR} * batch / 256, the linear scaling rule)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch", action="store_true", help="also train the same net in torch (eager, CPU)")
    args = parser.parse_args()
    lr = args.lr if args.lr is not None else LR * args.batch / 256

    Tensor.manual_seed(args.seed)
    model = resnet18(args.classes, args.width)
    reference = torch_reference(model, lr=lr) if args.torch else None
    step = make_train_step(model, lr=lr)
    data = random_batches(min(args.steps, 4), args.batch, args.size, args.classes, args.seed)
    n_params = sum(p.numel() for p in get_parameters(model) if p.requires_grad is not False)
    print(
        f"ResNet-18 width {args.width} ({n_params / 1e6:.2f}M parameters), batch {args.batch} of "
        f"{args.size}x{args.size}, {args.classes} classes, lr {lr:g}, on {Device.DEFAULT}"
    )

    times = []
    for i in range(args.steps):
        x, y = data[i % len(data)]
        start = time.perf_counter()
        loss = step(Tensor(x), Tensor(y)).item()
        times.append(time.perf_counter() - start)
        print(f"step {i:3d}  loss {loss:.4f}  {times[-1] * 1e3:9.1f} ms")
    print(f"lazygrad steady-state step time: {_steady(times)}")

    if reference is not None:
        import torch

        _, torch_step = reference
        times = []
        for i in range(args.steps):
            x, y = data[i % len(data)]
            start = time.perf_counter()
            loss = torch_step(torch.from_numpy(x), torch.from_numpy(y).long()).item()
            times.append(time.perf_counter() - start)
            print(f"torch step {i:3d}  loss {loss:.4f}  {times[-1] * 1e3:9.1f} ms")
        print(f"torch eager steady-state step time: {_steady(times)}")


if __name__ == "__main__":
    main()
