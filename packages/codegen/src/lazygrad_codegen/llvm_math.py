"""`exp2`, `log2` and `sin` on float32 scalars and vectors as LLVM IR functions of plain arithmetic, for the CPU.

LLVM lowers `llvm.exp2.v16f32` on the host to one call of the C library's `exp2f` per lane: a softmax spent most of
its time there (issue 15's row benchmark: 0.1-0.2x torch on the CPU). These functions compute every lane at once
with fma, rint and integer operations on the float's bits:

- `exp2`: x clamped to [-151, 128.5] (beyond, the result is 0 or inf anyway), n = rint(x), 2**(x - n) by a
  degree-7 polynomial on [-0.5, 0.5], scaled by 2**n as two powers of two made from their exponent bits, so that
  subnormal and overflowing results round once, as they should. NaN gives NaN.
- `log2`: in float64 (where float32's subnormals are normal numbers), the exponent e and mantissa m in
  [sqrt(1/2), sqrt(2)) from the double's bits, log2(m) = 2 atanh(s) / ln 2 with s = (m - 1)/(m + 1) by a polynomial
  in s**2, plus e; 0, negatives, inf and NaN answered directly.
- `sin`: in float64 (every float32 is a double, and sin's reduction by pi/2 then leaves no error a float sees):
  k = rint(x 2/pi), r = x - k pi/2 with pi/2 in three parts (Cody-Waite, with fma), sin or cos of r by their Taylor
  polynomials, picked and signed by k mod 4. Where any lane has |x| > 2**30 the whole vector calls `llvm.sin`
  instead (the C library's exact reduction).

Accuracy against float64: at most 2 ulp of float32 over the whole range (tested against numpy in
`codegen/tests/test_llvm_math.py`). The polynomial coefficients are their Taylor series' terms, computed here in
40-digit decimals.
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal, localcontext

with localcontext() as _ctx:
    _ctx.prec = 40
    _LN2 = Decimal(2).ln()
    _PI = Decimal("3.141592653589793238462643383279502884197")
    # 2**f = e**(f ln2) on |f| <= 1/2: the first term left out, (ln2/2)**8 / 8!, is 5e-9 of the result
    _EXP2_C = [_LN2**k / math.factorial(k) for k in range(8)]
    # log2(m) = 2/ln2 (s + s**3/3 + ...) on |s| <= 0.172: the first term left out, s**17/17, is 1e-15 of the result
    _LOG2_C = [2 / _LN2 / (2 * k + 1) for k in range(8)]
    _HALF_PI = _PI / 2
    _TWO_OVER_PI = 2 / _PI
# sin r = r + r**3 P(r**2), cos r = 1 + r**2 Q(r**2) on |r| <= pi/4: the first terms left out are below 2**-45 of the
# result
_SIN_C = [Decimal((-1) ** (k + 1)) / math.factorial(2 * k + 3) for k in range(8)]
_COS_C = [Decimal((-1) ** (k + 1)) / math.factorial(2 * k + 2) for k in range(7)]

# the functions, by operation name; their names are lg_<op>_<suffix>
OPS = ("exp2", "log2", "sin")


def _f64(x: float | Decimal) -> str:
    """LLVM's literal of the double nearest `x`."""
    return f"0x{struct.unpack('<Q', struct.pack('<d', float(x)))[0]:016X}"


def _f32(x: float | Decimal) -> str:
    """LLVM's literal of the float nearest `x` (written, as LLVM wants, as the hex of that float's double)."""
    return _f64(struct.unpack("<f", struct.pack("<f", float(x)))[0])


