"""Autograd as a graph rewrite: each tensor-graph op says how the gradient of its output becomes gradients of its
sources, and `compute_gradient` applies those rules from the root back to the targets.

The gradients are ordinary lazy UOps over the forward graph, so the scheduler fuses the backward pass exactly as it
fuses the forward pass: nothing runs until a gradient (or an optimizer step that reads it) is realized.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Collection, Mapping
from typing import Any

from lazygrad.split_reduce import reduce_uop_along_axis
from lazygrad_uop.device import Buffer
from lazygrad_uop.dtype import dtypes, sum_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.pattern import PatternMatcher, UPat
from lazygrad_uop.shape import device_of, shape_of
from lazygrad_uop.tensor_graph import base_buffer, buffer_of, view_base
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
    acc = sum_dtype(u.dtype)
    # on GPUs, column sums and sums around a kept axis in two kernels along one reduced axis (`split_reduce`)
    x = u.cast(acc)
    if (summed := reduce_uop_along_axis(x, Ops.ADD, axes)) is None:
        summed = UOp(Ops.REDUCE_AXIS, acc, (x,), (Ops.ADD, axes))
    return summed.cast(u.dtype)


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
        # d(prod x)/dx_i is the product of the others: prod / x_i where x_i != 0; at a zero, the product of the
        # nonzero others if it is the only zero, else 0 (torch's); prod / x_i is 0 at the nonzeros then
        nonzero = x.ne(_full(x, 0))
        zeros = _expand(_sum(nonzero.where(_full(x, 0), _full(x, 1)), axes), shape)
        nonzero_prod = _expand(UOp(Ops.REDUCE_AXIS, x.dtype, (nonzero.where(x, _full(x, 1)),), ret.arg), shape)
        at_zero = zeros.ne(_full(x, 1)).where(_full(x, 0), nonzero_prod)
        others = nonzero.where(_expand(ret, shape) * _recip(x), at_zero)
        return (_expand(ctx, shape) * others,)
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


# *** functions that say their own backward ***

GradientRule = Callable[[UOp, Callable[[UOp], bool]], dict[UOp, UOp]]
"""Given the gradient of a node and a test of which nodes need one, the gradients of nodes below it."""

_gradient_rules: weakref.WeakKeyDictionary[UOp, GradientRule] = weakref.WeakKeyDictionary()


def set_gradient_rule(out: UOp, rule: GradientRule) -> None:
    """Differentiate `out` by `rule` rather than through the graph it is built from: a function (a convolution)
    whose backward, written out, is cheaper than what the op-by-op rules give. `rule(ctx, needed)` returns the
    gradients of the function's inputs (nodes anywhere below `out`) for those `needed(node)` is true of; they must be
    the whole derivative of `out`, since nothing flows into the nodes between. Held as long as `out` lives."""
    _gradient_rules[out] = rule


def _origin_key(u: UOp, origins: Mapping[UOp, UOp | None]) -> UOp | None:
    """The key of `u` in `origins` when it is a realized tensor: its VIEW, or for one kernelized and not yet run,
    ASSIGN(VIEW, KERNEL), that VIEW."""
    if u.op is Ops.ASSIGN and u.src[1].op is Ops.KERNEL:
        u = u.src[0]
    return u if u.op is Ops.VIEW and u in origins else None


def _sources(u: UOp, origins: Mapping[UOp, UOp | None]) -> tuple[UOp, ...]:
    """What autograd goes through from `u`: its sources, or for a realized tensor the graph it was computed from (none
    for a stale one, whose graph was dropped)."""
    if (key := _origin_key(u, origins)) is not None:
        v = origins[key]
        return () if v is None else (v,)
    return u.src


def _walk(root: UOp, origins: Mapping[UOp, UOp | None]) -> list[UOp]:
    """The nodes autograd sees under `root`, sources first: the graph, continued through realized tensors."""
    if not origins or not any(_origin_key(u, origins) is not None for u in root.toposort):
        return list(root.toposort)
    order: dict[UOp, None] = {}
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        u, expanded = stack.pop()
        if u in order:
            continue
        if expanded:
            order[u] = None
        else:
            stack.append((u, True))
            stack.extend((s, False) for s in reversed(_sources(u, origins)) if s not in order)
    return list(order)


def _on_path(root: UOp, targets: set[UOp], origins: Mapping[UOp, UOp | None]) -> list[UOp]:
    """The nodes under `root` that some target is reachable from, sources first; DETACH cuts the graph. A stale
    realized tensor counts as reaching one: its graph is gone, so whether it did can't be told."""
    reaches: dict[UOp, bool] = {}
    for u in _walk(root, origins):
        if (key := _origin_key(u, origins)) is not None:
            v = origins[key]
            reaches[u] = u in targets or v is None or reaches[v]
        else:
            reaches[u] = u in targets or (u.op is not Ops.DETACH and any(reaches[s] for s in u.src))
    return [u for u, r in reaches.items() if r]


