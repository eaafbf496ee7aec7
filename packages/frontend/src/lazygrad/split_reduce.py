"""Long reductions as partial reductions and a reduction of the parts (`lazygrad_codegen.reductions.split_plan`
decides where and how finely, from the device's renderer): the reduced axes moved last and flattened, the first
`parts * length` elements reshaped to (parts, length) and reduced along the length, then the parts and the elements
left over reduced together (padded with the reduction's identity to whole lanes). The scheduler stores the parts (a
reduction never fuses into another one's input), so the first kernel spreads over every workgroup or core and the
second is short. The parts' reduction goes through `Tensor._reduce` again, and is itself split when still long.

On GPUs, reductions across the contiguous axis (columns) and over axes with an output axis between them (BatchNorm
statistics) are cut along one reduced axis instead, moving none (`lazygrad_codegen.reductions.axis_split`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lazygrad_codegen.reductions import AxisSplit, axis_split, split_plan
from lazygrad_uop.device import Renderer
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.shape import device_of, shape_of
from lazygrad_uop.uop import UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor


# a product of broadcasts with at most this many outputs per compute unit is a matrix-vector product (`matmul_like`)
GEMV_OUTPUTS_PER_UNIT = 32


def renderer_of(device: str) -> Renderer | None:
    """The renderer kernels for `device` are made with (None for a device that isn't one compiled device)."""
    if not isinstance(device, str):
        return None
    return getattr(Device[device], "renderer", None)


def vector_product(device: str, outputs: int) -> bool:
    """Whether a row times a matrix with `outputs` columns on `device` is a matrix-vector product to reduce as a
    column reduction of the matrix: on a GPU (a renderer with workgroups and shared memory, where `axis_split` cuts
    it), with too few outputs for a matmul's tiles (see `matmul_like`)."""
    r = renderer_of(device)
    return r is not None and r.has_local and r.has_shared and not _many_outputs(r, outputs)


def _many_outputs(renderer: Renderer, outputs: int) -> bool:
    return outputs > max(renderer.compute_units, 1) * GEMV_OUTPUTS_PER_UNIT


def broadcast_along(u: UOp, axes: tuple[int, ...]) -> bool:
    """Whether `u` is a broadcast (an EXPAND from size 1) along every one of `axes`: its value doesn't change over a
    reduction of them, which codegen lowers to one step's value times the count (exact, and one kernel), so
    splitting it would only add rounding and a kernel."""
    return u.op is Ops.EXPAND and all(shape_of(u.src[0])[a] == 1 for a in axes)


_MOVES = (Ops.CAST, Ops.RESHAPE, Ops.PERMUTE, Ops.PAD, Ops.SHRINK, Ops.FLIP)


def _broadcast(u: UOp) -> bool:
    """Whether `u` is a broadcast (an EXPAND) under movement ops and casts."""
    while u.op in _MOVES:
        u = u.src[0]
    return u.op is Ops.EXPAND


def matmul_like(u: UOp, renderer: Renderer | None = None, outputs: int | None = None) -> bool:
    """Whether `u` (under casts) is a product of two broadcasts: a matmul's or a convolution's products, whose
    reduction codegen tiles (and splits) as a matmul, so the frontend leaves it whole. Given the `renderer` and the
    reduction's `outputs`, not one with fewer outputs than a warp per compute unit: a matrix-vector product (a
    decoding step's `x @ W` with one row of x) has nothing to tile and is a column reduction of W, cut like one."""
    while u.op is Ops.CAST:
        u = u.src[0]
    if not (u.op is Ops.MUL and all(_broadcast(s) for s in u.src)):
        return False
    return renderer is None or outputs is None or _many_outputs(renderer, outputs)


def split_reduce(x: Tensor, op: Ops, axes: tuple[int, ...]) -> Tensor | None:
    """`x` reduced with `op` over `axes` (sorted, normalised, keeping them as size 1) in parts, or None when the
    reduction is better left whole (or has a symbolic size)."""
    shape = x.shape
    if not all(isinstance(d, int) for d in shape) or broadcast_along(x.uop, axes):
        return None
    length = math.prod(shape[a] for a in axes)
    outputs = math.prod(d for a, d in enumerate(shape) if a not in axes)
    renderer = renderer_of(x.device)
    if renderer is None:
        return None
    if not matmul_like(x.uop, renderer, outputs) and (cut := axis_split(renderer, shape, axes, op)) is not None:
        return split_along(x, op, axes, cut) if cut.parts > 1 else None
    if (plan := split_plan(renderer, outputs, length, op)) is None:
        return None
    keep = [a for a in range(len(shape)) if a not in axes]
    flat = x.permute(*keep, *axes).reshape(*(shape[a] for a in keep), length)
    head = plan.parts * plan.length
    lead = tuple((0, d) for d in flat.shape[:-1])
    whole = flat if head == length else flat.shrink((*lead, (0, head)))
    parts = whole.reshape(*flat.shape[:-1], plan.parts, plan.length)._reduce(op, len(keep) + 1, keepdim=False)
    if head < length:
        # the elements left over join the parts' reduction, so that the parts read no padding
        parts = parts.cat(flat.shrink((*lead, (head, length))), dim=len(keep))
    if plan.final > parts.shape[-1]:
        # whole lanes for the last reduction (its parts are few, padding them costs nothing)
        identity = 0 if op is Ops.ADD else 1 if op is Ops.MUL else dtypes.min(x.dtype)
        parts = parts.pad(((0, 0),) * len(keep) + ((0, plan.final - parts.shape[-1]),), value=identity)
    out = parts._reduce(op, len(keep), keepdim=False)
    return out.reshape(tuple(1 if a in axes else d for a, d in enumerate(shape)))


def split_along(x: Tensor, op: Ops, axes: tuple[int, ...], cut: AxisSplit) -> Tensor:
    """`x` reduced with `op` over `axes` (sorted, keeping them as size 1) in two reductions: the reduced axis
    `cut.axis` reshaped to (parts, rest), the first reducing the rest and the reduced axes after it, the second the
    parts and the reduced axes before it."""
    shape, a = x.shape, cut.axis
    y = x.reshape(*shape[:a], cut.parts, shape[a] // cut.parts, *shape[a + 1 :])
    parts = y._reduce(op, (a + 1, *(b + 1 for b in axes if b > a)), keepdim=True)
    out = parts._reduce(op, (*(b for b in axes if b < a), a), keepdim=True)
    return out.reshape(tuple(1 if i in axes else d for i, d in enumerate(shape)))


def reduce_uop_along_axis(u: UOp, op: Ops, axes: tuple[int, ...]) -> UOp | None:
    """The tensor-graph UOp `u` reduced with `op` over `axes` (sorted, keeping them as size 1) in two REDUCE_AXIS cut
    along one reduced axis where `axis_split` cuts it on `u`'s device (as `split_along` does for a Tensor), else None.
    For reductions built as UOps (the gradient's sums, the adjoint of a broadcast: BatchNorm's weight gradient)."""
    shape = shape_of(u)
    if not all(isinstance(d, int) for d in shape) or broadcast_along(u, axes) or matmul_like(u):
        return None
    renderer = renderer_of(device_of(u))
    if renderer is None or (cut := axis_split(renderer, shape, axes, op)) is None or cut.parts == 1:
        return None
    a = cut.axis
    split = (*shape[:a], cut.parts, shape[a] // cut.parts, *shape[a + 1 :])
    y = UOp(Ops.RESHAPE, u.dtype, (u,), split)
    parts = UOp(Ops.REDUCE_AXIS, u.dtype, (y,), (op, (a + 1, *(b + 1 for b in axes if b > a))))
    out = UOp(Ops.REDUCE_AXIS, u.dtype, (parts,), (op, (*(b for b in axes if b < a), a)))
    return UOp(Ops.RESHAPE, u.dtype, (out,), tuple(1 if i in axes else d for i, d in enumerate(shape)))
