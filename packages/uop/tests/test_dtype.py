"""Dtypes: PyTorch's promotion (torch as the reference), lattice laws, numpy conversion and constant wrapping."""

from __future__ import annotations

import itertools
import math
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lazygrad_uop.dtype import (
    DType,
    DTypeError,
    PtrDType,
    dtypes,
    from_numpy_dtype,
    least_upper_dtype,
    least_upper_float,
    to_dtype,
    to_numpy_dtype,
)

ALL = list(dtypes.fields().values())
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64]
INTS += [dtypes.uint64]
NUMPY_NAMES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
NUMPY_NAMES += ["float16", "float32", "float64"]
NO_NUMPY = [dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2]
TORCH_NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
any_dtype = st.sampled_from(ALL)


# *** promotion ***


@pytest.mark.parametrize(("a", "b"), list(itertools.product(TORCH_NAMES, repeat=2)))
def test_promotion_matches_torch(a: str, b: str) -> None:
    torch = pytest.importorskip("torch")
    want = torch.promote_types(getattr(torch, a), getattr(torch, b))
    assert least_upper_dtype(to_dtype(a), to_dtype(b)) is to_dtype(str(want).removeprefix("torch."))


@pytest.mark.parametrize("d", ["uint16", "uint32", "uint64"])
@pytest.mark.parametrize("f", ["float16", "bfloat16", "float32", "float64"])
def test_promotion_of_wide_unsigned_with_floats_matches_torch(d: str, f: str) -> None:
    # torch promotes its uint16/32/64 only with floats
    torch = pytest.importorskip("torch")
    want = torch.promote_types(getattr(torch, d), getattr(torch, f))
    assert least_upper_dtype(to_dtype(d), to_dtype(f)) is to_dtype(str(want).removeprefix("torch."))


@given(any_dtype, any_dtype)
def test_promotion_commutative(a: DType, b: DType) -> None:
    assert least_upper_dtype(a, b) is least_upper_dtype(b, a)


@given(any_dtype, any_dtype, any_dtype)
def test_promotion_associative(a: DType, b: DType, c: DType) -> None:
    assert least_upper_dtype(least_upper_dtype(a, b), c) is least_upper_dtype(a, least_upper_dtype(b, c))


def test_promotion_associative_exhaustive() -> None:
    # small enough to check every triple; n-ary promotion must not depend on argument order either
    for a, b, c in itertools.product(ALL, repeat=3):
        j = least_upper_dtype(least_upper_dtype(a, b), c)
        assert j is least_upper_dtype(a, least_upper_dtype(b, c)), (a, b, c)
        assert all(least_upper_dtype(*p) is j for p in itertools.permutations((a, b, c))), (a, b, c)


@given(any_dtype, any_dtype)
def test_promotion_is_an_upper_bound_and_absorbs(a: DType, b: DType) -> None:
    j = least_upper_dtype(a, b)
    assert least_upper_dtype(a, j) is j and least_upper_dtype(b, j) is j
    assert least_upper_dtype(a, a) is a
    assert least_upper_dtype(dtypes.bool, a) is a and least_upper_dtype(a, dtypes.bool) is a


@given(any_dtype, st.integers(2, 8))
def test_promotion_of_vectors_uses_the_scalar(a: DType, n: int) -> None:
    assert least_upper_dtype(a.vec(n), dtypes.bool) is a


def test_promotion_errors() -> None:
    with pytest.raises(DTypeError, match="at least one"):
        least_upper_dtype()
    with pytest.raises(DTypeError, match="void"):
        least_upper_dtype(dtypes.void, dtypes.int32)
    with pytest.raises(DTypeError):
        least_upper_dtype(dtypes.float32.ptr(), dtypes.int32)


@pytest.mark.parametrize("d", ALL)
def test_least_upper_float(d: DType) -> None:
    want = d if d in (dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.float16, dtypes.bfloat16) else None
    want = want or (dtypes.float64 if d is dtypes.float64 else dtypes.float32)
    assert least_upper_float(d) is want


@pytest.mark.parametrize(
    "value", [True, 3, 2.5, [1, 2], [True, 1], [[1], [2.0]], [[True], [False]], [[1, 2], [3, 4.5]]]
)
def test_from_py_matches_torch_tensor(value) -> None:
    # torch picks the same kind; its default ints are int64 where lazygrad uses dtypes.default_int
    torch = pytest.importorskip("torch")
    want = {"torch.int64": dtypes.default_int, "torch.float32": dtypes.default_float, "torch.bool": dtypes.bool}
    assert dtypes.from_py(value) is want[str(torch.tensor(value).dtype)]


