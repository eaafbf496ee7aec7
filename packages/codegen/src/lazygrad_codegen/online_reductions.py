"""Online reductions: two reductions over the same rows, the second reading the first's result, computed in one loop
over the row instead of one loop each.

The kernel of softmax's (or logsumexp's) row values holds `M = max(x)` and `S = sum(exp2((x - M) * c))` (the
frontend's `exp` is `exp2` of `x * log2(e)`): nested, S's loop reads M, so the row is read twice before the output
kernel reads it a third time. `find_online` recognises that pair in a kernel AST, and `lower_online` computes both
in the loop of M, keeping a running max `m` and the sum `s` of `exp2((x - m) * c)` seen so far: when a step raises
the max from `m` to `m'`, `s` is first rescaled by `exp2((m - m') * c)` (exactly 1 where the max stays, so no
-inf - -inf appears). Partial states (m, s) of a row's accumulator lanes, warp lanes and warps combine the same way:
`m = max(m1, m2)`, `s = s1 * exp2((m1 - m) * c) + s2 * exp2((m2 - m) * c)`, through the same shuffles and local memory
a plain grouped reduction uses.

Special values follow the nested form: an element equal to -inf adds 0 (as it does whenever the row's max is
finite); a row whose max is -inf (every element -inf) gets the nested form's NaN sum; a NaN or a +inf element makes
the sum NaN as it does there. Rounding: each element's term is rounded once, as in the nested form, and rescaled by
the factors of the later max raises (a few per row on most data), each within an ulp or two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lazygrad_codegen.kernel import AxisType, Kernel, warp_size
from lazygrad_codegen.vectors import gep, vectorize
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

if TYPE_CHECKING:
    from lazygrad_codegen.lowerer import _Lowerer


@dataclass(frozen=True)
class OnlineSoftmax:
    """`total = sum(exp2((x - max(x)) * scale))` over the rows of `peak = max(x)`, both over the same axes."""

    peak: UOp
    total: UOp
    scale: float


def _const(u: UOp) -> float | None:
    """The value of a kernel-AST constant (a CONST, broadcast by its VIEW or not), else None."""
    return u.arg if u.op is Ops.CONST and isinstance(u.arg, (int, float)) else None


def _split_mul(u: UOp, want: float | None = None) -> tuple[UOp, float] | None:
    """(other operand, constant) of `u` = MUL of a value and a constant (equal to `want` where given), either order."""
    if u.op is not Ops.MUL:
        return None
    for a, b in (u.src, u.src[::-1]):
        if (c := _const(b)) is not None and (want is None or c == want):
            return a, c
    return None


def _online_softmax(total: UOp) -> OnlineSoftmax | None:
    """The pair of `total` when it is `sum(exp2((x + max(x) * -1) * c))` with c > 0 (the max's source `x` the very
    node the sum reads), else None."""
    if total.op is not Ops.REDUCE_AXIS or total.arg[0] is not Ops.ADD or not dtypes.is_float(total.dtype):
        return None
    e = total.src[0]
    if e.op is not Ops.EXP2 or (scaled := _split_mul(e.src[0])) is None or not scaled[1] > 0:
        return None
    diff, c = scaled
    if diff.op is not Ops.ADD:
        return None
    for x, neg in (diff.src, diff.src[::-1]):
        if (negated := _split_mul(neg, -1)) is None:
            continue
        peak = negated[0]
        if (
            peak.op is Ops.REDUCE_AXIS
            and peak.arg[0] is Ops.MAX
            and peak.arg[1] == total.arg[1]
            and peak.src[0] is x
            and peak.dtype == total.dtype
            and not any(u.op is Ops.REDUCE_AXIS for u in x.toposort)
        ):
            return OnlineSoftmax(peak, total, float(c))
    return None


def find_online(k: Kernel) -> dict[UOp, OnlineSoftmax]:
    """Each reduction of `k` that an online reduction computes (both of a pair), mapped to its pair. Not on tensor
    cores, and not where either reduction's result is read by anything but a later reduction or a store (the pair's
    max read elsewhere in the sum's source would need the final max inside the loop)."""
    if k.tensor_core is not None:
        return {}
    out: dict[UOp, OnlineSoftmax] = {}
    for red in k.reduceops:
        if (pair := _online_softmax(red)) is None or pair.peak in out:
            continue
        # the max is read in the sum's source only as the shift: one use there
        uses = sum(1 for u in red.src[0].toposort for s in u.src if s is pair.peak)
        if uses == 1:
            out[pair.peak] = out[pair.total] = pair
    return out


