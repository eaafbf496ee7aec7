"""Every ALU op on every dtype, run as an elementwise kernel on random values and checked against numpy computing in
the same dtype (integers wrap, float32 and float16 round at every op, C truncating division and remainder)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyinterp_helpers import bf16_round, compile_program, elementwise, run

from lazygrad_python import PythonProgram
from lazygrad_testkit.dtypes import ALL_INTS
from lazygrad_uop import DType, Ops, dtypes
from lazygrad_uop.dtype import to_numpy_dtype

N = 24
INTS = ALL_INTS
FLOATS = [dtypes.float16, dtypes.float32, dtypes.float64]


def _tdiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = [int(Fraction(int(x), int(y))) for x, y in zip(a, b, strict=True)]  # int() of a Fraction truncates toward 0
    return np.array([v & 0xFFFFFFFFFFFFFFFF for v in q], dtype=np.uint64).astype(a.dtype)


def _in_f64(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """`fn` computed in float64 and rounded once to the operands' dtype."""

    def ref(*xs: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(*(x.astype(np.float64) for x in xs)).astype(xs[0].dtype)

    return ref


BINARY: dict[Ops, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    Ops.ADD: lambda a, b: a + b,
    Ops.MUL: lambda a, b: a * b,
    Ops.IDIV: _tdiv,
    Ops.MOD: np.fmod,
    Ops.MAX: np.maximum,
    Ops.CMPLT: np.less,
    Ops.CMPNE: np.not_equal,
    Ops.AND: np.bitwise_and,
    Ops.OR: np.bitwise_or,
    Ops.XOR: np.bitwise_xor,
    Ops.SHL: np.left_shift,
    Ops.SHR: np.right_shift,
}
UNARY: dict[Ops, Callable[[np.ndarray], np.ndarray]] = {
    Ops.NEG: lambda a: ~a if a.dtype == np.bool_ else np.negative(a),
    Ops.TRUNC: lambda a: a if a.dtype.kind in "biu" else np.trunc(a),
    Ops.SQRT: _in_f64(np.sqrt),
    Ops.RECIP: _in_f64(lambda a: 1.0 / a),
    Ops.EXP2: _in_f64(np.exp2),
    Ops.LOG2: _in_f64(np.log2),
    Ops.SIN: _in_f64(np.sin),
}
TERNARY: dict[Ops, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    Ops.WHERE: np.where,
    # one rounding for floats, like a fused multiply-add of operands narrower than a double
    Ops.MULACC: lambda a, b, c: _in_f64(lambda *x: x[0] * x[1] + x[2])(a, b, c) if a.dtype.kind == "f" else a * b + c,
}
# transcendental functions: libm and numpy may differ in the last bit of a double
APPROX = {Ops.EXP2, Ops.LOG2, Ops.SIN}

OPS_FOR = {
    "int": [
        *(Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL),
        *(Ops.SHR, Ops.NEG, Ops.TRUNC, Ops.WHERE, Ops.MULACC),
    ],
    "float": [
        *(Ops.ADD, Ops.MUL, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.NEG, Ops.TRUNC, Ops.SQRT, Ops.RECIP),
        *(Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.WHERE, Ops.MULACC),
    ],
    "bool": [Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.NEG, Ops.WHERE],
}
ALL = [*INTS, *FLOATS, dtypes.bool]


def kind(dt: DType) -> str:
    return "float" if dtypes.is_float(dt) else "int" if dtypes.is_int(dt) else "bool"


def values(dt: DType) -> st.SearchStrategy[np.ndarray]:
    """N random values of `dt`, edge values included."""
    if dtypes.is_float(dt):
        # drawn as doubles and rounded to the dtype by numpy: hypothesis filters too much for narrow widths
        specials = st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, math.inf, -math.inf, math.nan])
        elem = st.one_of(st.floats(), st.floats(-4, 4), specials)
    elif dtypes.is_int(dt):
        lo, hi = dtypes.min(dt), dtypes.max(dt)
        elem = st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, lo + 1, hi - 1]), st.integers(max(lo, -3), 3))
    else:
        elem = st.booleans()
    return st.lists(elem, min_size=N, max_size=N).map(lambda v: _array(v, dt))


