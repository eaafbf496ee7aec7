"""Autograd as a graph rewrite: each tensor-graph op says how the gradient of its output becomes gradients of its
sources, and `compute_gradient` applies those rules from the root back to the targets.

The gradients are ordinary lazy UOps over the forward graph, so the scheduler fuses the backward pass exactly as it
fuses the forward pass: nothing runs until a gradient (or an optimizer step that reads it) is realized.
"""

from __future__ import annotations

import math
from typing import Any

from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.pattern import PatternMatcher, UPat
from lazygrad_uop.shape import device_of, shape_of
from lazygrad_uop.uop import UOp

# *** tensor-graph builders: shapes must match exactly, so constants get one and sums keep their axes ***


def _full(like: UOp, value: Any) -> UOp:
    """A constant with the dtype, shape and device of `like`."""
    c = UOp(Ops.CONST, like.dtype, (UOp(Ops.DEVICE, arg=device_of(like)),), dtypes.as_const(value, like.dtype))
    return _expand(_reshape(c, (1,) * len(shape_of(like))), shape_of(like))


def _reshape(u: UOp, shape: tuple[int, ...]) -> UOp:
    return u if shape_of(u) == tuple(shape) else UOp(Ops.RESHAPE, u.dtype, (u,), tuple(shape))


def _expand(u: UOp, shape: tuple[int, ...]) -> UOp:
    return u if shape_of(u) == tuple(shape) else UOp(Ops.EXPAND, u.dtype, (u,), tuple(shape))


def _sum(u: UOp, axes: tuple[int, ...]) -> UOp:
    """Sum over `axes`, keeping them as size 1; half precision accumulates in float32 as Tensor.sum does."""
    if not axes:
        return u
    acc = dtypes.float32 if u.dtype in (dtypes.float16, dtypes.bfloat16) else u.dtype
    return UOp(Ops.REDUCE_AXIS, acc, (u.cast(acc),), (Ops.ADD, axes)).cast(u.dtype)


def _sum_to(g: UOp, shape: tuple[int, ...]) -> UOp:
    """`g` summed over the axes where `shape` has size 1 and `g` does not: the adjoint of EXPAND."""
    return _sum(g, tuple(i for i, (s, d) in enumerate(zip(shape, shape_of(g))) if s == 1 and d != 1))


# *** one rule per op: the output's gradient `ctx` -> one gradient (or None) per source ***


def _reduce_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None]:
    x, (op, axes) = ret.src[0], ret.arg
    shape = shape_of(x)
    if op is Ops.ADD:
        return (_expand(ctx, shape),)
    if op is Ops.MAX:
        # split the gradient evenly among the elements equal to the max, as torch's amax does
        is_max = x.ne(_expand(ret, shape)).where(_full(x, 0), _full(x, 1))
        count = _expand(_sum(is_max, axes), shape)
        return (is_max * _recip(count) * _expand(ctx, shape),)
    if op is Ops.MUL:
        # d(prod x)/dx_i = prod / x_i; undefined where an x_i is 0 (as in every autograd that skips the 0 special case)
        return (_expand(ctx * ret, shape) * _recip(x),)
    raise NotImplementedError(f"no gradient for a {op} reduction")


def _max_grad(ctx: UOp, ret: UOp) -> tuple[UOp, UOp]:
    a, b = ret.src
    # ties split the gradient in half, as torch.maximum does
    tie = a.ne(b).where(_full(ctx, 0), ctx * _full(ctx, 0.5))
    return ((b < a).where(ctx, tie), (a < b).where(ctx, tie))


def _copy_grad(ctx: UOp, ret: UOp) -> tuple[None, UOp]:
    return (None, UOp(Ops.COPY, ctx.dtype, (UOp(Ops.DEVICE, arg=device_of(ret.src[1])), ctx)))


def _cast_grad(ctx: UOp, ret: UOp) -> tuple[UOp | None]:
    # the gradient goes back in the source's type; a cast to or from an integer or bool passes none
    return (ctx.cast(ret.src[0].dtype) if dtypes.is_float(ret.src[0].dtype) and dtypes.is_float(ret.dtype) else None,)


def _pad_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
    return (UOp(Ops.SHRINK, ctx.dtype, (ctx,), tuple((b, b + s) for (b, _), s in zip(ret.arg, shape_of(ret.src[0])))),)


def _shrink_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
    return (UOp(Ops.PAD, ctx.dtype, (ctx,), tuple((b, s - e) for (b, e), s in zip(ret.arg, shape_of(ret.src[0])))),)


def _permute_grad(ctx: UOp, ret: UOp) -> tuple[UOp]:
    inverse = tuple(sorted(range(len(ret.arg)), key=ret.arg.__getitem__))
    return (UOp(Ops.PERMUTE, ctx.dtype, (ctx,), inverse),)


