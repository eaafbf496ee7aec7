"""Train a small conv net on the handwritten digits that ship with scikit-learn (8x8 images, 1797 samples), on the
default device, and report its accuracy on a held-out quarter of them.

Run:  python examples/train_digits.py            (DEV=PYTHON, DEBUG=2, ... work as everywhere)
Needs: pip install scikit-learn tqdm              (or the `examples` extra of the lazygrad package)
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits
from tqdm import trange

from lazygrad import Device, Tensor, TinyJit, nn
from lazygrad.nn.lr_scheduler import CosineAnnealingLR
from lazygrad.nn.optim import Adam
from lazygrad.nn.state import get_parameters


class DigitsNet:
    """conv 3x3 (16) -> relu -> conv 3x3 (32) -> relu -> 2x2 max pool -> linear, on (N, 1, 8, 8) images."""

    def __init__(self) -> None:
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.conv1(x).relu()
        x = self.conv2(x).relu().max_pool2d(2)
        return self.fc(x.flatten(1))


def load_split(seed: int = 0, test_fraction: float = 0.25) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Images scaled to [0, 1] as (N, 1, 8, 8) float32 and integer labels: a shuffled train/test split."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def accuracy(model: DigitsNet, x: np.ndarray, y: np.ndarray) -> float:
    """The fraction of `x` the model labels as `y`."""
    pred = model(Tensor(x)).argmax(-1).numpy()
    return float((pred == y).mean())


def make_train_step(model: DigitsNet, opt: Adam) -> TinyJit:
    """One jitted training step of `model` with `opt` on a batch `(x, y)`, returning the loss. From the third call on,
    TinyJit replays the step's kernels: no graph building, scheduling or compiling."""

    @TinyJit
    @Tensor.train()
    def train_step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        opt.step()
        return loss

    return train_step


def train(
    steps: int = 150, batch_size: int = 128, lr: float = 1e-2, seed: int = 0, progress: bool = True
) -> tuple[DigitsNet, float]:
    """Train a DigitsNet with Adam and a cosine learning-rate decay on random minibatches; returns the model and
    its accuracy on the held-out test images."""
    Tensor.manual_seed(seed)
    x_train, y_train, x_test, y_test = load_split(seed)
    model = DigitsNet()
    opt = Adam(get_parameters(model), lr=lr)
    schedule = CosineAnnealingLR(opt, T_max=steps)
    rng = np.random.default_rng(seed)

    train_step = make_train_step(model, opt)
    bar = trange(steps, disable=not progress)
    for step in bar:
        idx = rng.integers(0, len(x_train), batch_size)
        loss = train_step(Tensor(x_train[idx]), Tensor(y_train[idx]))
        schedule.step()
        if step % 20 == 0 or step == steps - 1:
            bar.set_description(f"loss {loss.item():.3f}")
    return model, accuracy(model, x_test, y_test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"training on {Device.DEFAULT}")
    start = time.perf_counter()
    _, acc = train(args.steps, args.batch_size, args.lr, args.seed)
    print(f"test accuracy {acc * 100:.2f}% after {args.steps} steps in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
