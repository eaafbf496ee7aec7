"""The symbolic engine: rewrite rules that simplify integer and boolean UOp expressions.

`symbolic` is a `PatternMatcher`; `simplify(u)` applies it to a fixed point. The rules fold constants, replace
a node whose bounds (`vmin`/`vmax`) pin it to one value by that value, put sums and products in a canonical
order with like terms collected, fold nested and bounded `//` and `%`, and rewrite comparisons into smaller
equivalent ones. Integer rules hold with C semantics (`//` truncates toward zero, `%` takes the dividend's
sign) and with wrapping arithmetic: a rule that reasons about exact values first checks, from the bounds, that
nothing on the way can wrap. Float expressions only get rules that are exact in IEEE arithmetic.

Sums are kept as left-nested chains `((t1 + t2) + t3) + c`: terms sorted by `order_key`, the constant last, and
each term `base * coefficient` with the coefficient last. Products are kept the same way.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.pattern import PatternMatcher, UPat, graph_rewrite
from lazygrad_uop.uop import UOp, _dtype_range, _int_range, eval_alu, eval_uop

INTS: tuple[DType, ...] = (
    dtypes.int8,
    dtypes.uint8,
    dtypes.int16,
    dtypes.uint16,
    dtypes.int32,
    dtypes.uint32,
    dtypes.int64,
    dtypes.uint64,
)
_INTS_BOOL = (*INTS, dtypes.bool)

# *** canonical order ***


def order_key(u: UOp) -> tuple[Any, ...]:
    """A total order on nodes that is the same in every run: constants last, then by op, arg, dtype and sources.

    Built from reprs and op values, never from object ids, so simplified graphs (and the kernels rendered from
    them) don't change from run to run.
    """
    # memoised in the node's own __dict__ (it dies with the node; a WeakKeyDictionary lookup costs a Python call)
    if (k := u.__dict__.get("_order_key")) is not None:
        return k
    # an explicit stack: deep graphs must not hit Python's recursion limit
    stack = [u]
    while stack:
        n = stack[-1]
        if "_order_key" in n.__dict__:
            stack.pop()
            continue
        missing = [s for s in n.src if "_order_key" not in s.__dict__]
        if missing:
            stack.extend(missing)
            continue
        stack.pop()
        srcs = tuple([s.__dict__["_order_key"] for s in n.src])
        n.__dict__["_order_key"] = (n.op is Ops.CONST, n.op.value, repr(n.arg), n.dtype.priority, n.dtype.count, srcs)
    return u.__dict__["_order_key"]


def _size(u: UOp) -> int:
    return len(u._below) + 1  # len(u.toposort), without building the view


def _no_bigger(new: UOp, old: UOp) -> UOp | None:
    """`new` when it has no more nodes than `old`: a rule that would grow the graph doesn't fire."""
    return new if new is not old and _size(new) <= _size(old) else None


# *** constant folding and bounds ***

