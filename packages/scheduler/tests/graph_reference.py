"""Two references the scheduler tests compare against each other, neither of which uses the scheduler's own logic:

- `evaluate_graph`: the value of a tensor graph, computed directly with numpy (movement ops as numpy reshapes,
  broadcasts, transposes, pads, slices and flips);
- `execute_schedule`: runs kernel ASTs, as the codegen README's contract defines them, over flat numpy buffers: each
  VIEW's (index, valid) is evaluated with `eval_uop` at every coordinate of its shape, then the ALU and reductions
  run with numpy over all coordinates at once.

The executor also checks the contract as it goes: ALU sources of one shape, stores of shape R that cover each element
once, loads inside the buffer, no load of an element nothing has written yet, and no kernel that reads an element of
its own output that another iteration writes (a read/write race once the kernel runs in parallel).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from lazygrad_uop.device import Buffer
from lazygrad_uop.dtype import DType, dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.tensor_graph import buffer_of
from lazygrad_uop.uop import UOp, eval_uop
from lazygrad_uop.views import ShapeTracker

# numpy's meaning of each elementwise op the tests build; both references share it, so they agree on what an op is
NP_ALU: dict[Ops, Callable[..., np.ndarray]] = {
    Ops.ADD: np.add,
    Ops.MUL: np.multiply,
    Ops.MAX: np.maximum,
    Ops.NEG: np.negative,
    Ops.CMPLT: np.less,
    Ops.CMPNE: np.not_equal,
    Ops.WHERE: np.where,
    Ops.RECIP: np.reciprocal,
    Ops.SQRT: np.sqrt,
    Ops.EXP2: np.exp2,
    Ops.LOG2: np.log2,
    Ops.SIN: np.sin,
    Ops.TRUNC: np.trunc,
    Ops.AND: np.bitwise_and,
    Ops.OR: np.bitwise_or,
    Ops.XOR: np.bitwise_xor,
}


def np_dtype(dt: DType) -> np.dtype:
    """The numpy dtype that holds values of `dt`."""
    return to_numpy_dtype(dt)


def reduce_array(op: Ops, x: np.ndarray, axes: Iterable[int]) -> np.ndarray:
    """`x` reduced over `axes` with ADD, MAX or MUL, keeping them as size 1; an empty reduction gives the identity."""
    axes = tuple(axes)
    if op is Ops.ADD:
        return np.add.reduce(x, axis=axes, keepdims=True, dtype=x.dtype)
    if op is Ops.MUL:
        return np.multiply.reduce(x, axis=axes, keepdims=True, dtype=x.dtype)
    if op is Ops.MAX:
        lowest = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
        return np.maximum.reduce(x, axis=axes, keepdims=True, initial=lowest)
    raise NotImplementedError(f"the reference reduces with ADD, MUL or MAX, not {op}")


def _alu(u: UOp, srcs: list[np.ndarray]) -> np.ndarray:
    if u.op not in NP_ALU:
        raise NotImplementedError(f"the reference has no numpy meaning for {u.op}")
    with np.errstate(all="ignore"):  # inf and nan are values like any other here; both sides must agree on them
        out = np.asarray(NP_ALU[u.op](*srcs))
    return out.astype(np_dtype(u.dtype), copy=False)


# *** the tensor graph, evaluated with numpy ***


def _postorder(roots: Sequence[UOp], stop: Mapping[UOp, Any]) -> list[UOp]:
    """Nodes under `roots`, sources first, not descending below the nodes of `stop`."""
    order: list[UOp] = []
    seen: set[UOp] = set()
    stack: list[tuple[UOp, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        u, expanded = stack.pop()
        if expanded:
            order.append(u)
            continue
        if u in seen:
            continue
        seen.add(u)
        stack.append((u, True))
        if u not in stop:
            stack.extend((s, False) for s in reversed(u.src))
    return order


def evaluate_graph(
    outputs: Sequence[UOp], buffers: Mapping[UOp, np.ndarray], known: Mapping[UOp, np.ndarray] | None = None
) -> list[np.ndarray]:
    """The numpy value of each of `outputs`: BUFFER nodes hold `buffers[node]` (flat), nodes in `known` hold those
    values. An ASSIGN's value is its new value; its target read elsewhere is the buffer's value in `buffers`."""
    vals: dict[UOp, Any] = dict(known or {})
    for u in _postorder(outputs, vals):
        if u not in vals:
            vals[u] = _graph_node(u, [vals[s] for s in u.src], buffers)
    return [np.asarray(vals[o]) for o in outputs]


def _graph_node(u: UOp, src: list[Any], buffers: Mapping[UOp, np.ndarray]) -> Any:
    op, arg = u.op, u.arg
    if op in (Ops.DEVICE, Ops.UNIQUE):
        return None
    if op is Ops.BUFFER:
        return buffers[u]
    if op is Ops.VIEW:
        if not arg.contiguous or arg.size != src[0].size:
            raise NotImplementedError("the reference reads a buffer only through a plain contiguous view of all of it")
        return src[0].reshape(arg.shape)
    if op is Ops.CONST:
        if u.src and u.src[0].op is not Ops.DEVICE:
            raise NotImplementedError("the reference knows tensor-graph constants only as CONST(DEVICE)")
        return np.array(arg, dtype=np_dtype(u.dtype))
    if op is Ops.RESHAPE:
        return src[0].reshape(arg)
    if op is Ops.EXPAND:
        return np.broadcast_to(src[0], arg)
    if op is Ops.PERMUTE:
        return np.transpose(src[0], arg)
    if op is Ops.PAD:
        return np.pad(src[0], arg, constant_values=0)
    if op is Ops.SHRINK:
        return src[0][tuple(slice(b, e) for b, e in arg)]
    if op is Ops.FLIP:
        return np.flip(src[0], tuple(i for i, f in enumerate(arg) if f))
    if op is Ops.REDUCE_AXIS:
        return reduce_array(arg[0], src[0], arg[1])
    if op in (Ops.CONTIGUOUS, Ops.DETACH):
        return src[0]
    if op is Ops.ASSIGN:
        return src[1]
    if op is Ops.CAST:
        return src[0].astype(np_dtype(u.dtype))
    return _alu(u, src)


# *** kernel ASTs, executed element by element ***


@functools.cache
def index_map(st: ShapeTracker) -> tuple[np.ndarray, np.ndarray]:
    """For every coordinate of `st.shape`: the buffer index its (index, valid) expressions give, and whether valid.

    Each coordinate gets its own expressions, over constants, evaluated with `eval_uop`: no loop variables whose
    bounds the index math could lean on. Cached per tracker, since kernels reuse them."""
    shape = tuple(st.shape)
    idx_out = np.zeros(shape, dtype=np.int64)
    valid_out = np.zeros(shape, dtype=bool)
    if math.prod(shape) == 0:
        return idx_out, valid_out
    for coords in itertools.product(*(range(s) for s in shape)):
        idx, valid = st.to_indexed_uops([UOp.const(dtypes.int32, c) for c in coords])
        valid_out[coords] = bool(eval_uop(valid))
        idx_out[coords] = int(eval_uop(idx)) if valid_out[coords] else 0
    return idx_out, valid_out


class Memory:
    """Flat numpy arrays standing in for device Buffers (by identity), with which elements have been written."""

    def __init__(self) -> None:
        self.data: dict[Buffer, np.ndarray] = {}
        self.written: dict[Buffer, np.ndarray] = {}

    def put(self, buf: Buffer, values: np.ndarray) -> None:
        """Give `buf` these contents (all of them written)."""
        values = np.asarray(values, dtype=np_dtype(buf.dtype)).reshape(-1)
        assert values.size == buf.size, f"{values.size} values for {buf!r}"
        self.data[buf] = values.copy()
        self.written[buf] = np.ones(buf.size, dtype=bool)

    def array(self, buf: Buffer) -> np.ndarray:
        """The contents of `buf`; a buffer seen for the first time starts unwritten (NaN where the dtype has it)."""
        if buf not in self.data:
            dt = np_dtype(buf.dtype)
            fill = np.nan if np.issubdtype(dt, np.floating) else 0
            self.data[buf] = np.full(buf.size, fill, dtype=dt)
            self.written[buf] = np.zeros(buf.size, dtype=bool)
        return self.data[buf]

    def read(self, buf: Buffer, st: ShapeTracker) -> np.ndarray:
        """`buf` seen through `st` (invalid elements read 0); every element read must have been written."""
        arr = self.array(buf)
        idx, valid = index_map(st)
        picked = idx[valid]
        assert ((picked >= 0) & (picked < arr.size)).all(), f"{st} reads outside {buf!r}"
        assert self.written[buf][picked].all(), f"{st} reads elements of {buf!r} that nothing has written yet"
        out = np.zeros(idx.shape, dtype=arr.dtype)
        out[valid] = arr[picked]
        return out


def execute_schedule(items: Sequence[Any], memory: Memory) -> None:
    """Run ScheduleItems in order, each on the arrays `memory` keeps for its `bufs`."""
    for item in items:
        execute_kernel(item.ast, list(item.bufs), memory)


def _full_shape(ast: UOp, reduce: UOp) -> tuple[int, ...]:
    """The shape F a REDUCE_AXIS reduces: the shape of the VIEWs of the loads and constants below it."""
    shapes = {tuple(v.arg.shape) for v in reduce.toposort if v.op is Ops.VIEW}
    assert len(shapes) == 1, f"views below one REDUCE_AXIS disagree on the full shape: {shapes}"
    return shapes.pop()


def execute_kernel(ast: UOp, bufs: list[Buffer], memory: Memory) -> None:
    """Run one kernel AST: every value is computed for all coordinates, then every STORE writes its elements."""
    if ast.op is not Ops.SINK:
        raise NotImplementedError(f"the reference runs SINK kernels, not {ast.op}")
    stores = list(ast.src)
    assert stores and all(s.op is Ops.STORE for s in stores), "a kernel AST is a SINK of STOREs"
    out_shape = tuple(stores[0].src[1].arg.shape)
    assert all(tuple(s.src[1].arg.shape) == out_shape for s in stores), "STOREs of one kernel differ in shape"
    # a REDUCE_AXIS may sit in another's source (same axes, asserted below): there its result, one value per row,
    # is broadcast back over the reduced axes
    reduces = [u for u in ast.toposort if u.op is Ops.REDUCE_AXIS]
    full = _full_shape(ast, reduces[0]) if reduces else out_shape
    assert all(_full_shape(ast, r) == full for r in reduces), "REDUCE_AXIS nodes of one kernel reduce different shapes"
    assert all(r.arg[1] == reduces[0].arg[1] for r in reduces), "REDUCE_AXIS nodes of one kernel differ in axes"
    assert len(full) == len(out_shape), f"full shape {full} and output shape {out_shape} differ in rank"

    vals: dict[UOp, np.ndarray] = {}
    loads: list[UOp] = []
    for u in ast.toposort:
        if u.op in (Ops.SINK, Ops.STORE, Ops.DEFINE_GLOBAL, Ops.VIEW):
            continue
        if u.op is Ops.LOAD:
            vals[u] = memory.read(bufs[u.src[0].arg], u.src[1].arg)
            loads.append(u)
        elif u.op is Ops.CONST:
            _, valid = index_map(u.src[0].arg)
            vals[u] = np.where(valid, np.array(u.arg, dtype=np_dtype(u.dtype)), 0).astype(np_dtype(u.dtype))
        elif u.op is Ops.REDUCE_AXIS:
            vals[u] = reduce_array(u.arg[0], vals[u.src[0]], u.arg[1])
        elif u.op is Ops.CAST:
            vals[u] = vals[u.src[0]].astype(np_dtype(u.dtype))
        else:
            srcs = [vals[s] for s in u.src]
            if len({s.shape for s in srcs}) != 1:
                shapes = {s.shape for s in srcs}
                assert shapes == {full, out_shape}, f"{u.op} has sources of shapes {[s.shape for s in srcs]}"
                srcs = list(np.broadcast_arrays(*srcs))
            vals[u] = _alu(u, srcs)

    _check_no_races(stores, loads, bufs, full, out_shape)
    for s in stores:
        slot, view, value = s.src
        arr, written = memory.array(bufs[slot.arg]), memory.written[bufs[slot.arg]]
        idx, valid = index_map(view.arg)
        assert valid.all(), f"STORE view {view.arg} masks out part of the output"
        assert vals[value].shape == out_shape, f"stored value has shape {vals[value].shape}, the output {out_shape}"
        flat = idx.reshape(-1)
        assert ((flat >= 0) & (flat < arr.size)).all(), f"STORE view {view.arg} writes outside {bufs[slot.arg]!r}"
        assert len(np.unique(flat)) == flat.size, f"STORE view {view.arg} writes an element twice"
        arr[flat] = vals[value].reshape(-1)
        written[flat] = True


def _check_no_races(
    stores: list[UOp], loads: list[UOp], bufs: list[Buffer], full: tuple[int, ...], out_shape: tuple[int, ...]
) -> None:
    """A load of a buffer the kernel also writes may only read elements written by its own output coordinate."""
    out_numel = math.prod(out_shape)
    for s in stores:
        buf = bufs[s.src[0].arg]
        writer = np.full(buf.size, -1, dtype=np.int64)
        writer[index_map(s.src[1].arg)[0].reshape(-1)] = np.arange(out_numel)
        for ld in loads:
            if bufs[ld.src[0].arg] is not buf:
                continue
            idx, valid = index_map(ld.src[1].arg)
            # the output coordinate each load coordinate belongs to: reduced axes collapse to 0
            coords = np.indices(idx.shape)
            if idx.shape != out_shape:
                coords = np.stack([c if o == f else np.zeros_like(c) for c, o, f in zip(coords, out_shape, full)])
            mine = np.ravel_multi_index(tuple(coords), out_shape) if out_numel else np.zeros(idx.shape, np.int64)
            owner = writer[idx[valid]]
            clash = (owner != -1) & (owner != mine[valid])
            assert not clash.any(), f"kernel reads elements of {buf!r} that other iterations of it overwrite"


def read_target(memory: Memory, target: UOp) -> np.ndarray:
    """The value an ASSIGN's target VIEW(BUFFER, st) holds: the BUFFER's Buffer seen through st."""
    assert target.op is Ops.VIEW and target.src[0].op is Ops.BUFFER, f"target is {target.op}, not VIEW(BUFFER)"
    return memory.read(buffer_of(target.src[0]), target.arg)
