"""C source in the calling convention of the CPU device's programs (`lazygrad_cpu.program.CPUProgram`)."""

from __future__ import annotations

from typing import ClassVar

from lazygrad_codegen import CRenderer
from lazygrad_cpu.renderer import arity_symbol
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

# float16 and bfloat16 as (mantissa bits with the implicit one, frexp exponent of the smallest normal, largest
# finite value): what rounding a double to the format needs
_FORMATS: dict[DType, tuple[int, int, str]] = {
    dtypes.float16: (11, -13, "65504.0"),
    dtypes.bfloat16: (8, -125, "3.3895313892515355e38"),
}
_SUFFIX = {dtypes.float16: "h", dtypes.bfloat16: "bf"}

# Half-precision values live in `float` variables holding a value the format can represent, and in memory as their
# 16 bits (`unsigned short`). C has no portable type for them (GCC 12 has no `__bf16` arithmetic, and `_Float16`
# needs the compiler's runtime helpers, whose results the CPU device's object loader gets wrong), so the kernel
# rounds with these functions after each operation: computing + - * / sqrt in float and rounding once gives the
# correctly rounded result of the narrow format (float has more than twice its digits), as numpy's float16 does.
_HELPERS = """
static inline double lg_round(double x, int p, int emin, double maxv) {
  if (x != x || x == 0.0 || isinf(x)) return x;
  int e;
  frexp(x, &e);
  if (e < emin) e = emin; /* subnormal: the quantum stops shrinking */
  double q = ldexp(1.0, e - p);
  double r = nearbyint(x / q) * q; /* to nearest, ties to even (the default rounding mode) */
  return fabs(r) > maxv ? copysign(INFINITY, x) : r;
}
static inline float lg_rh(double x) { return (float)lg_round(x, %(h)s); }
static inline float lg_rbf(double x) { return (float)lg_round(x, %(bf)s); }
static inline float lg_h2f(unsigned short h) {
  int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v = exp == 0    ? ldexpf((float)mant, -24) /* subnormal */
            : exp == 31 ? (mant ? NAN : INFINITY)
                        : ldexpf((float)(mant | 0x400), exp - 25);
  return (h & 0x8000) ? -v : v;
}
static inline unsigned short lg_f2h(float x) {
  if (x != x) return 0x7e00;
  unsigned short sign = signbit(x) ? 0x8000 : 0;
  double a = fabs(lg_rh(x));
  if (isinf(a)) return sign | 0x7c00;
  if (a < ldexp(1.0, -14)) return sign | (unsigned short)(a * 16777216.0); /* subnormal: units of 2^-24 */
  int e;
  frexp(a, &e);
  return sign | (unsigned short)((e + 14) << 10) | (unsigned short)((ldexp(a, 1 - e) - 1.0) * 1024.0);
}
static inline float lg_bf2f(unsigned short b) {
  union { unsigned int u; float f; } v = {.u = (unsigned int)b << 16};
  return v.f;
}
static inline unsigned short lg_f2bf(float x) {
  union { float f; unsigned int u; } v = {.f = x != x ? NAN : lg_rbf(x)};
  return (unsigned short)(v.u >> 16); /* exact: the value is a bfloat16 already */
}
""" % {dt_name: f"{p}, {emin}, {maxv}" for dt_name, (p, emin, maxv) in zip(("h", "bf"), _FORMATS.values())}


class CPUCRenderer(CRenderer):
    """Codegen's plain C kernel, plus what a CPU program expects of a kernel: two trailing `int` parameters, the range
    of the `core0` axis a call runs (this renderer has no such axis, so a launch is one call that runs everything),
    and a constant named `<kernel>.arity` holding how many buffers and variables the kernel takes. float16 and
    bfloat16 are 16-bit storage converted by the helper functions above, computed in float and rounded back."""

    extra_params: ClassVar[tuple[str, ...]] = ("const int core_start", "const int core_end")
    type_map: ClassVar[dict[DType, str]] = {**CRenderer.type_map, dtypes.float16: "float", dtypes.bfloat16: "float"}

    def render_dtype(self, dtype: DType) -> str:
        """`float` for a half-precision value, `unsigned short*` for a buffer of them."""
        if isinstance(dtype, PtrDType) and dtype.base.scalar() in _FORMATS:
            return "unsigned short*"
        return super().render_dtype(dtype)

    def render_cast(self, x: str, src: DType, dest: DType) -> str:
        """Into float16 or bfloat16: the value rounded to the format (from double directly, so once); out of them:
        a float's conversion."""
        if dest.scalar() in _FORMATS:
            return f"lg_r{_SUFFIX[dest.scalar()]}((double)({x}))"
        return super().render_cast(x, src, dest)

    def render_bitcast(self, x: str, src: DType, dest: DType) -> str:
        """The bits of a half-precision value are its storage; other types pun through a union as in C."""
        if src.scalar() in _FORMATS:
            return super().render_bitcast(f"lg_f2{_SUFFIX[src.scalar()]}({x})", dtypes.uint16, dest)
        if dest.scalar() in _FORMATS:
            return f"lg_{_SUFFIX[dest.scalar()]}2f({super().render_bitcast(x, src, dtypes.uint16)})"
        return super().render_bitcast(x, src, dest)

    def render_load(self, ptr: str, dtype: DType, index: UOp) -> str:
        """A half-precision element is read as its bits and converted to float."""
        if dtype.scalar() in _FORMATS:
            return f"lg_{_SUFFIX[dtype.scalar()]}2f({super().render_load(ptr, dtype, index)})"
        return super().render_load(ptr, dtype, index)

    def render_store(self, ptr: str, value: str, dtype: DType, index: UOp) -> str:
        """A half-precision value is written as its bits."""
        if dtype.scalar() in _FORMATS:
            value = f"lg_f2{_SUFFIX[dtype.scalar()]}({value})"
        return super().render_store(ptr, value, dtype, index)

    def render_prelude(self, uops: list[UOp]) -> list[str]:
        """The includes, and the half-precision helpers where the kernel has such values."""
        narrow = any(
            (u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype).scalar() in _FORMATS
            for u in uops
            if u.op is not Ops.SINK
        )
        return [*super().render_prelude(uops), *([_HELPERS] if narrow else [])]

    def render_kernel(self, name: str, body: list[str], params: list[tuple[str, DType]], uops: list[UOp]) -> str:
        """The C kernel, then its arity constant (a symbol name with a dot, given through an asm label)."""
        src = super().render_kernel(name, body, params, uops)
        return f'{src}const int {name}_arity __asm__("{arity_symbol(name)}") = {len(params)};\n'
