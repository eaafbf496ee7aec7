"""The integer width of a kernel's index arithmetic: 32 bits where its symbolic bounds stay within int32, 64 bits where
an offset, a mask bound or a loop bound can pass 2^31 - 1.

A kernel's index expressions are sums of `index * stride` terms plus an offset, one per view, and the flat positions
that reshapes divide and take remainders of; none can exceed, in magnitude, `|offset| + sum(|stride| * (size - 1))`
of its view or the number of elements of a view that is unravelled (any but the last of a shape tracker), and the
loops count up to the element count of the output axes or of the reduce axes. When one of those (with symbolic
sizes and strides at their bounds) passes int32, the lowerer builds the kernel's loops, lane constants and views in
int64 (`index_dtype`); otherwise in int32, so kernels of ordinary sizes are unchanged and pay nothing (a 4096^3
matmul or a convolution at batch 64, whose loop nests pass 2^31 but whose buffers do not, included).

In an int64 kernel a few indices remain int32: the hardware indices (SPECIAL, whose launch sizes are int32 on every
device), symbolic variables, and positions computed from loaded data (one-hot selections). `promote_rules` widens
every integer op that mixes them with int64 operands, so each expression is computed in one width and no renderer
sees mixed operands.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.pattern import PatternMatcher, UPat
from lazygrad_uop.uop import UOp, sint
from lazygrad_uop.views import ShapeTracker, View

INT32_MAX = 2**31 - 1


def _magnitude(x: sint) -> int:
    """The largest |value| a size, stride or offset can take."""
    if isinstance(x, int):
        return abs(x)
    return max(abs(int(x.vmin)), abs(int(x.vmax)))


def view_reach(v: View, unravels: bool = True) -> int:
    """An upper bound of |every integer| the index arithmetic of view `v` computes (see the module docstring).
    `unravels=False` for the last view of a shape tracker, which takes the kernel's indices themselves: no flat
    position of its shape is divided into coordinates, so its element count (a broadcast over a big loop nest) is no
    bound of anything computed."""
    sizes = [_magnitude(s) for s in v.shape]
    terms = sum(_magnitude(st) * max(s - 1, 0) for s, st in zip(sizes, v.strides, strict=True))
    return max(_magnitude(v.offset) + terms, math.prod(sizes) if unravels else max(sizes, default=0))


def index_dtype(views: list[ShapeTracker], full_shape: tuple[sint, ...], reduce_axes: Collection[int] = ()) -> DType:
    """int64 when the index arithmetic of `views` (a kernel's shape trackers) or its loops can pass int32, else
    int32. The loops' own bound is the element count of the output axes and that of the reduce axes (`reduce_axes`),
    each: the lowerer flattens indices within one kind (a launch folded into fewer dimensions) but never across, so a
    matmul or convolution whose whole loop nest passes 2^31 still indexes in int32 when its buffers allow."""
    outputs = math.prod(_magnitude(s) for a, s in enumerate(full_shape) if a not in reduce_axes)
    reduced = math.prod(_magnitude(s) for a, s in enumerate(full_shape) if a in reduce_axes)
    if max(outputs, reduced) > INT32_MAX:
        return dtypes.int64
    if any(view_reach(v, i < len(st.views) - 1) > INT32_MAX for st in views for i, v in enumerate(st.views)):
        return dtypes.int64
    return dtypes.int32


_NARROW, _WIDE = dtypes.int32, dtypes.int64


def _widened(x: UOp) -> UOp | None:
    srcs = x.src[1:] if x.op is Ops.WHERE else x.src
    kinds = {s.dtype.scalar() for s in srcs}
    if _WIDE not in kinds or _NARROW not in kinds:
        return None
    new = tuple(s.cast(_WIDE.vec(s.dtype.count)) if s.dtype.scalar() == _NARROW else s for s in srcs)
    if x.op is Ops.WHERE:
        new = (x.src[0], *new)
    dtype = x.dtype if x.op in GroupOp.Comparison else _WIDE.vec(x.dtype.count)
    return UOp(x.op, dtype, new, x.arg)


promote_rules = PatternMatcher([(UPat(tuple(GroupOp.Binary | GroupOp.Ternary), name="x"), _widened)])
"""Integer ops with both int32 and int64 operands computed in int64 (the int32 ones cast)."""