def test_from_py_rejects_other_types() -> None:
    with pytest.raises(DTypeError, match="str"):
        dtypes.from_py("1")


# *** numpy ***


@pytest.mark.parametrize("name", NUMPY_NAMES)
def test_numpy_round_trip(name: str) -> None:
    d = to_dtype(name)
    assert to_numpy_dtype(d) == np.dtype(name)
    assert to_numpy_dtype(d).itemsize == d.itemsize
    assert from_numpy_dtype(np.dtype(name)) is d
    assert from_numpy_dtype(to_numpy_dtype(d)) is d
    # anything numpy.dtype() accepts: the scalar type, its name, its type code
    assert from_numpy_dtype(np.dtype(name).type) is d
    assert from_numpy_dtype(name) is d
    assert from_numpy_dtype(np.dtype(name).str) is d


@pytest.mark.parametrize("d", NO_NUMPY)
def test_numpy_has_no_bfloat16_or_fp8(d: DType) -> None:
    with pytest.raises(DTypeError, match="float32"):
        to_numpy_dtype(d)
    with pytest.raises(DTypeError, match="no lazygrad equivalent"):
        from_numpy_dtype(d.name if d is dtypes.bfloat16 else "float8_e4m3fn")


def test_from_numpy_dtype_rejects_unsupported() -> None:
    for npdt in (np.complex64, np.dtype("U3"), "float128-nonsense"):
        with pytest.raises(DTypeError, match="supported: bool"):
            from_numpy_dtype(npdt)


# *** constants ***


@pytest.mark.parametrize("d", INTS)
def test_min_max_match_iinfo(d: DType) -> None:
    info = np.iinfo(to_numpy_dtype(d))
    assert dtypes.min(d) == info.min and dtypes.max(d) == info.max
    assert type(dtypes.min(d)) is int and type(dtypes.max(d)) is int


def test_min_max_bool_and_floats() -> None:
    assert dtypes.min(dtypes.bool) is False and dtypes.max(dtypes.bool) is True
    for d in (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64, dtypes.fp8e4m3):
        assert dtypes.min(d) == -math.inf and dtypes.max(d) == math.inf


@pytest.mark.parametrize("d", [dtypes.float16, dtypes.float32, dtypes.float64])
def test_finfo_bits_match_numpy(d: DType) -> None:
    info = np.finfo(to_numpy_dtype(d))
    assert dtypes.finfo(d) == (info.nexp, info.nmant)
    assert 1 + sum(dtypes.finfo(d)) == 8 * d.itemsize


def test_finfo_of_numpyless_floats_and_errors() -> None:
    # sign + exponent + mantissa fill the type; ml_dtypes' finfo would be the reference, not installed here
    assert dtypes.finfo(dtypes.bfloat16) == (8, 7)
    assert dtypes.finfo(dtypes.fp8e4m3) == (4, 3) and dtypes.finfo(dtypes.fp8e5m2) == (5, 2)
    with pytest.raises(DTypeError, match="not a floating-point"):
        dtypes.finfo(dtypes.int32)


@given(st.sampled_from(INTS), st.integers(-(2**70), 2**70))
def test_as_const_wraps_like_numpy(d: DType, v: int) -> None:
    want = np.array(v % 2**64, dtype=np.uint64).astype(to_numpy_dtype(d))  # numpy casts integers by wrapping
    got = dtypes.as_const(v, d)
    assert type(got) is int and got == int(want)


@given(st.sampled_from(INTS), st.booleans())
def test_as_const_of_bool_in_int_types(d: DType, v: bool) -> None:
    got = dtypes.as_const(v, d)
    assert type(got) is int and got == int(v)


@given(st.sampled_from([dtypes.float16, dtypes.float32, dtypes.float64]), st.floats(allow_nan=False, width=64))
def test_as_const_floats_round_like_numpy(d: DType, v: float) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow to inf is what we compare against
        want = float(np.array(v).astype(to_numpy_dtype(d)))
    got = dtypes.as_const(v, d)
    assert type(got) is float and got == want and math.copysign(1, got) == math.copysign(1, want)


@pytest.mark.parametrize("v", [0, 2, -1, 0.0, 0.5, math.nan, -math.inf])
def test_as_const_bool_like_numpy(v) -> None:
    assert dtypes.as_const(v, dtypes.bool) is bool(np.array(v).astype(np.bool_))


