"""Exact value semantics of every scalar dtype, in plain Python.

Values travel through the interpreter as Python objects that are always exactly representable in their dtype: `bool`
for bool, `int` within the type's range for integers, `float` holding an exactly representable value for the float
types. Each function here keeps that invariant: `normalizer(dt)` rounds or wraps a batch of raw results into `dt`,
`caster(src, dst)` converts, `bitcaster(src, dst)` reinterprets bits, and `memory(dt, view)` reads and writes
elements of `dt` in a byte buffer.

Floats narrower than a double are computed in double and rounded once: for +, -, *, / and sqrt of float32, float16
or bfloat16 operands that single rounding of the double result equals the correctly rounded result, because a double
has more than twice their mantissa bits plus two.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lazygrad_uop.dtype import DType, dtypes

Normalizer = Callable[[Iterable[Any]], list[Any]]

INF, NAN = math.inf, math.nan


# *** rounding doubles to narrow float formats ***


def make_float_rounder(mant_bits: int, min_exp: int, max_value: float, has_inf: bool) -> Callable[[float], float]:
    """Round-to-nearest-even from a double to a binary float format with `mant_bits` stored mantissa bits, smallest
    normal 2**min_exp and largest finite `max_value`. Results past the largest finite value become inf, or nan for
    formats without inf (float8 e4m3)."""

    def rounder(x: float) -> float:
        if x != x:
            return x
        if x in (INF, -INF):
            return x if has_inf else NAN
        if x == 0.0:
            return x
        if abs(x) >= 2.0 * max_value:  # overflows for sure (and rounding it would overflow ldexp)
            return math.copysign(INF, x) if has_inf else NAN
        exp = math.frexp(x)[1] - 1  # x = 1.m * 2**exp
        quantum = max(exp, min_exp) - mant_bits  # the value of the last mantissa bit; fixed below the normal range
        # ldexp by a power of two is exact, and round() on a float rounds half to even.
        y = math.ldexp(round(math.ldexp(x, -quantum)), quantum)
        if y == 0.0:
            return math.copysign(0.0, x)
        if abs(y) > max_value:
            return math.copysign(INF, x) if has_inf else NAN
        return y

    return rounder


_round_f32 = make_float_rounder(23, -126, 3.4028234663852886e38, True)
_round_f16 = make_float_rounder(10, -14, 65504.0, True)
_round_bf16 = make_float_rounder(7, -126, 3.3895313892515355e38, True)
_round_e4m3 = make_float_rounder(3, -6, 448.0, False)
_round_e5m2 = make_float_rounder(2, -14, 57344.0, True)

FLOAT_ROUNDERS: dict[DType, Callable[[float], float]] = {
    dtypes.float64: float,
    dtypes.float32: _round_f32,
    dtypes.float16: _round_f16,
    dtypes.bfloat16: _round_bf16,
    dtypes.fp8e4m3: _round_e4m3,
    dtypes.fp8e5m2: _round_e5m2,
}
_MANT_BITS = {dt: dtypes.finfo(dt)[1] for dt in FLOAT_ROUNDERS}


# *** batch normalizers: a list of raw results -> a list of values of the dtype ***


def _norm_f64(values: Iterable[Any]) -> list[Any]:
    return list(values)


def _norm_f32(values: Iterable[Any]) -> list[Any]:
    # array('f') converts in C with the hardware's rounding (overflow becomes inf): one call for the whole batch.
    return array("f", values).tolist()


def _norm_f16(values: Iterable[Any]) -> list[Any]:
    vals = values if isinstance(values, list) else list(values)
    fmt = f"<{len(vals)}e"
    try:
        return list(struct.unpack(fmt, struct.pack(fmt, *vals)))
    except OverflowError:  # struct refuses finite values that round to inf; IEEE gives inf
        return [_round_f16(float(v)) for v in vals]


def round_float32_mantissa(values: Sequence[float], bits: int) -> list[float]:
    """float32 `values` rounded to `bits` explicit mantissa bits (0 to 22), to nearest with ties away from zero, the
    exponent range kept: `bits=10` is NVIDIA's TF32 as `cvt.rna.tf32.f32` makes it. On the bits: half of the last kept
    bit's weight is added to the magnitude and the dropped bits cleared, so a carry moves to the next binade (or past
    the largest finite value to inf), subnormals round at the same bit position, and the sign is kept. inf and nan
    are left as they are."""
    if not 0 <= bits < 23:
        raise ValueError(f"a float32 keeps 0 to 22 of its 23 mantissa bits when rounded, not {bits}")
    drop = 23 - bits
    half, keep = 1 << (drop - 1), ~((1 << drop) - 1) & 0xFFFFFFFF
    raw = array("I", array("f", values).tobytes())
    for i, u in enumerate(raw):
        if u & 0x7F800000 != 0x7F800000:
            raw[i] = (u + half) & keep
    return list(array("f", raw.tobytes()))


def _per_element(rounder: Callable[[float], float]) -> Normalizer:
    def norm(values: Iterable[Any]) -> list[Any]:
        return [rounder(float(v)) for v in values]

    return norm


def _wrap_signed(bits: int) -> Normalizer:
    half, mask = 1 << (bits - 1), (1 << bits) - 1

    def norm(values: Iterable[Any]) -> list[Any]:
        return [((v + half) & mask) - half for v in values]

    return norm


def _wrap_unsigned(bits: int) -> Normalizer:
    mask = (1 << bits) - 1

    def norm(values: Iterable[Any]) -> list[Any]:
        return [v & mask for v in values]

    return norm


def _norm_bool(values: Iterable[Any]) -> list[Any]:
    return list(map(bool, values))


_NORMALIZERS: dict[DType, Normalizer] = {
    dtypes.float64: _norm_f64,
    dtypes.float32: _norm_f32,
    dtypes.float16: _norm_f16,
    dtypes.bfloat16: _per_element(_round_bf16),
    dtypes.fp8e4m3: _per_element(_round_e4m3),
    dtypes.fp8e5m2: _per_element(_round_e5m2),
    dtypes.bool: _norm_bool,
    **{dt: _wrap_signed(8 * dt.itemsize) for dt in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)},
    **{dt: _wrap_unsigned(8 * dt.itemsize) for dt in (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)},
}


def normalizer(dt: DType) -> Normalizer:
    """The function that turns raw Python results (any int, any double) into values of scalar dtype `dt`: integers
    wrap to the type's width, floats round to nearest even (overflow gives inf), anything becomes bool by truth."""
    if dt.scalar() not in _NORMALIZERS:
        raise NotImplementedError(f"the PYTHON interpreter has no values of dtype {dt}")
    return _NORMALIZERS[dt.scalar()]


