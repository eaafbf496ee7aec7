"""Index arithmetic past 2^31 on every device, through views (expand, reshape, shrink) of small buffers rather than
multi-GiB allocations, and sums of lazy constants of 2^31 and more elements, which fold exactly; numpy (with int64
index arithmetic) is the reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lazygrad import Tensor
from lazygrad_uop.dtype import dtypes

N = 2**31


@pytest.mark.parametrize("n", [N - 1, N, N + 16, 10**12])
def test_sum_of_ones_is_exact(device: str, n: int) -> None:
    assert Tensor.ones(n, device=device).sum().item() == np.float32(n)


def test_sum_of_a_broadcast_row_past_int32(device: str) -> None:
    a = np.array([1.0, -0.5, 3.0], np.float32)
    got = Tensor(a, device=device).reshape(3, 1).expand(3, N + 3).sum(1).numpy()
    np.testing.assert_array_equal(got, (a.astype(np.float64) * (N + 3)).astype(np.float32))


def _periodic(device: str, period: int, length: int) -> Tensor:
    """A view of `length` elements of a `period`-element uint8 buffer repeated: element i is i % period."""
    base = Tensor(np.arange(period, dtype=np.uint8), device=device)
    return base.reshape(1, period).expand(-(-length // period), period).reshape(-1).shrink(((0, length),))


@given(start=st.integers(N - 40, N + 40), count=st.integers(1, 24), period=st.sampled_from([3, 16, 255]))
def test_reads_around_2_31_through_views(start: int, count: int, period: int) -> None:
    for device in ("CPU", "PYTHON"):
        got = _periodic(device, period, N + 64).shrink(((start, start + count),)).numpy()
        np.testing.assert_array_equal(got, (np.arange(start, start + count, dtype=np.int64) % period).astype(np.uint8))


def test_element_2_31_plus_15_of_a_long_view(device: str) -> None:
    t = _periodic(device, 16, N + 16)
    assert t[N + 15].item() == 15
    assert t[N - 1].item() == 15
    np.testing.assert_array_equal(t[N - 2 :].numpy(), np.array([14, 15, *range(16)], np.uint8))


def test_offsets_past_int32_in_int64_arithmetic(device: str) -> None:
    # a 2-D view whose row stride times row index passes int32: the flat offset of row 2^20, column 2^11 + 5
    rows, cols = 2**20 + 2, 2**11 + 8
    t = _periodic(device, 251, rows * cols).reshape(rows, cols)
    r, c = 2**20, 2**11 + 5
    assert r * cols + c > N
    assert t[r, c].item() == (r * cols + c) % 251
    np.testing.assert_array_equal(t[r:, c].numpy(), (np.arange(r, rows) * cols + c) % 251)


def test_int64_values_stay_exact(device: str) -> None:
    got = Tensor.full((4,), 2**40 + 3, dtype=dtypes.int64, device=device).sum().item()
    assert got == 4 * (2**40 + 3)
