"""Elementwise ops of `Tensor` beyond the arithmetic core: powers, bit shifts, predicates, rounding, clamping,
transcendental functions and activations. Each is a composition of the ALU ops the codegen renders (no new kernel
types); semantics follow PyTorch where tinygrad and PyTorch differ."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from lazygrad.errors import InputError, KindError
from lazygrad_uop.dtype import DTypeError, dtypes, least_upper_float
from lazygrad_uop.ops import Ops

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_MAX_UNROLLED_POWER = 64  # integer powers up to this are products of the base; larger ones go through exp2/log2


def _int_pow(base: Tensor, exp: Tensor) -> Tensor:
    """base**exp for integer tensors of one shape, by square-and-multiply over every bit of exp from the top
    (wrapping as the dtype does); a negative exponent gives 0 except for bases 1 and -1, as torch does.

    From the top bit down, each step squares the running result, a `where` of the last step: repeated squaring of
    the base instead would nest MULs 2**bits deep, which the symbolic simplifier flattens into that many factors."""
    bits = 8 * exp.dtype.itemsize
    result = base.ones_like()
    for i in reversed(range(bits)):
        if i < bits - 1:
            result = result * result
        bit = (exp >> i) & 1 if i else exp & 1
        result = bit.ne(0).where(result * base, result)
    if dtypes.is_unsigned(base.dtype):
        return result
    odd = (exp & 1).ne(0)
    at_minus_one = odd.where(base.full_like(-1), base.ones_like())
    negative = base.eq(1).where(base.ones_like(), base.eq(-1).where(at_minus_one, base.zeros_like()))
    return (exp < 0).where(negative, result)


def _float_pow(base: Tensor, exp: Tensor) -> Tensor:
    """base**exp for float tensors of one dtype and shape, with C's pow rules for signs, zeros, ones and nan.

    x**0 and 1**y are 1 even for nan; for x**0 the general formula runs on a base of 1, so its gradient (0, torch's)
    doesn't come out as 0 * inf = nan from log2(0) or 0 * log2(inf)."""
    zero_exp = exp.eq(0)
    one = zero_exp.logical_or(base.eq(1).logical_and(exp.isfinite().logical_not()))
    mag = (exp * zero_exp.where(1.0, base).abs().log2()).exp2()
    is_int = exp.eq(exp.trunc())
    half = exp * 0.5
    odd = is_int.logical_and(half.ne(half.trunc()))
    negative = base < 0
    out = negative.logical_and(odd).where(-mag, mag)
    # a negative base with a non-integer exponent is nan, and so is its gradient (a constant nan would pass 0);
    # -inf is not: (-inf)**0.3 is inf
    undefined = negative.logical_and(is_int.logical_not()).logical_and(base.ne(-math.inf))
    out = out * undefined.where(math.nan, 1.0).cast(out.dtype)
    return one.where(1.0, out)


def _scalar_float_pow(base: Tensor, e: float) -> Tensor:
    """base**e for a float tensor and a non-integer (or large) scalar exponent, with torch's gradient at a zero base:
    e * 0**(e-1) (inf for 0 < e < 1, -inf for e < 0, 0 for e > 1), where the general formula's gradient is
    0 * inf = nan. At zero bases the result is a small expression of `z`, which is 0 there with gradient 1, chosen to
    have torch's value and gradient; elsewhere z is 1 and its gradient 0, keeping every term finite."""
    if math.isnan(e) or e == 0 or e == 1:
        return _float_pow(*base._broadcasted(e))
    at_zero = base.eq(0)
    general = _float_pow(*at_zero.where(1.0, base)._broadcasted(e))
    z = at_zero.where(base - base.detach(), 1.0)
    if e < 0:
        special = z.reciprocal()  # value inf (C's 0**e), gradient -inf
    elif e < 1:
        special = z.sqrt() * e  # value 0, gradient inf
    else:
        special = z * 0.0  # value 0, gradient 0
    return at_zero.where(special, general)


def _erf(x: Tensor) -> Tensor:
    """The error function: a Taylor series near 0 (good relative error), Abramowitz & Stegun 7.1.26 elsewhere
    (absolute error below 1.5e-7, enough for float32)."""
    ax = x.abs()
    t = (1.0 + 0.3275911 * ax).reciprocal()
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    far = 1.0 - poly * (-(ax * ax)).exp()
    x2 = x * x
    series, term = x.zeros_like(), x
    for n in range(7):
        series = series + term * (1.0 / (math.factorial(n) * (2 * n + 1)))
        term = term * (-1.0) * x2
    near = series * (2.0 / math.sqrt(math.pi))
    return (ax < 0.5).where(near, far * x.sign())


class ElementwiseMixin:
    """Elementwise ops of `Tensor` (mixed into it; see `lazygrad.tensor`)."""

    __slots__ = ()

    # *** powers ***

    def pow(self: Tensor, x: Any, reverse: bool = False) -> Tensor:
        """self**x (x**self with reverse), with torch's promotion and rules: integer tensors give integers (a
        negative integer scalar exponent raises), negative bases with non-integer exponents give nan."""
        if not reverse and isinstance(x, (int, float)) and not isinstance(x, bool):
            return self._pow_scalar(x)
        base, exp = self._broadcasted(x, reverse)
        if dtypes.is_bool(base.dtype):
            base, exp = base.cast(dtypes.int64), exp.cast(dtypes.int64)
        if dtypes.is_int(base.dtype):
            return _int_pow(base, exp)
        return _float_pow(base, exp)

    def _pow_scalar(self: Tensor, x: float) -> Tensor:
        if dtypes.is_int(self.dtype) or dtypes.is_bool(self.dtype):
            if isinstance(x, float):
                return self.cast(least_upper_float(self.dtype)).pow(x)
            if x < 0:
                raise InputError(f"integer tensors can't be raised to the negative integer power {x}; cast to float")
        if x == 0.5 and dtypes.is_float(self.dtype):
            return self.sqrt()
        if x == 0 and dtypes.is_float(self.dtype):
            # 1, with a gradient of 0 everywhere (infinities and nan included), as torch
            return self.isfinite().where(self, 0.0) * 0.0 + 1.0
        base = self.cast(dtypes.int64) if dtypes.is_bool(self.dtype) else self
        if float(x).is_integer() and abs(x) <= _MAX_UNROLLED_POWER:
            # a product of the base: exact for integers, within a few ulps for floats, and the gradient of x**2 at 0
            # is 0 (not the 0 * inf of the exp2/log2 path)
            out = None
            for bit in bin(abs(int(x)))[2:] if x else "":
                out = out * out if out is not None else None
                if bit == "1":
                    out = base if out is None else out * base
            if out is None:
                # x ** 0 is 1 everywhere (nan and inf too), but stays a function of x, so that autograd gives x a zero
                # gradient, as torch does, instead of finding no dependence
                out = base.ne(0).where(1, 1).cast(base.dtype)
            return out.reciprocal() if x < 0 else out
        if dtypes.is_int(base.dtype):
            # an uploaded exponent keeps _int_pow's bits data: a constant would fold into one long chain of MULs
            exp = type(self)([int(x)], device=self.device, dtype=dtypes.int64).reshape(()).expand(base.shape)
            return _int_pow(base, exp)
        return _scalar_float_pow(base, float(x))

    def __pow__(self: Tensor, x: Any) -> Tensor:
        return self.pow(x)

    def __rpow__(self: Tensor, x: Any) -> Tensor:
        return self.pow(x, reverse=True)

    # *** bits ***

    def _int_operands(self: Tensor, x: Any, what: str, reverse: bool = False) -> tuple[Tensor, Tensor]:
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            raise KindError(f"{what} needs integer or bool tensors, got {a.dtype!r}")
        return a, b

    def bitwise_and(self: Tensor, x: Any) -> Tensor:
        """Elementwise bitwise and of integer or bool tensors."""
        a, b = self._int_operands(x, "bitwise_and")
        return a._alu(Ops.AND, b)

    def bitwise_or(self: Tensor, x: Any) -> Tensor:
        """Elementwise bitwise or of integer or bool tensors."""
        a, b = self._int_operands(x, "bitwise_or")
        return a._alu(Ops.OR, b)

    def bitwise_xor(self: Tensor, x: Any) -> Tensor:
        """Elementwise bitwise xor of integer or bool tensors."""
        a, b = self._int_operands(x, "bitwise_xor")
        return a._alu(Ops.XOR, b)

    def bitwise_not(self: Tensor) -> Tensor:
        """Elementwise bitwise not (logical not for bools)."""
        return ~self

    def logical_xor(self: Tensor, x: Any) -> Tensor:
        """Elementwise xor of the truth values."""
        other = x.bool() if isinstance(x, type(self)) else bool(x)
        return self.bool().ne(other)

    def _shift(self: Tensor, x: Any, op: Ops, reverse: bool) -> Tensor:
        a, b = self._int_operands(x, "a shift", reverse)
        if dtypes.is_bool(a.dtype):
            raise KindError("shifts need integer tensors, got bool; cast to an integer type first")
        bits = 8 * a.dtype.itemsize
        shifted = a._alu(op, b)
        if isinstance(x, int) and not reverse and 0 <= x < bits:
            return shifted
        # a count past the width is undefined in C and LLVM; torch gives 0 (or the sign for a signed right shift)
        past = 0 if op is Ops.SHL or dtypes.is_unsigned(a.dtype) else a._alu(Ops.SHR, a.full_like(bits - 1))
        return (b < bits).where(shifted, past)

    def lshift(self: Tensor, x: Any, reverse: bool = False) -> Tensor:
        """self << x for integer tensors."""
        return self._shift(x, Ops.SHL, reverse)

    def rshift(self: Tensor, x: Any, reverse: bool = False) -> Tensor:
        """self >> x for integer tensors (arithmetic for signed types)."""
        return self._shift(x, Ops.SHR, reverse)

    def __lshift__(self: Tensor, x: Any) -> Tensor:
        return self.lshift(x)

    def __rshift__(self: Tensor, x: Any) -> Tensor:
        return self.rshift(x)

    def __rlshift__(self: Tensor, x: Any) -> Tensor:
        return self.lshift(x, reverse=True)

    def __rrshift__(self: Tensor, x: Any) -> Tensor:
        return self.rshift(x, reverse=True)

    def __rand__(self: Tensor, x: Any) -> Tensor:
        return self & x

    def __ror__(self: Tensor, x: Any) -> Tensor:
        return self | x

    def __rxor__(self: Tensor, x: Any) -> Tensor:
        return self ^ x

    # *** predicates ***

    def isnan(self: Tensor) -> Tensor:
        """True where the value is nan."""
        return self.ne(self) if dtypes.is_float(self.dtype) else self.full_like(False, dtype=dtypes.bool)

    def isinf(self: Tensor, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        """True where the value is +inf (detect_positive) or -inf (detect_negative)."""
        out = self.full_like(False, dtype=dtypes.bool)
        if not dtypes.is_float(self.dtype):
            return out
        if detect_positive:
            out = out.logical_or(self.eq(math.inf))
        if detect_negative:
            out = out.logical_or(self.eq(-math.inf))
        return out

    def isfinite(self: Tensor) -> Tensor:
        """True where the value is neither inf nor nan."""
        return self.isinf().logical_or(self.isnan()).logical_not()

    # *** rounding and signs ***

    def round(self: Tensor) -> Tensor:
        """Round to the nearest integer, halves to even (torch.round)."""
        if not dtypes.is_float(self.dtype):
            return self
        lo = self.floor()
        frac = self - lo
        lo_even = (lo * 0.5).eq((lo * 0.5).floor())
        up = (frac > 0.5).logical_or(frac.eq(0.5).logical_and(lo_even.logical_not()))
        return up.where(lo + 1, lo)

    def sign(self: Tensor) -> Tensor:
        """-1, 0 or 1 by the sign of each value (0 for nan, as torch.sign)."""
        if dtypes.is_bool(self.dtype):
            return self
        return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)

    def copysign(self: Tensor, other: Any) -> Tensor:
        """|self| with the sign of `other` (a float result)."""
        a, b = self._broadcasted(other)
        a, b = a.cast(least_upper_float(a.dtype)), b.cast(least_upper_float(a.dtype))
        # the sign bit, so that -0.0 and -nan count as negative
        neg = b._sign_bit()
        return neg.where(-a.abs(), a.abs())

    def fmod(self: Tensor, other: Any) -> Tensor:
        """Remainder with the sign of the dividend (C's fmod, torch.fmod); `%` takes the divisor's sign instead.
        Integer division by zero is undefined, as in C."""
        a, b = self._broadcasted(other)
        if dtypes.is_bool(a.dtype):
            raise KindError("fmod of bool tensors is not supported; cast to an integer type first")
        if not dtypes.is_float(a.dtype):
            return a._alu(Ops.MOD, b)  # the integer MOD op truncates, as C's %
        r = a - b * a.div(b).trunc()
        # a * (1/b) can round across an integer quotient: one step of b (with a's sign) puts r back in [0, |b|)
        sign = (a < 0).where(-1.0, 1.0).cast(a.dtype)
        step = b.abs() * sign
        r = (r * sign < 0).where(r + step, r)
        return (r * sign >= step * sign).where(r - step, r)

    def _sign_bit(self: Tensor) -> Tensor:
        int_dt = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[self.dtype.itemsize]
        return self.bitcast(int_dt) < 0

    # *** clamping and interpolation ***

    def clip(self: Tensor, min_: Any = None, max_: Any = None) -> Tensor:
        """Clamp into [min_, max_] (either may be None); where min_ > max_ the result is max_, as in torch."""
        if min_ is None and max_ is None:
            raise InputError("clip needs at least one of min_ and max_")
        # where, not maximum/minimum: at a bound the gradient passes whole to x (torch's), not split with the bound
        out = self
        if min_ is not None:
            out = (out < min_).where(min_, out)
        if max_ is not None:
            out = (out > max_).where(max_, out)
        return out

    def clamp(self: Tensor, min_: Any = None, max_: Any = None) -> Tensor:
        """Alias of clip."""
        return self.clip(min_, max_)

    def lerp(self: Tensor, end: Any, weight: Any) -> Tensor:
        """self + weight * (end - self), computed from the nearer end for accuracy as torch.lerp does."""
        start, end = self._broadcasted(end)
        if not dtypes.is_float(start.dtype):
            raise DTypeError(f"lerp needs floating-point tensors, got {start.dtype!r}")
        w = weight if isinstance(weight, type(self)) else start._const_like(weight)
        w = w.cast(start.dtype)
        diff = end - start
        return (w.abs() < 0.5).where(start + w * diff, end - diff * (1 - w))

    # *** transcendental ***

    def log10(self: Tensor) -> Tensor:
        """Base-10 logarithm."""
        return self.log2() * math.log10(2)

    def log1p(self: Tensor) -> Tensor:
        """log(1 + x), accurate for small x."""
        t = self.cast(least_upper_float(self.dtype))
        w = 1 + t
        d = w - 1
        # log(w) * t / (w - 1) cancels the rounding of 1 + t (Goldberg's trick); the ratio is ~1 and carries no
        # gradient, so the gradient is 1/w, and the unused branch stays finite where w == 1
        ratio = (t / d.eq(0).where(1, d)).detach()
        return d.eq(0).where(t, w.log() * ratio)

    def expm1(self: Tensor) -> Tensor:
        """exp(x) - 1, accurate for small x."""
        t = self.cast(least_upper_float(self.dtype))
        u = t.exp()
        lu = u.log()
        # (u - 1) * t / log(u) cancels the rounding of exp (Kahan's trick), the ratio (~1) carrying no gradient
        safe = lu.eq(0).logical_or(lu.isinf()).where(1, lu)
        kahan = (u - 1) * (t / safe).detach()
        return u.eq(1).where(t, (u - 1).eq(-1).where(-1.0, u.isinf().where(u, kahan)))

    def sinh(self: Tensor) -> Tensor:
        """Hyperbolic sine."""
        return (self.exp() - (-self).exp()) * 0.5

    def cosh(self: Tensor) -> Tensor:
        """Hyperbolic cosine."""
        return (self.exp() + (-self).exp()) * 0.5

    def asinh(self: Tensor) -> Tensor:
        """Inverse hyperbolic sine."""
        t = self.cast(least_upper_float(self.dtype))
        return t.sign() * (t.abs() + (t * t + 1).sqrt()).log()

    def acosh(self: Tensor) -> Tensor:
        """Inverse hyperbolic cosine."""
        t = self.cast(least_upper_float(self.dtype))
        return (t + (t * t - 1).sqrt()).log()

    def atanh(self: Tensor) -> Tensor:
        """Inverse hyperbolic tangent."""
        t = self.cast(least_upper_float(self.dtype))
        return ((1 + t) / (1 - t)).log() * 0.5

    def atan(self: Tensor) -> Tensor:
        """Arctangent: reduced to |y| <= tan(pi/8) by atan(x) = pi/2 - atan(1/x) and atan(x) = pi/4 +
        atan((x-1)/(x+1)), then a Taylor series (enough terms for the dtype)."""
        t = self.cast(least_upper_float(self.dtype))
        a = t.abs()
        big = a > 1
        r = big.where(1 / big.where(a, 1), a)
        mid = r > math.tan(math.pi / 8)
        y = mid.where((r - 1) / (r + 1), r)
        y2, term, series = y * y, y, y.zeros_like()
        for n in range(24 if t.dtype == dtypes.float64 else 11):
            series = series + term * ((-1) ** n / (2 * n + 1))
            term = term * y2
        out = series + mid.cast(t.dtype) * (math.pi / 4)
        out = big.where(math.pi / 2 - out, out)
        return (t < 0).where(-out, out)

    def asin(self: Tensor) -> Tensor:
        """Arcsine, as atan(x / sqrt(1 - x**2))."""
        t = self.cast(least_upper_float(self.dtype))
        return (t / (1 - t * t).sqrt()).atan()

    def acos(self: Tensor) -> Tensor:
        """Arccosine, as pi/2 - asin(x)."""
        return math.pi / 2 - self.asin()

    def logaddexp(self: Tensor, x: Any) -> Tensor:
        """log(exp(self) + exp(x)), computed stably."""
        a, b = self._broadcasted(x)
        a, b = a.cast(least_upper_float(a.dtype)), b.cast(least_upper_float(a.dtype))
        m = a.maximum(b)
        # equal operands (infinities included, where a - b is nan) give a + log(2), written symmetrically so that
        # each gets half the gradient, as torch's exp(a - out)
        return a.eq(b).where(a * 0.5 + b * 0.5 + math.log(2), m + (-(a - b).abs()).exp().log1p())

    def erf(self: Tensor) -> Tensor:
        """The Gauss error function."""
        return _erf(self.cast(least_upper_float(self.dtype)))

    # *** activations ***

    def gelu(self: Tensor, approximate: str = "none") -> Tensor:
        """Gaussian error linear unit: x * Phi(x) exactly (torch's default), or its tanh approximation
        (approximate="tanh", what tinygrad's gelu computes)."""
        t = self.cast(least_upper_float(self.dtype))
        if approximate == "tanh":
            return 0.5 * t * (1 + (math.sqrt(2 / math.pi) * (t + 0.044715 * t * t * t)).tanh())
        if approximate != "none":
            raise InputError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
        return 0.5 * t * (1 + (t * (1 / math.sqrt(2))).erf())

    def quick_gelu(self: Tensor) -> Tensor:
        """x * sigmoid(1.702 x)."""
        return self * (self * 1.702).sigmoid()

    def silu(self: Tensor) -> Tensor:
        """x * sigmoid(x)."""
        return self * self.sigmoid()

    def swish(self: Tensor) -> Tensor:
        """Alias of silu."""
        return self.silu()

    def softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (torch's rule)."""
        t = self.cast(least_upper_float(self.dtype))
        bx = t * beta
        soft = (bx.relu() + (-bx.abs()).exp().log1p()) * (1 / beta)
        return (bx > threshold).where(t, soft)

    def mish(self: Tensor) -> Tensor:
        """x * tanh(softplus(x))."""
        return self * self.softplus().tanh()

    def softsign(self: Tensor) -> Tensor:
        """x / (1 + |x|)."""
        return self / (1 + self.abs())

    def logsigmoid(self: Tensor) -> Tensor:
        """log(sigmoid(x)), stable for large |x|."""
        return -(-self).softplus()

    def elu(self: Tensor, alpha: float = 1.0) -> Tensor:
        """x for x > 0, alpha (e**x - 1) otherwise."""
        return (self > 0).where(self, alpha * self._nonpositive().expm1())

    def celu(self: Tensor, alpha: float = 1.0) -> Tensor:
        """max(0, x) + min(0, alpha (e**(x/alpha) - 1))."""
        return (self > 0).where(self, alpha * (self._nonpositive() * (1 / alpha)).expm1())

    def _nonpositive(self: Tensor) -> Tensor:
        # x where x <= 0, else 0: the exponential of a where's unused branch must stay finite, or its gradient
        # would be 0 * inf = nan
        return (self > 0).where(0, self)

    def selu(self: Tensor) -> Tensor:
        """scale * elu(x, alpha) with the self-normalizing constants."""
        return _SELU_SCALE * self.elu(_SELU_ALPHA)

    def leaky_relu(self: Tensor, neg_slope: float = 0.01) -> Tensor:
        """x for x > 0, neg_slope * x otherwise."""
        return (self > 0).where(self, self * neg_slope)

    def relu6(self: Tensor) -> Tensor:
        """min(max(x, 0), 6)."""
        return self.relu().minimum(6)

    def hardtanh(self: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        """x clamped to [min_val, max_val]."""
        return self.clip(min_val, max_val)

    def hardsigmoid(self: Tensor, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
        """max(0, min(1, alpha x + beta))."""
        return (alpha * self + beta).clip(0, 1)

    def hardswish(self: Tensor) -> Tensor:
        """x * relu6(x + 3) / 6."""
        return self * (self + 3).relu6() * (1 / 6)

    # *** in-place operators: assign the result, as torch's and tinygrad's += do ***

    def _inplace(self: Tensor, out: Tensor) -> Tensor:
        if dtypes.is_float(out.dtype) and not dtypes.is_float(self.dtype):
            raise DTypeError(f"an in-place op can't store a {out.dtype!r} result in a {self.dtype!r} tensor")
        return self.assign(out.cast(self.dtype))

    def __iadd__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self + x)

    def __isub__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self - x)

    def __imul__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self * x)

    def __itruediv__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self / x)

    def __ifloordiv__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self // x)

    def __imod__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self % x)

    def __ipow__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self**x)

    def __iand__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self & x)

    def __ior__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self | x)

    def __ixor__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self ^ x)

    def __ilshift__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self << x)

    def __irshift__(self: Tensor, x: Any) -> Tensor:
        return self._inplace(self >> x)