def to_value(dt: DType, x: Any) -> Any:
    """One Python value (a constant's arg) as a value of scalar dtype `dt`."""
    if dtypes.is_float(dt):
        return normalizer(dt)([float(x)])[0]
    if dtypes.is_int(dt):
        return normalizer(dt)([int(x)])[0]
    if dtypes.is_bool(dt):
        return bool(x)
    raise NotImplementedError(f"the PYTHON interpreter has no values of dtype {dt}")


# *** casts ***


def _int_to_float(dst: DType) -> Callable[[int], float]:
    mant = _MANT_BITS[dst] + 1  # significant bits, the implicit one included
    rounder = FLOAT_ROUNDERS[dst]

    def cast(v: int) -> float:
        if -(1 << 53) <= v <= 1 << 53:
            return rounder(float(v))  # exact in a double, so one rounding
        # Round the integer itself to `mant` significant bits (half to even) so no double rounding happens.
        mag, shift = abs(v), abs(v).bit_length() - mant
        q, r = divmod(mag, 1 << shift)
        half = 1 << (shift - 1)
        if r > half or (r == half and q & 1):
            q += 1
        try:
            out = float(q << shift)
        except OverflowError:  # beyond the double range (only for formats wider than a double: none today)
            out = INF
        return rounder(-out if v < 0 else out)

    return cast