def test_as_const_vectors() -> None:
    assert dtypes.as_const((1, 300), dtypes.uint8.vec(2)) == (1, 44)
    with pytest.raises(DTypeError, match="needs 4 values"):
        dtypes.as_const((1, 2), dtypes.float32.vec(4))


# *** identity, vectors, pointers, pickling ***


@given(any_dtype, st.integers(1, 16))
def test_vec_is_interned(d: DType, n: int) -> None:
    v = d.vec(n)
    assert v is d.vec(n) and v is d.vec(count=n)
    assert v.count == n and v.scalar() is d and v.itemsize == n * d.itemsize
    assert (v is d) == (n == 1)


def test_vec_errors() -> None:
    with pytest.raises(DTypeError, match="vector of vector"):
        dtypes.float32.vec(4).vec(2)
    with pytest.raises(DTypeError, match="at least 1"):
        dtypes.float32.vec(0)


def test_ptr_identity() -> None:
    f = dtypes.float32
    assert f.ptr() is f.ptr(-1, False) and f.ptr(16) is f.ptr(size=16)
    assert f.ptr(local=True) is f.ptr(-1, True) and f.ptr(local=True) is not f.ptr()
    assert f.ptr(16) is not f.ptr(17)
    p = f.ptr(16)
    assert isinstance(p, PtrDType) and p.base is f and p.size == 16 and not p.local
    assert p.vec(4) is p.vec(count=4) and p.vec(4).vcount == 4 and p.vec(4).scalar() is p
    assert f.vec(4).ptr().base is f.vec(4)
    with pytest.raises(DTypeError, match="pointers to pointers"):
        p.ptr()
    with pytest.raises(DTypeError, match="vector pointer"):
        p.vec(4).vec(2)


def test_dtypes_compare_by_identity() -> None:
    assert dtypes.float32 == dtypes.float and dtypes.float32 != dtypes.int32
    assert len({dtypes.float32, dtypes.float, dtypes.float32.vec(1)}) == 1
    assert dtypes.float32.ptr() != dtypes.float32


@pytest.mark.parametrize(
    "d",
    [
        *ALL,
        dtypes.void,
        dtypes.float32.vec(4),
        dtypes.half.vec(8),
        dtypes.float32.ptr(),
        dtypes.int32.ptr(64, local=True),
        dtypes.float32.vec(4).ptr(10),
        dtypes.float32.ptr(32).vec(4),
    ],
    ids=repr,
)
def test_pickle_returns_the_same_object(d: DType) -> None:
    for proto in (2, pickle.HIGHEST_PROTOCOL):
        assert pickle.loads(pickle.dumps(d, proto)) is d


# *** names ***


@pytest.mark.parametrize(
    ("name", "d"),
    [
        ("float32", dtypes.float32),
        ("float", dtypes.float32),
        ("half", dtypes.float16),
        ("double", dtypes.float64),
        ("int", dtypes.int32),
        ("long", dtypes.int64),
        ("uchar", dtypes.uint8),
        ("bool", dtypes.bool),
        ("bfloat16", dtypes.bfloat16),
        ("fp8e5m2", dtypes.fp8e5m2),
    ],
)
def test_to_dtype_names(name: str, d: DType) -> None:
    assert to_dtype(name) is d and to_dtype(d) is d


def test_every_field_name_resolves_to_itself() -> None:
    for name, d in dtypes.fields().items():
        assert to_dtype(name) is d
        assert d.count == 1 and d.scalar() is d


@pytest.mark.parametrize("bad", ["float31", "fields", "min", "__class__", ""])
def test_to_dtype_unknown_name_lists_known(bad: str) -> None:
    with pytest.raises(DTypeError, match="unknown dtype") as e:
        to_dtype(bad)
    assert "float32" in str(e.value) and "int8" in str(e.value)


def test_repr() -> None:
    assert repr(dtypes.float32) == "dtypes.float" and repr(dtypes.float32.vec(4)) == "dtypes.float.vec(4)"
    assert repr(dtypes.float32.ptr(16, local=True)) == "dtypes.float.ptr(16, local=True)"


def test_predicates() -> None:
    assert all(dtypes.is_int(d) and not dtypes.is_float(d) for d in INTS)
    assert [d for d in INTS if dtypes.is_unsigned(d)] == [d for d in INTS if dtypes.min(d) == 0]
    assert dtypes.is_float(dtypes.bfloat16.vec(2)) and dtypes.is_bool(dtypes.bool.vec(4))
    assert not dtypes.is_int(dtypes.bool) and not dtypes.is_float(dtypes.void)
