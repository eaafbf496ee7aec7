"""One-hot selections: reductions that pick a single element, lowered as one gated load instead of a loop.

Indexing by an integer tensor is built by the frontend as a comparison with an arange and a reduction,
`(arange(V) == idx).where(x, 0).sum(V axis)` (or, in `nn.Embedding`, `(arange(V) == idx).cast(x.dtype) @ x`). In a
kernel AST that is a REDUCE_AXIS over a reduce axis r of

    WHERE(f(r) == e, x(r), alt)        or        CAST(f(r) == e) * x(r)        (alt = 0)

where `f(r)` is index math of r alone (CONSTs under views and ALU ops, no buffer read: an arange the kernel computes)
and `e` does not depend on the reduce axes. When `f` is injective on [0, V), at most one r matches, so for
`alt` the reduction's identity the result is `x(r*)` where `f(r*) == e`, and `alt` where nothing matches. Lowering
then reads `x` once at r* (its loads gated by whether r* exists, the index kept in range) instead of running the
loop: the kernel's work drops from (outputs x V) to (outputs).

Several conditions joined by AND are handled: each reduce axis must be fixed by exactly one `f_a(r_a) == e_a`, the
others must not depend on the reduce axes (they gate the result). `f` is checked, not assumed: the lowered index math
is evaluated for every r in [0, V) and must equal `s*r + c` with s != 0 (an arange with any start and step), which
gives r* = (e - c) / s, valid when it is a whole number in range. A comparison with an arange *read from a buffer*
is not a selection here: codegen can't know what the buffer holds.

`CAST(cond) * x` is only a selection for sums; unlike the WHERE form, it drops the NaN that `0 * inf` would have
given at the positions that don't match (which is what indexing means, and what torch's embedding gives).

The reduce axes of a selection must stay whole: `keep_selections_whole` removes the opts (UNROLL, GROUP, GROUPTOP,
PADTO of a reduce axis, TC) that the heuristic or BEAM chose for such a kernel; a kernel that still has them (opts
given explicitly) keeps its loop.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from lazygrad_codegen.kernel import AxisType, Kernel, KernelOptError
from lazygrad_codegen.vectors import vector_rules
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.pattern import PatternMatcher, UPat, graph_rewrite
from lazygrad_uop.symbolic import symbolic
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker

# the largest reduce axis whose index math is checked element by element (about a second of numpy at this size;
# a 30522-row vocabulary takes a few ms)
MAX_CHECKED = 1 << 24
_CHUNK = 1 << 16


@dataclass(frozen=True)
class Selection:
    """A REDUCE_AXIS recognised as a one-hot selection: the AST `value` x it picks, one `(axis, index, target)` pin
    per reduce axis of the kernel (`index` the index math f of that axis, `target` the e it must equal), the AST
    `gates` (bools independent of the reduce axes) that must also hold, and `alt`, the result where nothing is
    picked."""

    value: UOp
    pins: tuple[tuple[int, UOp, UOp], ...]
    gates: tuple[UOp, ...]
    alt: UOp


# *** recognising a selection in a kernel AST ***

_TRUE = UPat(Ops.CONST, dtypes.bool, arg=True)

# `a == b` as the frontend writes it: not (a != b)
_equality = PatternMatcher(
    [
        (
            UPat((Ops.CMPNE, Ops.XOR), src=[UPat(Ops.CMPNE, src=(UPat.var("a"), UPat.var("b"))), _TRUE]),
            lambda a, b: (a, b),
        ),
    ]
)


def _strip_bool_casts(u: UOp) -> UOp | None:
    """The bool under a chain of CASTs (which turn it into exactly 0 or 1), or None."""
    while u.op is Ops.CAST and not dtypes.is_bool(u.dtype):
        u = u.src[0]
    return u if dtypes.is_bool(u.dtype) else None


def _cast_form(c: UOp, x: UOp) -> tuple[UOp, UOp, UOp] | None:
    cond = _strip_bool_casts(c) if c.op is Ops.CAST else None
    return None if cond is None else (cond, x, x.const_like(0))


def _cast_of(c: UOp, inner: UOp) -> tuple[UOp, UOp, UOp] | None:
    """CAST(selection) (a sum in a wider dtype): a selection of the cast value, when the alternative is 0 (0 in
    every dtype)."""
    form = _selecting.rewrite(inner)
    if form is None:
        return None
    cond, x, alt = form  # type: ignore[misc]
    return None if alt.arg != 0 else (cond, x.cast(c.dtype), UOp.const(c.dtype, 0))


# the reduced value as (condition, value, alternative): WHERE(cond, x, CONST), CAST(cond) * x, or a CAST of either
_selecting = PatternMatcher(
    [
        (
            UPat(Ops.WHERE, src=(UPat.var("cond"), UPat.var("x"), UPat(Ops.CONST, name="alt"))),
            lambda cond, x, alt: (cond, x, alt),
        ),
        (UPat(Ops.MUL, src=[UPat(Ops.CAST, name="c"), UPat.var("x")]), _cast_form),
        (UPat(Ops.CAST, src=(UPat((Ops.WHERE, Ops.MUL), name="inner"),), name="c"), _cast_of),
    ]
)


def _constant(alt: UOp, k: Kernel) -> UOp | None:
    """An AST CONST's value where it is the same everywhere: a masked CONST is 0 outside its mask."""
    value = UOp.const(alt.dtype, alt.arg)
    if alt.arg == 0 or not alt.src:
        return value
    st = k.views.get(alt.src[0])
    return value if st is not None and all(v.mask is None for v in st.views) else None