def _array(v: list[object], dt: DType) -> np.ndarray:
    with np.errstate(over="ignore"):  # doubles beyond float16/float32 become inf, as intended
        return np.array(v, dtype=to_numpy_dtype(dt))


def operand_dtypes(op: Ops, dt: DType) -> tuple[DType, ...]:
    if op in TERNARY:
        return (dtypes.bool, dt, dt) if op is Ops.WHERE else (dt, dt, dt)
    return (dt, dt) if op in BINARY else (dt,)


@functools.cache
def kernel(op: Ops, dt: DType) -> PythonProgram:
    out = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dt
    return compile_program(elementwise(op, out, operand_dtypes(op, dt), N))


def fix_operands(op: Ops, dt: DType, xs: list[np.ndarray]) -> list[np.ndarray]:
    """Operands moved into the range where the op is defined (C leaves the rest undefined)."""
    if op in (Ops.IDIV, Ops.MOD) and dtypes.is_int(dt):
        xs[1] = np.where(xs[1] == 0, np.ones_like(xs[1]), xs[1])
        if not dtypes.is_unsigned(dt):  # INT_MIN / -1 overflows
            xs[0] = np.where((xs[0] == dtypes.min(dt)) & (xs[1] == -1), np.zeros_like(xs[0]), xs[0])
    if op in (Ops.SHL, Ops.SHR):
        xs[1] = (xs[1].astype(np.int64) % (8 * dt.itemsize)).astype(xs[1].dtype)
    return xs


@pytest.mark.parametrize("dt", ALL, ids=lambda dt: dt.name)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_alu_matches_numpy(dt: DType, data: st.DataObject) -> None:
    # one draw of operands serves every op of the dtype, which keeps the example count affordable
    operands, cond = [data.draw(values(dt)) for _ in range(3)], data.draw(values(dtypes.bool))
    for op in OPS_FOR[kind(dt)]:
        arity = len(operand_dtypes(op, dt))
        xs = fix_operands(op, dt, [cond, *operands[:2]] if op is Ops.WHERE else operands[:arity])
        ref_fn = BINARY.get(op) or UNARY.get(op) or TERNARY[op]
        with np.errstate(all="ignore"):
            ref = np.asarray(ref_fn(*xs))
        (res, *_) = run(kernel(op, dt), np.zeros(N, ref.dtype), *xs)
        msg = f"{op} on {dt} of {xs}"
        if op in APPROX:
            eps = float(np.finfo(res.dtype).eps)
            np.testing.assert_allclose(res, ref, rtol=2 * eps, atol=2 * eps, equal_nan=True, err_msg=msg)
        else:
            np.testing.assert_array_equal(res, ref, err_msg=msg)


@pytest.mark.parametrize(
    ("op", "x", "expected"),
    [
        (Ops.LOG2, 0.0, -math.inf),
        (Ops.LOG2, -0.0, -math.inf),
        (Ops.LOG2, -1.0, math.nan),
        (Ops.LOG2, math.inf, math.inf),
        (Ops.RECIP, 0.0, math.inf),
        (Ops.RECIP, -0.0, -math.inf),
        (Ops.SQRT, -1.0, math.nan),
        (Ops.SQRT, -0.0, -0.0),
        (Ops.EXP2, 200.0, math.inf),
        (Ops.EXP2, -math.inf, 0.0),
        (Ops.SIN, math.inf, math.nan),
        (Ops.EXP2, 128.0, math.inf),  # finite in a double, overflows float32
    ],
)
def test_ieee_special_results_in_float32(op: Ops, x: float, expected: float) -> None:
    (res, _) = run(kernel_1(op), np.zeros(1, np.float32), np.array([x], np.float32))
    np.testing.assert_array_equal(res, np.array([expected], np.float32))
    assert math.copysign(1.0, float(res[0])) == math.copysign(1.0, expected)


