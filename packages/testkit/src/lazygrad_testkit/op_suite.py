"""The op suite: a representative set of Tensor graphs across ops and dtypes, each with its numpy reference, run by
the conformance suite on every device under test (`conformance/test_ops.py`) and by device packages on their
emulations. A case builds its graph on a given device from numpy inputs and returns (tensor, reference, tolerances).

bfloat16 has no numpy dtype: its cases cast to bfloat16 inside the graph and back to float32 at the end, and their
references round to bfloat16 with `bf16`, written here from the format's definition (float32 with the low 16 bits
rounded off, to nearest even).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lazygrad import Tensor, dtypes
from lazygrad_testkit.dtypes import ARITH_DTYPES, PORTABLE_CAST_DTYPES
from lazygrad_uop.dtype import DType, to_numpy_dtype

Result = tuple[Tensor, np.ndarray, dict[str, float]]

EXACT: dict[str, float] = {"rtol": 0, "atol": 0}
F32: dict[str, float] = {"rtol": 2e-5, "atol": 1e-5}
F16: dict[str, float] = {"rtol": 2e-3, "atol": 2e-3}
BF16: dict[str, float] = {"rtol": 1.6e-2, "atol": 1e-2}


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def rand(shape: tuple[int, ...], dt: DType, seed: int, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    """Random values exact in `dt` (bfloat16: float32 values that are exact in bfloat16)."""
    rng = np.random.default_rng(seed)
    if dt == dtypes.bool:
        return rng.random(shape) < 0.5
    if dtypes.is_int(dt):
        lo = 0 if dtypes.is_unsigned(dt) else int(low)
        return rng.integers(lo, int(high) + 1, size=shape).astype(to_numpy_dtype(dt))
    values = rng.uniform(low, high, size=shape).astype(np.float32)
    return bf16(values) if dt == dtypes.bfloat16 else values.astype(to_numpy_dtype(dt))


def tensor(x: np.ndarray, device: str, dt: DType | None = None) -> Tensor:
    """`x` on `device`, cast to `dt` inside the graph when given (the way to get bfloat16 tensors)."""
    t = Tensor(x, device=device)
    return t.cast(dt) if dt is not None and dt != t.dtype else t


@dataclass(frozen=True)
class OpCase:
    """One graph of the suite: `build(device)` returns the tensor, its numpy reference and tolerances."""

    name: str
    build: Callable[[str], Result]

    def __repr__(self) -> str:
        return self.name


CASES: list[OpCase] = []


def case(name: str) -> Callable[[Callable[[str], Result]], Callable[[str], Result]]:
    def add(fn: Callable[[str], Result]) -> Callable[[str], Result]:
        CASES.append(OpCase(name, fn))
        return fn

    return add


def _tol(dt: DType) -> dict[str, float]:
    return {dtypes.float32: F32, dtypes.float16: F16, dtypes.bfloat16: BF16}.get(dt, EXACT)


# *** elementwise arithmetic, per dtype ***


def _arith(dt: DType) -> Callable[[str], Result]:
    def build(device: str) -> Result:
        a, b = rand((4, 6), dt, 1, 0, 9), rand((1, 6), dt, 2, 0, 9)
        ta, tb = tensor(a, device), tensor(b, device)
        out = (ta + tb) * tb - ta
        return out, (a + b) * b - a, _tol(dt)

    return build


for _dt in ARITH_DTYPES:
    case(f"arith_{_dt.name}")(_arith(_dt))


@case("arith_bfloat16")
def _arith_bf16(device: str) -> Result:
    a, b = rand((4, 6), dtypes.bfloat16, 3), rand((4, 6), dtypes.bfloat16, 4)
    ta, tb = tensor(a, device, dtypes.bfloat16), tensor(b, device, dtypes.bfloat16)
    out = ((ta * tb + ta) - tb).cast(dtypes.float32)
    return out, bf16(bf16(bf16(a * b) + a) - b), BF16


@case("int_wrap_and_extremes")
def _int_wrap(device: str) -> Result:
    a = np.array([2**31 - 1, -(2**31), 7, -7], np.int32)
    out = (tensor(a, device) + 1) * 3
    return out, (a + np.int32(1)) * np.int32(3), EXACT


@case("int64_large_constants")
def _int64(device: str) -> Result:
    a = np.array([1, -5, 2**40, -(2**50)], np.int64)
    out = tensor(a, device) * 3 + (2**41 + 17)
    return out, a * 3 + (2**41 + 17), EXACT


@case("uint32_large_values")
def _uint32(device: str) -> Result:
    a = np.array([0, 1, 2**32 - 1, 2**31 + 5], np.uint32)
    out = tensor(a, device) + tensor(np.array([5, 7, 1, 2**31], np.uint32), device)
    return out, a + np.array([5, 7, 1, 2**31], np.uint32), EXACT


@case("int_floordiv_mod")
def _idiv(device: str) -> Result:
    a, b = rand((3, 5), dtypes.int32, 5, -50, 50), rand((3, 5), dtypes.int32, 6, 1, 7)
    ta, tb = tensor(a, device), tensor(b, device)
    out = (ta // tb) * 100 + ta % -tb
    return out, (a // b) * 100 + a % -b, EXACT


@case("int8_floordiv")
def _idiv8(device: str) -> Result:
    a, b = rand((12,), dtypes.int8, 7, -100, 100), rand((12,), dtypes.int8, 8, 1, 9)
    return tensor(a, device) // tensor(b, device), a // b, EXACT


@case("float_div")
def _div(device: str) -> Result:
    a, b = rand((5, 4), dtypes.float32, 9), rand((5, 4), dtypes.float32, 10, 0.5, 3)
    return tensor(a, device) / tensor(b, device), a / b, F32


@case("half_div_and_recip")
def _hdiv(device: str) -> Result:
    a, b = rand((5, 4), dtypes.float16, 11), rand((5, 4), dtypes.float16, 12, 0.5, 3)
    ta, tb = tensor(a, device), tensor(b, device)
    return ta / tb + tb.reciprocal(), a / b + np.float16(1) / b, F16


@case("maximum_minimum_nan")
def _maxmin(device: str) -> Result:
    a = np.array([1.0, np.nan, -2.0, 3.0, -np.inf, 0.5], np.float32)
    b = np.array([2.0, 1.0, np.nan, -3.0, 4.0, np.inf], np.float32)
    ta, tb = tensor(a, device), tensor(b, device)
    return ta.maximum(tb) + ta.minimum(tb), np.maximum(a, b) + np.minimum(a, b), F32


@case("int_maximum_minimum")
def _imaxmin(device: str) -> Result:
    a, b = rand((9,), dtypes.int16, 13, -20, 20), rand((9,), dtypes.int16, 14, -20, 20)
    ta, tb = tensor(a, device), tensor(b, device)
    return ta.maximum(tb) - ta.minimum(tb), np.maximum(a, b) - np.minimum(a, b), EXACT


@case("bitwise_ints")
def _bitwise(device: str) -> Result:
    a, b = rand((8,), dtypes.int32, 15, -100, 100), rand((8,), dtypes.int32, 16, -100, 100)
    ta, tb = tensor(a, device), tensor(b, device)
    return (ta & tb) ^ (ta | 5), (a & b) ^ (a | 5), EXACT


@case("bitwise_bools")
def _bitwise_bool(device: str) -> Result:
    a, b = rand((8,), dtypes.bool, 17), rand((8,), dtypes.bool, 18)
    ta, tb = tensor(a, device), tensor(b, device)
    return (ta & tb) | (ta ^ tb).logical_not(), (a & b) | ~(a ^ b), EXACT


# *** comparisons and where ***

CMP_DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.float32]


def _cmp(dt: DType) -> Callable[[str], Result]:
    def build(device: str) -> Result:
        a, b = rand((3, 4), dt, 19), rand((3, 4), dt, 20)
        ta, tb = tensor(a, device), tensor(b, device)
        out = (ta < tb).logical_or(ta == tb).logical_and(ta != tb.maximum(tb))
        return out, ((a < b) | (a == b)) & (a != np.maximum(b, b)), EXACT

    return build


for _dt in CMP_DTYPES:
    case(f"compare_{_dt.name}")(_cmp(_dt))


@case("where_broadcast")
def _where(device: str) -> Result:
    c, a = rand((4, 1), dtypes.bool, 21), rand((1, 5), dtypes.float32, 22)
    out = tensor(c, device).where(tensor(a, device), -2.5)
    return out, np.where(c, a, np.float32(-2.5)), F32


@case("where_half_inf")
def _where_inf(device: str) -> Result:
    a = rand((6,), dtypes.float16, 23)
    ta = tensor(a, device)
    out = (ta > 0).where(ta, float("-inf"))
    return out, np.where(a > 0, a, np.float16(-np.inf)), F16


# *** unary math ***


def _unary(dt: DType) -> Callable[[str], Result]:
    def build(device: str) -> Result:
        x = rand((2, 7), dt, 24)
        pos = np.abs(x) + np.asarray(0.25, x.dtype)
        t, tp = tensor(x, device), tensor(pos, device)
        out = t.exp() + tp.log() + t.sin() + tp.sqrt() + t.exp2() + tp.log2() + t.trunc()
        with np.errstate(all="ignore"):
            ref = (np.exp(x) + np.log(pos) + np.sin(x) + np.sqrt(pos) + np.exp2(x) + np.log2(pos) + np.trunc(x)).astype(
                x.dtype
            )
        return out, ref, {"rtol": 1e-4, "atol": 1e-4} if dt == dtypes.float32 else {"rtol": 1e-2, "atol": 2e-2}

    return build


case("unary_float32")(_unary(dtypes.float32))
case("unary_float16")(_unary(dtypes.float16))


@case("unary_bfloat16")
def _unary_bf16(device: str) -> Result:
    x = rand((9,), dtypes.bfloat16, 25, 0.25, 3)
    t = tensor(x, device, dtypes.bfloat16)
    out = t.sqrt().cast(dtypes.float32) + t.log2().cast(dtypes.float32)
    return out, bf16(np.sqrt(x)) + bf16(np.log2(x)), BF16


@case("activations")
def _activations(device: str) -> Result:
    x = rand((3, 5), dtypes.float32, 26)
    t = tensor(x, device)
    out = t.relu() + t.sigmoid() + t.tanh() + t.abs() + t.square() - t.neg()
    x64 = x.astype(np.float64)
    ref = np.maximum(x64, 0) + 1 / (1 + np.exp(-x64)) + np.tanh(x64) + np.abs(x64) + x64 * x64 + x64
    return out, ref.astype(np.float32), {"rtol": 1e-5, "atol": 1e-5}


@case("rounding")
def _rounding(device: str) -> Result:
    x = np.array([-2.5, -1.5, -0.2, 0.0, 0.7, 1.5, 2.49], np.float32)
    t = tensor(x, device)
    return t.floor() * 100 + t.ceil() * 10 + t.trunc(), np.floor(x) * 100 + np.ceil(x) * 10 + np.trunc(x), F32


@case("edge_values")
def _edges(device: str) -> Result:
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan], np.float32)
    t = tensor(x, device)
    with np.errstate(all="ignore"):
        ref = np.log2(x) + np.sqrt(x) + np.exp2(x)
    return t.log2() + t.sqrt() + t.exp2(), ref, F32


# *** casts and bitcasts ***

CAST_DTYPES = PORTABLE_CAST_DTYPES


def _cast(src: DType) -> Callable[[str], Result]:
    def build(device: str) -> Result:
        x = rand((2, 4), src, 27, -100, 100)
        t = tensor(x, device)
        outs, refs = [], []
        for dst in CAST_DTYPES:
            y = x
            if dtypes.is_float(src) and dtypes.is_int(dst):
                info = np.iinfo(to_numpy_dtype(dst))
                with np.errstate(over="ignore"):  # int64's bounds overflow float16: clipping is then a no-op
                    y = np.clip(np.abs(x) if dtypes.is_unsigned(dst) else x, info.min, info.max).astype(x.dtype)
            with np.errstate(all="ignore"):
                refs.append(y.astype(to_numpy_dtype(dst)).astype(np.float32))
            outs.append(tensor(y, device).cast(dst).cast(dtypes.float32) if y is not x else t.cast(dst).float())
        out = outs[0]
        for o in outs[1:]:
            out = out * 1000 + o
        ref = refs[0]
        for r in refs[1:]:
            ref = ref * 1000 + r
        return out, ref, {"rtol": 1e-6, "atol": 0}

    return build


for _dt in CAST_DTYPES:
    case(f"cast_from_{_dt.name}")(_cast(_dt))


@case("cast_bfloat16_roundtrips")
def _cast_bf16(device: str) -> Result:
    x = rand((10,), dtypes.float32, 28, -100, 100)
    t = tensor(x, device).cast(dtypes.bfloat16)
    out = t.cast(dtypes.float32) + t.cast(dtypes.int32).cast(dtypes.float32) + t.cast(dtypes.float16).float()
    b = bf16(x)
    return out, b + np.trunc(b) + b.astype(np.float16).astype(np.float32), BF16


@case("cast_int_to_bfloat16")
def _cast_int_bf16(device: str) -> Result:
    x = rand((8,), dtypes.int16, 29, -300, 300)
    return tensor(x, device).cast(dtypes.bfloat16).float(), bf16(x.astype(np.float32)), EXACT


@case("bitcasts")
def _bitcasts(device: str) -> Result:
    x = rand((6,), dtypes.float32, 30)
    h = rand((6,), dtypes.float16, 31)
    t, th = tensor(x, device), tensor(h, device)
    out = t.bitcast(dtypes.int32).cast(dtypes.int64) * 3 + th.bitcast(dtypes.int16).cast(dtypes.int64)
    ref = x.view(np.int32).astype(np.int64) * 3 + h.view(np.int16).astype(np.int64)
    return out, ref, EXACT


@case("bitcast_uint32_to_float")
def _bitcast_u32(device: str) -> Result:
    x = np.array([0x3F800000, 0x40490FDB, 0xC0000000, 0x7F800000], np.uint32)
    return tensor(x, device).bitcast(dtypes.float32), x.view(np.float32), EXACT


# *** reductions ***


def _reduce(dt: DType, op: str) -> Callable[[str], Result]:
    def build(device: str) -> Result:
        x = rand((4, 5, 3), dt, 32, 1 if op == "prod" else -3, 2 if op == "prod" else 3)
        t = tensor(x, device)
        fn = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[op]
        out = getattr(t, op)(axis=1)
        ref = fn(x, axis=1)
        if dtypes.is_int(dt) or dt == dtypes.bool:
            ref = np.asarray(ref).astype(to_numpy_dtype(out.dtype))
        return out, ref, _tol(dt) if dt != dtypes.float16 else {"rtol": 1e-2, "atol": 1e-2}

    return build


for _dt, _ops in [
    (dtypes.float32, ["sum", "max", "min", "prod"]),
    (dtypes.float16, ["sum", "max"]),
    (dtypes.int32, ["sum", "max", "min", "prod"]),
    (dtypes.int8, ["sum", "max"]),
    (dtypes.uint8, ["min"]),
    (dtypes.bool, ["sum", "max"]),
    (dtypes.int64, ["sum"]),
]:
    for _op in _ops:
        case(f"reduce_{_op}_{_dt.name}")(_reduce(_dt, _op))


@case("reduce_all_and_mean")
def _reduce_all(device: str) -> Result:
    x = rand((6, 7), dtypes.float32, 33)
    t = tensor(x, device)
    return t.sum() + t.mean() + t.max(), np.float32(x.sum() + x.mean() + x.max()), {"rtol": 1e-5, "atol": 1e-5}


@case("reduce_grouped_to_scalar")
def _grouped_scalar(device: str) -> Result:
    # large enough that codegen splits the reduction over a threadgroup (threadgroup memory and a barrier)
    x = rand((4096,), dtypes.float32, 48)
    return tensor(x, device).sum(), np.float32(x.astype(np.float64).sum()), {"rtol": 1e-4, "atol": 1e-3}


@case("reduce_grouped_rows_int32_max")
def _grouped_rows(device: str) -> Result:
    x = rand((4, 1024), dtypes.int32, 49, -1000, 1000)
    t = tensor(x, device)
    return t.max(axis=1) + t.sum(axis=1), x.max(axis=1) + x.sum(axis=1), EXACT


@case("reduce_bfloat16")
def _reduce_bf16(device: str) -> Result:
    x = rand((3, 8), dtypes.bfloat16, 34)
    return tensor(x, device, dtypes.bfloat16).sum(axis=1).float(), x.sum(axis=1), {"rtol": 3e-2, "atol": 3e-2}


@case("reduce_of_view")
def _reduce_view(device: str) -> Result:
    x = rand((5, 6), dtypes.float32, 35)
    t = tensor(x, device)
    out = t.permute(1, 0).flip(0).pad(((1, 2), (0, 1))).sum(axis=0, keepdim=True)
    ref = np.pad(x.T[::-1], ((1, 2), (0, 1))).sum(axis=0, keepdims=True)
    return out, ref, F32


@case("reduce_then_elementwise")
def _epilogue(device: str) -> Result:
    x, y = rand((8, 4), dtypes.float32, 36), rand((8,), dtypes.float32, 37)
    out = (tensor(x, device).sum(1) + tensor(y, device)).relu()
    return out, np.maximum(x.sum(1) + y, 0), F32


# *** movement ***


@case("movement_chain")
def _movement(device: str) -> Result:
    x = rand((3, 4, 5), dtypes.float32, 38)
    t = tensor(x, device)
    out = t.permute(2, 0, 1).flip(1).shrink(((1, 4), None, (0, 3))).pad(((0, 1), (2, 0), (1, 1))).reshape(4, -1)
    ref = np.pad(x.transpose(2, 0, 1)[:, ::-1][1:4, :, 0:3], ((0, 1), (2, 0), (1, 1))).reshape(4, -1)
    return out + 1, ref + 1, F32


@case("slicing_with_steps")
def _slicing(device: str) -> Result:
    x = rand((7, 9), dtypes.int32, 39)
    return tensor(x, device)[1:6:2, ::3] * 2, x[1:6:2, ::3] * 2, EXACT


@case("expand_broadcast_4d")
def _expand(device: str) -> Result:
    a, b = rand((2, 1, 3, 1), dtypes.float32, 40), rand((1, 4, 1, 5), dtypes.float32, 41)
    return tensor(a, device) * tensor(b, device), a * b, F32


@case("five_dims_fold_into_grid")
def _five_dims(device: str) -> Result:
    x = rand((2, 3, 2, 3, 4), dtypes.float32, 42)
    return tensor(x, device).exp2() * 2, np.exp2(x) * 2, F32


# *** matmul and chains ***


def _matmul(dt: DType, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> Callable[[str], Result]:
    def build(device: str) -> Result:
        a, b = rand(shape_a, dt, 43, -2, 2), rand(shape_b, dt, 44, -2, 2)
        out = tensor(a, device) @ tensor(b, device)
        ref = (a.astype(np.float32) @ b.astype(np.float32)).astype(a.dtype)
        return out, ref, {"rtol": 1e-4, "atol": 1e-4} if dt == dtypes.float32 else {"rtol": 1e-2, "atol": 5e-2}

    return build


case("matmul_float32")(_matmul(dtypes.float32, (5, 7), (7, 3)))
case("matmul_float16_8x8x8")(_matmul(dtypes.float16, (8, 8), (8, 8)))
# shapes the simdgroup-matrix tensor cores take (tiles of 8x8x8), several tiles and a K loop
case("matmul_tc_float32_16x16x16")(_matmul(dtypes.float32, (16, 16), (16, 16)))
case("matmul_tc_float16_8x32x8")(_matmul(dtypes.float16, (8, 32), (32, 8)))
case("matmul_tc_float16_24x16x40")(_matmul(dtypes.float16, (24, 16), (16, 40)))
case("matmul_batched")(_matmul(dtypes.float32, (2, 3, 4), (4, 5)))
case("matmul_int32")(_matmul(dtypes.int32, (3, 4), (4, 2)))


@case("matmul_bfloat16")
def _matmul_bf16(device: str) -> Result:
    a, b = rand((4, 8), dtypes.bfloat16, 45, -2, 2), rand((8, 3), dtypes.bfloat16, 46, -2, 2)
    out = (tensor(a, device, dtypes.bfloat16) @ tensor(b, device, dtypes.bfloat16)).float()
    return out, a @ b, {"rtol": 3e-2, "atol": 1e-1}


@case("softmax")
def _softmax(device: str) -> Result:
    x = rand((4, 9), dtypes.float32, 47)
    t = tensor(x, device)
    e = (t - t.max(-1, keepdim=True)).exp()
    ref = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdim=True), ref / ref.sum(-1, keepdims=True), {"rtol": 1e-5, "atol": 1e-6}


@case("creation_arange_eye_full")
def _creation(device: str) -> Result:
    out = Tensor.arange(12, device=device).reshape(3, 4) + Tensor.eye(3, 4, device=device).cast(dtypes.int32) * 100
    out = out + Tensor.full((3, 4), 7, device=device)
    return out, np.arange(12, dtype=np.int32).reshape(3, 4) + np.eye(3, 4, dtype=np.int32) * 100 + 7, EXACT