def _identity(op: Ops, dtype: DType) -> object:
    if op is Ops.ADD:
        return False if dtypes.is_bool(dtype) else 0
    if op is Ops.MUL:
        return True if dtypes.is_bool(dtype) else 1
    return dtypes.min(dtype)


def conjuncts(cond: UOp) -> list[UOp]:
    """The terms of bool `cond` read as an AND of terms (itself alone when it is no AND)."""
    if cond.op is Ops.AND and dtypes.is_bool(cond.dtype):
        return [t for s in cond.src for t in conjuncts(s)]
    return [cond]


@functools.lru_cache(maxsize=4096)
def _view_axes(st: ShapeTracker, valid_only: bool) -> frozenset[int]:
    """The axes whose index can change what `st` gives: its index and validity (a LOAD), or only its validity (a
    CONST). Through several views that needs the index math: an arange computed from masked constants has a view
    per bit, yet depends on one axis."""
    from lazygrad_codegen.lowerer import relevant_axes

    if len(st.views) == 1 and not valid_only:
        return frozenset(relevant_axes(st))
    if len(st.views) == 1:
        mask = st.views[0].mask
        return frozenset(() if mask is None else (a for a, m in enumerate(mask) if m != (0, st.shape[a])))
    idx, valid = st.to_indexed_uops(simplify=True)
    deps = (valid,) if valid_only else (idx, valid)
    return frozenset(u.arg for u in UOp(Ops.SINK, dtypes.void, deps).toposort if u.op is Ops.RANGE)


def axes_read(u: UOp, k: Kernel) -> set[int]:
    """The kernel axes whose index can change the value of AST subtree `u`."""
    out: set[int] = set()
    for n in u.toposort:
        if n.op in (Ops.LOAD, Ops.CONST) and n.src and n.src[-1] in k.views:
            out |= _view_axes(k.views[n.src[-1]], n.op is Ops.CONST)
    return out


def find_selection(red: UOp, k: Kernel) -> Selection | None:
    """`red` (a REDUCE_AXIS of `k`'s AST) as a one-hot selection over `k`'s reduce axes, or None when it isn't one
    (or when opts have split its reduce axes, or it runs on tensor cores)."""
    if k.tensor_core is not None or k.reduce_mask is not None:
        return None
    if k.axes(AxisType.UNROLL, AxisType.GROUP_REDUCE, AxisType.TC_K):
        return None
    reduce_axes = set(k.axes(AxisType.REDUCE))
    op = red.arg[0]
    form = _selecting.rewrite(red.src[0])
    if not reduce_axes or form is None:
        return None
    cond, x, alt_node = form  # type: ignore[misc]
    if x.dtype != red.dtype or (alt := _constant(alt_node, k)) is None:
        return None
    if red.src[0].op in (Ops.MUL, Ops.CAST) and op is not Ops.ADD:
        return None  # not-picked elements are 0, the identity of a sum only
    if alt.arg != _identity(op, red.dtype):
        return None
    pins: dict[int, tuple[UOp, UOp]] = {}
    gates: list[UOp] = []
    for term in conjuncts(cond):
        read = axes_read(term, k) & reduce_axes
        if not read:
            gates.append(term)
            continue
        if (pair := _equality.rewrite(term)) is None:
            return None
        a, b = pair  # type: ignore[misc]
        read_a, read_b = axes_read(a, k), axes_read(b, k)
        if read_b & reduce_axes:
            a, b, read_a, read_b = b, a, read_b, read_a
        # the index side is index math of one reduce axis; the other side must not depend on any reduce axis
        if len(read_a) != 1 or not read_a <= reduce_axes or read_b & reduce_axes:
            return None
        if any(u.op is Ops.LOAD for u in a.toposort):
            return None
        (axis,) = read_a
        if axis in pins:
            return None
        pins[axis] = (a, b)
    if set(pins) != reduce_axes:
        return None
    return Selection(x, tuple((ax, *pins[ax]) for ax in sorted(pins)), tuple(gates), alt)


# *** checking the index math ***


def _c_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
    return np.where((a < 0) != (b < 0), -q, q)


_NUMPY: dict[Ops, object] = {
    Ops.ADD: np.add,
    Ops.MUL: np.multiply,
    Ops.IDIV: _c_div,
    Ops.MOD: lambda a, b: a - _c_div(a, b) * b,
    Ops.MAX: np.maximum,
    Ops.CMPLT: np.less,
    Ops.CMPNE: np.not_equal,
    Ops.AND: np.bitwise_and,
    Ops.OR: np.bitwise_or,
    Ops.XOR: np.bitwise_xor,
    Ops.SHL: np.left_shift,
    Ops.SHR: np.right_shift,
    Ops.WHERE: np.where,
}


