"""Integer `//` and `%` on tensors never crash and match numpy on every device, a zero divisor and MIN // -1
included, also under `where` (which computes both branches)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lazygrad import Tensor

INT_DTYPES = [np.int8, np.int32, np.int64, np.uint8, np.uint32]


def _edge_pairs(npdt: type) -> tuple[np.ndarray, np.ndarray]:
    info = np.iinfo(npdt)
    values = [v for v in (info.min, info.min + 1, -9, -1, 0, 1, 4, 9, info.max) if info.min <= v <= info.max]
    a = np.array([x for x in values for _ in values], npdt)
    b = np.array([y for _ in values for y in values], npdt)
    return a, b


@pytest.mark.parametrize("npdt", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_floordiv_and_mod_match_numpy(device: str, npdt: type) -> None:
    a, b = _edge_pairs(npdt)
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    with np.errstate(divide="ignore", over="ignore"):
        np.testing.assert_array_equal((ta // tb).numpy(), a // b)
        np.testing.assert_array_equal((ta % tb).numpy(), a % b)


def test_where_guard_with_zero_divisor(device: str) -> None:
    a = np.array([7, -7, 5, -(2**31)], np.int32)
    b = np.array([0, 2, 0, -1], np.int32)
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    got = (tb != 0).where(ta // tb, 0).numpy()
    with np.errstate(divide="ignore", over="ignore"):
        np.testing.assert_array_equal(got, np.where(b != 0, a // b, 0))


@given(st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(-3, 3)), min_size=1, max_size=16))
def test_int32_divmod_property(pairs: list[tuple[int, int]]) -> None:
    a = np.array([p[0] for p in pairs], np.int32)
    b = np.array([p[1] for p in pairs], np.int32)
    ta, tb = Tensor(a, device="CPU"), Tensor(b, device="CPU")
    with np.errstate(divide="ignore", over="ignore"):
        np.testing.assert_array_equal((ta // tb).numpy(), a // b)
        np.testing.assert_array_equal((ta % tb).numpy(), a % b)


def test_division_by_a_lazy_zero_constant(device: str) -> None:
    a = np.array([5, -7, 0, -(2**31)], np.int32)
    ta = Tensor(a, device=device)
    zeros = Tensor.zeros(4, dtype=ta.dtype, device=device)
    np.testing.assert_array_equal((ta // zeros).numpy(), np.zeros(4, np.int32))
    np.testing.assert_array_equal((ta % zeros).numpy(), np.zeros(4, np.int32))
    np.testing.assert_array_equal((ta // -1).numpy(), np.array([-5, 7, 0, -(2**31)], np.int32))
