"""`ProcessGroup`: the collectives every backend provides (MPI, NCCL), on lazygrad tensors.

Each collective realizes its input, runs the communication library on the tensor's memory (without a copy where the
device's memory is host memory, as the CPU's is) and returns a new, realized tensor on the input's device. The
communication runs at once: a collective is a synchronisation point between the ranks, so every rank must call the
same collectives in the same order with tensors of the same shape and dtype.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import numpy as np

from lazygrad import Tensor, index_checks
from lazygrad_uop.device import Buffer
from lazygrad_uop.dtype import to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.tensor_graph import buffer_of

REDUCE_OPS = ("sum", "prod", "max", "min", "avg")


class CollectiveError(ValueError):
    """A collective was called with arguments that can't work (an unknown op, a shape that doesn't split)."""


def check_op(op: str, dtype: object) -> None:
    """Raise CollectiveError unless `op` is a reduction this module knows and fits `dtype`."""
    if op not in REDUCE_OPS:
        raise CollectiveError(f"unknown reduction {op!r}; use one of {', '.join(REDUCE_OPS)}")
    if op == "avg" and not np.issubdtype(np.dtype(dtype), np.floating):  # type: ignore[arg-type]
        raise CollectiveError(f"an 'avg' all-reduce needs a floating-point tensor, got {dtype}; cast it first")


def whole_buffer(t: Tensor) -> Buffer | None:
    """The buffer that tensor `t` is, all of it in order, when `t` is nothing more (nothing to compute, no view)."""
    u = t.uop
    if u.op is not Ops.VIEW or not u.src or u.src[0].op is not Ops.BUFFER:
        return None
    return buffer_of(u.src[0]) if u.arg.contiguous and u.arg.size == u.src[0].arg else None


def _host_memory(buf: Buffer, shape: tuple[int, ...]) -> np.ndarray | None:
    """`buf`'s memory as a numpy array of `shape`, where the device's memory is host memory, else None."""
    as_buffer = getattr(buf.allocator, "_as_buffer", None)
    if as_buffer is None or not buf.nbytes:
        return None
    return np.frombuffer(as_buffer(buf.handle), dtype=to_numpy_dtype(buf.dtype), count=buf.size).reshape(shape)


def host_array(t: Tensor) -> np.ndarray:
    """`t` realized, as a C-contiguous numpy array: a read-only view of the device memory where the device's memory
    is host memory, else a copy."""
    if isinstance(t.device, tuple):
        raise CollectiveError(
            f"a process group's collectives take a tensor on one device, not on {t.device}; gather it with .to()"
        )
    # a realized tensor that is a whole buffer is read where it lies; going through Tensor.numpy would schedule it
    # again, which costs more than an all-reduce of a megabyte
    buf = whole_buffer(t)
    if buf is not None and buf.is_allocated and (view := _host_memory(buf, t.shape)) is not None:
        index_checks.verify(t)  # a read synchronises: pending index checks raise here, as Tensor.numpy's do
        view.flags.writeable = False
        return view
    return np.ascontiguousarray(t.numpy())


def output_tensor(shape: tuple[int, ...], like: Tensor) -> tuple[Tensor, np.ndarray, Callable[[], None]]:
    """A new realized tensor of `shape` with `like`'s dtype and device, a writable numpy array that the
    communication library fills, and the function to call once it has: where the device's memory is host memory the
    array *is* that memory (nothing to do), else a host array copied in."""
    out = Tensor.empty(*shape, dtype=like.dtype, device=like.device)
    buf = whole_buffer(out)
    assert buf is not None, "Tensor.empty is a whole buffer"
    return (out, *_filled_by_host(buf.allocate(), out))


def _filled_by_host(buf: Buffer, t: Tensor) -> tuple[np.ndarray, Callable[[], None]]:
    """A writable array of `t`'s shape and dtype that fills `buf`, `t`'s allocated buffer, and the function to call
    once it is filled: the buffer's memory itself where that is host memory (nothing to do), else a host array
    copied in."""
    if (view := _host_memory(buf, t.shape)) is not None:
        return view, lambda: None
    host = np.empty(t.shape, dtype=to_numpy_dtype(t.dtype))
    return host, lambda: buf.copyin(memoryview(host.reshape(-1)).cast("B")) if buf.nbytes else None


def out_buffer(out: Tensor, like: Tensor) -> Buffer:
    """The allocated buffer of `out`, a tensor given to a collective to be overwritten with its result (reused
    across calls, or the input itself), checked: it must be a whole buffer (`Tensor.empty(...)`, or a realized
    tensor that is not a view) of `like`'s shape, dtype and device."""
    if not isinstance(out, Tensor):
        raise CollectiveError(f"out must be a Tensor, got {type(out).__name__}")
    if (out.shape, out.dtype, out.device) != (like.shape, like.dtype, like.device):
        raise CollectiveError(
            f"out is {out.shape} {out.dtype!r} on {out.device}, the result is {like.shape} {like.dtype!r} on "
            f"{like.device}; make it with Tensor.empty(*t.shape, dtype=t.dtype, device=t.device)"
        )
    buf = whole_buffer(out)
    if buf is None:
        raise CollectiveError(
            "out must be a tensor with its own memory (Tensor.empty, or a realized tensor that is not a view); "
            "realize it with .contiguous().realize() first"
        )
    return buf if buf.is_allocated else buf.allocate()


