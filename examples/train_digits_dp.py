"""Data-parallel training of train_digits.py's conv net: the same global batch split over several devices in this
process, or over several MPI processes, with the same loss curve as one device.

Run:  python examples/train_digits_dp.py                      one device
      python examples/train_digits_dp.py --devices 2          CPU:0 and CPU:1 in this process (Tensor.shard)
      mpirun -n 2 python examples/train_digits_dp.py --mpi    2 ranks (lazygrad-distributed over MPI)
Needs: pip install scikit-learn tqdm (the `examples` extra), and for --mpi: pip install lazygrad-distributed[mpich]

In-process, the batch is sharded along its first axis and the weights are replicated: each device runs the step on
its half, and the gradients of the replicated weights are summed across devices inside the graph (an all-reduce), so
the whole step, all-reduce included, is one TinyJit capture. Over MPI each rank takes its part of the batch, and
DataParallel averages the gradients between backward and the optimizer step.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
from train_digits import DigitsNet, accuracy, load_split, make_train_step

from lazygrad import Tensor, TinyJit
from lazygrad.nn.lr_scheduler import CosineAnnealingLR
from lazygrad.nn.optim import Adam
from lazygrad.nn.state import get_parameters


def _batches(steps: int, batch_size: int, n: int, seed: int) -> list[np.ndarray]:
    """The minibatch indices of every step: one random stream whatever the number of devices or ranks."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, batch_size) for _ in range(steps)]


def train_in_process(
    devices: tuple[str, ...] | None, steps: int = 150, batch_size: int = 128, lr: float = 1e-2, seed: int = 0
) -> dict[str, Any]:
    """Train on one device (devices None) or on `devices` with the batch sharded; returns the loss of every step,
    the test accuracy and the training throughput (samples/s, after the JIT's capture)."""
    Tensor.manual_seed(seed)
    x_train, y_train, x_test, y_test = load_split(seed)
    model = DigitsNet()
    params = get_parameters(model)
    if devices is not None:
        for p in params:
            p.shard_(devices)
    opt = Adam(params, lr=lr)
    schedule = CosineAnnealingLR(opt, T_max=steps)

    train_step = make_train_step(model, opt)

    losses, start = [], 0.0
    for step, idx in enumerate(_batches(steps, batch_size, len(x_train), seed)):
        if step == 3:
            start = time.perf_counter()  # the JIT replays from here on
        if devices is None:
            x, y = Tensor(x_train[idx]), Tensor(y_train[idx])
        else:  # each device's part of the batch goes straight to it
            x, y = (
                Tensor.from_shards([Tensor(a, device=d) for a, d in zip(np.split(data[idx], len(devices)), devices)], 0)
                for data in (x_train, y_train)
            )
        losses.append(train_step(x, y).item())
        schedule.step()
    rate = (steps - 3) * batch_size / (time.perf_counter() - start) if steps > 3 else float("nan")
    if devices is None:
        acc = accuracy(model, x_test, y_test)
    else:  # the test images replicated on the devices, as the weights are
        acc = float((model(Tensor(x_test).shard(devices)).argmax(-1).numpy() == y_test).mean())
    return {"losses": losses, "accuracy": acc, "samples_per_s": rate}


def train_mpi(steps: int = 150, batch_size: int = 128, lr: float = 1e-2, seed: int = 0) -> dict[str, Any]:
    """Train on this MPI rank's part of every global batch, gradients averaged with DataParallel."""
    from lazygrad_distributed import DataParallel, MPIProcessGroup

    group = MPIProcessGroup()
    rank, world = group.rank, group.world_size
    if batch_size % world:
        raise ValueError(f"the global batch of {batch_size} doesn't split over {world} ranks; pick a multiple")
    Tensor.manual_seed(seed)
    x_train, y_train, x_test, y_test = load_split(seed)
    model = DigitsNet()
    params = get_parameters(model)
    dp = DataParallel(params, group)
    opt = Adam(params, lr=lr)
    schedule = CosineAnnealingLR(opt, T_max=steps)

    # backward and the update are captured separately: the averaging between them is MPI traffic, not kernels
    @TinyJit
    @Tensor.train()
    def forward_backward(x: Tensor, y: Tensor) -> list[Tensor]:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        return [loss, *(p.grad for p in params)]  # type: ignore[list-item]

    @TinyJit
    def update(*grads: Tensor) -> None:
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()

    part = batch_size // world
    losses, start = [], 0.0
    for step, idx in enumerate(_batches(steps, batch_size, len(x_train), seed)):
        if step == 3:
            group.barrier()
            start = time.perf_counter()
        mine = idx[rank * part : (rank + 1) * part]
        loss, *grads = forward_backward(Tensor(x_train[mine]), Tensor(y_train[mine]))
        for p, g in zip(params, grads):  # a replay returns the gradients but sets no attribute: hand them over
            p.grad = g
        dp.sync_gradients()
        update(*(p.grad for p in params))
        losses.append(group.all_reduce(loss.detach(), "avg").item())
        schedule.step()
    group.barrier()
    rate = (steps - 3) * batch_size / (time.perf_counter() - start) if steps > 3 else float("nan")
    return {"losses": losses, "accuracy": accuracy(model, x_test, y_test), "samples_per_s": rate, "rank": rank}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=1, help="devices of this process (CPU:0..N-1)")
    parser.add_argument("--mpi", action="store_true", help="one device per MPI rank (run under mpirun)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=128, help="the global batch, over all devices or ranks")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the loss curve and throughput to this JSON file (rank 0)")
    args = parser.parse_args()
    if args.mpi:
        result = train_mpi(args.steps, args.batch_size, args.lr, args.seed)
    else:
        devices = tuple(f"CPU:{i}" for i in range(args.devices)) if args.devices > 1 else None
        result = train_in_process(devices, args.steps, args.batch_size, args.lr, args.seed)
    if result.get("rank", 0) == 0:
        curve = " ".join(f"{x:.3f}" for x in result["losses"][:: max(1, args.steps // 10)])
        print(f"loss every {max(1, args.steps // 10)} steps: {curve}")
        print(f"test accuracy {result['accuracy'] * 100:.2f}%, {result['samples_per_s']:.0f} samples/s")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f)


if __name__ == "__main__":
    main()