@functools.cache
def kernel_1(op: Ops) -> PythonProgram:
    return compile_program(elementwise(op, dtypes.float32, (dtypes.float32,), 1))


def test_max_propagates_nan_from_either_side() -> None:
    a = np.array([math.nan, 1.0, math.nan, -math.inf], np.float32)
    b = np.array([1.0, math.nan, math.nan, -math.inf], np.float32)
    (res, _, _) = run(elementwise(Ops.MAX, dtypes.float32, (dtypes.float32,) * 2, 4), np.zeros(4, np.float32), a, b)
    np.testing.assert_array_equal(res, np.maximum(a, b))


def test_integer_division_by_zero_gives_zero_rather_than_failing() -> None:
    # a // b under WHERE(b != 0, ...) computes the division for every thread: it must not raise
    a, b = np.array([7, -7, 5], np.int32), np.array([0, 2, 0], np.int32)
    (q, _, _) = run(elementwise(Ops.IDIV, dtypes.int32, (dtypes.int32,) * 2, 3), np.zeros(3, np.int32), a, b)
    (m, _, _) = run(elementwise(Ops.MOD, dtypes.int32, (dtypes.int32,) * 2, 3), np.zeros(3, np.int32), a, b)
    np.testing.assert_array_equal(q, [0, -3, 0])
    np.testing.assert_array_equal(m, [0, -1, 0])


def test_out_of_range_shifts_follow_numpy() -> None:
    a, b = np.array([1, -8, 5, -5], np.int32), np.array([32, 40, -1, 33], np.int32)
    (left, _, _) = run(elementwise(Ops.SHL, dtypes.int32, (dtypes.int32,) * 2, 4), np.zeros(4, np.int32), a, b)
    (right, _, _) = run(elementwise(Ops.SHR, dtypes.int32, (dtypes.int32,) * 2, 4), np.zeros(4, np.int32), a, b)
    np.testing.assert_array_equal(left, [0, 0, 0, 0])
    np.testing.assert_array_equal(right, [0, -1, 0, -1])


@pytest.mark.parametrize(
    ("ctr", "key", "out"),
    [  # known-answer vectors of Threefry-2x32-20 from the Random123 distribution (kat_vectors)
        ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
        ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
    ],
)
def test_threefry_known_answers(ctr: tuple[int, int], key: tuple[int, int], out: tuple[int, int]) -> None:
    def pack(words: tuple[int, int]) -> np.ndarray:
        return np.array([words[0] | (words[1] << 32)], np.uint64)

    prg = elementwise(Ops.THREEFRY, dtypes.uint64, (dtypes.uint64,) * 2, 1)
    (res, _, _) = run(prg, np.zeros(1, np.uint64), pack(ctr), pack(key))
    assert int(res[0]) == int(pack(out)[0])


BF16_OPS: dict[Ops, Callable[..., np.ndarray]] = {
    Ops.ADD: lambda a, b: a + b,
    Ops.MUL: lambda a, b: a * b,
    Ops.MAX: np.maximum,
    Ops.SQRT: np.sqrt,
    Ops.RECIP: lambda a: 1.0 / a,
}


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    return (bf16_round(x).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("op", list(BF16_OPS), ids=lambda op: op.name)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_bfloat16_ops_round_once(op: Ops, data: st.DataObject) -> None:
    arity = 2 if op in BINARY else 1
    floats = st.lists(st.floats(width=32, allow_nan=False), min_size=N, max_size=N)
    xs = [bf16_round(np.array(data.draw(floats), np.float32)) for _ in range(arity)]
    with np.errstate(all="ignore"):
        ref = bf16_round(BF16_OPS[op](*(x.astype(np.float64) for x in xs)).astype(np.float32))
    bits = [_bf16_bits(x) for x in xs]
    (res, *_) = run(elementwise(op, dtypes.bfloat16, (dtypes.bfloat16,) * arity, N), np.zeros(N, np.uint16), *bits)
    got = (res.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(got, ref)