def graph_nodes(root: UOp, origins: Mapping[UOp, UOp | None] | None = None) -> set[UOp]:
    """Every node the gradient of `root` can depend on: its graph, continued through realized tensors' origins."""
    return set(_walk(root, origins or {}))


def depends_on(root: UOp, target: UOp, origins: Mapping[UOp, UOp | None] | None = None) -> bool:
    """Whether `root` is computed from `target` other than through DETACH (through non-differentiable ops too)."""
    return any(u is root for u in _on_path(root, {target}, origins or {}))


def compute_gradient(
    root: UOp, root_grad: UOp, targets: set[UOp], origins: Mapping[UOp, UOp | None] | None = None
) -> dict[UOp, UOp]:
    """The gradient of `root` (seeded with `root_grad`, of root's shape) with respect to each target it depends on.

    Walks the graph from the root back to the targets, applying one rule of `pm_gradient` per node and summing the
    gradients of nodes used more than once. Targets that `root` does not depend on are absent from the result.

    `origins` maps realized tensors (VIEWs of their buffers) to the graphs they were computed from (see
    `RealizedGraphs`): the walk goes through them as through an identity, and the gradients read the stored values
    instead of computing them again.
    """
    origins = origins if origins is not None else {}
    grads: dict[UOp, UOp] = {root: root_grad}
    inverse: dict[UOp, UOp] = {}
    path = _on_path(root, targets, origins)
    on_path = set(path)
    for node in reversed(path):
        if (g := grads.get(node)) is None:
            continue
        if (key := _origin_key(node, origins)) is not None:
            if (v := origins[key]) is None:
                if node in targets:
                    continue
                raise RuntimeError(
                    "the gradient goes through a realized tensor whose inputs were overwritten in place after it was "
                    "computed (e.g. parameters updated by an optimizer step, or a TinyJit replay that wrote new "
                    "values), so its graph no longer describes it: run the forward pass again from the current "
                    "values, or .detach() that tensor to use it as a constant"
                )
            grads[v] = grads[v] + g if v in grads else g
            inverse[v] = node
            continue
        if node.op in (Ops.BUFFER, Ops.VIEW, Ops.CONST):
            continue
        if (rule := _gradient_rules.get(node)) is not None:
            for s, sg in rule(g, on_path.__contains__).items():
                grads[s] = grads[s] + sg if s in grads else sg
            continue
        src_grads = pm_gradient.rewrite(node, ctx=g)
        if src_grads is None:
            raise NotImplementedError(f"no gradient rule for {node.op}; add one to pm_gradient in lazygrad.gradient")
        for s, sg in zip(node.src, src_grads):
            if sg is not None:
                grads[s] = grads[s] + sg if s in grads else sg
    out = {t: grads[t] for t in targets if t in grads}
    # a rule that reads its own output (exp, max, ...) reads the realized buffer rather than computing it again
    return {t: g.substitute(inverse) for t, g in out.items()} if inverse else out


