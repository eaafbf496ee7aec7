"""CAST and BITCAST between every pair of dtypes, run as kernels and checked against numpy's conversions, and the
rounding of the formats numpy lacks (bfloat16, float8) against bit-level references and known values."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyinterp_helpers import bf16_round, compile_program, const, elementwise, end, glob, load, program, rng, run, store

from lazygrad_python import PythonProgram
from lazygrad_python.numerics import FLOAT_ROUNDERS, decode, encode
from lazygrad_testkit.dtypes import NUMPY_SCALARS
from lazygrad_uop import DType, Ops, UOp, dtypes
from lazygrad_uop.dtype import to_numpy_dtype

N = 16
NUMPY_DTYPES = NUMPY_SCALARS


def values(dt: DType) -> st.SearchStrategy[np.ndarray]:
    if dtypes.is_float(dt):
        specials = st.sampled_from([0.0, -0.0, 0.5, -1.5, 2.5, 255.9, -128.7, math.inf, -math.inf, math.nan])
        elem = st.one_of(st.floats(), st.floats(-300, 300), st.floats(-(2.0**65), 2.0**65), specials)
    elif dtypes.is_int(dt):
        elem = st.integers(dtypes.min(dt), dtypes.max(dt))
    else:
        elem = st.booleans()
    return st.lists(elem, min_size=N, max_size=N).map(lambda v: _array(v, dt))


def _array(v: list[object], dt: DType) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.array(v, dtype=to_numpy_dtype(dt))


@functools.cache
def kernel(op: Ops, src: DType, dst: DType) -> PythonProgram:
    return compile_program(elementwise(op, dst, (src,), N))


def cast_reference(x: np.ndarray, src: DType, dst: DType) -> tuple[np.ndarray, np.ndarray]:
    """Inputs where C defines the cast (float -> int only for finite values whose truncation fits) and numpy's cast."""
    if dtypes.is_float(src) and dtypes.is_int(dst):
        with np.errstate(invalid="ignore"):
            t = np.trunc(x.astype(np.float64))
            # float64 can't hold the int64/uint64 maximum exactly: keep clear of the top
            hi = min(float(dtypes.max(dst)), 2.0**62)
            fits = np.isfinite(t) & (t >= float(dtypes.min(dst))) & (t <= hi)
        x = np.where(fits, x, np.zeros_like(x))
    with np.errstate(all="ignore"):
        return x, x.astype(to_numpy_dtype(dst))


@pytest.mark.parametrize("src", NUMPY_DTYPES, ids=lambda d: d.name)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_cast_to_every_dtype_matches_numpy(src: DType, data: st.DataObject) -> None:
    drawn = data.draw(values(src))
    for dst in NUMPY_DTYPES:
        if dst == src:
            continue
        x, ref = cast_reference(drawn, src, dst)
        (res, _) = run(kernel(Ops.CAST, src, dst), np.zeros(N, ref.dtype), x)
        np.testing.assert_array_equal(res, ref, err_msg=f"CAST {src} -> {dst} of {x}")


SAME_SIZE = [
    (a, b)
    for group in (
        [dtypes.int8, dtypes.uint8],
        [dtypes.int16, dtypes.uint16, dtypes.float16],
        [dtypes.int32, dtypes.uint32, dtypes.float32],
        [dtypes.int64, dtypes.uint64, dtypes.float64],
    )
    for a in group
    for b in group
    if a != b
]


@pytest.mark.parametrize(("src", "dst"), SAME_SIZE, ids=[f"{a.name}-{b.name}" for a, b in SAME_SIZE])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_bitcast_matches_numpy_view(src: DType, dst: DType, data: st.DataObject) -> None:
    x = data.draw(values(src))
    if dtypes.is_float(src):  # a float value carries no NaN payload through the interpreter
        x = np.where(np.isnan(x), np.zeros_like(x), x)
    ref = x.view(to_numpy_dtype(dst))
    (res, _) = run(kernel(Ops.BITCAST, src, dst), np.zeros(N, ref.dtype), x)
    np.testing.assert_array_equal(res, ref)


def test_bitcast_between_a_scalar_and_a_vector() -> None:
    x = np.array([1.5, -2.25e-3], np.float32)
    out, inp = glob(0, dtypes.uint16, 4), glob(1, dtypes.float32, 2)
    r = rng(2)
    halves = UOp(Ops.BITCAST, dtypes.uint16.vec(2), (load(inp, r),))
    uops = program(
        r, *(store(out, r * 2 + k, UOp(Ops.GEP, dtypes.uint16, (halves,), arg=(k,))) for k in range(2)), end(r)
    )
    (res, _) = run(uops, np.zeros(4, np.uint16), x)
    np.testing.assert_array_equal(res, x.view(np.uint16))


