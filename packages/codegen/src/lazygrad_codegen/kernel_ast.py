"""Builders of kernel ASTs in the form the scheduler emits them (see the codegen README): buffers by slot, loads and
stores through a view, constants broadcast by a view, reductions over axes, the SINK of every store.

For code that makes kernels without a Tensor graph: the codegen's and the device packages' tests, and a third-party
backend checking its renderer on hand-made kernels.

    from lazygrad_codegen import kernel_ast as ka
    st = ka.st(16, 4)
    ast = ka.sink(ka.store(0, ka.reduce(ka.load(1, dtypes.float32, st), Ops.ADD, (1,)), ka.st(16, 1)))
"""

from __future__ import annotations

from typing import Any

from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker, View


def st(*shape: Any) -> ShapeTracker:
    """The contiguous view of `shape`."""
    return ShapeTracker.from_shape(shape)


def strided(shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0) -> ShapeTracker:
    """A view of `shape` with explicit element `strides` and `offset`."""
    return ShapeTracker((View.create(shape, strides, offset),))


def buf(slot: int, dtype: DType, size: int) -> UOp:
    """Kernel argument `slot`: a buffer of `size` elements of `dtype`."""
    return UOp(Ops.DEFINE_GLOBAL, dtype.ptr(size), arg=slot)


def load(slot: int, dtype: DType, view: ShapeTracker, size: int | None = None) -> UOp:
    """Read buffer `slot` through `view` (the buffer holds `size` elements, by default what the view reaches)."""
    size = view.real_size() if size is None else size
    return UOp(Ops.LOAD, dtype, (buf(slot, dtype, size), UOp(Ops.VIEW, arg=view)))


def const(value: Any, dtype: DType, view: ShapeTracker) -> UOp:
    """`value` as `dtype`, broadcast to `view`'s shape."""
    return UOp(Ops.CONST, dtype, (UOp(Ops.VIEW, arg=view),), dtypes.as_const(value, dtype))


def store(slot: int, value: UOp, view: ShapeTracker, size: int | None = None) -> UOp:
    """Write `value` to buffer `slot` through `view`."""
    size = view.real_size() if size is None else size
    return UOp(Ops.STORE, dtypes.void, (buf(slot, value.dtype, size), UOp(Ops.VIEW, arg=view), value))


def reduce(x: UOp, op: Ops, axes: tuple[int, ...]) -> UOp:
    """Reduce `x` with `op` (ADD, MUL, MAX) over `axes`, keeping them as size 1."""
    return UOp(Ops.REDUCE_AXIS, x.dtype, (x,), (op, axes))


def sink(*stores: UOp) -> UOp:
    """The kernel: every store it makes."""
    return UOp(Ops.SINK, dtypes.void, stores)


def row_reduce(kind: str, dtype: DType, rows: int, n: int) -> UOp:
    """The kernel `out[r] = sum / max / min of x[r, :]` of a (rows, n) input: output slot 0, input slot 1 (min as
    -max(-x), the form the frontend gives it)."""
    x = load(1, dtype, st(rows, n))
    if kind not in ("sum", "max", "min"):
        raise ValueError(f"row_reduce kind must be sum, max or min, got {kind!r}")
    if kind == "min":
        value = -reduce(-x, Ops.MAX, (1,))
    else:
        value = reduce(x, Ops.ADD if kind == "sum" else Ops.MAX, (1,))
    return sink(store(0, value, st(rows, 1)))


def matmul(m: int, n: int, k: int, dtype_in: DType, acc: DType = dtypes.float32) -> UOp:
    """The kernel `C = A @ B` of an (m, k) A in slot 1 and a (k, n) B in slot 2, both of `dtype_in`, products and
    sums in `acc`, into an (m, n) C of `acc` in slot 0: the shape tensor cores apply to."""
    a = load(1, dtype_in, st(m, 1, k).expand((m, n, k)))
    b = load(2, dtype_in, st(1, k, n).permute((0, 2, 1)).expand((m, n, k)))
    product = a.cast(acc) * b.cast(acc) if dtype_in != acc else a * b
    return sink(store(0, reduce(product, Ops.ADD, (2,)), st(m, n, 1)))