class _Body:
    """The lines of one function over `n` lanes, with helpers that name their results and declare the intrinsics
    they call."""

    def __init__(self, n: int) -> None:
        self.n, self.lines, self.k = n, [], 0
        self.declares: set[str] = set()

    def t(self, scalar: str) -> str:
        return scalar if self.n == 1 else f"<{self.n} x {scalar}>"

    def c(self, literal: str, scalar: str) -> str:
        """`literal` in every lane."""
        return literal if self.n == 1 else "<" + ", ".join([f"{scalar} {literal}"] * self.n) + ">"

    def __call__(self, text: str) -> str:
        self.k += 1
        self.lines.append(f"  %t{self.k} = {text}")
        return f"%t{self.k}"

    def intrinsic(self, ret: str, name: str, *args: tuple[str, str]) -> str:
        """Call `llvm.<name>` with (type, value) `args`."""
        self.declares.add(f"declare {ret} @llvm.{name}({', '.join(t for t, _ in args)})")
        return self(f"call {ret} @llvm.{name}({', '.join(f'{t} {v}' for t, v in args)})")

    def call(self, name: str, scalar: str, *args: str) -> str:
        """Call the overloaded math intrinsic `llvm.<name>` on values of `scalar` in every lane."""
        t = self.t(scalar)
        base = {"float": "f32", "double": "f64"}[scalar]
        return self.intrinsic(t, f"{name}.{base if self.n == 1 else f'v{self.n}{base}'}", *[(t, a) for a in args])

    def horner(self, var: str, coefficients: list[Decimal], scalar: str) -> str:
        """sum(c_k * var**k), highest power first, with fma."""
        lit = _f32 if scalar == "float" else _f64
        acc = self.c(lit(coefficients[-1]), scalar)
        for c in reversed(coefficients[:-1]):
            acc = self.call("fma", scalar, acc, var, self.c(lit(c), scalar))
        return acc


def _exp2(b: _Body) -> str:
    f32, i32 = b.t("float"), b.t("i32")
    lo = b.call("maxnum", "float", "%x", b.c(_f32(-151.0), "float"))
    x = b.call("minnum", "float", lo, b.c(_f32(128.5), "float"))
    n = b.call("rint", "float", x)
    p = b.horner(b(f"fsub {f32} {x}, {n}"), _EXP2_C, "float")
    # 2**n = 2**h 2**(n-h), h = floor(n/2): both are normal floats for n in [-151, 129]
    ni = b(f"fptosi {f32} {n} to {i32}")
    h = b(f"ashr {i32} {ni}, {b.c('1', 'i32')}")
    scaled = p
    for e in (h, b(f"sub {i32} {ni}, {h}")):
        biased = b(f"add {i32} {e}, {b.c('127', 'i32')}")
        bits = b(f"shl {i32} {biased}, {b.c('23', 'i32')}")
        power = b(f"bitcast {i32} {bits} to {f32}")
        scaled = b(f"fmul {f32} {scaled}, {power}")
    nan = b(f"fcmp uno {f32} %x, %x")
    return b(f"select {b.t('i1')} {nan}, {f32} %x, {f32} {scaled}")


def _log2(b: _Body) -> str:
    f32, f64, i64, i1 = b.t("float"), b.t("double"), b.t("i64"), b.t("i1")
    # in float64, where every float32 (subnormals too) is a normal number and the result's errors stay far below a
    # float's last place
    x = b(f"fpext {f32} %x to {f64}")
    # the bits less sqrt(1/2)'s: the exponent of x/sqrt(1/2) rounded down, and m = x / 2**e in [sqrt(1/2), sqrt(2))
    sqrt_half = b.c(str(struct.unpack("<q", struct.pack("<d", math.sqrt(0.5)))[0]), "i64")
    ix = b(f"sub {i64} {b(f'bitcast {f64} {x} to {i64}')}, {sqrt_half}")
    e = b(f"ashr {i64} {ix}, {b.c('52', 'i64')}")
    low = b(f"and {i64} {ix}, {b.c(str(2**52 - 1), 'i64')}")
    m = b(f"bitcast {i64} {b(f'add {i64} {low}, {sqrt_half}')} to {f64}")
    one = b.c(_f64(1.0), "double")
    num, den = b(f"fsub {f64} {m}, {one}"), b(f"fadd {f64} {m}, {one}")
    s = b(f"fdiv {f64} {num}, {den}")
    q = b.horner(b(f"fmul {f64} {s}, {s}"), _LOG2_C, "double")
    r = b.call("fma", "double", s, q, b(f"sitofp {i64} {e} to {f64}"))
    r = b(f"fptrunc {f64} {r} to {f32}")
    # +inf, 0 and (NaN or negative) have their own answers
    for cond, value, answer in (("oeq", math.inf, math.inf), ("oeq", 0.0, -math.inf), ("ult", 0.0, math.nan)):
        hit = b(f"fcmp {cond} {f32} %x, {b.c(_f32(value), 'float')}")
        r = b(f"select {i1} {hit}, {f32} {b.c(_f32(answer), 'float')}, {f32} {r}")
    return r


