"""Online reductions: two reductions over the same rows, the second reading the first's result, computed in one loop
over the row instead of one loop each: softmax's max and sum of exponentials, and layernorm's (or a variance's) sum and
sum of squared deviations from the mean.

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

For `Q = sum((x - a) ** 2)` with `a = f(S)`, `S = sum(x)` (layernorm's variance, `a = S / n`), the loop works on
the deviations `d = x - K` from the row's first element `K` (0 where that is infinite or NaN): per accumulator lane a
count, their mean and sum of squared deviations from it (Welford's update, each step's elements folded in as one
chunk), and the plain sums of d and of x; lanes, warps and threads merge those by Chan's parallel formula and by
adding. Then `Q = M2 + n * (mean - t) ** 2` with `t = a - K` (an identity; the second term ~0), and S is the plain
sum, or `n * K + sum(d)` where that sum is the smaller (rows far from zero). The shift keeps the running mean small
against the spread: Welford on the raw values drifts by its roundings where the mean is far from zero (fp32 rows
around 1e4 with spread 3 lose 1e-3 of the variance at 4,097 elements), shifted sums of squares cancel where the
first element is far out of the row (every digit, for a first element 64 spreads away), the sum of squares minus
the squared sum loses every digit on both; Welford on the shifted values stays within ~1e-6 of the variance on
both.

Later sums over the same rows whose sources are sums of products of the term (or of the deviation `x - mean`) with
values reading no reduction (weights: the incoming gradient) and values of the rows (factors: `1 / S`, the variance,
an earlier such sum) join the loop too (the backward passes of softmax and layernorm): softmax's weighted sums are
rescaled with S; for the deviation, the loop keeps each weight's sum and its sum times `x - K`, and
`sum(W * (x - a)) = sum(W * (x - K)) - t * sum(W)`. Sums linear in softmax's `d = x - max(x)` (cross-entropy's sum of
the target times log_softmax, `d - log(S)`) join the loop the same way: each weight's sum and its sum times `x - m`
from the running max `m`, moved by `-(m' - m) * sum(W)` whenever the max rises to `m'`, so the loss reads the logits
once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lazygrad_codegen.kernel import REDUCE_TYPES, AxisType, Kernel, warp_size
from lazygrad_codegen.vectors import gep, vectorize
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

if TYPE_CHECKING:
    from lazygrad_codegen.lowerer import _Lowerer


@dataclass(frozen=True)
class OnlineSoftmax:
    """`total = sum(exp2((x - max(x)) * scale))` over the rows of `peak = max(x)`, both over the same axes; and each
    `(sum, weight, row)` of `weighted`, a reduction `sum(weight * exp2(...) * row)` of the same term (softmax's
    backward: the incoming gradient times the softmax, `exp2(...) * (1 / total)`), `weight` reading no reduction and
    `row` only the pair's results (either None where there is none): computed as `row * sum(weight * exp2(...))`,
    the weighted sum rescaled with `total`."""

    peak: UOp
    total: UOp
    scale: float
    weighted: tuple[tuple[UOp, UOp | None, UOp | None], ...] = ()
    # `d = x - max(x)`, the node the sum's exponent reads
    deviation: UOp | None = None
    # sums linear in `d` (cross-entropy's sum of the target times log_softmax, `d - log(S)`): the weights (None for
    # 1) whose sums and sums times `d` the loop keeps, and the reductions computed from them, as in `OnlineVariance`
    weights: tuple[UOp | None, ...] = ()
    linear: tuple[tuple[UOp, tuple[tuple[UOp | None, int, int], ...]], ...] = ()


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
            return OnlineSoftmax(peak, total, float(c), deviation=diff)
    return None


@dataclass(frozen=True)
class OnlineVariance:
    """`squares = sum((x - mean) ** 2)` over the rows of `total = sum(x)`, `mean` any elementwise function of
    `total` (the frontend's `total * (1 / n)`)."""

    total: UOp
    squares: UOp
    mean: UOp
    # `d = x - mean`, the node the squares read
    deviation: UOp | None = None
    # weights (None for 1) whose sums and sums times the deviations the loop keeps, and the reductions computed
    # from them: each `(sum, monomials)`, a monomial `(row factor or None, weight index, power of d: 0 or 1)`
    weights: tuple[UOp | None, ...] = ()
    linear: tuple[tuple[UOp, tuple[tuple[UOp | None, int, int], ...]], ...] = ()


def _online_variance(squares: UOp) -> OnlineVariance | None:
    """The pair of `squares` when it is `sum(d * d)` with `d = x + f(sum(x)) * -1` (`x` the very node the inner sum
    reads, f reading no other buffer or reduction), else None."""
    if squares.op is not Ops.REDUCE_AXIS or squares.arg[0] is not Ops.ADD or not dtypes.is_float(squares.dtype):
        return None
    sq = squares.src[0]
    if sq.op is not Ops.MUL or sq.src[0] is not sq.src[1] or (d := sq.src[0]).op is not Ops.ADD:
        return None
    for x, neg in (d.src, d.src[::-1]):
        if (negated := _split_mul(neg, -1)) is None:
            continue
        mean = negated[0]
        reds = [u for u in mean.toposort if u.op is Ops.REDUCE_AXIS]
        if len(reds) != 1:
            continue
        total = reds[0]
        # f reads nothing but the sum (its loads are the sum's own)
        if any(u.op is Ops.LOAD and u not in total.toposort for u in mean.toposort):
            continue
        if (
            total.arg == (Ops.ADD, squares.arg[1])
            and total.src[0] is x
            and total.dtype == squares.dtype == x.dtype
            and not any(u.op is Ops.REDUCE_AXIS for u in x.toposort)
        ):
            return OnlineVariance(total, squares, mean, d)
    return None


Pair = OnlineSoftmax | OnlineVariance


def find_online(k: Kernel) -> dict[UOp, Pair]:
    """Each reduction of `k` that an online reduction computes (both of a pair), mapped to its pair. Not on tensor
    cores, and not where either reduction's result is read by anything but a later reduction or a store (the pair's
    max read elsewhere in the sum's source would need the final max inside the loop)."""
    if k.tensor_core is not None:
        return {}
    out: dict[UOp, Pair] = {}
    for red in k.reduceops:
        if (pair := _online_softmax(red)) is not None and pair.peak not in out:
            # the max is read in the sum's source only as the shift: one use there
            if sum(1 for u in red.src[0].toposort for s in u.src if s is pair.peak) == 1:
                out[pair.peak] = out[pair.total] = pair
        elif (var := _online_variance(red)) is not None and var.total not in out:
            if sum(1 for u in red.src[0].toposort for s in u.src if s is var.mean) == 1:
                out[var.total] = out[var.squares] = var
    for red in k.reduceops:
        if red in out or red.arg[0] is not Ops.ADD:
            continue
        variances = {id(p): p for p in out.values() if isinstance(p, OnlineVariance)}.values()
        if (var_pair := next((p for p in variances if _linear(red, p) is not None), None)) is not None:
            grown_var = _with_linear(var_pair, red)
            for r, p in list(out.items()):
                if p is var_pair:
                    out[r] = grown_var
            out[red] = grown_var
            continue
        for pair in {id(p): p for p in out.values() if isinstance(p, OnlineSoftmax)}.values():
            if (found := _weighted(red, pair)) is not None:
                grown = dataclasses.replace(pair, weighted=(*pair.weighted, found))
            elif _reads_the_pair(red, pair) and _linear(red, pair) is not None:
                grown = _with_linear(pair, red)
            else:
                continue
            for r, p in list(out.items()):
                if p is pair:
                    out[r] = grown
            out[red] = grown
            break
    return out


Monomial = tuple[list[UOp], list[UOp], int]
# a reduction expanded into more monomials than this stays nested
MAX_MONOMIALS = 16


def _expand(u: UOp, pair: Pair, rows: set[UOp]) -> list[Monomial] | None:
    """`u` as a sum of monomials (row factors, weight factors, power of the pair's deviation `d`): ADDs and MULs of
    `d`, of values reading no reduction (weights) and of values reading only the reductions `rows` (row factors);
    None for anything else."""
    if u is pair.deviation:
        return [([], [], 1)]
    if u.op is Ops.ADD:
        a, b = _expand(u.src[0], pair, rows), _expand(u.src[1], pair, rows)
        return None if a is None or b is None or len(a) + len(b) > MAX_MONOMIALS else a + b
    if u.op is Ops.MUL:
        a, b = _expand(u.src[0], pair, rows), _expand(u.src[1], pair, rows)
        if a is None or b is None or len(a) * len(b) > MAX_MONOMIALS:
            return None
        return [(c1 + c2, w1 + w2, p1 + p2) for c1, w1, p1 in a for c2, w2, p2 in b]
    if not any(x.op is Ops.REDUCE_AXIS for x in u.toposort):
        return [([], [u], 0)]
    if _reads_only(u, rows):
        return [([u], [], 0)]
    return None


def _linear(red: UOp, pair: Pair) -> list[Monomial] | None:
    """`red` as monomials of at most the first power of the pair's deviation (`_expand`), when it sums over the
    pair's rows in its dtype and reads the pair's results and earlier such sums only as row factors."""
    if pair.deviation is None or red.arg[1] != pair.total.arg[1] or red.dtype != pair.total.dtype:
        return None
    results = (pair.total, pair.squares) if isinstance(pair, OnlineVariance) else (pair.peak, pair.total)
    rows = {*results, *(r for r, _ in pair.linear)}
    terms = _expand(red.src[0], pair, rows)
    if terms is None or any(p > 1 for _, _, p in terms):
        return None
    return terms


def _with_linear(pair: Pair, red: UOp) -> Pair:
    """`pair` also computing `red` (`_linear` holds) from sums of weights kept in its loop."""
    terms = _linear(red, pair)
    assert terms is not None
    weights = list(pair.weights)
    monomials = []
    for coef, weight, power in terms:
        w = _product(weight)
        if w not in weights:
            weights.append(w)
        monomials.append((_product(coef), weights.index(w), power))
    return dataclasses.replace(pair, weights=tuple(weights), linear=(*pair.linear, (red, tuple(monomials))))


def _reads_the_pair(red: UOp, pair: OnlineSoftmax) -> bool:
    """Whether `red`'s source reads the pair's max or sum: a sum reading neither is a plain reduction beside them."""
    return any(u is pair.peak or u is pair.total for u in red.src[0].toposort)


def _factors(u: UOp) -> list[UOp]:
    """The operands of the tree of MULs at `u`."""
    return [f for s in u.src for f in _factors(s)] if u.op is Ops.MUL else [u]


def _reads_only(u: UOp, allowed: set[UOp]) -> bool:
    """Whether `u` reads no buffer and no reduction but those in `allowed` (a value per row of them)."""
    stack, seen = [u], set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x.op is Ops.REDUCE_AXIS:
            if x not in allowed:
                return False
            continue
        if x.op is Ops.LOAD:
            return False
        stack.extend(x.src)
    return True


def _product(factors: list[UOp]) -> UOp | None:
    out = None
    for f in factors:
        out = f if out is None else UOp(Ops.MUL, out.dtype, (out, f))
    return out


def _weighted(red: UOp, pair: OnlineSoftmax) -> tuple[UOp, UOp | None, UOp | None] | None:
    """`(red, weight, row)` when `red` sums `weight * exp2(...) * row` over the rows of `pair` (`OnlineSoftmax`)."""
    term = pair.total.src[0]
    if red.arg[1] != pair.total.arg[1] or red.dtype != pair.total.dtype:
        return None
    factors = _factors(red.src[0])
    if sum(1 for f in factors if f is term) != 1:
        return None
    weight, row = [], []
    for f in factors:
        if f is term:
            continue
        if not any(u.op is Ops.REDUCE_AXIS for u in f.toposort):
            weight.append(f)
        elif _reads_only(f, {pair.peak, pair.total}):
            row.append(f)
        else:
            return None
    return red, _product(weight), _product(row)


# *** lowering ***

State = tuple[UOp, ...]


def _splat(like: UOp, value: float) -> UOp:
    """`value` in every lane of a vector shaped as `like`."""
    return vectorize([UOp.const(like.dtype.scalar(), value)] * like.dtype.count)


def _exp2_scaled(d: UOp, c: float) -> UOp:
    return (d * _splat(d, c)).alu(Ops.EXP2)


def _rescale(m: UOp, new_m: UOp, c: float) -> UOp:
    """exp2((m - new_m) * c), exactly 1 where the max did not change (also where both are -inf or +inf)."""
    return m.eq(new_m).where(_splat(m, 1.0), _exp2_scaled(m - new_m, c))


def _raise(m: UOp, new_m: UOp) -> UOp:
    """new_m - m, 0 where the max did not change or was -inf (a part of -inf elements only, whose sums of
    `x - m` are then -inf or NaN already, as the nested form's `x - max` of them)."""
    zero = _splat(m, 0.0)
    return m.eq(new_m).where(zero, m.eq(_splat(m, -math.inf)).where(zero, new_m - m))


def _identities(pair: Pair) -> tuple[float, ...]:
    """Each state component's value before any element: (max, sum) or (count, mean(d), M2(d), sum(d), sum(x))."""
    if isinstance(pair, OnlineSoftmax):
        return (-math.inf, 0.0) + (0.0,) * len(pair.weighted) + (0.0, 0.0) * len(pair.weights)
    return (0.0, 0.0, 0.0, 0.0, 0.0) + (0.0, 0.0) * len(pair.weights)


def _combine(pair: Pair, a: State, b: State) -> State:
    """Two partial states of the same rows merged."""
    if isinstance(pair, OnlineSoftmax):
        m = a[0].alu(Ops.MAX, b[0])
        ra, rb = _rescale(a[0], m, pair.scale), _rescale(b[0], m, pair.scale)
        n = 2 + len(pair.weighted)
        scaled = (x * ra + y * rb for x, y in zip(a[1:n], b[1:n], strict=True))
        # sums of weights times `x - m`, moved to the joint max: minus the max's raise times the weights' sum
        sa, sb = _raise(a[0], m), _raise(b[0], m)
        linear = []
        for j in range(n, len(a), 2):
            linear += [a[j] + b[j], (a[j + 1] - sa * a[j]) + (b[j + 1] - sb * b[j])]
        return (m, *scaled, *linear)
    (na, ma, qa, *sa), (nb, mb, qb, *sb) = a, b
    n = na + nb
    # (a part of no elements, a padded lane's, leaves the other as it is)
    zero = _splat(n, 0.0)
    frac = (zero < n).where(nb * n.alu(Ops.RECIP), zero)
    delta = mb - ma
    return (n, ma + delta * frac, qa + qb + delta * delta * na * frac, *(x + y for x, y in zip(sa, sb, strict=True)))


def _step(
    pair: Pair,
    state: State,
    xs: list[UOp],
    valid: list[UOp] | None,
    shift: UOp | None,
    step: UOp | None = None,
    weights: list[list[UOp] | None] | None = None,
    linear: list[list[UOp] | None] | None = None,
) -> State:
    """The state after one loop step reading the vectors `xs` (one lane per accumulator lane each; `valid` says
    which lanes hold elements where the rows are padded; `shift` the first element of each lane's row; `step`, where
    every lane counts the same elements, the index of the step in the only reduce loop, which gives the counts;
    `weights` the weights of each weighted sum, like `xs`, None for a weight of 1; `linear` those of each sum linear
    in a softmax's `x - max`)."""
    if isinstance(pair, OnlineSoftmax):
        raw = xs
        m, *sums = state
        # padded elements read as -inf: no effect on the max, 0 in the sum
        if valid is not None:
            xs = [v.where(x, _splat(x, -math.inf)) for x, v in zip(xs, valid, strict=True)]
        peak = xs[0]
        for x in xs[1:]:
            peak = peak.alu(Ops.MAX, x)
        new_m = m.alu(Ops.MAX, peak)
        scale = _rescale(m, new_m, pair.scale)
        # (the sums of exponentials; the sums linear in x - max move with the max below)
        n = 1 + len(pair.weighted)
        sums = [v * scale for v in sums[:n]] + sums[n:]
        for i, x in enumerate(xs):
            # an element of -inf adds 0 even while the max is still -inf (where (x - m) would be NaN)
            term = x.eq(_splat(x, -math.inf)).where(_splat(x, 0.0), _exp2_scaled(x - new_m, pair.scale))
            sums[0] = sums[0] + term
            for j, w in enumerate(weights or []):
                sums[j + 1] = sums[j + 1] + (term if w is None else w[i] * term)
        shift = _raise(m, new_m)
        for j, w in enumerate(linear or []):
            sw, swd = sums[n + 2 * j], sums[n + 2 * j + 1] - shift * sums[n + 2 * j]
            for i, x in enumerate(raw):
                zero = _splat(x, 0.0)
                # x - max as the nested form has it once the max is known: -inf for an element of -inf
                d = x.eq(_splat(x, -math.inf)).where(x, x - new_m)
                wi = _splat(x, 1.0) if w is None else w[i]
                if valid is not None:
                    d, wi = valid[i].where(d, zero), valid[i].where(wi, zero)
                sw, swd = sw + wi, swd + wi * d
            sums[n + 2 * j], sums[n + 2 * j + 1] = sw, swd
        return (new_m, *sums)
    assert shift is not None
    zero = _splat(xs[0], 0.0)
    ds = [x - shift for x in xs]
    if valid is not None:
        xs = [v.where(x, zero) for x, v in zip(xs, valid, strict=True)]
        ds = [v.where(d, zero) for d, v in zip(ds, valid, strict=True)]
        count = valid[0].where(_splat(zero, 1.0), zero)
        for v in valid[1:]:
            count = count + v.where(_splat(zero, 1.0), zero)
    else:
        count = _splat(zero, float(len(xs)))
    # the step's deviations as one chunk (count, mean, squared deviations from it), merged into the state
    chunk = ds[0]
    for d in ds[1:]:
        chunk = chunk + d
    if len(ds) == 1:
        mean, squares = chunk, zero
    else:
        mean = (zero < count).where(chunk * count.alu(Ops.RECIP), zero)
        squares = zero
        for i, d in enumerate(ds):
            e = d - mean
            e = e if valid is None else valid[i].where(e, zero)
            squares = squares + e * e
    if step is None:
        n, m, q = _combine(pair, state[:5], (count, mean, squares, zero, zero))[:3]
    else:
        # the counts before and after this step are the same in every lane: (step * k) and (step + 1) * k, so the
        # merge's fraction k / n is one scalar division per step, not one per lane
        k = len(xs)
        before = step.cast(zero.dtype.scalar()) * UOp.const(zero.dtype.scalar(), k)
        frac = UOp.const(zero.dtype.scalar(), k) * (before + UOp.const(zero.dtype.scalar(), k)).alu(Ops.RECIP)
        n, delta = state[0], mean - state[1]
        frac_v = vectorize([frac] * delta.dtype.count)
        m = state[1] + delta * frac_v
        q = state[2] + squares + delta * delta * vectorize([before] * delta.dtype.count) * frac_v
    # the plain sums of the deviations and of the values, element by element (`lower_online` picks one for S)
    deviations, total = state[3], state[4]
    for d, x in zip(ds, xs, strict=True):
        deviations, total = deviations + d, total + x
    # each weight's sum and sum times the deviations (from K)
    sums = list(state[5:])
    for j, w in enumerate(weights or []):
        for i, d in enumerate(ds):
            wi = _splat(d, 1.0) if w is None else w[i]
            if valid is not None:
                wi = valid[i].where(wi, zero)
            sums[2 * j], sums[2 * j + 1] = sums[2 * j] + wi, sums[2 * j + 1] + wi * d
    return (n, m, q, deviations, total, *sums)


def _fold(pair: Pair, state: State, n_out: int, apart: int, dot: bool) -> State:
    """The `n_out` states of an accumulator keeping `apart` lanes per output (`lowerer._acc_lanes`'s layouts)."""

    def lanes(u: int) -> list[int]:
        return [o * apart + u for o in range(n_out)] if dot else list(range(u * n_out, (u + 1) * n_out))

    res = tuple(gep(v, lanes(0)) for v in state)
    for u in range(1, apart):
        res = _combine(pair, res, tuple(gep(v, lanes(u)) for v in state))
    return res


def _butterfly(pair: Pair, state: State, lanes: int) -> State:
    """`state` combined over each aligned run of `lanes` threads of a warp by shuffles (`lowerer._butterfly`)."""
    offset = lanes // 2
    while offset >= 1:
        other = tuple(
            vectorize([UOp(Ops.SHUFFLE_XOR, v.dtype.scalar(), (gep(v, (o,)),), offset) for o in range(v.dtype.count)])
            for v in state
        )
        state = _combine(pair, state, other)
        offset //= 2
    return state


def _through_shared(lw: _Lowerer, pair: Pair, state: State, row: UOp, slot: UOp, n: int, writer: UOp | None) -> State:
    """Combine the states of `n` threads (or warps) per row of a workgroup through local memory, one buffer per
    component (`lowerer._Lowerer._through_shared` for a state)."""
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
        return tuple(
            vectorize(
                [UOp(Ops.LOAD, b.dtype.base, (UOp(Ops.INDEX, b.dtype, (b, first + o)), barrier)) for o in range(n_out)]
            )
            for b in bufs
        )

    if k.warp_split() is not None and n & (n - 1) == 0 and n <= warp_size(k.renderer):
        return _butterfly(pair, partial(lw._flat(k.axes(AxisType.GROUP_REDUCE)) % n), n)
    second = UOp.range(n, k.rank + lw.local_buffers)
    dtype = state[0].dtype.scalar()
    accs = tuple(lw._acc(dtype, n_out, UOp.const(dtype, ident), (second,)) for ident in _identities(pair))
    new = _combine(pair, accs, partial(second))
    return tuple(UOp(Ops.ASSIGN, a.dtype, (a, v)) for a, v in zip(accs, new, strict=True))


def _group(lw: _Lowerer, pair: Pair, state: State) -> State:
    """The states of a row's threads combined (`lowerer._Lowerer._group_reduce` for a state)."""
    k = lw.k
    groups, local = k.axes(AxisType.GROUP_REDUCE), k.axes(AxisType.LOCAL)
    l_flat, g_flat = lw._flat(local), lw._flat(groups)
    lw.store_gate = lw._first_in_group()
    if (split := k.warp_split()) is None:
        return _through_shared(lw, pair, state, l_flat, g_flat, k.lanes(AxisType.GROUP_REDUCE), None)
    lanes, warps = split
    state = _butterfly(pair, state, lanes)
    if warps == 1:
        return state
    return _through_shared(lw, pair, state, l_flat, g_flat // lanes, warps, (g_flat % lanes).eq(0))


def lower_online(lw: _Lowerer, pair: Pair) -> dict[UOp, UOp]:
    """The results (one lane per output lane) of both reductions of `pair`, computed in one loop over the rows: the
    loops of the pair's level (0), with the accumulator layout a plain reduction there would get."""
    from lazygrad_codegen.lowerer import _acc_lanes, _Lanes

    k = lw.k
    ranges = lw.ranges[0]
    n_out = lw.out.n
    n_unroll = lw.full.n // n_out
    apart, dot = lw._acc_layout(n_out, n_unroll)
    if isinstance(pair, OnlineSoftmax) and dot and apart > lw.width and apart % lw.width == 0:
        # one vector per output, several steps per iteration: a step's max rises once for all of its vectors, so each
        # iteration rescales one vector of sums instead of one per vector of elements (an exp2 per element fewer on
        # the CPU's 64-element steps)
        apart = lw.width
    full = lw.full
    if dot:
        n_un = len(k.axes(AxisType.UNROLL))
        full = _Lanes(full.axes[n_un:] + full.axes[:n_un], full.sizes[n_un:] + full.sizes[:n_un])
    first = pair_first(pair)
    x = lw.value(first.src[0], full)
    dtype = first.dtype
    steps = range(n_unroll // apart)
    slices = [gep(x, _acc_lanes(step, n_out, n_unroll, apart, dot)) for step in steps]
    valid = None
    if k.reduce_mask is not None:
        mask = vectorize([v for _, v in lw.indexed(k.reduce_mask, full)])
        valid = [gep(mask, _acc_lanes(step, n_out, n_unroll, apart, dot)) for step in steps]
    n_acc = n_out * apart

    def per_step(weight: UOp | None) -> list[UOp] | None:
        w = None if weight is None else lw.value(weight, full)
        return None if w is None else [gep(w, _acc_lanes(st, n_out, n_unroll, apart, dot)) for st in steps]

    softmax = isinstance(pair, OnlineSoftmax)
    weights = [per_step(w) for w in ([w for _, w, _ in pair.weighted] if softmax else pair.weights)]
    linear = [per_step(w) for w in pair.weights] if softmax else None
    state: State
    shift = first_of_row = None
    if isinstance(pair, OnlineVariance):
        # the row's first element, one per output lane, then per accumulator lane (`lowerer._acc_lanes`'s order)
        at_zero = tuple((a, (UOp.const(lw.idx_dt, 0),) * n_out) for a in k.axes(*REDUCE_TYPES))
        first_of_row = lw.value(pair.total.src[0], _Lanes(lw.out.axes, lw.out.sizes, pins=at_zero))
        # (an infinite or NaN first element shifts nothing: the sums then see the values themselves, as unshifted)
        first_of_row = (
            (first_of_row - first_of_row).eq(_splat(first_of_row, 0.0)).where(first_of_row, _splat(first_of_row, 0.0))
        )
        order = (
            [o for o in range(n_out) for _ in range(apart)] if dot else [o for _ in range(apart) for o in range(n_out)]
        )
        shift = gep(first_of_row, order)
    trips = ranges[0].src[0].arg if len(ranges) == 1 and ranges[0].src[0].op is Ops.CONST else None
    if isinstance(pair, OnlineVariance) and valid is None and isinstance(trips, int):
        # every lane counts the same elements: the count is the loop's, no accumulator of its own
        accs = tuple(lw._acc(dtype, n_acc, UOp.const(dtype, ident), ranges) for ident in _identities(pair)[1:])
        count = vectorize([UOp.const(dtype, float(trips * len(slices)))] * n_acc)
        new = _step(pair, (count, *accs), slices, None, shift, ranges[0], weights)[1:]
        state = (count, *(UOp(Ops.ASSIGN, a.dtype, (a, v)) for a, v in zip(accs, new, strict=True)))
    elif ranges:
        accs = tuple(lw._acc(dtype, n_acc, UOp.const(dtype, ident), ranges) for ident in _identities(pair))
        new = _step(pair, accs, slices, valid, shift, weights=weights, linear=linear)
        state = tuple(UOp(Ops.ASSIGN, a.dtype, (a, v)) for a, v in zip(accs, new, strict=True))
    else:
        start = tuple(vectorize([UOp.const(dtype, ident)] * n_acc) for ident in _identities(pair))
        state = _step(pair, start, slices, valid, shift, weights=weights, linear=linear)
    state = _fold(pair, state, n_out, apart, dot)
    if k.axes(AxisType.GROUP_REDUCE):
        state = _group(lw, pair, state)
    if isinstance(pair, OnlineSoftmax):
        m, *sums = state
        n = 1 + len(pair.weighted)
        sums, lin = sums[:n], sums[n:]
        # a row of -inf only: the nested form's sum of exp2((-inf - -inf) * c) is NaN (an empty row keeps its 0), and
        # so is each sum of weights times x - max
        if all(isinstance(n, int) and n > 0 for n in (k.full_shape[a] for a in _reduced_axes(k))):
            sums = [m.eq(_splat(m, -math.inf)).where(_splat(v, math.nan), v) for v in sums]
            lin = [
                v if j % 2 == 0 else m.eq(_splat(m, -math.inf)).where(_splat(v, math.nan), v) for j, v in enumerate(lin)
            ]
        out = {pair.peak: m, pair.total: sums[0]}
        lw.memo[("online", pair.peak)], lw.memo[("online", pair.total)] = m, sums[0]
        for (red, _, row), v in zip(pair.weighted, sums[1:], strict=True):
            # the factor of every element of the row, known now (it reads the pair's results)
            out[red] = v if row is None else v * lw.value(row, lw.out)
        # each sum times x - max read through its weights' sum times (max - max), 0 for a finite max and NaN where the
        # sum is NaN anyway (a max of +inf): the weights' sum, which the loop's update of the other reads, is then
        # kept (an accumulator only an unused result reads would be left out of the loop)
        live = m - m
        lin = [v if j % 2 == 0 else v + lin[j - 1] * live for j, v in enumerate(lin)]
        out.update(_linear_sums(lw, pair.linear, lin, None))
        return out
    count, mean, m2, deviations, plain, *sums = state
    assert first_of_row is not None
    # S as n * K + sum(d) (one rounding where the device fuses the multiply-add) where that is the smaller sum: a
    # sequential sum's error grows with its partial sums, so rows far from zero (whose plain sum grows to n times
    # the offset) take the shifted one, rows near zero the plain one; a NaN or infinite sum stays the plain one
    shifted = count.alu(Ops.MULACC, first_of_row, deviations)
    bound = (count * deviations.alu(Ops.MAX, -deviations)) + (count * first_of_row).alu(
        Ops.MAX, -(count * first_of_row)
    )
    total = (bound < count * plain.alu(Ops.MAX, -plain)).where(shifted, plain)
    # the total is known now: the mean the graph computes from it (read above the loops), as an offset from K
    lw.memo[("online", pair.total)] = total
    t = lw.value(pair.mean, lw.out) - first_of_row
    off = mean - t
    out = {pair.total: total, pair.squares: m2 + count * off * off}
    lw.memo[("online", pair.squares)] = out[pair.squares]
    out.update(_linear_sums(lw, pair.linear, sums, t))
    return out


def _linear_sums(
    lw: _Lowerer,
    linear: tuple[tuple[UOp, tuple[tuple[UOp | None, int, int], ...]], ...],
    sums: list[UOp],
    t: UOp | None,
) -> list[tuple[UOp, UOp]]:
    """Each sum of `linear` from the weights' sums and sums times the deviation the loop kept (`sums`, in pairs), one
    after the other (a later one's row factors may read an earlier one). For a variance `sum(W * (x - a)) =
    sum(W * d) - t * sum(W)` with `d = x - K`, `t = a - K`; for a softmax `t` is None, the loop's deviation `x - max`
    the sum's own. Row factors read above the loops."""
    out = []
    for red, monomials in linear:
        value = None
        for coef, j, power in monomials:
            term = sums[2 * j] if power == 0 else sums[2 * j + 1] if t is None else sums[2 * j + 1] - t * sums[2 * j]
            term = term if coef is None else lw.value(coef, lw.out) * term
            value = term if value is None else value + term
        assert value is not None
        lw.memo[("online", red)] = value
        out.append((red, value))
    return out


def _reduced_axes(k: Kernel) -> list[int]:
    return k.axes(AxisType.REDUCE, AxisType.GROUP_REDUCE, AxisType.UNROLL)


def pair_first(pair: Pair) -> UOp:
    """The reduction of `pair` that reads no other: the one whose loops both share."""
    return pair.peak if isinstance(pair, OnlineSoftmax) else pair.total