class RealizedGraphs:
    """For realized tensors that autograd may have to go through, the graph each was computed from.

    Realizing replaces a tensor's graph by a VIEW of its buffer in every live tensor, which would make it a constant
    to autograd. So when a realize computes a value whose graph reaches a tensor with requires_grad=True
    (differentiably: not only through DETACH), the VIEW is recorded here with that graph, one level deep: its
    sources are themselves the VIEWs of the other values computed in the same realize, so a chain of realizes is a
    chain of entries, and the gradient reads the stored values rather than computing them again.

    Memory: entries are held weakly by their VIEW, so an entry lives only as long as some tensor (or graph) can
    still reach the realized value. An in-place update (an ASSIGN, e.g. an optimizer step, or a TinyJit replay) of a
    buffer that a recorded graph reads makes that entry stale: its graph is dropped (freeing what it held) and a
    backward through it raises instead of silently using the new values. Values realized by an ASSIGN keep no
    graph: the update of a parameter is not part of the next step's autograd.
    """

    def __init__(self) -> None:
        self._graphs: weakref.WeakKeyDictionary[UOp, UOp | None] = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        return len(self._graphs)

    @property
    def mapping(self) -> Mapping[UOp, UOp | None]:
        """The live entries: realized VIEW -> the graph it was computed from (None: stale)."""
        return self._graphs

    def plan(self, becomes: Mapping[UOp, UOp], leaves: set[UOp]) -> tuple[dict[UOp, UOp | None], set[UOp]]:
        """Before a realize runs kernelize's `becomes`: the entries it adds (stale already where the value reads a
        buffer the same realize overwrites), and the BUFFER nodes its assigns overwrite. `leaves` are the nodes of
        the tensors with requires_grad=True."""
        written = {base_buffer(view_base(r.src[0])) for r in becomes if r.op is Ops.ASSIGN}
        roots = [r for r in becomes if r.op not in (Ops.ASSIGN, Ops.DETACH)]
        if not roots or not (leaves or self._graphs):
            return {}, written
        reach: dict[UOp, bool] = {}
        old: dict[UOp, bool] = {}
        for u in UOp(Ops.SINK, src=tuple(roots)).toposort:
            known = u.op is Ops.VIEW and u in self._graphs
            reach[u] = known or u in leaves or (u.op is not Ops.DETACH and any(reach[s] for s in u.src))
            # an ASSIGN is the buffer after its write; anything else reading a written buffer reads the old contents
            old[u] = (u.op is Ops.BUFFER and u in written) or (u.op is not Ops.ASSIGN and any(old[s] for s in u.src))
        needed = [r for r in roots if any(reach[s] for s in r.src)]
        if not needed:
            return {}, written
        final = {r: a.src[0] for r, a in becomes.items()}
        srcs = UOp(Ops.SINK, src=tuple(s for r in needed for s in r.src)).substitute(final).src
        entries: dict[UOp, UOp | None] = {}
        i = 0
        for r in needed:
            entries[final[r]] = None if old[r] else r.replace(src=srcs[i : i + len(r.src)])
            i += len(r.src)
        return entries, written

    def invalidate(self, written: Collection[Buffer]) -> None:
        """Mark stale the entries whose value or graph reads one of the device buffers `written`: kernels overwrote
        them without a realize (a TinyJit replay)."""
        for k, v in list(self._graphs.items()):
            if v is None:
                continue
            read = (buffer_of(u) for u in v.toposort if u.op is Ops.BUFFER)
            if buffer_of(k.src[0]) in written or any(b in written for b in read):
                self._graphs[k] = None

    def commit(self, entries: Mapping[UOp, UOp | None], written: set[UOp]) -> None:
        """After the realize ran: mark the entries that read overwritten buffers stale, then add `entries`."""
        if written:
            for k, v in list(self._graphs.items()):
                if v is not None and (k.src[0] in written or any(b in v.toposort for b in written)):
                    self._graphs[k] = None
        self._graphs.update(entries)


realized_graphs = RealizedGraphs()
"""The graphs of the realized tensors autograd may go through (see `RealizedGraphs`)."""