def _float_to_int(v: float) -> int:
    # C leaves out-of-range and non-finite conversions undefined; here they truncate then wrap, and nan/inf give 0.
    return int(v) if math.isfinite(v) else 0


def caster(src: DType, dst: DType) -> Callable[[list[Any]], list[Any]]:
    """The batch conversion of values of scalar dtype `src` to scalar dtype `dst`, as C does it: float->int truncates
    toward zero, ->bool is `!= 0` (nan is true), int->int wraps, ->float rounds to nearest even."""
    src, dst = src.scalar(), dst.scalar()
    norm = normalizer(dst)
    if src == dst:
        return list
    if dst == dtypes.bool:
        return _norm_bool
    if dtypes.is_float(dst):
        if dtypes.is_float(src):
            return norm
        to_float = _int_to_float(dst)
        return lambda vals: [to_float(int(v)) for v in vals]
    if dtypes.is_int(dst):
        if dtypes.is_float(src):
            return lambda vals: norm(map(_float_to_int, vals))
        return lambda vals: norm(map(int, vals))
    raise NotImplementedError(f"the PYTHON interpreter can't cast {src} to {dst}")


# *** bits: encoding values to bytes and back ***


def _bf16_encode(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0] >> 16  # v is exactly a bfloat16, so the low half is zero


def _bf16_decode(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def _fp8_table(exp_bits: int, mant_bits: int, has_inf: bool) -> tuple[list[float], dict[float, int]]:
    bias = (1 << (exp_bits - 1)) - 1
    decode: list[float] = []
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        e, m = (byte >> mant_bits) & ((1 << exp_bits) - 1), byte & ((1 << mant_bits) - 1)
        if e == (1 << exp_bits) - 1 and (has_inf or m == (1 << mant_bits) - 1):
            decode.append(sign * INF if has_inf and m == 0 else NAN)
        elif e == 0:
            decode.append(sign * math.ldexp(m, 1 - bias - mant_bits))
        else:
            decode.append(sign * math.ldexp(m + (1 << mant_bits), e - bias - mant_bits))
    # -0.0 == 0.0 as dict keys, so zeros are encoded by sign separately
    encode = {v: byte for byte, v in enumerate(decode) if v == v and v != 0.0}
    return decode, encode


def _fp8_codec(exp_bits: int, mant_bits: int, has_inf: bool) -> tuple[Callable[[float], int], Callable[[int], float]]:
    decode, encode = _fp8_table(exp_bits, mant_bits, has_inf)
    nan_byte = 0x7F

    def enc(v: float) -> int:
        if v != v:
            return nan_byte
        if v == 0.0:
            return 0x80 if math.copysign(1.0, v) < 0 else 0
        return encode[v]

    return enc, decode.__getitem__


_E4M3 = _fp8_codec(4, 3, False)
_E5M2 = _fp8_codec(5, 2, True)
# Dtypes struct can't pack are stored as unsigned integers of their width through these (encode, decode) pairs.
_CODECS: dict[DType, tuple[str, Callable[[Any], int], Callable[[int], Any]]] = {
    dtypes.bfloat16: ("H", _bf16_encode, _bf16_decode),
    dtypes.fp8e4m3: ("B", *_E4M3),
    dtypes.fp8e5m2: ("B", *_E5M2),
}


def encode(dt: DType, values: Sequence[Any]) -> bytes:
    """The little-endian bytes of `values`, each a value of scalar dtype `dt`."""
    dt = dt.scalar()
    if dt in _CODECS:
        fmt, enc, _ = _CODECS[dt]
        return struct.pack(f"<{len(values)}{fmt}", *map(enc, values))
    return struct.pack(f"<{len(values)}{_fmt(dt)}", *values)


def decode(dt: DType, data: bytes) -> list[Any]:
    """The values of scalar dtype `dt` held in the little-endian bytes `data`."""
    dt = dt.scalar()
    count = len(data) // dt.itemsize
    if dt in _CODECS:
        fmt, _, dec = _CODECS[dt]
        return [dec(b) for b in struct.unpack(f"<{count}{fmt}", data)]
    return list(struct.unpack(f"<{count}{_fmt(dt)}", data))


def _fmt(dt: DType) -> str:
    if dt.fmt is None:
        raise NotImplementedError(f"the PYTHON interpreter can't store dtype {dt}")
    return dt.fmt


def bitcaster(src: DType, dst: DType) -> Callable[[list[Any]], list[Any]]:
    """The batch reinterpretation of values of `src` as `dst` (scalars or vectors of the same total size); vector
    values are tuples of lanes."""
    if src.itemsize != dst.itemsize:
        raise ValueError(f"BITCAST from {src} ({src.itemsize} bytes) to {dst} ({dst.itemsize} bytes) changes the size")
    s_scalar, d_scalar, s_vec, d_vec = src.scalar(), dst.scalar(), src.count > 1, dst.count > 1

    def one(v: Any) -> Any:
        lanes = decode(d_scalar, encode(s_scalar, v if s_vec else (v,)))
        return tuple(lanes) if d_vec else lanes[0]

    return lambda vals: [one(v) for v in vals]


# *** memory ***


class _CodecMemory:
    """Elements of a dtype that memoryview can't cast to, stored as unsigned integers through an encode/decode pair."""

    __slots__ = ("_dec", "_enc", "_raw")

    def __init__(self, raw: memoryview, enc: Callable[[Any], int], dec: Callable[[int], Any]) -> None:
        self._raw, self._enc, self._dec = raw, enc, dec

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, i: int) -> Any:
        return self._dec(self._raw[i])

    def __setitem__(self, i: int, v: Any) -> None:
        self._raw[i] = self._enc(v)


