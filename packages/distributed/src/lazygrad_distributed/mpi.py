"""`MPIProcessGroup`: the collectives over MPI through mpi4py, for tensors on host-memory devices (and any device,
staged through the host). Launch the ranks with `mpirun -n N python train.py`."""

from __future__ import annotations

from typing import Any

import numpy as np

from lazygrad import Tensor
from lazygrad_distributed.process_group import (
    CollectiveError,
    ProcessGroup,
    check_op,
    host_array,
    output_into,
    output_tensor,
    whole_buffer,
)


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as exc:  # mpi4py imports, but finds no MPI library: say which package brings one
        raise RuntimeError(
            f"MPI is not usable here ({exc}); install an MPI library: `pip install mpich` (or a system MPI such as "
            "Debian's mpich or openmpi packages)"
        ) from exc
    return MPI


class MPIProcessGroup(ProcessGroup):
    """The ranks of an MPI communicator (by default every process `mpirun` started)."""

    def __init__(self, comm: Any = None) -> None:
        self.MPI = _mpi()
        self.comm = comm if comm is not None else self.MPI.COMM_WORLD
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self._ops = {"sum": self.MPI.SUM, "avg": self.MPI.SUM, "prod": self.MPI.PROD, "max": self.MPI.MAX}

    def _op(self, op: str) -> Any:
        return self._ops.get(op, self.MPI.MIN)

    def all_reduce(self, t: Tensor, op: str = "sum", out: Tensor | None = None) -> Tensor:
        """The reduction (`sum`, `prod`, `max`, `min`, `avg`) of every rank's `t`, on every rank: a new tensor, or
        written into `out` and `out` returned. Giving `out` (a buffer reused from call to call, or `t` itself, which
        is reduced in place) saves making a tensor per call, which costs as much as reducing tens of kilobytes."""
        if out is t and whole_buffer(t) is None:
            t.realize()  # still to compute: into memory of its own, which the result then overwrites
        src = host_array(t)
        check_op(op, src.dtype)
        if out is None:
            out, dest, done = output_tensor(t.shape, t)
        else:
            dest, done = output_into(out, t)
        if dest.ctypes.data == src.ctypes.data:  # `t` is `out`: MPI reads and writes the one buffer
            self.comm.Allreduce(self.MPI.IN_PLACE, dest, op=self._op(op))
        else:
            self.comm.Allreduce(src, dest, op=self._op(op))
        if op == "avg":
            dest /= self.world_size
        done()
        return out

    def iall_reduce(self, array: np.ndarray, op: str = "sum") -> Any:
        """Start an in-place all-reduce of the host `array` and return its MPI request (`.Wait()` to finish), so
        that other work can run while it travels. An 'avg' is left as a sum: divide once it is done."""
        check_op(op, array.dtype)
        return self.comm.Iallreduce(self.MPI.IN_PLACE, array, op=self._op(op))

    def broadcast(self, t: Tensor, root: int = 0) -> Tensor:
        """Rank `root`'s `t` on every rank."""
        self._check_root(root)
        src = host_array(t)
        out, dest, done = output_tensor(t.shape, t)
        if self.rank == root:
            dest[...] = src
        self.comm.Bcast(dest, root=root)
        done()
        return out

    def all_gather(self, t: Tensor, axis: int = 0) -> Tensor:
        """Every rank's `t` concatenated along `axis` in rank order."""
        if t.ndim == 0:
            raise CollectiveError("all_gather concatenates along an axis; reshape a 0-d tensor to (1,) first")
        axis %= t.ndim
        src = np.ascontiguousarray(np.moveaxis(host_array(t), axis, 0))
        gathered = np.empty((self.world_size, *src.shape), dtype=src.dtype)
        self.comm.Allgather(src, gathered)
        whole = np.moveaxis(gathered.reshape(-1, *src.shape[1:]), 0, axis)
        shape = tuple(d * self.world_size if i == axis else d for i, d in enumerate(t.shape))
        out, dest, done = output_tensor(shape, t)
        dest[...] = whole
        done()
        return out

    def reduce_scatter(self, t: Tensor, op: str = "sum", axis: int = 0) -> Tensor:
        """Rank r's part (along `axis`, of world_size equal parts) of the reduction of every rank's `t`."""
        axis = self._scatter_axis(t, axis)
        src = np.ascontiguousarray(np.moveaxis(host_array(t), axis, 0))
        check_op(op, src.dtype)
        part = np.empty((src.shape[0] // self.world_size, *src.shape[1:]), dtype=src.dtype)
        self.comm.Reduce_scatter_block(src, part, op=self._op(op))
        if op == "avg":
            part /= self.world_size
        shape = tuple(d // self.world_size if i == axis else d for i, d in enumerate(t.shape))
        out, dest, done = output_tensor(shape, t)
        dest[...] = np.moveaxis(part, 0, axis)
        done()
        return out

    def barrier(self) -> None:
        """Return once every rank has called it."""
        self.comm.Barrier()