def test_integer_to_float_rounds_once() -> None:
    # through a double, 2**60 + 2**36 + 1 would lose the +1 and then tie to even: 2**60; rounded once it is above
    # the halfway point and rounds up
    big = 2**60 + 2**36 + 1
    x = np.array([big, -big, 2**63 - 1, -(2**63)], np.int64)
    (res, _) = run(kernel_n(Ops.CAST, dtypes.int64, dtypes.float32, 4), np.zeros(4, np.float32), x)
    np.testing.assert_array_equal(res, x.astype(np.float32))
    assert float(res[0]) == 2.0**60 + 2.0**37


@functools.cache
def kernel_n(op: Ops, src: DType, dst: DType, n: int) -> PythonProgram:
    return compile_program(elementwise(op, dst, (src,), n))


def test_float_overflow_thresholds() -> None:
    f16, f32 = FLOAT_ROUNDERS[dtypes.float16], FLOAT_ROUNDERS[dtypes.float32]
    assert f16(65519.99) == 65504.0 and f16(65520.0) == math.inf and f16(-65520.0) == -math.inf
    assert f32(3.4028235677973362e38) == 3.4028234663852886e38 and f32(3.4028235677973366e38) == math.inf
    assert f16(2.0**-25) == 0.0 and f16(2.0**-25 * 1.01) == 2.0**-24  # subnormal rounding, ties to even
    assert math.copysign(1.0, f32(-1e-50)) == -1.0  # underflow keeps the sign


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(width=32), min_size=N, max_size=N))
def test_float32_to_bfloat16_matches_bit_rounding(vals: list[float]) -> None:
    x = np.array(vals, np.float32)
    (res, _) = run(kernel(Ops.CAST, dtypes.float32, dtypes.bfloat16), np.zeros(N, np.uint16), x)
    got = (res.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(got, bf16_round(x))


def test_float64_to_bfloat16_rounds_directly() -> None:
    # 1 + 2**-8 + 2**-40 is just above the halfway point between bfloat16 1.0 and 1.0078125; through float32 it would
    # become the halfway point itself and tie to 1.0
    x = np.array([1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-8, 3.0e38, 3.4e38], np.float64)
    (res, _) = run(kernel_n(Ops.CAST, dtypes.float64, dtypes.bfloat16, 4), np.zeros(4, np.uint16), x)
    got = (res.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(got, [1.0078125, 1.0, bf16_round(np.float32(3.0e38)), np.inf])


@pytest.mark.parametrize(
    ("dt", "x", "expected"),
    [
        (dtypes.fp8e4m3, 448.0, 448.0),
        (dtypes.fp8e4m3, 464.0, 448.0),  # halfway to the missing 480: ties to the even 448
        (dtypes.fp8e4m3, 470.0, math.nan),  # past it: e4m3 has no inf
        (dtypes.fp8e4m3, math.inf, math.nan),
        (dtypes.fp8e4m3, 2.0**-9, 2.0**-9),  # smallest subnormal
        (dtypes.fp8e4m3, 2.0**-10, 0.0),  # ties to even zero
        (dtypes.fp8e4m3, 0.3, 0.3125),
        (dtypes.fp8e5m2, 57344.0, 57344.0),
        (dtypes.fp8e5m2, 61440.0, math.inf),  # halfway, ties to the even 65536, which overflows
        (dtypes.fp8e5m2, 2.0**-16, 2.0**-16),
        (dtypes.fp8e5m2, -0.3, -0.3125),
    ],
)
def test_float8_rounding_known_values(dt: DType, x: float, expected: float) -> None:
    # float32 -> fp8 -> float32 through memory, as a kernel
    out, inp = glob(0, dtypes.float32, 1), glob(1, dtypes.float32, 1)
    tmp = glob(2, dt, 1)
    zero = const(dtypes.int32, 0)
    first = store(tmp, zero, load(inp, zero).cast(dt))
    back = UOp(Ops.LOAD, dt, (UOp(Ops.INDEX, tmp.dtype, (tmp, zero)), UOp(Ops.BARRIER, dtypes.void, (first,))))
    uops = program(first, back.src[1], store(out, zero, back.cast(dtypes.float32)))
    (res, _, _) = run(uops, np.zeros(1, np.float32), np.array([x], np.float32), np.zeros(1, np.uint8))
    np.testing.assert_array_equal(res, np.array([expected], np.float32))


@pytest.mark.parametrize("dt", [dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.bfloat16], ids=lambda d: d.name)
def test_every_encoding_of_narrow_floats_decodes_and_encodes_back(dt: DType) -> None:
    storage = np.uint8 if dt.itemsize == 1 else np.uint16
    codes = np.arange(256 if dt.itemsize == 1 else 65536).astype(storage)
    vals = decode(dt, codes.tobytes())
    again = np.frombuffer(encode(dt, vals), storage)
    finite = [i for i, v in enumerate(vals) if not math.isnan(v)]
    np.testing.assert_array_equal(again[finite], codes[finite])
    assert all(FLOAT_ROUNDERS[dt](v) == v for v in vals if not math.isnan(v))  # every value is a fixed point
