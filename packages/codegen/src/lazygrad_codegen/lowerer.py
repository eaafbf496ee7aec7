"""Lowering: a kernel AST (a SINK of STOREs over LOADs indexed through VIEWs) becomes a graph of linear-level ops.

Every axis of the kernel's full shape F gets an index: a RANGE loop, a SPECIAL hardware index on renderers with
local/global dimensions, or the constant 0 for size-1 axes. The rewrite rules below then replace

- `LOAD(buf, VIEW)` by `LOAD(INDEX(buf, idx, valid), 0, valid)` (a gated load when the view has a mask),
- `CONST(VIEW)` by the constant, or `valid.where(constant, 0)` when masked,
- `REDUCE_AXIS` by a `DEFINE_ACC` over the reduce loops and an `ASSIGN` that folds one element into it,
- `STORE(buf, VIEW, value)` by `STORE(INDEX(buf, idx), value)`,

with the `(idx, valid)` pairs from `ShapeTracker.to_indexed_uops`. The result is still a graph (a SINK of STOREs);
`lazygrad_codegen.linearizer` orders it into loops, after the symbolic engine has simplified the index math.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from lazygrad_uop.device import Renderer
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.pattern import PatternMatcher, UPat, graph_rewrite
from lazygrad_uop.uop import UOp, sint
from lazygrad_uop.views import ShapeTracker


class KernelASTError(ValueError):
    """A kernel AST breaks the scheduler-codegen contract (see the package README)."""


# the hardware indices a renderer with local dimensions offers for the global grid
MAX_GLOBAL_DIMS = 3


@dataclass(frozen=True)
class KernelShape:
    """The shapes a kernel AST works on: the full shape F (below its reductions), the output shape R, and the axes
    it reduces over (empty without a reduction, when F == R)."""

    full: tuple[sint, ...]
    output: tuple[sint, ...]
    reduce_axes: tuple[int, ...]

    @property
    def has_reduce(self) -> bool:
        """Whether the kernel holds a REDUCE_AXIS."""
        return bool(self.reduce_axes)


@dataclass(frozen=True)
class LoweredKernel:
    """A kernel after lowering: the linear-level graph, its launch dimensions and its shapes."""

    sink: UOp
    shape: KernelShape
    global_size: tuple[sint, sint, sint]
    local_size: tuple[int, int, int]


def _is_one(s: sint) -> bool:
    return isinstance(s, int) and s == 1


def kernel_shape(ast: UOp) -> KernelShape:
    """Check that `ast` is a kernel AST as the contract describes, and return its shapes."""
    if ast.op is not Ops.SINK or not ast.src:
        raise KernelASTError(f"a kernel AST is a SINK of one or more STOREs, got {ast.op} with {len(ast.src)} sources")
    outputs: set[tuple[sint, ...]] = set()
    for st in ast.src:
        if (
            st.op is not Ops.STORE
            or len(st.src) != 3
            or st.src[0].op is not Ops.DEFINE_GLOBAL
            or st.src[1].op is not Ops.VIEW
        ):
            raise KernelASTError(
                f"every source of a kernel SINK must be STORE(DEFINE_GLOBAL, VIEW, value), got {st.op}"
            )
        outputs.add(st.src[1].arg.shape)
    if len(outputs) != 1:
        raise KernelASTError(f"all STOREs of one kernel must have the same shape, got {sorted(outputs, key=str)}")
    (output,) = outputs
    reduces = [u for u in ast.toposort if u.op is Ops.REDUCE_AXIS]
    if not reduces:
        return KernelShape(output, output, ())
    fulls: set[tuple[sint, ...]] = set()
    axes_seen: set[tuple[int, ...]] = set()
    for r in reduces:
        op, axes = r.arg
        if op not in (Ops.ADD, Ops.MAX, Ops.MUL):
            raise KernelASTError(f"REDUCE_AXIS reduces with ADD, MAX or MUL, got {op}")
        fulls.add(_ast_shape(r.src[0]))
        axes_seen.add(tuple(sorted(axes)))
        if any(u.op is Ops.REDUCE_AXIS for u in r.src[0].toposort):
            raise KernelASTError("a REDUCE_AXIS may not sit inside another REDUCE_AXIS's source in one kernel")
    if len(fulls) != 1 or len(axes_seen) != 1:
        raise KernelASTError(
            f"all REDUCE_AXIS of one kernel must share the full shape and axes, got shapes {sorted(fulls, key=str)} "
            f"and axes {sorted(axes_seen)}"
        )
    (full,), (axes,) = fulls, axes_seen
    if len(full) != len(output) or any(not 0 <= a < len(full) for a in axes):
        raise KernelASTError(f"reduce axes {axes} of full shape {full} don't fit output shape {output}")
    expected = tuple(1 if i in axes else s for i, s in enumerate(full))
    if expected != output:
        raise KernelASTError(f"reducing {full} over axes {axes} gives {expected}, but the STOREs have shape {output}")
    return KernelShape(full, output, axes)


def _ast_shape(u: UOp) -> tuple[sint, ...]:
    """The shape of a value in a kernel AST: that of the nearest LOAD, CONST or REDUCE_AXIS below it (elementwise
    ops keep their sources' shape)."""
    frontier, seen = deque([u]), set()
    while frontier:
        n = frontier.popleft()
        if n in seen:
            continue
        seen.add(n)
        if n.op in (Ops.LOAD, Ops.CONST) and n.src and n.src[-1].op is Ops.VIEW:
            return n.src[-1].arg.shape
        if n.op is Ops.REDUCE_AXIS:
            return tuple(1 if i in n.arg[1] else s for i, s in enumerate(_ast_shape(n.src[0])))
        frontier.extend(n.src)
    raise KernelASTError(f"can't tell the shape of {u.op}: no LOAD or CONST with a VIEW below it")


@dataclass
class _Lowering:
    """What the lowering rules need: the index of every axis, for loads of the full shape and of the output shape."""

    shape: KernelShape
    full_idxs: list[UOp]
    output_idxs: list[UOp]
    reduce_ranges: tuple[UOp, ...]
    accumulators: dict[UOp, UOp] = field(default_factory=dict)

    def idxs_for(self, view_shape: tuple[sint, ...]) -> list[UOp]:
        if view_shape == self.shape.full:
            return self.full_idxs
        if view_shape == self.shape.output:
            return self.output_idxs
        raise KernelASTError(
            f"a VIEW of shape {view_shape} fits neither the full shape {self.shape.full} nor the output shape "
            f"{self.shape.output} of its kernel"
        )

    def index(self, view: UOp) -> tuple[UOp, UOp]:
        st: ShapeTracker = view.arg
        return st.to_indexed_uops(self.idxs_for(st.shape))


def _identity(op: Ops, dtype: DType) -> UOp:
    if op is Ops.ADD:
        return UOp.const(dtype, 0)
    if op is Ops.MUL:
        return UOp.const(dtype, 1)
    return UOp.const(dtype, dtypes.min(dtype))


def _lower_load(ctx: _Lowering, ld: UOp, buf: UOp, view: UOp) -> UOp:
    idx, valid = ctx.index(view)
    # the gate is checked by the renderer before the memory is touched: masked-out indices may be out of bounds
    return UOp(Ops.LOAD, ld.dtype, (UOp(Ops.INDEX, buf.dtype, (buf, idx, valid)), UOp.const(ld.dtype, 0), valid))


def _lower_const(ctx: _Lowering, c: UOp, view: UOp) -> UOp:
    value = UOp.const(c.dtype, c.arg)
    _, valid = ctx.index(view)
    return valid.where(value, value.const_like(0))


def _lower_store(ctx: _Lowering, buf: UOp, view: UOp, value: UOp) -> UOp:
    idx, valid = ctx.index(view)
    return UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, idx, valid)), value, valid))


