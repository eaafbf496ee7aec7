"""The link between BUFFER nodes of the tensor graph and the device `Buffer`s that hold their bytes."""

from __future__ import annotations

import itertools
import weakref

from lazygrad_uop.device import Buffer
from lazygrad_uop.dtype import DType
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

_buffers: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()
_unique = itertools.count()


def new_buffer(device: str, size: int, dtype: DType) -> UOp:
    """A BUFFER node that no other node equals (each gets its own UNIQUE source)."""
    return UOp(Ops.BUFFER, dtype, (UOp(Ops.UNIQUE, arg=next(_unique)), UOp(Ops.DEVICE, arg=device)), size)


def buffer_of(u: UOp) -> Buffer:
    """The device Buffer behind a BUFFER node, created (not yet allocated) on first use."""
    if u.op is not Ops.BUFFER:
        raise TypeError(f"buffer_of needs a BUFFER node, got {u.op}")
    if (buf := _buffers.get(u)) is None:
        buf = _buffers[u] = Buffer(u.src[1].arg, u.arg, u.dtype)
    return buf


def attach_buffer(u: UOp, buf: Buffer) -> None:
    """Make `buf` the storage of BUFFER node `u` (used for data that already exists, e.g. from numpy)."""
    if (u.arg, u.dtype) != (buf.size, buf.dtype):
        raise ValueError(f"{buf!r} doesn't fit BUFFER node of {u.arg} x {u.dtype!r}")
    _buffers[u] = buf
