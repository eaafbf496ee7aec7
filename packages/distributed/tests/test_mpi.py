"""The MPI process group on localhost: `mpirun -n 2` and `-n 3` (an odd count) run mpi_worker.py, whose ranks check
every collective against numpy and train 5 data-parallel steps, compared here with the same training in one
process on the global batch."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mpi_worker
import numpy as np
import pytest

from lazygrad import Tensor
from lazygrad_distributed import CollectiveError, DataParallel, MPIProcessGroup

WORKER = Path(__file__).with_name("mpi_worker.py")
TIMEOUT_S = 240


def _mpirun() -> str:
    """The mpirun beside this Python (the mpich wheel's) or on PATH; skips where no MPI is installed."""
    beside = Path(sys.executable).with_name("mpirun")
    found = str(beside) if beside.exists() else shutil.which("mpirun")
    if found is None:
        pytest.skip("no mpirun: install an MPI (`pip install mpich`, the test dependency group has it)")
    return found


def _run(n: int, mode: str, tmp_path: Path) -> list[dict]:
    out = tmp_path / mode
    env = {**os.environ, "CPU_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(WORKER.parent), *sys.path])}
    cmd = [_mpirun(), "-n", str(n), sys.executable, str(WORKER), mode, str(out)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpirun -n {n} {mode} did not finish in {TIMEOUT_S} s: {exc.stdout}{exc.stderr}")
    assert proc.returncode == 0, f"mpirun -n {n} {mode} failed:\n{proc.stdout}\n{proc.stderr}"
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_match_numpy_on_every_rank(n: int, tmp_path: Path) -> None:
    results = _run(n, "collectives", tmp_path)
    assert [r["rank"] for r in results] == list(range(n)) and all(r["world"] == n for r in results)
    assert all("reduce_scatter" in r["checked"] and "all_reduce sum int32" in r["checked"] for r in results)
    assert all(
        "all_reduce in place int32" in r["checked"] and "all_reduce out= float32" in r["checked"] for r in results
    )


@pytest.mark.parametrize("n", [2, 3])
def test_five_data_parallel_steps_match_one_process(n: int, tmp_path: Path) -> None:
    results = _run(n, "train", tmp_path)
    one = mpi_worker.train(None)
    for r in results:
        np.testing.assert_allclose(r["losses"], one["losses"], rtol=1e-4, atol=1e-5)
        for got, want in zip(r["params"], one["params"]):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # every rank seeded its own initial weights: they end equal to the bit only if rank 0's were broadcast and every
    # rank applied the same averaged gradients
    assert all(r["params"] == results[0]["params"] for r in results)


# *** one rank, in this process ***


def test_single_rank_group_and_argument_errors() -> None:
    group = MPIProcessGroup()
    assert (group.rank, group.world_size) == (0, 1)
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(group.all_reduce(Tensor(a)).numpy(), a)
    np.testing.assert_array_equal(group.all_gather(Tensor(a), 1).numpy(), a)
    with pytest.raises(CollectiveError, match="unknown reduction"):
        group.all_reduce(Tensor(a), "mean")
    with pytest.raises(CollectiveError, match="floating-point"):
        group.all_reduce(Tensor(a).int(), "avg")
    with pytest.raises(CollectiveError, match="not in this group"):
        group.broadcast(Tensor(a), 1)
    with pytest.raises(CollectiveError, match="one device"):
        group.all_reduce(Tensor(a).shard(("CPU", "CPU:1"), 0))
    p = Tensor(a, requires_grad=True)
    dp = DataParallel([p], group)
    with pytest.raises(RuntimeError, match=r"no \.grad"):
        dp.sync_gradients()
    (p * p).sum().backward()
    dp.sync_gradients()
    np.testing.assert_allclose(p.grad.numpy(), 2 * a)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="bucket_bytes"):
        DataParallel([p], group, bucket_bytes=0)


def test_all_reduce_into_out_checks_it() -> None:
    """`out=` takes a whole buffer of the input's shape, dtype and device (a new or reused tensor, or the input
    itself); anything else is refused with the way to make one, and the output is left as it was."""
    group = MPIProcessGroup()
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    t = Tensor(a)
    out = Tensor.full((3, 4), 7, dtype=t.dtype).realize()
    for bad, match in (
        (Tensor.empty(4, 3, dtype=t.dtype), r"Tensor\.empty"),
        (Tensor.empty(3, 4), r"Tensor\.empty"),
        (Tensor.empty(3, 4, dtype=t.dtype, device="CPU:1"), r"Tensor\.empty"),
        (out.T.T, "own memory"),
        (a, "must be a Tensor"),
    ):
        with pytest.raises(CollectiveError, match=match):
            group.all_reduce(t, out=bad)  # type: ignore[arg-type]
    np.testing.assert_array_equal(out.numpy(), np.full((3, 4), 7))
    assert group.all_reduce(t, "max", out=out) is out
    np.testing.assert_array_equal(out.numpy(), a)  # one rank: the reduction is the input
    f = Tensor(a.astype(np.float32)).realize()
    group.all_reduce(f, "avg", out=f)
    np.testing.assert_array_equal(f.numpy(), a.astype(np.float32))


def test_all_reduce_into_the_same_out_again_reads_the_input_anew() -> None:
    """A second call with the same tensors reuses the first one's views of their memory: it still reads what the
    input holds now (written in place, or assigned), and stops reusing once a tensor is replaced or dropped."""
    group = MPIProcessGroup()
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    t, out = Tensor(a).realize(), Tensor.empty(3, 4, dtype=Tensor(a).dtype)
    group.all_reduce(t, out=out)
    np.testing.assert_array_equal(out.numpy(), a)
    assert group._reuse is not None and group._reuse.arrays(t, out) is not None  # the next call takes them
    t.assign(t * 3).realize()
    group.all_reduce(t, out=out)
    np.testing.assert_array_equal(out.numpy(), a * 3)
    t.assign(Tensor(a + 1)).realize()
    group.all_reduce(t, "max", out=out)
    np.testing.assert_array_equal(out.numpy(), a + 1)
    lazy = Tensor(a) - 5  # computed for MPI into a copy, which must not be reused as the tensor's memory
    group.all_reduce(lazy, out=out)
    lazy.assign(Tensor(a) * 7).realize()
    group.all_reduce(lazy, out=out)
    np.testing.assert_array_equal(out.numpy(), a * 7)
    kept = group._reuse
    assert kept is not None and kept.arrays(lazy, out) is not None
    del t, out, lazy
    gc.collect()
    assert kept._views is None  # the arrays, which hold the memory, went with the tensors


def test_buckets_send_the_last_parameters_first() -> None:
    ps = [Tensor.zeros(n) for n in (4, 8, 2, 2)]  # 16, 32, 8, 8 bytes
    dp = DataParallel(ps, MPIProcessGroup(), bucket_bytes=20)
    assert [[p.shape[0] for p in b] for b in dp.buckets()] == [[2, 2], [8], [4]]


def test_collectives_read_realized_host_tensors_in_place() -> None:
    """A realized CPU tensor is handed to MPI as a read-only view of its own memory (no copy, no second schedule); a
    tensor still to compute, or a view, is computed first; either way the input is left as it was."""
    from lazygrad_distributed.process_group import host_array

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(a).realize()
    view = host_array(t)
    np.testing.assert_array_equal(view, a)
    assert np.shares_memory(view, t.numpy()) and not view.flags.writeable
    np.testing.assert_array_equal(host_array(t * 2), a * 2)
    np.testing.assert_array_equal(host_array(t.T), a.T)
    group = MPIProcessGroup()
    np.testing.assert_array_equal(group.all_reduce(t.T).numpy(), a.T)  # one rank: the sum is the tensor itself
    np.testing.assert_array_equal(t.numpy(), a)


def test_collectives_raise_pending_index_checks() -> None:
    """Reading a tensor for MPI is a read: an out-of-range gather index found on the device raises, as .numpy() does."""
    table = Tensor(np.arange(8, dtype=np.float32).reshape(4, 2)).realize()
    picked = table[Tensor(np.array([1, 7], dtype=np.int32))].realize()
    with pytest.raises(IndexError):
        MPIProcessGroup().all_reduce(picked)