def _lower_reduce(ctx: _Lowering, red: UOp, x: UOp) -> UOp:
    op, _ = red.arg
    if not ctx.reduce_ranges:
        return x  # every reduced axis has size 1: the single element is the result
    identity = _identity(op, red.dtype)
    if dtypes.is_bool(red.dtype):
        # on bools a sum is "any", a product "all" and a max "any"
        op = {Ops.ADD: Ops.OR, Ops.MUL: Ops.AND, Ops.MAX: Ops.OR}[op]
    acc = UOp(Ops.DEFINE_ACC, red.dtype, (identity, *ctx.reduce_ranges), arg=(len(ctx.accumulators),))
    ctx.accumulators[red] = acc
    return UOp(Ops.ASSIGN, red.dtype, (acc, acc.alu(op, x)))


lowering_rules = PatternMatcher(
    [
        (
            UPat(Ops.LOAD, src=(UPat(Ops.DEFINE_GLOBAL, name="buf"), UPat(Ops.VIEW, name="view")), name="ld"),
            _lower_load,
        ),
        (UPat(Ops.CONST, src=(UPat(Ops.VIEW, name="view"),), name="c"), _lower_const),
        (
            UPat(Ops.STORE, src=(UPat(Ops.DEFINE_GLOBAL, name="buf"), UPat(Ops.VIEW, name="view"), UPat.var("value"))),
            _lower_store,
        ),
        (UPat(Ops.REDUCE_AXIS, src=(UPat.var("x"),), name="red"), _lower_reduce),
    ]
)


def _global_indices(sizes: list[sint], axes: list[int]) -> tuple[dict[int, UOp], tuple[sint, sint, sint]]:
    """SPECIAL gidx indices for output axes `axes` of `sizes`: gidx0 is the innermost axis; when there are more
    than three, the outermost ones share gidx2 and are recovered from it by division and remainder."""
    if not axes:
        return {}, (1, 1, 1)
    inner_first = axes[::-1]
    direct, merged = inner_first[: MAX_GLOBAL_DIMS - 1], inner_first[MAX_GLOBAL_DIMS - 1 :]
    idxs: dict[int, UOp] = {}
    dims: list[sint] = []
    for n, a in enumerate(direct):
        idxs[a] = UOp.special(sizes[a], f"gidx{n}")
        dims.append(sizes[a])
    if merged:
        if not all(isinstance(sizes[a], int) for a in merged):
            raise NotImplementedError("symbolic sizes on output axes merged into gidx2 are not supported yet")
        total = math.prod(sizes[a] for a in merged)  # type: ignore[misc]
        g = UOp.special(total, f"gidx{len(direct)}")
        dims.append(total)
        place = 1
        # merged holds the axes innermost first, so the first one varies fastest within gidx2
        for n, a in enumerate(merged):
            q = g if place == 1 else g // place
            idxs[a] = q if n == len(merged) - 1 else q % sizes[a]
            place *= sizes[a]  # type: ignore[operator]
    while len(dims) < MAX_GLOBAL_DIMS:
        dims.append(1)
    return idxs, (dims[0], dims[1], dims[2])


