"""Facts about the tensor graph that every package reading it shares: which nodes hold their value in memory
(leaves), the BUFFER node under a leaf and how its value is laid out there, movement ops applied to a view, and the
link between BUFFER nodes and the device `Buffer`s that hold their bytes. The scheduler fuses around these; the
frontend uses them to read, assign and capture tensors."""

from __future__ import annotations

import functools
import itertools
import weakref
from typing import Any

from lazygrad_uop.device import Buffer
from lazygrad_uop.dtype import DType
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.uop import UOp, _arg_key
from lazygrad_uop.views import ShapeTracker

MOVEMENT = GroupOp.Movement | {Ops.VIEW}


def is_kernelized(u: UOp) -> bool:
    """True for ASSIGN(target, KERNEL): a node whose value a scheduled kernel writes."""
    return u.op is Ops.ASSIGN and len(u.src) == 2 and u.src[1].op is Ops.KERNEL


def is_leaf(u: UOp) -> bool:
    """True for nodes whose value is in memory (or will be once their kernel runs)."""
    return u.op is Ops.BUFFER or is_kernelized(u)


def view_base(u: UOp) -> UOp:
    """The node under a chain of movement ops."""
    while u.op in MOVEMENT and u.src:
        u = u.src[0]
    return u


def base_buffer(leaf: UOp) -> UOp:
    """The BUFFER node a leaf's bytes live in."""
    if leaf.op is Ops.BUFFER:
        return leaf
    target = leaf.src[0]
    return view_base(target) if target.op is not Ops.BUFFER else target


def leaf_view(leaf: UOp) -> ShapeTracker:
    """How a leaf's value is laid out in its buffer."""
    if leaf.op is Ops.BUFFER:
        return ShapeTracker.from_shape((leaf.arg,))
    return apply_movement(ShapeTracker.from_shape((base_buffer(leaf).arg,)), movement_chain(leaf.src[0]))


def movement_chain(u: UOp) -> list[UOp]:
    """The movement ops on the way from `u` down to its base, leaf-first."""
    chain = []
    while u.op in MOVEMENT and u.src:
        chain.append(u)
        u = u.src[0]
    return chain[::-1]


def apply_movement(st: ShapeTracker, ops: list[UOp]) -> ShapeTracker:
    """`st` with movement nodes `ops` applied in order (leaf first)."""
    return _moved(st, tuple((m.op, _arg_key(m.arg), m.arg) for m in ops))


# The same views through the same movements recur in every kernel that reads a tensor (forward, backward, update)
# and in every realize of a model. Keyed by the ops' (op, arg), not the nodes, which would keep their graphs (and
# buffers) alive; with the arg's interning key, which tells True from 1 where the arg alone would not.
@functools.lru_cache(maxsize=1 << 15)
def _moved(st: ShapeTracker, ops: tuple[tuple[Ops, Any, Any], ...]) -> ShapeTracker:
    for op, _, arg in ops:
        if op is Ops.VIEW:
            st = st + arg
        elif op is Ops.RESHAPE:
            st = st.reshape(arg)
        elif op is Ops.EXPAND:
            st = st.expand(arg)
        elif op is Ops.PERMUTE:
            st = st.permute(arg)
        elif op is Ops.PAD:
            st = st.pad(arg)
        elif op is Ops.SHRINK:
            st = st.shrink(arg)
        elif op is Ops.FLIP:
            st = st.flip(arg)
        else:
            raise AssertionError(f"{op} is not a movement op")
    return st


def is_view_of_leaf(u: UOp) -> bool:
    """True when `u` is a leaf or movement ops over one: realizing it needs no kernel."""
    return is_leaf(view_base(u))


# *** BUFFER nodes and their device Buffers ***

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
