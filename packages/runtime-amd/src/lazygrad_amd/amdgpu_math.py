"""Double-precision `exp2`, `log2` and `sin` as LLVM IR functions, for targets whose backend can't lower the
`llvm.exp2.f64`, `llvm.log2.f64` and `llvm.sin.f64` intrinsics (AMDGPU has no instructions for them and no libm to
call: LLVM stops with "Cannot select").

They use only operations every backend lowers (fma, rint, floor, ldexp, frexp, min/max, selects), so the same text
is checked against numpy on the host CPU. Accuracy: a few ulp over the whole range of exp2 and log2 (subnormals
included); `sin` reduces its argument with a three-part pi/2 (Cody-Waite, with fma), a few ulp while |x| < 2**40,
degrading gradually beyond.

The polynomial coefficients are computed here from their definitions (Taylor series), in 60-digit decimals.
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal, getcontext

getcontext().prec = 60
_PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459")
_LN2 = Decimal(2).ln()

EXP2 = "lg_exp2_f64"
LOG2 = "lg_log2_f64"
SIN = "lg_sin_f64"


def _hex(x: float | Decimal) -> str:
    """LLVM's literal of the double nearest `x`."""
    return f"0x{struct.unpack('<Q', struct.pack('<d', float(x)))[0]:016X}"


def _horner(var: str, coefficients: list[Decimal], out: str) -> list[str]:
    """Lines computing `out` = sum(c_k * var**k) by Horner's rule with fma, highest power first."""
    lines = []
    acc = _hex(coefficients[-1])
    for k in range(len(coefficients) - 2, -1, -1):
        name = out if k == 0 else f"{out}.{k}"
        lines.append(
            f"  %{name} = call double @llvm.fma.f64(double {acc}, double %{var}, double {_hex(coefficients[k])})"
        )
        acc = f"%{name}"
    return lines


def _exp2() -> str:
    # 2**f = e**(f ln2) for f in [-0.5, 0.5]: the terms (f ln2)**k / k! fall below 2**-60 from k = 14 on
    coefficients = [_LN2**k / math.factorial(k) for k in range(14)]
    return "\n".join(
        [
            f"define internal double @{EXP2}(double %x) alwaysinline {{",
            "  %n = call double @llvm.rint.f64(double %x)",
            "  %f = fsub double %x, %n",
            *_horner("f", coefficients, "p"),
            # beyond +-2100 the result is inf or 0 anyway; clamping keeps the conversion to int defined
            f"  %lo = call double @llvm.maxnum.f64(double %n, double {_hex(-2100.0)})",
            f"  %nc = call double @llvm.minnum.f64(double %lo, double {_hex(2100.0)})",
            "  %ni = fptosi double %nc to i32",
            "  %r = call double @llvm.ldexp.f64.i32(double %p, i32 %ni)",
            # inf - inf is NaN: the infinities are answered directly
            f"  %pinf = fcmp oeq double %x, {_hex(math.inf)}",
            f"  %ninf = fcmp oeq double %x, {_hex(-math.inf)}",
            f"  %r1 = select i1 %pinf, double {_hex(math.inf)}, double %r",
            "  %r2 = select i1 %ninf, double 0.0, double %r1",
            "  ret double %r2",
            "}",
        ]
    )