def output_into(out: Tensor, like: Tensor) -> tuple[np.ndarray, Callable[[], None]]:
    """A writable numpy array that the communication library fills with the result for `out` (checked by
    `out_buffer`), and the function to call once it has.

    The write lands in `out`'s memory at once, as torch.distributed's in-place all_reduce writes: lazy tensors
    computed from `out` and not yet realized see the new values, so realize those that need the old ones first."""
    return _filled_by_host(out_buffer(out, like), out)


class ProcessGroup(abc.ABC):
    """A set of processes (ranks 0 .. world_size-1) that exchange tensors. Every rank calls the same collectives in
    the same order; each returns a new tensor and leaves its input as it was, except an all_reduce given `out`."""

    rank: int
    world_size: int

    @abc.abstractmethod
    def all_reduce(self, t: Tensor, op: str = "sum", out: Tensor | None = None) -> Tensor:
        """The reduction (`sum`, `prod`, `max`, `min`, `avg`) of every rank's `t`, on every rank: a new tensor, or
        written into `out` (see `output_into`; `t` itself for an in-place all-reduce) and `out` returned."""

    @abc.abstractmethod
    def broadcast(self, t: Tensor, root: int = 0) -> Tensor:
        """Rank `root`'s `t` on every rank (the other ranks' `t` gives only the shape and dtype)."""

    @abc.abstractmethod
    def all_gather(self, t: Tensor, axis: int = 0) -> Tensor:
        """Every rank's `t` concatenated along `axis` in rank order, on every rank."""

    @abc.abstractmethod
    def reduce_scatter(self, t: Tensor, op: str = "sum", axis: int = 0) -> Tensor:
        """The reduction of every rank's `t`, split in world_size equal parts along `axis`: rank r gets part r."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank has called it."""

    def _check_root(self, root: int) -> None:
        if not 0 <= root < self.world_size:
            raise CollectiveError(f"root rank {root} is not in this group of {self.world_size} ranks")

    def _scatter_axis(self, t: Tensor, axis: int) -> int:
        if not -t.ndim <= axis < max(t.ndim, 1) or t.ndim == 0:
            raise CollectiveError(f"axis {axis} is out of range for a tensor of shape {t.shape}")
        axis %= t.ndim
        if t.shape[axis] % self.world_size:
            raise CollectiveError(
                f"reduce_scatter splits axis {axis} of size {t.shape[axis]} in {self.world_size} equal parts; pad "
                f"it to a multiple of {self.world_size}"
            )
        return axis