def _sin(b: _Body) -> str:
    f32, f64, i32, i1 = b.t("float"), b.t("double"), b.t("i32"), b.t("i1")
    x = b(f"fpext {f32} %x to {f64}")
    k = b.call("rint", "double", b(f"fmul {f64} {x}, {b.c(_f64(_TWO_OVER_PI), 'double')}"))
    nk = b(f"fneg {f64} {k}")
    p1 = Decimal(float(_HALF_PI))
    p2 = Decimal(float(_HALF_PI - p1))
    p3 = Decimal(float(_HALF_PI - p1 - p2))
    r = x
    for part in (p1, p2, p3):
        r = b.call("fma", "double", nk, b.c(_f64(part), "double"), r)
    z = b(f"fmul {f64} {r}, {r}")
    sin_r = b.call("fma", "double", b(f"fmul {f64} {r}, {z}"), b.horner(z, _SIN_C, "double"), r)
    cos_r = b.call("fma", "double", z, b.horner(z, _COS_C, "double"), b.c(_f64(1.0), "double"))
    # the quadrant k mod 4 (k is an exact integer below 2**30 here)
    q = b(f"and {i32} {b(f'fptosi {f64} {k} to {i32}')}, {b.c('3', 'i32')}")
    odd = b(f"trunc {i32} {q} to {i1}")
    neg = b(f"icmp uge {i32} {q}, {b.c('2', 'i32')}")
    v = b(f"select {i1} {odd}, {f64} {cos_r}, {f64} {sin_r}")
    v = b(f"select {i1} {neg}, {f64} {b(f'fneg {f64} {v}')}, {f64} {v}")
    out = b(f"fptrunc {f64} {v} to {f32}")
    # sin(-0.0) is -0.0, which the reduction would make +0.0
    zero = b(f"fcmp oeq {f32} %x, {b.c(_f32(0.0), 'float')}")
    return b(f"select {i1} {zero}, {f32} %x, {f32} {out}")


def function_name(op: str, n: int) -> str:
    """The name of the function computing `op` on `n` float32 lanes."""
    return f"lg_{op}_{'f32' if n == 1 else f'v{n}f32'}"


def definition(op: str, n: int) -> tuple[str, set[str]]:
    """The text of the function computing `op` ("exp2", "log2" or "sin") on `n` float32 lanes, and the declarations
    of the intrinsics it calls."""
    if op not in OPS:
        raise ValueError(f"no polynomial function for {op!r}: there are {OPS}")
    b = _Body(n)
    f32 = b.t("float")
    if op == "sin":
        # |x| > 2**30 in any lane (inf included; not NaN, which the polynomial path answers): the library's sin
        big = b(f"fcmp ogt {f32} {b.call('fabs', 'float', '%x')}, {b.c(_f32(2.0**30), 'float')}")
        anybig = big if n == 1 else b.intrinsic("i1", f"vector.reduce.or.v{n}i1", (b.t("i1"), big))
        b.lines.append(f"  br i1 {anybig}, label %library, label %polynomial")
        b.lines.append("library:")
        b.lines.append(f"  ret {f32} {b.call('sin', 'float', '%x')}")
        b.lines.append("polynomial:")
    result = {"exp2": _exp2, "log2": _log2, "sin": _sin}[op](b)
    head = f"define internal {f32} @{function_name(op, n)}({f32} %x) alwaysinline {{"
    return "\n".join([head, *b.lines, f"  ret {f32} {result}", "}"]), b.declares