class _HalfMemory:
    """float16 elements: memoryview has no 'e' cast, struct packs them."""

    __slots__ = ("_buf", "_len")

    def __init__(self, buf: memoryview) -> None:
        self._buf, self._len = buf, len(buf) // 2

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> float:
        if not 0 <= i < self._len:
            raise IndexError(f"element {i} is outside a float16 buffer of {self._len} elements")
        return struct.unpack_from("<e", self._buf, 2 * i)[0]

    def __setitem__(self, i: int, v: float) -> None:
        if not 0 <= i < self._len:
            raise IndexError(f"element {i} is outside a float16 buffer of {self._len} elements")
        struct.pack_into("<e", self._buf, 2 * i, v)


def memory(dt: DType, buf: memoryview) -> Any:
    """An indexable view of the bytes `buf` as elements of scalar dtype `dt`: `m[i]` reads element i as a value of
    `dt` and `m[i] = v` writes one; `len(m)` is the number of whole elements."""
    dt = dt.scalar()
    raw = buf.cast("B") if buf.format != "B" else buf
    raw = raw[: len(raw) - len(raw) % dt.itemsize]
    if dt == dtypes.float16:
        return _HalfMemory(raw)
    if dt in _CODECS:
        fmt, enc, dec = _CODECS[dt]
        return _CodecMemory(raw.cast(fmt), enc, dec)
    return raw.cast(_fmt(dt))


def memory_bytes(mem: Any) -> memoryview:
    """The bytes behind a view that `memory` made: writing them changes its elements (bit-exact copies of any dtype,
    whatever dtype the view reads them as)."""
    if isinstance(mem, _HalfMemory):
        return mem._buf
    if isinstance(mem, _CodecMemory):
        return mem._raw.cast("B")
    return mem.cast("B")


def zero(dt: DType) -> Any:
    """The zero value of `dt` (a tuple of zeros for a vector)."""
    z = to_value(dt.scalar(), 0)
    return (z,) * dt.count if dt.count > 1 else z