# *** lowering ***

State = tuple[UOp, UOp]


def _splat(like: UOp, value: float) -> UOp:
    """`value` in every lane of a vector shaped as `like`."""
    return vectorize([UOp.const(like.dtype.scalar(), value)] * like.dtype.count)


def _exp2_scaled(d: UOp, c: float) -> UOp:
    return (d * _splat(d, c)).alu(Ops.EXP2)


def _rescale(m: UOp, new_m: UOp, c: float) -> UOp:
    """exp2((m - new_m) * c), exactly 1 where the max did not change (also where both are -inf or +inf)."""
    return m.eq(new_m).where(_splat(m, 1.0), _exp2_scaled(m - new_m, c))


def _combine(a: State, b: State, c: float) -> State:
    m = a[0].alu(Ops.MAX, b[0])
    return m, a[1] * _rescale(a[0], m, c) + b[1] * _rescale(b[0], m, c)


def _fold(state: State, n_out: int, apart: int, dot: bool, c: float) -> State:
    """The `n_out` states of an accumulator keeping `apart` lanes per output (`lowerer._acc_lanes`'s layouts)."""

    def lanes(u: int) -> list[int]:
        return [o * apart + u for o in range(n_out)] if dot else list(range(u * n_out, (u + 1) * n_out))

    res = (gep(state[0], lanes(0)), gep(state[1], lanes(0)))
    for u in range(1, apart):
        res = _combine(res, (gep(state[0], lanes(u)), gep(state[1], lanes(u))), c)
    return res


def _butterfly(state: State, lanes: int, c: float) -> State:
    """`state` combined over each aligned run of `lanes` threads of a warp by shuffles (`lowerer._butterfly`)."""
    offset = lanes // 2
    while offset >= 1:
        other = tuple(
            vectorize([UOp(Ops.SHUFFLE_XOR, v.dtype.scalar(), (gep(v, (o,)),), offset) for o in range(v.dtype.count)])
            for v in state
        )
        state = _combine(state, (other[0], other[1]), c)
        offset //= 2
    return state


def _through_shared(
    lw: _Lowerer, pair: OnlineSoftmax, state: State, row: UOp, slot: UOp, n: int, writer: UOp | None
) -> State:
    """Combine the states of `n` threads (or warps) per row of a workgroup through local memory, one buffer per
    component (`lowerer._Lowerer._through_shared` for a pair)."""
    k = lw.k
    n_out = state[0].dtype.count
    size = k.lanes(AxisType.LOCAL) * n * n_out
    gate = () if writer is None else (writer,)
    base = (row * n + slot) * n_out
    bufs, stores = [], []
    for v in state:
        buf = UOp(Ops.DEFINE_LOCAL, v.dtype.scalar().ptr(size, local=True), arg=f"temp{lw.local_buffers}")
        lw.local_buffers += 1
        bufs.append(buf)
        for o in range(n_out):
            index = UOp(Ops.INDEX, buf.dtype, (buf, base + o))
            stores.append(UOp(Ops.STORE, dtypes.void, (index, gep(v, (o,)), *gate)))
    barrier = UOp(Ops.BARRIER, dtypes.void, tuple(stores))

    def partial(i: UOp) -> State:
        first = (row * n + i) * n_out
        m, s = (
            vectorize(
                [UOp(Ops.LOAD, b.dtype.base, (UOp(Ops.INDEX, b.dtype, (b, first + o)), barrier)) for o in range(n_out)]
            )
            for b in bufs
        )
        return m, s

    if k.warp_split() is not None and n & (n - 1) == 0 and n <= warp_size(k.renderer):
        return _butterfly(partial(lw._flat(k.axes(AxisType.GROUP_REDUCE)) % n), n, pair.scale)
    second = UOp.range(n, k.rank + lw.local_buffers)
    dtype = state[0].dtype.scalar()
    acc_m = lw._acc(dtype, n_out, UOp.const(dtype, -math.inf), (second,))
    acc_s = lw._acc(dtype, n_out, UOp.const(dtype, 0.0), (second,))
    m, s = _combine((acc_m, acc_s), partial(second), pair.scale)
    return UOp(Ops.ASSIGN, acc_m.dtype, (acc_m, m)), UOp(Ops.ASSIGN, acc_s.dtype, (acc_s, s))


