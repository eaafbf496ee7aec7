"""Run by the tests under `mpirun -n N python mpi_worker.py MODE OUT`: each rank checks the collectives against numpy
(every rank can make every rank's data: it is seeded by rank), or trains a small model data-parallel for 5 steps;
rank r writes what it found to OUT.r (JSON)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import numpy as np

from lazygrad import Tensor, nn
from lazygrad.nn.optim import Adam
from lazygrad.nn.state import get_parameters

STEPS, GLOBAL_BATCH = 5, 12


def rank_data(rank: int, shape: Sequence[int], dtype: type = np.float32) -> np.ndarray:
    rng = np.random.default_rng(100 + rank)
    return (
        (rng.standard_normal(shape) * 10).astype(dtype)
        if dtype != np.int32
        else rng.integers(-50, 50, shape).astype(dtype)
    )


def check_collectives(group: object) -> dict[str, object]:
    """Each collective against numpy on every rank's data; returns what was checked."""
    rank, world = group.rank, group.world_size  # type: ignore[attr-defined]
    checked = []
    for dtype in (np.float32, np.int32):
        data = [rank_data(r, (world * 2, 5), dtype) for r in range(world)]
        mine = Tensor(data[rank])
        stacked = np.stack(data)
        for op, ref in (("sum", stacked.sum(0)), ("max", stacked.max(0)), ("min", stacked.min(0))):
            got = group.all_reduce(mine, op).numpy()  # type: ignore[attr-defined]
            np.testing.assert_allclose(got, ref, rtol=1e-6)
            checked.append(f"all_reduce {op} {np.dtype(dtype).name}")
        # into a reused output tensor, then in place (the input is its own output); exact for int32
        check = np.testing.assert_array_equal if dtype == np.int32 else np.testing.assert_allclose
        out = Tensor.empty(*mine.shape, dtype=mine.dtype)
        for op, ref in (("sum", stacked.sum(0)), ("max", stacked.max(0))):
            assert group.all_reduce(mine, op, out=out) is out  # type: ignore[attr-defined]
            check(out.numpy(), ref)
        np.testing.assert_array_equal(mine.numpy(), data[rank])
        in_place = Tensor(data[rank]) * 1  # still to compute: all_reduce realizes it, then reduces its memory
        assert group.all_reduce(in_place, "sum", out=in_place) is in_place  # type: ignore[attr-defined]
        check(in_place.numpy(), stacked.sum(0))
        group.all_reduce(in_place, "sum", out=in_place)  # type: ignore[attr-defined]  # the same tensors: reused views
        check(in_place.numpy(), stacked.sum(0) * world)
        checked += [f"all_reduce out= {np.dtype(dtype).name}", f"all_reduce in place {np.dtype(dtype).name}"]
        np.testing.assert_array_equal(group.broadcast(mine, world - 1).numpy(), data[world - 1])  # type: ignore[attr-defined]
        for axis in (0, 1):
            gathered = group.all_gather(mine, axis).numpy()  # type: ignore[attr-defined]
            np.testing.assert_array_equal(gathered, np.concatenate(data, axis))
        scattered = group.reduce_scatter(mine, "sum", 0).numpy()  # type: ignore[attr-defined]
        np.testing.assert_allclose(scattered, np.split(stacked.sum(0), world, 0)[rank], rtol=1e-6)
        checked += [f"broadcast {np.dtype(dtype).name}", "all_gather", "reduce_scatter"]
    avg = group.all_reduce(Tensor(data[rank].astype(np.float32)), "avg").numpy()  # type: ignore[attr-defined]
    np.testing.assert_allclose(avg, stacked.astype(np.float32).mean(0), rtol=1e-5)
    group.barrier()  # type: ignore[attr-defined]
    return {"rank": rank, "world": world, "checked": checked}


class TinyNet:
    def __init__(self) -> None:
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 3 * 3, 3)

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc(self.conv(x).relu().max_pool2d(2).flatten(1))


def batches() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((STEPS, GLOBAL_BATCH, 1, 6, 6)).astype(np.float32)
    ys = rng.integers(0, 3, (STEPS, GLOBAL_BATCH)).astype(np.int32)
    return xs, ys


def train(group: object | None) -> dict[str, object]:
    """5 Adam steps on the global batch (group None) or on this rank's part of it, gradients averaged."""
    Tensor.manual_seed(3 + (group.rank if group is not None else 0))  # type: ignore[attr-defined]
    model = TinyNet()
    params = get_parameters(model)
    dp = None
    if group is not None:
        from lazygrad_distributed import DataParallel

        dp = DataParallel(params, group)  # rank 0's weights everywhere, though each rank seeded its own
    opt = Adam(params, lr=0.05)
    xs, ys = batches()
    rank, world = (group.rank, group.world_size) if group is not None else (0, 1)  # type: ignore[attr-defined]
    part = GLOBAL_BATCH // world
    losses = []
    with Tensor.train():
        for i in range(STEPS):
            x, y = Tensor(xs[i, rank * part : (rank + 1) * part]), Tensor(ys[i, rank * part : (rank + 1) * part])
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            if dp is not None:
                dp.sync_gradients()
                loss = group.all_reduce(loss.detach(), "avg")  # type: ignore[attr-defined]
            opt.step()
            losses.append(float(loss.item()))
    return {"losses": losses, "params": [p.numpy().tolist() for p in params]}


def main(argv: list[str]) -> None:
    from lazygrad_distributed import MPIProcessGroup

    mode, out = argv
    group = MPIProcessGroup()
    result = check_collectives(group) if mode == "collectives" else train(group)
    with open(f"{out}.{group.rank}", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1:])