def _where_grad(ctx: UOp, ret: UOp) -> tuple[None, UOp, UOp]:
    zero = _full(ctx, 0)
    return (None, ret.src[0].where(ctx, zero), ret.src[0].where(zero, ctx))


def _cos(u: UOp) -> UOp:
    # sin(pi/2 - x), with the primitives the forward pass already has
    return (_full(u, math.pi / 2) + _neg(u)).alu(Ops.SIN)


def _neg(u: UOp) -> UOp:
    return u * _full(u, -1)


def _recip(u: UOp) -> UOp:
    return u.alu(Ops.RECIP)


LN2 = math.log(2)
NO_GRADIENT = (
    Ops.DETACH, Ops.CMPLT, Ops.CMPNE, Ops.TRUNC, Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR,
    Ops.BITCAST, Ops.THREEFRY,
)  # fmt: skip

pm_gradient = PatternMatcher(
    [
        (UPat(Ops.ADD), lambda ctx: (ctx, ctx)),
        (UPat(Ops.MUL, name="ret"), lambda ctx, ret: (ret.src[1] * ctx, ret.src[0] * ctx)),
        (UPat(Ops.NEG), lambda ctx: (_neg(ctx),)),
        (UPat(Ops.MAX, name="ret"), _max_grad),
        (UPat(Ops.RECIP, name="ret"), lambda ctx, ret: (_neg(ctx * ret * ret),)),
        (UPat(Ops.EXP2, name="ret"), lambda ctx, ret: (ctx * ret * _full(ret, LN2),)),
        (UPat(Ops.LOG2, name="ret"), lambda ctx, ret: (ctx * _recip(ret.src[0] * _full(ret, LN2)),)),
        (UPat(Ops.SQRT, name="ret"), lambda ctx, ret: (ctx * _recip(ret * _full(ret, 2)),)),
        (UPat(Ops.SIN, name="ret"), lambda ctx, ret: (ctx * _cos(ret.src[0]),)),
        (UPat(Ops.WHERE, name="ret"), _where_grad),
        (UPat(Ops.CAST, name="ret"), _cast_grad),
        (UPat(Ops.REDUCE_AXIS, name="ret"), _reduce_grad),
        # movement ops: the gradient moves back the other way
        (UPat(Ops.RESHAPE, name="ret"), lambda ctx, ret: (_reshape(ctx, shape_of(ret.src[0])),)),
        (UPat(Ops.EXPAND, name="ret"), lambda ctx, ret: (_sum_to(ctx, shape_of(ret.src[0])),)),
        (UPat(Ops.PERMUTE, name="ret"), _permute_grad),
        (UPat(Ops.PAD, name="ret"), _pad_grad),
        (UPat(Ops.SHRINK, name="ret"), _shrink_grad),
        (UPat(Ops.FLIP, name="ret"), lambda ctx, ret: (UOp(Ops.FLIP, ctx.dtype, (ctx,), ret.arg),)),
        (UPat(Ops.CONTIGUOUS), lambda ctx: (ctx,)),
        (UPat(Ops.COPY, name="ret"), _copy_grad),
        # later readers see the assigned value, not the old contents of the target
        (UPat(Ops.ASSIGN), lambda ctx: (None, ctx)),
        # piecewise constant, or no gradient by design
        (UPat(NO_GRADIENT, name="ret"), lambda ret: (None,) * len(ret.src)),
    ]
)


def _on_path(root: UOp, targets: set[UOp]) -> list[UOp]:
    """The nodes under `root` that some target is reachable from, sources first; DETACH cuts the graph."""
    reaches: dict[UOp, bool] = {}
    for u in root.toposort:
        reaches[u] = u in targets or (u.op is not Ops.DETACH and any(reaches[s] for s in u.src))
    return [u for u, r in reaches.items() if r]


def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp]) -> dict[UOp, UOp]:
    """The gradient of `root` (seeded with `root_grad`, of root's shape) with respect to each target it depends on.

    Walks the graph from the root back to the targets, applying one rule of `pm_gradient` per node and summing the
    gradients of nodes used more than once. Targets that `root` does not depend on are absent from the result.
    """
    grads: dict[UOp, UOp] = {root: root_grad}
    for node in reversed(_on_path(root, targets)):
        if (g := grads.get(node)) is None or node.op in (Ops.BUFFER, Ops.VIEW, Ops.CONST):
            continue
        src_grads = pm_gradient.rewrite(node, ctx=g)
        if src_grads is None:
            raise NotImplementedError(f"no gradient rule for {node.op}; add one to pm_gradient in lazygrad.gradient")
        for s, sg in zip(node.src, src_grads):
            if sg is not None:
                grads[s] = grads[s] + sg if s in grads else sg
    return {t: grads[t] for t in targets if t in grads}