def _log2() -> str:
    # ln(m) = 2 atanh(s) = 2 (s + s**3/3 + s**5/5 + ...), s = (m-1)/(m+1), |s| <= 0.172 for m in [sqrt(1/2), sqrt(2))
    coefficients = [Decimal(1) / (2 * k + 1) for k in range(12)]
    return "\n".join(
        [
            f"define internal double @{LOG2}(double %x) alwaysinline {{",
            "  %fr = call { double, i32 } @llvm.frexp.f64.i32(double %x)",
            "  %m = extractvalue { double, i32 } %fr, 0",
            "  %e = extractvalue { double, i32 } %fr, 1",
            f"  %small = fcmp olt double %m, {_hex(Decimal(2).sqrt() / 2)}",
            "  %m2x = fmul double %m, 2.0",
            "  %m1 = select i1 %small, double %m2x, double %m",
            "  %e1d = sub i32 %e, 1",
            "  %e1 = select i1 %small, i32 %e1d, i32 %e",
            "  %num = fsub double %m1, 1.0",
            "  %den = fadd double %m1, 1.0",
            "  %s = fdiv double %num, %den",
            "  %z = fmul double %s, %s",
            *_horner("z", coefficients, "q"),
            "  %s2 = fmul double %s, 2.0",
            "  %lnm = fmul double %s2, %q",
            "  %ed = sitofp i32 %e1 to double",
            f"  %r = call double @llvm.fma.f64(double %lnm, double {_hex(1 / _LN2)}, double %ed)",
            f"  %pinf = fcmp oeq double %x, {_hex(math.inf)}",
            "  %zero = fcmp oeq double %x, 0.0",
            "  %bad = fcmp ult double %x, 0.0",
            f"  %r1 = select i1 %pinf, double {_hex(math.inf)}, double %r",
            f"  %r2 = select i1 %zero, double {_hex(-math.inf)}, double %r1",
            f"  %r3 = select i1 %bad, double {_hex(math.nan)}, double %r2",
            "  ret double %r3",
            "}",
        ]
    )


def _sin() -> str:
    half_pi = _PI / 2
    p1 = Decimal(float(half_pi))
    p2 = Decimal(float(half_pi - p1))
    p3 = Decimal(float(half_pi - p1 - p2))
    # on |r| <= pi/4 the Taylor terms r**k / k! fall below 2**-60 from k = 20 on
    sin_c = [Decimal((-1) ** (k + 1)) / math.factorial(2 * k + 3) for k in range(9)]  # sin r = r + r**3 * P(r**2)
    cos_c = [Decimal((-1) ** (k + 1)) / math.factorial(2 * k + 2) for k in range(9)]  # cos r = 1 + r**2 * Q(r**2)
    return "\n".join(
        [
            f"define internal double @{SIN}(double %x) alwaysinline {{",
            f"  %t = fmul double %x, {_hex(2 / _PI)}",
            "  %k = call double @llvm.rint.f64(double %t)",
            "  %nk = fneg double %k",
            f"  %ra = call double @llvm.fma.f64(double %nk, double {_hex(p1)}, double %x)",
            f"  %rb = call double @llvm.fma.f64(double %nk, double {_hex(p2)}, double %ra)",
            f"  %r = call double @llvm.fma.f64(double %nk, double {_hex(p3)}, double %rb)",
            "  %z = fmul double %r, %r",
            *_horner("z", sin_c, "sp"),
            "  %rz = fmul double %r, %z",
            "  %sinr = call double @llvm.fma.f64(double %rz, double %sp, double %r)",
            *_horner("z", cos_c, "cp"),
            "  %cosr = call double @llvm.fma.f64(double %z, double %cp, double 1.0)",
            # the quadrant k mod 4, in doubles (exact while |k| < 2**53; NaN for inf and NaN, which picks sin r = NaN)
            "  %k4 = fmul double %k, 0.25",
            "  %fl = call double @llvm.floor.f64(double %k4)",
            "  %fl4 = fmul double %fl, 4.0",
            "  %q = fsub double %k, %fl4",
            "  %q1 = fcmp oeq double %q, 1.0",
            "  %q3 = fcmp oeq double %q, 3.0",
            "  %odd = or i1 %q1, %q3",
            "  %neg = fcmp oge double %q, 2.0",
            "  %v = select i1 %odd, double %cosr, double %sinr",
            "  %nv = fneg double %v",
            "  %res = select i1 %neg, double %nv, double %v",
            # sin(-0.0) is -0.0: the reduction above would give +0.0
            "  %isz = fcmp oeq double %x, 0.0",
            "  %out = select i1 %isz, double %x, double %res",
            "  ret double %out",
            "}",
        ]
    )


DECLARATIONS = (
    "declare double @llvm.fma.f64(double, double, double)",
    "declare double @llvm.rint.f64(double)",
    "declare double @llvm.floor.f64(double)",
    "declare double @llvm.maxnum.f64(double, double)",
    "declare double @llvm.minnum.f64(double, double)",
    "declare double @llvm.ldexp.f64.i32(double, i32)",
    "declare { double, i32 } @llvm.frexp.f64.i32(double)",
)

DEFINITIONS: dict[str, str] = {EXP2: _exp2(), LOG2: _log2(), SIN: _sin()}