def lower(ast: UOp, renderer: Renderer) -> LoweredKernel:
    """Lower kernel AST `ast` for `renderer`: loops (or hardware indices) for the axes, index expressions for the
    views, accumulators for the reductions. The index math is left unsimplified."""
    shape = kernel_shape(ast)
    full, reduce_axes = shape.full, set(shape.reduce_axes)
    out_axes = [a for a, s in enumerate(full) if a not in reduce_axes and not _is_one(s)]
    idx_of: dict[int, UOp] = {}
    global_size: tuple[sint, sint, sint] = (1, 1, 1)
    if renderer.has_local:
        idx_of, global_size = _global_indices(list(full), out_axes)
        if renderer.global_max is not None:
            for n, (size, limit) in enumerate(zip(global_size, renderer.global_max, strict=False)):
                if isinstance(size, int) and size > limit:
                    raise NotImplementedError(
                        f"global dimension {n} of size {size} exceeds the renderer's limit {limit}; splitting it "
                        "over several dimensions is not implemented yet"
                    )
    else:
        idx_of = {a: UOp.range(full[a], a) for a in out_axes}
    looped_reduce_axes = [a for a in sorted(reduce_axes) if not _is_one(full[a])]
    reduce_ranges = tuple(UOp.range(full[a], a) for a in looped_reduce_axes)
    idx_of.update(zip(looped_reduce_axes, reduce_ranges, strict=True))
    zero = UOp.const(dtypes.int32, 0)
    full_idxs = [idx_of.get(a, zero) for a in range(len(full))]
    output_idxs = [zero if a in reduce_axes else i for a, i in enumerate(full_idxs)]
    ctx = _Lowering(shape, full_idxs, output_idxs, reduce_ranges)
    sink = graph_rewrite(ast, lowering_rules, ctx=ctx, name="lower")
    leftover = {u.op for u in sink.toposort if u.op in (Ops.VIEW, Ops.REDUCE_AXIS)}
    if leftover:
        raise KernelASTError(
            f"ops {sorted(o.name for o in leftover)} were left unlowered: they sit where the contract "
            "does not allow them (e.g. a VIEW that is not the source of a LOAD, CONST or STORE)"
        )
    bad = {u.op for u in sink.toposort} - _LINEAR_OPS
    if bad:
        raise KernelASTError(f"kernel AST holds ops codegen can't lower: {sorted(o.name for o in bad)}")
    return LoweredKernel(sink, shape, global_size, (1, 1, 1))


_LINEAR_OPS = (
    GroupOp.Elementwise
    | GroupOp.Defines
    | {Ops.SINK, Ops.CONST, Ops.SPECIAL, Ops.RANGE, Ops.INDEX, Ops.LOAD, Ops.STORE, Ops.ASSIGN}
)


def _drop_false_stores(sink: UOp) -> UOp | None:
    kept = tuple(s for s in sink.src if not (s.op is Ops.STORE and len(s.src) == 3 and _is_const(s.src[2], False)))
    return None if len(kept) == len(sink.src) else sink.replace(src=kept)


def _is_const(u: UOp, value: bool) -> bool:
    return u.op is Ops.CONST and u.arg is value


_TRUE, _FALSE = UPat.const(dtypes.bool, True), UPat.const(dtypes.bool, False)

# After the symbolic engine has folded gates to constants: an always-true gate is no gate, an always-false gate
# means the memory is never touched.
cleanup_rules = PatternMatcher(
    [
        (
            UPat(Ops.INDEX, src=(UPat.var("buf"), UPat.var("idx"), _TRUE), name="x"),
            lambda x, buf, idx: x.replace(src=(buf, idx)),
        ),
        (UPat(Ops.LOAD, src=(UPat.var("index"), UPat(), _TRUE), name="x"), lambda x, index: x.replace(src=(index,))),
        (UPat(Ops.LOAD, src=(UPat(), UPat.var("alt"), _FALSE)), lambda alt: alt),
        (
            UPat(Ops.STORE, src=(UPat.var("index"), UPat.var("value"), _TRUE), name="x"),
            lambda x, index, value: x.replace(src=(index, value)),
        ),
        (UPat(Ops.SINK, name="sink"), _drop_false_stores),
        (UPat(Ops.WHERE, src=(_TRUE, UPat.var("a"), UPat())), lambda a: a),
        (UPat(Ops.WHERE, src=(_FALSE, UPat(), UPat.var("b"))), lambda b: b),
    ]
)