def _group(lw: _Lowerer, pair: OnlineSoftmax, state: State) -> State:
    """The states of a row's threads combined (`lowerer._Lowerer._group_reduce` for a pair)."""
    k = lw.k
    groups, local = k.axes(AxisType.GROUP_REDUCE), k.axes(AxisType.LOCAL)
    l_flat, g_flat = lw._flat(local), lw._flat(groups)
    lw.store_gate = lw._first_in_group()
    if (split := k.warp_split()) is None:
        return _through_shared(lw, pair, state, l_flat, g_flat, k.lanes(AxisType.GROUP_REDUCE), None)
    lanes, warps = split
    state = _butterfly(state, lanes, pair.scale)
    if warps == 1:
        return state
    return _through_shared(lw, pair, state, l_flat, g_flat // lanes, warps, (g_flat % lanes).eq(0))


def _step(m: UOp, s: UOp, xs: list[UOp], c: float) -> State:
    """The state after one loop step reading the vectors `xs` (one lane per accumulator lane each)."""
    peak = xs[0]
    for x in xs[1:]:
        peak = peak.alu(Ops.MAX, x)
    new_m = m.alu(Ops.MAX, peak)
    total = s * _rescale(m, new_m, c)
    for x in xs:
        # an element of -inf adds 0 even while the max is still -inf (where (x - m) would be NaN)
        total = total + x.eq(_splat(x, -math.inf)).where(_splat(x, 0.0), _exp2_scaled(x - new_m, c))
    return new_m, total


def lower_online(lw: _Lowerer, pair: OnlineSoftmax) -> State:
    """The results (one lane per output lane) of `pair.peak` and `pair.total`, computed in one loop over the rows:
    the loops of the pair's level (0), with the accumulator layout a plain reduction there would get."""
    from lazygrad_codegen.lowerer import _acc_lanes, _Lanes

    k, c = lw.k, pair.scale
    ranges = lw.ranges[0]
    n_out = lw.out.n
    n_unroll = lw.full.n // n_out
    apart, dot = lw._acc_layout(n_out, n_unroll)
    full = lw.full
    if dot:
        n_un = len(k.axes(AxisType.UNROLL))
        full = _Lanes(full.axes[n_un:] + full.axes[:n_un], full.sizes[n_un:] + full.sizes[:n_un])
    x = lw.value(pair.peak.src[0], full)
    dtype = pair.total.dtype
    neg_inf = UOp.const(dtype, -math.inf)
    if k.reduce_mask is not None:
        # padded elements count as -inf: no effect on the max, 0 in the sum
        valid = [v for _, v in lw.indexed(k.reduce_mask, full)]
        x = vectorize([v.where(gep(x, (i,)), neg_inf) for i, v in enumerate(valid)])
    slices = [gep(x, _acc_lanes(step, n_out, n_unroll, apart, dot)) for step in range(n_unroll // apart)]
    n_acc = n_out * apart
    if ranges:
        acc_m = lw._acc(dtype, n_acc, neg_inf, ranges)
        acc_s = lw._acc(dtype, n_acc, UOp.const(dtype, 0.0), ranges)
        m, s = _step(acc_m, acc_s, slices, c)
        state: State = (UOp(Ops.ASSIGN, acc_m.dtype, (acc_m, m)), UOp(Ops.ASSIGN, acc_s.dtype, (acc_s, s)))
    else:
        state = _step(vectorize([neg_inf] * n_acc), vectorize([UOp.const(dtype, 0.0)] * n_acc), slices, c)
    state = _fold(state, n_out, apart, dot, c)
    if k.axes(AxisType.GROUP_REDUCE):
        state = _group(lw, pair, state)
    m, s = state
    # a row of -inf only: the nested form's sum of exp2((-inf - -inf) * c) is NaN (an empty row keeps its 0)
    if all(isinstance(n, int) and n > 0 for n in (k.full_shape[a] for a in _reduced_axes(k))):
        s = m.eq(_splat(m, -math.inf)).where(_splat(s, math.nan), s)
    return m, s


def _reduced_axes(k: Kernel) -> list[int]:
    return k.axes(AxisType.REDUCE, AxisType.GROUP_REDUCE, AxisType.UNROLL)
