"""All-reduce bandwidth and data-parallel throughput, each against a reference measured in the same run.

1. In one process, between CPU:0..N-1: the ring and the direct all-reduce (captured with TinyJit, so a call is the
   replay of its kernels) against a numpy copy of the same bytes (memcpy), timed alternately; "(chosen)" marks the
   one `all_reduce` picks by itself at that size. With S the bytes each device holds and t the time of one call,
   as nccl-tests report them:
   - algbw = S / t, the algorithm bandwidth: how fast a device's buffer is reduced;
   - busbw = algbw * 2(n-1)/n, the bus bandwidth: the bytes that cross the links per device in a ring (or any
     optimal) all-reduce, the figure that compares with the hardware's bandwidth whatever n is;
   - memcpy = S / (time of numpy copying S bytes on one thread); the ratios are algbw / memcpy and busbw / memcpy.
   The CPU devices read each other's memory in place, so the direct all-reduce whose results are all returned is
   one kernel reading each input once and writing each output once: n times a copy's memory traffic (the ring,
   whose chunks are written and read once more, (3n + 1) / 2 times); the "per byte moved" column is the algbw
   ratio times that: the speed per byte of memory traffic, against the copy's. The kernel runs on CPU_THREADS
   threads (all cores by default), the copy on one.
   The last rows time the replay of a 4 kB all-reduce, which is all dispatch (the kernel takes about a
   microsecond): the cost a call adds at every size.
2. Across MPI ranks (`mpirun -n 2`, started by this script): lazygrad-distributed's all_reduce on tensors (making a
   new output tensor per call, and writing into a reused one with `out=`) against mpi4py's own numpy Allreduce of
   the same arrays into a reused array, alternating, median of each.
3. Training throughput (samples/s) of examples/train_digits_dp.py over MPI with 1 and 2 ranks at the same per-rank
   batch.

    python benchmarks/allreduce.py [--runs 7] [--skip-mpi]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from lazygrad import Context, Tensor, TinyJit
from lazygrad.multi import all_reduce, multi, ring_chosen
from lazygrad_uop.ops import Ops

ROOT = Path(__file__).resolve().parents[1]
SIZES_MB = (1, 16, 64)


def alternating_medians(fns: Sequence[Callable[[], object]], runs: int) -> list[float]:
    """Median seconds of each of `fns`, timed in turn within each run so that all see the same machine load (other
    work on the machine changes a single-function timing by several times). Two warm-up calls each first (the JIT
    captures on its second)."""
    for fn in fns:
        fn()
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, ts in zip(fns, times):
            st = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - st)
    return [statistics.median(ts) for ts in times]


def _jitted_all_reduce(ring: bool) -> Callable[[Tensor], Tensor]:
    @TinyJit
    def reduce(t: Tensor) -> Tensor:
        return Tensor(multi(all_reduce(Ops.ADD, list(t.uop.src), ring=ring), None)).realize()

    return reduce


def in_process(runs: int) -> list[tuple[str, int, int, float, float, float]]:
    """(case, devices, bytes per device, seconds of the all-reduce, seconds of numpy copying the same bytes, copies'
    worth of memory traffic) per device count, algorithm and size."""
    rows = []
    rng = np.random.default_rng(0)
    for n in (2, 4):
        devices = tuple(f"CPU:{i}" for i in range(n))
        for mb in SIZES_MB:
            m = mb * 2**20 // 4
            data = rng.standard_normal((n, m)).astype(np.float32)
            x = Tensor.from_shards([Tensor(data[i], device=d) for i, d in enumerate(devices)], 0).realize()
            src, dst = data[0].copy(), np.empty_like(data[0])
            chosen = ring_chosen(list(x.uop.src))
            algos = (("ring", True), ("direct", False))
            reduces = [_jitted_all_reduce(ring) for _, ring in algos]
            with Context(RING_MIN_BYTES=0):
                for reduce in reduces:
                    np.testing.assert_allclose(reduce(x).numpy(), data.sum(0), rtol=1e-4, atol=1e-4)
                # both algorithms and the copy timed in turn, so that all three see the same machine load
                *seconds, copy_s = alternating_medians(
                    [*(lambda r=r, x=x: r(x) for r in reduces), lambda dst=dst, src=src: np.copyto(dst, src)],
                    runs * max(1, 16 // mb),  # small sizes are quick to time and the noisiest: more runs
                )
            for (algo, ring), s in zip(algos, seconds):
                mark = " (chosen)" if ring == chosen else ""
                moved = (3 * n + 1) / 2 if ring else n
                rows.append((f"{n} devices, {algo}{mark}, {mb} MB", n, m * 4, s, copy_s, moved))
    return rows


def dispatch(runs: int) -> list[tuple[str, float]]:
    """(case, median seconds) of the replay of a jitted 4 kB all-reduce (the one `all_reduce` chooses) on 2 and 4
    CPU devices: the kernel is about a microsecond, the rest is the cost of a call."""
    rows = []
    for n in (2, 4):
        x = Tensor.from_shards([Tensor.ones(1024, device=f"CPU:{i}") for i in range(n)], 0).realize()
        reduce = _jitted_all_reduce(ring_chosen(list(x.uop.src)))
        np.testing.assert_array_equal(reduce(x).numpy(), np.full(1024, n, np.float32))
        (s,) = alternating_medians([lambda x=x, reduce=reduce: reduce(x)], runs * 200)
        rows.append((f"{n} devices, 4 kB, replay", s))
    return rows


MPI_WORKER = """
import json, random, statistics, sys, time
import numpy as np
from mpi4py import MPI
from lazygrad import Tensor
from lazygrad_distributed import MPIProcessGroup
runs, sizes, out = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], sys.argv[3]
group, comm = MPIProcessGroup(), MPI.COMM_WORLD
rows = []
for mb in sizes:
    a = np.random.default_rng(comm.rank).standard_normal(mb * 2**20 // 4).astype(np.float32)
    t, recv, o = Tensor(a).realize(), np.empty_like(a), Tensor.empty(a.size)
    ref = np.empty_like(a); comm.Allreduce(a, ref)
    np.testing.assert_allclose(group.all_reduce(t).numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(group.all_reduce(t, out=o).numpy(), ref, rtol=1e-6)
    fns = {
        "mpi4py": lambda: comm.Allreduce(a, recv),
        "new tensor": lambda: group.all_reduce(t),
        "out=": lambda: group.all_reduce(t, out=o),  # a reused output, as mpi4py's recv is
    }
    times = {k: [] for k in fns}
    for run in range(runs * max(1, 16 // mb) + 1):  # alternate, so all see the same load; more runs of small sizes
        # in an order drawn anew each run (the same on every rank): what runs just before a call, and so what it
        # left in the caches, differs from run to run instead of favouring one of the three
        for k in random.Random(run).sample(list(fns), len(fns)):
            comm.Barrier(); st = time.perf_counter(); fns[k](); times[k].append(time.perf_counter() - st)
    rows.append((mb, {k: statistics.median(ts[1:]) for k, ts in times.items()}))
if comm.rank == 0:
    json.dump(rows, open(out, "w"))
"""


def _mpirun() -> str | None:
    beside = Path(sys.executable).with_name("mpirun")
    return str(beside) if beside.exists() else shutil.which("mpirun")


def mpi(runs: int, mpirun: str) -> list[tuple[str, float, float]]:
    """(case, GB/s of lazygrad's all_reduce, GB/s of mpi4py's numpy Allreduce) with 2 ranks: all_reduce making a
    new tensor per call, and writing into a reused one (`out=`, as the mpi4py call writes into a reused array)."""
    with tempfile.TemporaryDirectory() as tmp:
        script, out = Path(tmp) / "worker.py", Path(tmp) / "out.json"
        script.write_text(MPI_WORKER)
        sizes = ",".join(map(str, SIZES_MB))
        cmd = [mpirun, "-n", "2", sys.executable, str(script), str(runs), sizes, str(out)]
        subprocess.run(cmd, check=True, timeout=600, env={**os.environ, "CPU_THREADS": "1"})
        rows = json.loads(out.read_text())
    return [
        (f"2 ranks, {mb} MB, {case}", mb * 2**20 / s[case] / 1e9, mb * 2**20 / s["mpi4py"] / 1e9)
        for mb, s in rows
        for case in ("new tensor", "out=")
    ]


def throughput(mpirun: str, steps: int, per_rank: int) -> list[tuple[int, float, float]]:
    """(ranks, samples/s, last loss) of train_digits_dp.py --mpi at `per_rank` samples per rank."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2):
            out = Path(tmp) / f"{n}.json"
            cmd = [mpirun, "-n", str(n), sys.executable, str(ROOT / "examples" / "train_digits_dp.py"), "--mpi"]
            cmd += ["--steps", str(steps), "--batch-size", str(per_rank * n), "--out", str(out)]
            subprocess.run(cmd, check=True, timeout=900, capture_output=True, env={**os.environ, "CPU_THREADS": "1"})
            result = json.loads(out.read_text())
            rows.append((n, result["samples_per_s"], result["losses"][-1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--skip-mpi", action="store_true")
    parser.add_argument("--steps", type=int, default=60, help="training steps of the throughput rows")
    parser.add_argument("--per-rank-batch", type=int, default=64)
    args = parser.parse_args()
    head = f"{'in-process all-reduce':34s} {'us':>8s} {'algbw GB/s':>10s} {'busbw GB/s':>10s} {'memcpy GB/s':>11s}"
    print(f"{head} {'algbw/memcpy':>12s} {'busbw/memcpy':>12s} {'per byte moved':>14s}")
    for case, n, nbytes, s, copy_s, moved in in_process(args.runs):
        algbw, copy = nbytes / s / 1e9, nbytes / copy_s / 1e9
        busbw = algbw * 2 * (n - 1) / n
        print(
            f"{case:34s} {s * 1e6:8.0f} {algbw:10.2f} {busbw:10.2f} {copy:11.2f} {algbw / copy:12.2f} "
            f"{busbw / copy:12.2f} {algbw / copy * moved:14.2f}"
        )
    print(f"\n{'dispatch':34s} {'us':>8s}")
    for case, s in dispatch(args.runs):
        print(f"{case:34s} {s * 1e6:8.1f}")
    if args.skip_mpi:
        return
    if (mpirun := _mpirun()) is None:
        print("no mpirun here: `pip install mpich` for the MPI rows")
        return
    print(f"\n{'MPI all-reduce':34s} {'GB/s':>8s} {'mpi4py numpy GB/s':>16s} {'ratio':>7s}")
    for case, ours, ref in mpi(args.runs, mpirun):
        print(f"{case:34s} {ours:8.2f} {ref:16.2f} {ours / ref:7.2f}")
    print(f"\n{'data-parallel training':34s} {'samples/s':>10s} {'vs 1 rank':>10s} {'last loss':>10s}")
    rows = throughput(mpirun, args.steps, args.per_rank_batch)
    for n, rate, loss in rows:
        print(f"{f'{n} rank(s), {args.per_rank_batch}/rank':34s} {rate:10.0f} {rate / rows[0][1]:10.2f} {loss:10.3f}")


if __name__ == "__main__":
    main()
