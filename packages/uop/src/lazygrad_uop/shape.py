"""Shapes and devices of tensor-graph nodes, inferred from their sources and checked where they are built."""

from __future__ import annotations

import math

from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.uop import UOp, eval_uop, sint
from lazygrad_uop.views import span

# A dim is an int, or a symbolic size: an expression of bound variables (`Variable("n", 1, 9).bind(4)`), which one
# compiled kernel serves for every value of the variables.
Shape = tuple[sint, ...]


def resolve(x: sint) -> int:
    """The value of a size: an int as is, a symbolic size evaluated at the values its variables are bound to."""
    if isinstance(x, int):
        return x
    try:
        value = eval_uop(x)
    except KeyError:
        value = None
    if not isinstance(value, int):
        raise ShapeError(f"size {x.render()} has no integer value; bind its variables with .bind(value)")
    return value


def _add(a: sint, b: sint) -> sint:
    """a + b, as ShapeTracker.pad builds it: adding an int 0 leaves a symbolic size as it is."""
    if isinstance(a, int) and a == 0:
        return b
    if isinstance(b, int) and b == 0:
        return a
    return a + b


def _resolved(shape: Shape) -> tuple[int, ...]:
    return tuple(map(resolve, shape))


class ShapeError(ValueError):
    """A movement or elementwise op was given shapes or arguments that don't fit."""


def shape_of(u: UOp) -> Shape:
    """The shape of tensor-graph node `u` (memoised on the node)."""
    if "_shape" in u.__dict__:
        return u.__dict__["_shape"]
    # sources first, iteratively (a long chain must not recurse deeply), visiting only nodes without a shape yet:
    # a new node over an existing graph costs its own sources, not the whole graph
    stack: list[tuple[UOp, bool]] = [(u, False)]
    while stack:
        n, ready = stack.pop()
        if "_shape" in n.__dict__:
            continue
        if ready:
            n.__dict__["_shape"] = _infer(n)
        else:
            stack.append((n, True))
            stack.extend((s, False) for s in n.src if "_shape" not in s.__dict__)
    return u.__dict__["_shape"]


def _src_shape(u: UOp, i: int = 0) -> Shape:
    return u.src[i].__dict__["_shape"]


def _infer(u: UOp) -> Shape | None:
    op, arg = u.op, u.arg
    if op in (Ops.DEVICE, Ops.UNIQUE, Ops.KERNEL, Ops.SINK, Ops.DEFINE_VAR, Ops.BIND):
        return None
    if op is Ops.BUFFER:
        return (arg,)
    if op is Ops.CONST:
        return () if not u.src or u.src[0].op is Ops.DEVICE else u.src[0].arg.shape
    if op is Ops.VIEW:
        return arg.shape
    if op in (Ops.COPY,):
        return _src_shape(u, 1)
    if op is Ops.MULTI:
        return _multi_shape(u)
    if op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.ASSIGN, Ops.CAST, Ops.BITCAST):
        return _src_shape(u)
    s = _src_shape(u) if u.src else None
    if op is Ops.RESHAPE:
        if math.prod(_resolved(arg)) != math.prod(_resolved(s)):
            raise ShapeError(f"can't reshape {s} ({math.prod(s)} elements) to {arg} ({math.prod(arg)} elements)")
        return tuple(arg)
    if op is Ops.EXPAND:
        if len(arg) != len(s) or any(a != b and b != 1 for a, b in zip(arg, s)):
            raise ShapeError(f"can't expand {s} to {arg}: only size-1 dimensions expand")
        return tuple(arg)
    if op is Ops.PERMUTE:
        if sorted(arg) != list(range(len(s))):
            raise ShapeError(f"permutation {arg} is not a permutation of the {len(s)} axes of {s}")
        return tuple(s[i] for i in arg)
    if op is Ops.PAD:
        if len(arg) != len(s) or any(resolve(b) < 0 or resolve(a) < 0 for b, a in arg):
            raise ShapeError(f"pad {arg} needs one non-negative (before, after) pair per axis of {s}")
        return tuple(_add(_add(d, b), a) for d, (b, a) in zip(s, arg))
    if op is Ops.SHRINK:
        if len(arg) != len(s) or any(not 0 <= resolve(b) <= resolve(e) <= resolve(d) for d, (b, e) in zip(s, arg)):
            raise ShapeError(f"shrink {arg} needs one (start, end) with 0 <= start <= end <= size per axis of {s}")
        # built as ShapeTracker.shrink builds it, so the tensor graph's symbolic shapes are its views' shapes
        return tuple(span(b, e) for b, e in arg)
    if op is Ops.FLIP:
        if len(arg) != len(s):
            raise ShapeError(f"flip {arg} needs one bool per axis of {s}")
        return s
    if op is Ops.REDUCE_AXIS:
        axes = arg[1]
        if any(not 0 <= a < len(s) for a in axes):
            raise ShapeError(f"reduce axes {axes} out of range for shape {s}")
        return tuple(1 if i in axes else d for i, d in enumerate(s))
    if op in GroupOp.ALU:
        shapes = {n.__dict__["_shape"] for n in u.src}
        if len(shapes) != 1:
            raise ShapeError(
                f"{op.name} needs sources of one shape, got {sorted(shapes, key=str)}; broadcast them first"
            )
        return s
    raise ShapeError(f"{op} has no shape in a tensor graph")


def _multi_shape(u: UOp) -> Shape:
    shapes = {s.__dict__["_shape"] for s in u.src}
    if len(shapes) != 1:
        raise ShapeError(f"the parts of a tensor on several devices must have one shape, got {sorted(shapes, key=str)}")
    s = shapes.pop()
    if u.arg is None:
        return s
    if not 0 <= u.arg < len(s):
        raise ShapeError(f"sharded axis {u.arg} out of range for parts of shape {s}")
    return tuple(d * len(u.src) if i == u.arg else d for i, d in enumerate(s))


def device_of(u: UOp) -> str | tuple[str, ...] | None:
    """The device a tensor-graph node lives on, the tuple of devices of a MULTI (a tensor on several devices), or
    None for nodes without one (memoised on the nodes of the path to it, so asking along a long chain of ops doesn't
    walk the chain each time)."""
    path = [u]
    stops = (Ops.BUFFER, Ops.COPY, Ops.DEVICE, Ops.MULTI)
    while "_device" not in path[-1].__dict__ and path[-1].src and path[-1].op not in stops:
        path.append(path[-1].src[0])
    end = path[-1]
    if "_device" in end.__dict__:
        dev = end.__dict__["_device"]
    elif end.op is Ops.MULTI:
        dev = tuple(device_of(s) for s in end.src)
    elif end.op is Ops.DEVICE:
        dev = end.arg
    elif end.op is Ops.BUFFER:
        dev = end.src[1].arg
    elif end.op is Ops.COPY:
        dev = end.src[0].arg
    else:
        dev = None
    for n in path:
        n.__dict__["_device"] = dev
    return dev
