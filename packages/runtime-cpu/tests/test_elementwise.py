"""Elementwise kernels on the CPU device against numpy: every dtype, ALU op semantics (C division, NaN-propagating
max, transcendental functions), casts and bitcasts."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad_testkit.dtypes import ALL_INTS, bf16_bits, bf16_value
from lazygrad_uop.dtype import DType, dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops

N = 37  # not a multiple of any vector width, so the vectorised loops' remainders run too
RNG = np.random.default_rng(1234)

INT_DTYPES = ALL_INTS
FLOAT_DTYPES = [dtypes.float16, dtypes.float32, dtypes.float64]


def _values(dtype: DType, n: int = N, nonzero: bool = False) -> np.ndarray:
    npdt = to_numpy_dtype(dtype)
    if dtypes.is_bool(dtype):
        return RNG.integers(0, 2, n).astype(np.bool_)
    if dtypes.is_float(dtype):
        return (RNG.standard_normal(n) * 4).astype(npdt)
    info = np.iinfo(npdt)
    lo, hi = max(int(info.min), -100), min(int(info.max), 100)
    x = RNG.integers(lo, hi + 1, n).astype(npdt)
    if nonzero:
        x[x == 0] = 1
    return x


def _binary(k, op: Ops, dtype: DType, out_dtype: DType | None = None):
    st = k.st(N)
    a, b = k.load(1, dtype, st), k.load(2, dtype, st)
    return k.sink(k.store(0, a.alu(op, b), st))


@pytest.mark.parametrize("dtype", INT_DTYPES + FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MUL, Ops.MAX], ids=str)
def test_arithmetic(run, k, dtype: DType, op: Ops) -> None:
    a, b = _values(dtype), _values(dtype)
    out = run(_binary(k, op, dtype), {1: a, 2: b})[0]
    ref = {Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum}[op](a, b)
    if dtypes.is_float(dtype):
        np.testing.assert_allclose(out, ref, rtol=1e-3 if dtype == dtypes.float16 else 1e-6)
    else:
        np.testing.assert_array_equal(out, ref)  # wrapping arithmetic, as numpy's


@pytest.mark.parametrize("dtype", INT_DTYPES + FLOAT_DTYPES + [dtypes.bool], ids=str)
@pytest.mark.parametrize("op", [Ops.CMPLT, Ops.CMPNE], ids=str)
def test_comparisons(run, k, dtype: DType, op: Ops) -> None:
    a, b = _values(dtype), _values(dtype)
    b[::3] = a[::3]  # some equal pairs
    st = k.st(N)
    ast = k.sink(k.store(0, k.load(1, dtype, st).alu(op, k.load(2, dtype, st)), st))
    out = run(ast, {1: a, 2: b})[0]
    np.testing.assert_array_equal(out, a < b if op is Ops.CMPLT else a != b)


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint32], ids=str)
def test_division_is_c_division(run, k, dtype: DType) -> None:
    a, b = _values(dtype), _values(dtype, nonzero=True)
    st = k.st(N)
    x, y = k.load(1, dtype, st), k.load(2, dtype, st)
    outs = run(k.sink(k.store(0, x.alu(Ops.IDIV, y), st), k.store(3, x.alu(Ops.MOD, y), st)), {1: a, 2: b})
    # C truncates toward zero and gives the remainder the dividend's sign
    q = (np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))) * np.sign(a.astype(np.int64) * b.astype(np.int64))
    np.testing.assert_array_equal(outs[0], q.astype(a.dtype))
    np.testing.assert_array_equal(outs[3], np.fmod(a, b))


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint32, dtypes.int8, dtypes.bool], ids=str)
def test_bitwise(run, k, dtype: DType) -> None:
    a, b = _values(dtype), _values(dtype)
    st = k.st(N)
    x, y = k.load(1, dtype, st), k.load(2, dtype, st)
    outs = run(k.sink(k.store(0, x & y, st), k.store(3, x | y, st), k.store(4, x ^ y, st)), {1: a, 2: b})
    np.testing.assert_array_equal(outs[0], a & b)
    np.testing.assert_array_equal(outs[3], a | b)
    np.testing.assert_array_equal(outs[4], a ^ b)


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint32, dtypes.int64], ids=str)
def test_shifts(run, k, dtype: DType) -> None:
    a = _values(dtype)
    st = k.st(N)
    x, s = k.load(1, dtype, st), k.const(3, dtype, st)
    outs = run(k.sink(k.store(0, x.alu(Ops.SHL, s), st), k.store(2, x.alu(Ops.SHR, s), st)), {1: a})
    np.testing.assert_array_equal(outs[0], a << 3)
    np.testing.assert_array_equal(outs[2], a >> 3)  # arithmetic for signed, logical for unsigned, as numpy


def test_where_and_neg(run, k) -> None:
    c, a, b = _values(dtypes.bool), _values(dtypes.float32), _values(dtypes.int32)
    st = k.st(N)
    cond, x, y = k.load(1, dtypes.bool, st), k.load(2, dtypes.float32, st), k.load(3, dtypes.int32, st)
    ast = k.sink(
        k.store(0, cond.where(x, x.alu(Ops.NEG)), st),
        k.store(4, cond.where(y.alu(Ops.NEG), y), st),
        k.store(5, cond.alu(Ops.NEG), st),
    )
    outs = run(ast, {1: c, 2: a, 3: b})
    np.testing.assert_array_equal(outs[0], np.where(c, a, -a))
    np.testing.assert_array_equal(outs[4], np.where(c, -b, b))
    np.testing.assert_array_equal(outs[5], ~c)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_unary_math(run, k, dtype: DType) -> None:
    a = np.abs(_values(dtype)) + np.asarray(0.5, dtype=to_numpy_dtype(dtype))
    st = k.st(N)
    x = k.load(1, dtype, st)
    ops = [Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC]
    outs = run(k.sink(*(k.store(i + 2, x.alu(op), st) for i, op in enumerate(ops))), {1: a})
    refs = [np.exp2(a), np.log2(a), np.sin(a), np.sqrt(a), np.reciprocal(a), np.trunc(a)]
    tol = 2e-3 if dtype == dtypes.float16 else 1e-6
    for i, ref in enumerate(refs):
        np.testing.assert_allclose(outs[i + 2], ref, rtol=tol, atol=tol, err_msg=str(ops[i]))


def test_mulacc(run, k) -> None:
    a, b, c = (_values(dtypes.float32) for _ in range(3))
    st = k.st(N)
    x, y, z = (k.load(i, dtypes.float32, st) for i in (1, 2, 3))
    out = run(k.sink(k.store(0, x.alu(Ops.MULACC, y, z), st)), {1: a, 2: b, 3: c})[0]
    np.testing.assert_allclose(out, a * b + c, rtol=1e-5)


def test_max_propagates_nan_like_numpy(run, k) -> None:
    a = np.array([np.nan, 1.0, np.nan, -np.inf, 0.0, 2.0], dtype=np.float32)
    b = np.array([1.0, np.nan, np.nan, np.nan, -1.0, np.inf], dtype=np.float32)
    st = k.st(6)
    out = run(
        k.sink(k.store(0, k.load(1, dtypes.float32, st).maximum(k.load(2, dtypes.float32, st)), st)), {1: a, 2: b}
    )
    np.testing.assert_array_equal(out[0], np.maximum(a, b))


def test_nan_comparisons(run, k) -> None:
    a = np.array([np.nan, 1.0, np.nan], dtype=np.float32)
    b = np.array([1.0, np.nan, np.nan], dtype=np.float32)
    st = k.st(3)
    x, y = k.load(1, dtypes.float32, st), k.load(2, dtypes.float32, st)
    outs = run(k.sink(k.store(0, x < y, st), k.store(3, x.ne(y), st)), {1: a, 2: b})
    np.testing.assert_array_equal(outs[0], a < b)
    np.testing.assert_array_equal(outs[3], a != b)


CASTS = [
    (dtypes.float32, dtypes.int32),
    (dtypes.float32, dtypes.int8),
    (dtypes.float64, dtypes.int64),
    (dtypes.float32, dtypes.uint8),
    (dtypes.int32, dtypes.float32),
    (dtypes.uint32, dtypes.float64),
    (dtypes.int64, dtypes.float16),
    (dtypes.int32, dtypes.int8),
    (dtypes.int8, dtypes.int32),
    (dtypes.uint8, dtypes.int64),
    (dtypes.int16, dtypes.uint16),
    (dtypes.uint64, dtypes.uint8),
    (dtypes.float32, dtypes.float16),
    (dtypes.float16, dtypes.float64),
    (dtypes.float64, dtypes.float32),
    (dtypes.int32, dtypes.bool),
    (dtypes.float32, dtypes.bool),
    (dtypes.bool, dtypes.float32),
    (dtypes.bool, dtypes.int64),
]


@pytest.mark.parametrize(("src", "dest"), CASTS, ids=str)
def test_cast(run, k, src: DType, dest: DType) -> None:
    a = _values(src)
    if dtypes.is_float(src) and dtypes.is_unsigned(dest):
        a = np.abs(a)  # a negative float to an unsigned int has no defined value in C
    if dtypes.is_float(src) and dtypes.is_bool(dest):
        a[:4] = [0.0, -0.0, np.nan, np.inf]
    st = k.st(N)
    out = run(k.sink(k.store(0, k.load(1, src, st).cast(dest), st)), {1: a})[0]
    np.testing.assert_array_equal(out, a.astype(to_numpy_dtype(dest)))


def test_bitcast(run, k) -> None:
    a = _values(dtypes.float32)
    st = k.st(N)
    x = k.load(1, dtypes.float32, st)
    outs = run(k.sink(k.store(0, x.bitcast(dtypes.int32), st), k.store(2, x.bitcast(dtypes.uint32), st)), {1: a})
    np.testing.assert_array_equal(outs[0], a.view(np.int32))
    np.testing.assert_array_equal(outs[2], a.view(np.uint32))


def test_bfloat16(run, k) -> None:
    a, b = _values(dtypes.float32), _values(dtypes.float32)
    abits, bbits = bf16_bits(a), bf16_bits(b)
    st = k.st(N)
    x, y = k.load(1, dtypes.bfloat16, st), k.load(2, dtypes.bfloat16, st)
    f = k.load(3, dtypes.float32, st)
    ast = k.sink(
        k.store(0, x + y, st),
        k.store(4, (x * y).cast(dtypes.float32), st),
        k.store(5, f.cast(dtypes.bfloat16), st),
        k.store(6, x < y, st),
        k.store(7, x.maximum(y), st),
    )
    outs = run(ast, {1: abits, 2: bbits, 3: a})
    fa, fb = bf16_value(abits), bf16_value(bbits)
    np.testing.assert_array_equal(outs[0], bf16_bits(fa + fb))
    np.testing.assert_array_equal(outs[4], bf16_value(bf16_bits(fa * fb)))
    np.testing.assert_array_equal(outs[5], abits)
    np.testing.assert_array_equal(outs[6], fa < fb)
    np.testing.assert_array_equal(outs[7], bf16_bits(np.maximum(fa, fb)))


def test_fp8_is_not_implemented(cpu, k) -> None:
    from lazygrad_codegen import get_program

    st = k.st(4)
    ast = k.sink(k.store(0, k.load(1, dtypes.fp8e4m3, st), st))
    with pytest.raises(NotImplementedError, match=r"float8|fp8"):
        get_program(ast, cpu.renderer)


def test_constants_of_every_dtype(run, k) -> None:
    st = k.st(3)
    cases = [
        (dtypes.int8, -128),
        (dtypes.uint8, 255),
        (dtypes.int32, -(2**31)),
        (dtypes.uint32, 2**32 - 1),
        (dtypes.int64, -(2**63)),
        (dtypes.uint64, 2**64 - 1),
        (dtypes.float16, 65504.0),
        (dtypes.float32, 0.1),
        (dtypes.float64, 0.1),
        (dtypes.float32, float("-inf")),
        (dtypes.bool, True),
    ]
    outs = run(k.sink(*(k.store(i, k.const(v, dt, st), st) for i, (dt, v) in enumerate(cases))), {})
    for i, (dt, v) in enumerate(cases):
        np.testing.assert_array_equal(outs[i], np.full(3, v, dtype=to_numpy_dtype(dt)), err_msg=str(dt))