_FOLDABLE = frozenset(
    {Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
    | {Ops.SHL, Ops.SHR, Ops.WHERE, Ops.MULACC, Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.TRUNC, Ops.CAST}
)
# float constants are only folded where dtypes.as_const rounds to the dtype (bfloat16 and fp8 have no struct format)
_FOLD_DTYPES = frozenset({*INTS, dtypes.bool, dtypes.float16, dtypes.float32, dtypes.float64})


def _fold_constants(x: UOp) -> UOp | None:
    """An op on constants is its value, computed as the device would (`eval_uop`, wrapped and rounded to the dtype)."""
    if x.op not in _FOLDABLE or x.dtype not in _FOLD_DTYPES:
        return None
    vals = [s.arg for s in x.src]
    if x.op in (Ops.IDIV, Ops.MOD) and (not dtypes.is_int(x.dtype) or vals[1] == 0):
        return None  # codegen's division guard gives it its defined value (0) on every device
    if x.op in (Ops.SHL, Ops.SHR) and not (dtypes.is_int(x.dtype) and 0 <= vals[1] < 8 * x.dtype.itemsize):
        return None
    if x.op is Ops.CAST and dtypes.is_int(x.dtype) and isinstance(vals[0], float) and not math.isfinite(vals[0]):
        return None
    # what eval_uop(x) computes, in its one step: the sources are constants
    return x.const_like(eval_alu(x.op, x.dtype, vals))


def _fold_bounded(x: UOp) -> UOp | None:
    """A node that bounds pin to a single value is that value."""
    if x.dtype.count == 1 and (mm := x._min_max)[0] == mm[1]:
        return x.const_like(mm[0])
    return None


# *** linear forms: a sum of base*coefficient terms plus a constant ***

Linear = tuple[dict[UOp, int], int]


def _const_operand(u: UOp) -> tuple[UOp, int] | None:
    """(other operand, constant) of a binary node with one constant source."""
    if u.src[1].op is Ops.CONST and u.src[0].op is not Ops.CONST:
        return u.src[0], u.src[1].arg
    if u.src[0].op is Ops.CONST and u.src[1].op is not Ops.CONST:
        return u.src[1], u.src[0].arg
    return None


def _linear(u: UOp, deep: bool) -> Linear:
    """`u` as {base: coefficient} and a constant, in exact Python ints.

    Shallow: only the ADD chain of `u` is split. Deep also distributes a constant factor over a sum and reads
    `x ^ -1` as `-x - 1`; both are ring identities, so they hold with wrapping too.
    """
    coeffs: dict[UOp, int] = {}
    k = 0
    stack: list[tuple[UOp, int, bool]] = [(u, 1, False)]
    push = stack.append
    while stack:
        n, c, scaled = stack.pop()
        op = n.op
        if op is Ops.ADD and (deep or not scaled):
            for s in reversed(n.src):
                push((s, c, scaled))
        elif op is Ops.CONST:
            k += c * n.arg
        elif op is Ops.MUL and (co := _const_operand(n)) is not None:
            push((co[0], c * co[1], True))
        elif deep and op is Ops.XOR and (co := _const_operand(n)) is not None and co[1] == _wrap(-1, u.dtype):
            push((co[0], -c, True))
            k -= c
        else:
            coeffs[n] = coeffs.get(n, 0) + c
    return coeffs, k


def _interval(coeffs: dict[UOp, int], k: int) -> tuple[int, int]:
    """Exact bounds of a linear form, from the bounds of its bases."""
    lo = hi = k
    for b, c in coeffs.items():
        b0, b1 = b._min_max
        x0, x1 = c * int(b0), c * int(b1)
        if x0 <= x1:
            lo, hi = lo + x0, hi + x1
        else:
            lo, hi = lo + x1, hi + x0
    return lo, hi


def _fits(lo: int, hi: int, dt: DType) -> bool:
    """True when every value in [lo, hi] is representable in `dt`, so arithmetic there doesn't wrap."""
    r = _dtype_range(dt)
    return r[0] <= lo and hi <= r[1]


def _wrap(v: int, dt: DType) -> int:
    """`dtypes.as_const(v, dt)` for an int: `v` wrapped to the int dtype `dt`, without the call when it fits."""
    r = _int_range(dt)
    return v if r is not None and r[0] <= v <= r[1] else dtypes.as_const(v, dt)  # type: ignore[return-value]


def _build_sum(coeffs: dict[UOp, int], k: int, like: UOp) -> UOp:
    """The canonical chain for a linear form, in the dtype of `like` (coefficients wrap as the dtype does)."""
    # `terms[0] + terms[1] + ...` and `b * c`, built with `alu` directly: the operators' own steps are for Python
    # scalars, and this builds a good part of what the symbolic rules build
    dt = like.dtype
    out: UOp | None = None
    for b in sorted(coeffs, key=order_key):
        c = _wrap(coeffs[b], dt)
        if c != 0:
            t = b if c == 1 else b.alu(Ops.MUL, UOp.const(b.dtype, c))
            out = t if out is None else out.alu(Ops.ADD, t)
    k = _wrap(k, dt)
    if out is None:
        return UOp.const(dt, k)
    return out.alu(Ops.ADD, UOp.const(out.dtype, k)) if k != 0 else out


# *** sums and products ***


def _add_terms(x: UOp) -> tuple[list[UOp], int]:
    """The terms of x's ADD chain, each occurrence separately, and the sum of its constants."""
    terms: list[UOp] = []
    k = 0
    stack = [x]
    while stack:
        n = stack.pop()
        if n.op is Ops.ADD:
            stack.extend(reversed(n.src))
        elif n.op is Ops.CONST:
            k += n.arg
        else:
            terms.append(n)
    return terms, k


def _base(t: UOp) -> UOp:
    """A term without its constant coefficient."""
    return co[0] if t.op is Ops.MUL and (co := _const_operand(t)) is not None else t


# a sum already in canonical form has `_CANONICAL` in its __dict__: (order_key of its last base, whether it ends in a
# constant)
_CANONICAL = "_canonical_sum"


def _plain_term(t: UOp) -> UOp | None:
    """The base of a term as `_build_sum` writes it (base, or base * constant), when that base needs no deep form."""
    b = t
    if t.op is Ops.MUL and (co := _const_operand(t)) is not None:
        if t.src[1].op is not Ops.CONST or co[1] in (0, 1):
            return None
        b = co[0]
        if b.op is Ops.MUL and _const_operand(b) is not None:
            return None
    return None if b.op in (Ops.ADD, Ops.XOR, Ops.CONST) else b


def _is_canonical_sum(x: UOp) -> bool:
    """True when `_canonical_add` would leave x as it is because it is a chain `_build_sum` writes: distinct bases
    in order, the constant last. A structural fact, cached, so walking a long canonical chain costs O(1) a node."""
    spine = []
    n = x
    while n.op is Ops.ADD and _CANONICAL not in n.__dict__:
        spine.append(n)
        n = n.src[0]
    for n in reversed(spine):
        a, t = n.src
        if a.op is Ops.ADD:
            if (prev := a.__dict__.get(_CANONICAL)) is None or prev[1]:
                return False
            last = prev[0]
        elif (b0 := _plain_term(a)) is not None:
            last = order_key(b0)
        else:
            return False
        if t.op is Ops.CONST:
            if t.arg == 0:
                return False
            n.__dict__[_CANONICAL] = (last, True)
            continue
        if (b := _plain_term(t)) is None or not last < order_key(b):
            return False
        n.__dict__[_CANONICAL] = (order_key(b), False)
    return _CANONICAL in x.__dict__


def _canonical_add(x: UOp) -> UOp | None:
    """Flatten, collect like terms, fold constants, sort; distribute constants over inner sums only if smaller.

    Collecting can cost nodes (x + x has two, x*2 three; a shared subsum gets rebuilt), so where the result would
    be bigger than the chain it replaces, the terms are only sorted, and if even that is bigger, left alone.
    """
    if x.dtype.count != 1 or _is_canonical_sum(x):
        return None
    coeffs, k = _linear(x, deep=False)
    best = _build_sum(coeffs, k, x)
    if any(b.op is Ops.ADD or b.op is Ops.XOR for b in coeffs):
        deep = _build_sum(*_linear(x, deep=True), x)
        if _size(deep) < _size(best):
            best = deep
    if _size(best) <= _size(x):
        return best
    terms, k = _add_terms(x)
    # by base, as `_build_sum` orders, and stable so a chain this returned is left as it is
    chain = functools.reduce(lambda a, t: a + t, sorted(terms, key=lambda t: order_key(_base(t))))
    k = dtypes.as_const(k, x.dtype)
    return _no_bigger(chain + chain.const_like(k) if k != 0 else chain, x)


def _canonical_mul(x: UOp) -> UOp | None:
    """Flatten, multiply the constants, sort the factors; a constant factor distributes over a sum (`(x + 3)*4` is
    `x*4 + 12`) when that is no bigger."""
    if x.dtype.count != 1:
        return None
    factors: list[UOp] = []
    c = 1
    stack = [x]
    while stack:
        n = stack.pop()
        if n.op is Ops.MUL:
            stack.extend(reversed(n.src))
        elif n.op is Ops.CONST:
            c *= n.arg
        else:
            factors.append(n)
    c = dtypes.as_const(c, x.dtype)
    if c == 0:
        return x.const_like(0)
    if not factors:
        return x.const_like(c)
    out = functools.reduce(lambda a, f: a * f, sorted(factors, key=order_key))
    out = out * out.const_like(c) if c != 1 else out
    if len(factors) == 1 and c != 1 and factors[0].op is Ops.ADD:
        spread = _build_sum(*_linear(out, deep=True), x)
        if _size(spread) <= _size(out):
            return spread
    return out


# *** division and remainder ***


def _residue(a: int, m: int, nonneg: bool, lo: int, hi: int) -> int:
    """A residue r of `a` mod m (a - r divisible by m) chosen so r*base keeps the sign the regime wants."""
    r0 = a % m
    r1 = r0 - m if r0 else 0
    if lo >= 0:
        return r0 if nonneg else r1
    if hi <= 0:
        return r1 if nonneg else r0
    return r0 if abs(r0) <= abs(r1) else r1


def _split(coeffs: dict[UOp, int], k: int, m: int, nonneg: bool, keep_small: bool) -> tuple[Linear, Linear]:
    """The linear form as m*Q + R: (Q, R). `keep_small` leaves coefficients already smaller than m in R as they are."""
    qc: dict[UOp, int] = {}
    rc: dict[UOp, int] = {}
    for b, a in coeffs.items():
        if keep_small and abs(a) < m:
            r = a
        else:
            lo, hi = b._min_max
            r = _residue(a, m, nonneg, int(lo), int(hi))
        qc[b], rc[b] = (a - r) // m, r
    rk = k if keep_small and abs(k) < m else _residue(k, m, nonneg, 1, 1)
    return (qc, (k - rk) // m), (rc, rk)


def _fold_divmod(u: UOp) -> UOp | None:
    """`x // c` and `x % c` for a constant c, from x's linear form.

    With g = gcd(c, every coefficient, the constant): (g*a) // (g*b) == a // b and (g*a) % (g*b) == (a % b)*g
    for any signs. Where x >= 0 (or x <= 0) more holds, see `_signed_candidates`. The smallest result wins.
    """
    x, c, dt = u.src[0], u.src[1].arg, u.dtype
    if c == 0 or dt.count != 1:
        return None
    coeffs, k = _linear(x, deep=True)
    lo, hi = _interval(coeffs, k)
    if not _fits(lo, hi, dt):
        return None  # x may wrap: its value is not the exact sum the reasoning below is about
    m = abs(c)
    div = u.op is Ops.IDIV
    if div and c < 0:  # trunc(x / -m) == trunc(-x / m)
        coeffs, k, lo, hi = {b: -a for b, a in coeffs.items()}, -k, -hi, -lo
    g = math.gcd(m, k, *coeffs.values())
    coeffs, k, m, lo, hi = {b: a // g for b, a in coeffs.items()}, k // g, m // g, lo // g, hi // g
    cands: list[UOp] = []
    if m == 1:
        cands.append(_build_sum(coeffs, k, u) if div else u.const_like(0))
    else:
        if lo >= 0 or hi <= 0:
            cands.extend(_signed_candidates(coeffs, k, m, lo >= 0, div, u))
        if g > 1:
            form = _build_sum(coeffs, k, u)
            cands.append(form // form.const_like(m) if div else form % form.const_like(m))
    if not div and g > 1:
        cands = [ret * ret.const_like(g) for ret in cands]
    fits = [ret for ret in cands if _no_bigger(ret, u) is not None]
    return min(fits, key=_size) if fits else None


def _signed_candidates(coeffs: dict[UOp, int], k: int, m: int, nonneg: bool, div: bool, u: UOp) -> list[UOp]:
    """Quotients or remainders by m > 1 of a linear form x that is >= 0 (`nonneg`) or <= 0.

    Split x = m*Q + R. If R's bounds keep it in [0, m) (or (-m, 0]), x // m == Q and x % m == R. If R only has
    x's sign, x // m == Q + R // m and x % m == R % m. And with h = gcd(m, the coefficients) and the constant
    k = h*kq + kr, 0 <= kr < h (or -h < kr <= 0): x // m == (x/h without kr) // (m/h), and
    x % m == ((x/h without kr) % (m/h))*h + kr, because truncating by h first drops exactly kr.
    """
    # the second split only where the first doesn't settle it (a split reads bounds and builds nothing)
    splits = []
    for keep in (True, False):
        (qc, qk), (rc, rk) = split = _split(coeffs, k, m, nonneg, keep)
        rlo, rhi = _interval(rc, rk)
        if (0 <= rlo and rhi < m) if nonneg else (-m < rlo and rhi <= 0):
            return [_build_sum(qc, qk, u) if div else _build_sum(rc, rk, u)]
        splits.append((split, rlo, rhi))
    out = []
    for ((qc, qk), (rc, rk)), rlo, rhi in splits:
        if (rlo >= 0 if nonneg else rhi <= 0) and _fits(rlo, rhi, u.dtype) and (any(qc.values()) or qk):
            rem = _build_sum(rc, rk, u)
            out.append(_build_sum({**qc, rem // rem.const_like(m): 1}, qk, u) if div else rem % rem.const_like(m))
            break
    if (h := math.gcd(m, *coeffs.values())) > 1:
        kr = k % h if nonneg or k % h == 0 else k % h - h
        s = _build_sum({b: a // h for b, a in coeffs.items()}, (k - kr) // h, u)
        mh = s.const_like(m // h)
        out.append(s // mh if div else _build_sum({s % mh: h}, kr, u))
    return out


def _nonzero(y: UOp) -> bool:
    lo, hi = y._min_max
    return lo > 0 or hi < 0


def _mod_small(x: UOp, y: UOp) -> UOp | None:
    """x % y == x when |x| < |y| (C's remainder keeps the dividend)."""
    if _nonzero(y) and max(abs(x.vmin), abs(x.vmax)) < min(abs(y.vmin), abs(y.vmax)):
        return x
    return None


def _product_fits(x: UOp, y: UOp) -> bool:
    corners = [a * b for a in (int(x.vmin), int(x.vmax)) for b in (int(y.vmin), int(y.vmax))]
    return _fits(min(corners), max(corners), x.dtype)


def _div_div(x: UOp, a: UOp, b: UOp) -> UOp | None:
    """(x // a) // b == x // (a*b) for nonzero a, b: truncation is odd in each operand, and for positives it nests."""
    if a.arg == 0 or b.arg == 0 or not _fits(a.arg * b.arg, a.arg * b.arg, x.dtype):
        return None
    return x // x.const_like(a.arg * b.arg)


def _mod_mod(x: UOp, a: UOp, b: UOp) -> UOp | None:
    """(x % a) % b: x % b when b divides a (both keep x's sign, and are congruent mod b); x % a when |a| <= |b|."""
    if a.arg == 0 or b.arg == 0:
        return None
    if a.arg % b.arg == 0:
        return x % b
    if abs(a.arg) <= abs(b.arg):
        return x % a
    return None


# *** comparisons ***


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _fold_cmp_linear(x: UOp, c: int, const_left: bool, root: UOp) -> UOp | None:
    """`x < c` (or `c < x`) with x = g*S + R (a group S of terms, R the rest): `S < t` (or `t < S`) when the
    threshold t on S is the same for every value R can take. This moves constants into the threshold, divides
    out common factors, and drops terms too small to change the result. The smallest such form wins."""
    if x.dtype.count != 1:
        return None
    coeffs, k = _linear(x, deep=True)
    if not coeffs or not _fits(*_interval(coeffs, k), x.dtype):
        return None
    d = c - k
    best: UOp | None = None
    # the group S is the terms whose coefficient is at least a threshold
    for th in sorted({abs(a) for a in coeffs.values()}):
        big = {b: a for b, a in coeffs.items() if abs(a) >= th}
        small = {b: a for b, a in coeffs.items() if abs(a) < th}
        g = math.gcd(*big.values())
        if big[min(big, key=order_key)] < 0:
            g = -g  # keep the first coefficient of S positive
        rlo, rhi = _interval(small, 0)
        # g > 0: g*S + R < d  <=>  S < ceil((d - R)/g);   g*S + R > d  <=>  S > floor((d - R)/g)
        # g < 0 flips the comparison on S
        lt = (not const_left) == (g > 0)
        if lt:
            t, t2 = _ceil_div(d - rhi, g), _ceil_div(d - rlo, g)
        else:
            t, t2 = (d - rhi) // g, (d - rlo) // g
        s_coeffs = {b: a // g for b, a in big.items()}
        if t != t2 or not _fits(*_interval(s_coeffs, 0), x.dtype) or not _fits(t, t, x.dtype):
            continue
        s = _build_sum(s_coeffs, 0, x)
        cand = _no_bigger(s < s.const_like(t) if lt else s.const_like(t) < s, root)
        if cand is not None and (best is None or _size(cand) < _size(best)):
            best = cand
    return best


def _cmplt_const(x: UOp, c: UOp, u: UOp) -> UOp | None:
    return _fold_cmp_linear(x, c.arg, False, u)


def _const_cmplt(c: UOp, x: UOp, u: UOp) -> UOp | None:
    return _fold_cmp_linear(x, c.arg, True, u)


def _div_cmplt(x: UOp, c: UOp, d: UOp) -> UOp | None:
    """x // c < d  <=>  x < c*d for d >= 1, x < c*(d-1) + 1 for d <= 0 (c > 0, C's truncating division)."""
    if c.arg <= 0:
        return None
    t = c.arg * d.arg if d.arg >= 1 else c.arg * (d.arg - 1) + 1
    return x < x.const_like(t) if _fits(t, t, x.dtype) else None


def _cmplt_div(d: UOp, x: UOp, c: UOp) -> UOp | None:
    """d < x // c  <=>  not (x // c < d + 1)  <=>  t - 1 < x, with t as in `_div_cmplt`."""
    if c.arg <= 0:
        return None
    e = d.arg + 1
    t = c.arg * e if e >= 1 else c.arg * (e - 1) + 1
    return x.const_like(t - 1) < x if _fits(t - 1, t, x.dtype) else None


def _fold_cmpne_linear(x: UOp, c: UOp, u: UOp) -> UOp | None:
    """x != c with x = g*S + k: True when g doesn't divide c - k, else S != (c - k)/g."""
    if x.dtype.count != 1:
        return None
    coeffs, k = _linear(x, deep=True)
    if not coeffs or not _fits(*_interval(coeffs, k), x.dtype):
        return None
    g = math.gcd(*coeffs.values())
    if coeffs[min(coeffs, key=order_key)] < 0:
        g = -g
    d = c.arg - k
    if d % g != 0:
        return u.const_like(True)
    s = _build_sum({b: a // g for b, a in coeffs.items()}, 0, x)
    if not _fits(d // g, d // g, x.dtype):
        return None
    return _no_bigger(s.ne(s.const_like(d // g)), u)


def _not_lt_const(x: UOp, c: UOp) -> UOp | None:
    """not (x < c)  <=>  c - 1 < x (integers)."""
    return x.const_like(c.arg - 1) < x if c.arg > dtypes.min(x.dtype) else None


def _not_const_lt(c: UOp, x: UOp) -> UOp | None:
    """not (c < x)  <=>  x < c + 1 (integers)."""
    return x < x.const_like(c.arg + 1) if c.arg < dtypes.max(x.dtype) else None


# *** commutative binary ops ***


def _sort_operands(x: UOp) -> UOp | None:
    """Commutative ops that aren't flattened into chains get their two operands in `order_key` order."""
    a, b = x.src
    return x.replace(src=(b, a)) if order_key(b) < order_key(a) else None


def _max_bounded(x: UOp, y: UOp) -> UOp | None:
    if x.vmin >= y.vmax:
        return x
    if y.vmin >= x.vmax:
        return y
    return None


_int = UPat.var("x", INTS)
_bool = UPat.var("x", dtypes.bool)
_T, _F = UPat.const(dtypes.bool, True), UPat.const(dtypes.bool, False)

symbolic = PatternMatcher(
    [
        # constants
        (UPat(GroupOp.ALU | {Ops.CAST}, src=UPat(Ops.CONST), name="x"), _fold_constants),
        (UPat(GroupOp.ALU | {Ops.CAST}, _INTS_BOOL, name="x"), _fold_bounded),
        # exact for floats as well: x*1 keeps -0.0, nan and inf
        (UPat.var("x") * UPat.const(None, 1), lambda x: x),
        (UPat.var("x") * UPat.const(None, 1.0), lambda x: x),
        ((UPat.var("x") * UPat.const(None, -1.0)) * UPat.const(None, -1.0), lambda x: x),
        # sums and products in canonical order, like terms collected (integers only: reassociation is inexact
        # for floats)
        (UPat(Ops.ADD, INTS, name="x"), _canonical_add),
        (UPat(Ops.MUL, INTS, name="x"), _canonical_mul),
        # division and remainder
        (_int // UPat.const(None, 1), lambda x: x),
        (_int // UPat.const(None, -1), lambda x: x * x.const_like(-1)),
        (_int % UPat.const(None, 1), lambda x: x.const_like(0)),
        (_int % UPat.const(None, -1), lambda x: x.const_like(0)),
        ((_int // UPat.cvar("a")) // UPat.cvar("b"), _div_div),
        ((_int % UPat.cvar("a")) % UPat.cvar("b"), _mod_mod),
        ((_int % UPat.var("y")) % UPat.var("y"), lambda x, y: x % y),
        (_int % UPat.var("y"), _mod_small),
        (
            UPat(Ops.MOD, INTS, src=(UPat(Ops.MUL, src=[_int, UPat.var("y")]), UPat.var("y"))),
            lambda x, y: x.const_like(0) if _nonzero(y) and _product_fits(x, y) else None,
        ),
        (
            UPat(Ops.IDIV, INTS, src=(UPat(Ops.MUL, src=[_int, UPat.var("y")]), UPat.var("y"))),
            lambda x, y: x if _nonzero(y) and _product_fits(x, y) else None,
        ),
        (_int // UPat.var("x"), lambda x: x.const_like(1) if _nonzero(x) else None),
        (_int % UPat.var("x"), lambda x: x.const_like(0) if _nonzero(x) else None),
        (UPat(Ops.IDIV, INTS, src=(UPat.var(), UPat.cvar()), name="u"), _fold_divmod),
        (UPat(Ops.MOD, INTS, src=(UPat.var(), UPat.cvar()), name="u"), _fold_divmod),
        # comparisons (those that bounds decide are already constants)
        (_int < UPat.var("x"), lambda x: UOp.const(dtypes.bool, False)),
        (UPat(Ops.CMPNE, src=(_int, UPat.var("x"))), lambda x: UOp.const(dtypes.bool, False)),
        ((_int // UPat.cvar("c")) < UPat.cvar("d"), _div_cmplt),
        (UPat.cvar("d") < (_int // UPat.cvar("c")), _cmplt_div),
        (UPat(Ops.CMPLT, src=(_int, UPat.cvar("c")), name="u"), _cmplt_const),
        (UPat(Ops.CMPLT, src=(UPat.cvar("c"), _int), name="u"), _const_cmplt),
        (UPat(Ops.CMPNE, src=(_int, UPat.cvar("c")), name="u"), _fold_cmpne_linear),
        ((_int < UPat.cvar("c")).ne(True), _not_lt_const),
        ((UPat.cvar("c") < _int).ne(True), _not_const_lt),
        # booleans
        (_bool.ne(False), lambda x: x),
        (_bool.ne(True).ne(True), lambda x: x),
        (UPat(Ops.CMPNE, src=(_bool, UPat.var("x"))), lambda x: x.const_like(False)),
        (_bool & _T, lambda x: x),
        (_bool & _F, lambda x: x.const_like(False)),
        (_bool | _T, lambda x: x.const_like(True)),
        (_bool | _F, lambda x: x),
        (UPat(Ops.XOR, src=[_bool, _F]), lambda x: x),
        (UPat(Ops.XOR, src=[_bool, _T]), lambda x: x.ne(True)),
        (UPat(Ops.AND, src=(UPat.var("x"), UPat.var("x"))), lambda x: x),
        (UPat(Ops.OR, src=(UPat.var("x"), UPat.var("x"))), lambda x: x),
        (UPat(Ops.XOR, _INTS_BOOL, src=(UPat.var("x"), UPat.var("x"))), lambda x: x.const_like(0)),
        (_bool & _bool.ne(True), lambda x: x.const_like(False)),
        (_bool | _bool.ne(True), lambda x: x.const_like(True)),
        # integer bit ops
        (UPat(Ops.XOR, INTS, src=[_int, UPat.const(None, 0)]), lambda x: x),
        (UPat(Ops.OR, INTS, src=[_int, UPat.const(None, 0)]), lambda x: x),
        (UPat(Ops.AND, INTS, src=[_int, UPat.const(None, 0)]), lambda x: x.const_like(0)),
        (
            UPat(Ops.XOR, INTS, src=[UPat(Ops.XOR, src=[_int, UPat.cvar("a")]), UPat.cvar("b")]),
            lambda x, a, b: x ^ x.const_like(a.arg ^ b.arg),
        ),
        # max
        (UPat(Ops.MAX, src=(UPat.var("x"), UPat.var("x"))), lambda x: x),
        (UPat(Ops.MAX, _INTS_BOOL, src=(UPat.var("x"), UPat.var("y"))), _max_bounded),
        (
            UPat(Ops.MAX, INTS, src=[UPat(Ops.MAX, src=[_int, UPat.cvar("a")]), UPat.cvar("b")]),
            lambda x, a, b: x.maximum(max(a.arg, b.arg)),
        ),
        # where
        (UPat(Ops.WHERE, src=(UPat.cvar("c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg else b),
        (UPat(Ops.WHERE, src=(UPat.var(), UPat.var("a"), UPat.var("a"))), lambda a: a),
        (UPat(Ops.WHERE, src=(_bool.ne(True), UPat.var("a"), UPat.var("b"))), lambda x, a, b: x.where(b, a)),
        (UPat(Ops.WHERE, src=(_bool, _T, _F)), lambda x: x),
        (UPat(Ops.WHERE, src=(_bool, _F, _T)), lambda x: x.ne(True)),
        # operand order of the remaining commutative ops
        # (a != b is exact for floats too; the comparison's own dtype is bool)
        (UPat((Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR), _INTS_BOOL, name="x"), _sort_operands),
    ]
)
"""The symbolic rules; compose with other matchers with `+`."""


def simplify(u: UOp) -> UOp:
    """`u` rewritten with `symbolic` until no rule applies; never a graph with more nodes than `u`.

    Each rule checks that what it builds is no bigger than what it replaces, but it can't see the rest of the
    graph: a rewrite may stop sharing a constant or a subexpression with another part of it. In the rare case
    where that makes the whole graph bigger, `u` is returned unchanged.
    """
    out = graph_rewrite(u, symbolic, name="symbolic", memo=True)
    return out if _size(out) <= _size(u) else u


def sym_infer(u: UOp, var_vals: dict[str | UOp, int]) -> int:
    """The value of integer expression `u` with variables given by name or by node (C semantics for // and %)."""
    env: dict[UOp, int] = {}
    for n in u.toposort:
        if n in var_vals:
            env[n] = var_vals[n]
        elif n.op in (Ops.DEFINE_VAR, Ops.SPECIAL) and n.arg[0] in var_vals:
            env[n] = var_vals[n.arg[0]]
    return eval_uop(u, env)