def _evaluate(f: UOp, r: UOp, start: int, stop: int) -> np.ndarray | None:
    """Integer expression `f` of RANGE `r` evaluated for r in [start, stop) (C semantics), or None when it holds
    anything else (another index, a load, a float) or a value its dtype can't hold."""
    env: dict[UOp, np.ndarray] = {}
    for u in f.toposort:
        if u.dtype.count != 1 or not (dtypes.is_int(u.dtype) or dtypes.is_bool(u.dtype)):
            return None
        if u is r:
            val = np.arange(start, stop, dtype=np.int64)
        elif u.op is Ops.CONST:
            val = np.array(int(u.arg), dtype=np.int64)
        elif u.op is Ops.CAST and (dtypes.is_int(u.src[0].dtype) or dtypes.is_bool(u.src[0].dtype)):
            val = env[u.src[0]] != 0 if dtypes.is_bool(u.dtype) else env[u.src[0]]
        elif u.op in _NUMPY:
            val = _NUMPY[u.op](*(env[s] for s in u.src))  # type: ignore[operator]
        else:
            return None
        val = np.asarray(val, dtype=np.int64)
        if dtypes.is_bool(u.dtype):
            val = val != 0
        elif val.size and (val.min() < dtypes.min(u.dtype) or val.max() > dtypes.max(u.dtype)):
            return None
        env[u] = val
    return np.broadcast_to(env[f], (stop - start,))


# combined once: combining matchers inspects every rule
_index_rules = symbolic + vector_rules


def affine_fit(f: UOp, r: UOp, n: int) -> tuple[int, int] | None:
    """(s, c) with f(r) == s*r + c for every r in [0, n) and s != 0, where `f` is index math of RANGE `r` alone;
    None when it is not such a function (or n is too big to check)."""
    if n < 1 or n > MAX_CHECKED:
        return None
    f = graph_rewrite(f, _index_rules, name="selection index")
    if (first := _evaluate(f, r, 0, min(n, 2))) is None:
        return None
    c = int(first[0])
    s = int(first[1]) - c if n > 1 else 1
    if s == 0:
        return None
    # in chunks, so that a large axis never holds more than a chunk per node of `f` in memory
    for lo in range(0, n, _CHUNK):
        vals = _evaluate(f, r, lo, min(n, lo + _CHUNK))
        if vals is None or not np.array_equal(vals, c + s * np.arange(lo, lo + len(vals), dtype=np.int64)):
            return None
    return s, c


def solve(e: UOp, s: int, c: int, n: int) -> tuple[UOp, UOp]:
    """(valid, r*) for s*r* + c == e with r* in [0, n): `valid` says whether such r* exists, r* (int32) is where it
    is; where it isn't, r* is still in [0, n), so an index built from it stays in range."""
    lo, hi = min(c, c + s * (n - 1)), max(c, c + s * (n - 1))
    if hi > dtypes.max(e.dtype) or lo < dtypes.min(e.dtype):
        e = e.cast(dtypes.int64)
    valid = (e < lo).logical_not() & (e.const_like(hi) < e).logical_not()
    # e is moved into [lo, hi] before any arithmetic: nothing overflows, and (e - c) / s lands in [0, n) even where
    # s doesn't divide it
    d = valid.where(e, e.const_like(c)) - c
    if abs(s) != 1:
        valid = valid & (d % abs(s)).eq(0)
        d = d // s
    elif s == -1:
        d = -d
    return valid, d.cast(dtypes.int32)


# *** keeping the reduce axes of selections whole ***


def selections_only(k: Kernel) -> bool:
    """Whether every REDUCE_AXIS of `k` (a kernel with no opts applied) is a one-hot selection."""
    reds = k.reduceops
    return bool(reds) and all(find_selection(r, k) is not None for r in reds)


def keep_selections_whole(k: Kernel) -> Kernel:
    """`k` with the opts it was given re-applied to its AST, except those that would split, pad or move onto tensor
    cores a reduce axis of a kernel whose reductions are all one-hot selections (which lowering turns into loads,
    so those opts would only bring its loop back). Other kernels are returned as they are."""
    if not k.applied_opts or any(_selecting.rewrite(r.src[0]) is None for r in k.reduceops):
        return k  # the cheap test first: most kernels' reductions are no WHERE, product or cast at all
    base = Kernel(k.ast, k.renderer)
    if not selections_only(base):
        return k
    sizes = base.sizes(AxisType.REDUCE)
    for opt in k.applied_opts:
        trial = base.copy()
        try:
            trial.apply_opt(opt)
        except KernelOptError:
            continue
        if find_selection(trial.reduceops[0], trial) is None or trial.sizes(AxisType.REDUCE) != sizes:
            continue
        base = trial
    return base
