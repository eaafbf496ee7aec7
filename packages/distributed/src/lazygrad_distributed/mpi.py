"""`MPIProcessGroup`: the collectives over MPI through mpi4py, for tensors on host-memory devices (and any device,
staged through the host). Launch the ranks with `mpirun -n N python train.py`."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from lazygrad import Tensor, index_checks
from lazygrad_distributed.process_group import (
    CollectiveError,
    ProcessGroup,
    check_op,
    host_array,
    output_into,
    output_tensor,
    whole_buffer,
)
from lazygrad_uop.device import Buffer


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as exc:  # mpi4py imports, but finds no MPI library: say which package brings one
        raise RuntimeError(
            f"MPI is not usable here ({exc}); install an MPI library: `pip install mpich` (or a system MPI such as "
            "Debian's mpich or openmpi packages)"
        ) from exc
    return MPI


class _Reuse:
    """The numpy arrays over the memory of the input and output of the last `all_reduce(t, out=out)` (host memory,
    both), for the next call with the same two tensors. They hold while both tensors are still the same nodes (a
    realized tensor's node changes when it is assigned to) and their buffers the same memory; the tensors' nodes are
    held weakly, and the arrays are dropped with them."""

    def __init__(self, t: Tensor, out: Tensor, bufs: tuple[Buffer, Buffer], src: np.ndarray, dest: np.ndarray) -> None:
        forget = self._forget
        self._nodes = (weakref.ref(t.uop, forget), weakref.ref(out.uop, forget))
        self._bufs = (weakref.ref(bufs[0]), weakref.ref(bufs[1]))
        self._handles: tuple[Any, Any] = (bufs[0].handle, bufs[1].handle)
        self._views: tuple[np.ndarray, np.ndarray] | None = (src, dest)

    @staticmethod
    def of(t: Tensor, out: Tensor, src: np.ndarray, dest: np.ndarray) -> _Reuse | None:
        """What to keep of a call that read `t` as `src` and wrote `out` through `dest`, where both are views of the
        tensors' own memory (None where either is a staging copy)."""
        bufs = whole_buffer(t), whole_buffer(out)
        if bufs[0] is None or bufs[1] is None or not bufs[0].is_allocated or not bufs[1].is_allocated:
            return None
        for buf, array in zip(bufs, (src, dest)):
            memory = buf.allocator._as_buffer(buf.handle) if hasattr(buf.allocator, "_as_buffer") else None
            # the array must be the buffer's memory itself, not a copy made of it (a computed or strided input)
            if memory is None or np.frombuffer(memory, np.uint8).ctypes.data != array.ctypes.data:
                return None
        return _Reuse(t, out, (bufs[0], bufs[1]), src, dest)

    def _forget(self, _: object) -> None:
        self._views = None

    def arrays(self, t: Tensor, out: Tensor) -> tuple[np.ndarray, np.ndarray] | None:
        """The (input, output) arrays, if `t` and `out` are the tensors of the call this was made from, unchanged."""
        views = self._views
        if views is None or self._nodes[0]() is not t.uop or self._nodes[1]() is not out.uop:
            return None
        for ref, handle in zip(self._bufs, self._handles):
            buf = ref()
            if buf is None or not buf.is_allocated or buf.handle is not handle:
                return None
        return views


class MPIProcessGroup(ProcessGroup):
    """The ranks of an MPI communicator (by default every process `mpirun` started)."""

    def __init__(self, comm: Any = None) -> None:
        self.MPI = _mpi()
        self.comm = comm if comm is not None else self.MPI.COMM_WORLD
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self._ops = {"sum": self.MPI.SUM, "avg": self.MPI.SUM, "prod": self.MPI.PROD, "max": self.MPI.MAX}
        self._reuse: _Reuse | None = None

    def _op(self, op: str) -> Any:
        return self._ops.get(op, self.MPI.MIN)

    def all_reduce(self, t: Tensor, op: str = "sum", out: Tensor | None = None) -> Tensor:
        """The reduction (`sum`, `prod`, `max`, `min`, `avg`) of every rank's `t`, on every rank: a new tensor, or
        written into `out` and `out` returned. Giving `out` (a buffer reused from call to call, or `t` itself, which
        is reduced in place) saves making a tensor per call, which costs as much as reducing tens of kilobytes; a
        call with the same `t` and `out` as the last one also reuses its checks and views of their memory."""
        reuse = self._reuse
        if out is not None and reuse is not None and (arrays := reuse.arrays(t, out)) is not None:
            index_checks.verify(t)  # a read synchronises, as host_array's does
            src, dest = arrays
            check_op(op, src.dtype)
            done: Callable[[], None] | None = None
        else:
            if out is t and whole_buffer(t) is None:
                t.realize()  # still to compute: into memory of its own, which the result then overwrites
            src = host_array(t)
            check_op(op, src.dtype)
            if out is None:
                out, dest, done = output_tensor(t.shape, t)
            else:
                dest, done = output_into(out, t)
                self._reuse = _Reuse.of(t, out, src, dest)
        if dest.ctypes.data == src.ctypes.data:  # `t` is `out`: MPI reads and writes the one buffer
            self.comm.Allreduce(self.MPI.IN_PLACE, dest, op=self._op(op))
        else:
            self.comm.Allreduce(src, dest, op=self._op(op))
        if op == "avg":
            dest /= self.world_size
        if done is not None:
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
