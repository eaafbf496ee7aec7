"""`SharedMatrix`: the PTX ISA's canonical layouts of a wgmma operand in shared memory, against addresses written out
by hand from the ISA's definitions, and properties every swizzled layout must have (a bijection onto its bytes, and
the 8 rows an instruction reads at one K in 8 different 16-byte bank groups); `TensorCore.shared_operands`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lazygrad_uop.device import SharedMatrix, TensorCore, swizzled
from lazygrad_uop.dtype import dtypes


def test_k_major_128_byte_swizzle_by_hand() -> None:
    m = SharedMatrix("k", 16, 1024, 128)
    # row 0: no swizzle; halves 0..7 are the first 16 bytes, half 8 the next 16
    assert [m.address(0, 0, k, 2) for k in (0, 7, 8)] == [0, 14, 16]
    # row 1 (128 bytes on): its 16-byte units XORed with 1, so K 0 is at byte 128 + 16 and K 8 at 128 + 0
    assert m.address(0, 1, 0, 2) == 144 and m.address(0, 1, 8, 2) == 128
    # row 7: unit u at u ^ 7; row 8 starts the next 8-row group, SBO bytes on, unswizzled again
    assert m.address(0, 7, 0, 2) == 7 * 128 + 7 * 16 and m.address(0, 8, 0, 2) == 1024
    # a start 32 bytes into the row (the third K step of 16 halves) reads the same swizzled bytes as K + 16 from 0
    for mn in range(16):
        for k in range(16):
            assert m.address(32, mn, k, 2) == m.address(0, mn, k + 16, 2)


def test_mn_major_128_byte_swizzle_by_hand() -> None:
    m = SharedMatrix("mn", 8192, 1024, 128)
    # 64 halves of MN per 128-byte row; K rows 128 bytes apart, 8 of them an atom; the next 8 K rows SBO on; the
    # next 64 of MN LBO on
    assert m.address(0, 5, 0, 2) == 10
    assert m.address(0, 0, 1, 2) == 128 + 16  # row 1's first unit moves to unit 1
    assert m.address(0, 0, 8, 2) == 1024 and m.address(0, 64, 0, 2) == 8192
    assert m.address(0, 64 + 9, 3, 2) == 8192 + 3 * 128 + ((1 ^ 3) * 16) + 2


def test_unswizzled_layouts_by_hand() -> None:
    k_major = SharedMatrix("k", 256, 128, 0)
    # core matrices of 8 rows x 16 bytes: K's next 8 halves LBO on, MN's next 8 rows SBO on
    assert k_major.address(0, 3, 5, 2) == 3 * 16 + 10
    assert k_major.address(0, 3, 13, 2) == 256 + 3 * 16 + 10 and k_major.address(0, 11, 0, 2) == 128 + 3 * 16
    mn_major = SharedMatrix("mn", 128, 512, 0)
    assert mn_major.address(0, 3, 5, 2) == 5 * 16 + 6
    assert mn_major.address(0, 11, 5, 2) == 512 + 5 * 16 + 6 and mn_major.address(0, 3, 13, 2) == 128 + 5 * 16 + 6


@given(st.sampled_from([32, 64, 128]), st.integers(0, 15))
def test_swizzle_is_a_bijection_within_each_1024_bytes(swizzle: int, block: int) -> None:
    base = block * 1024
    moved = [swizzled(base + a, swizzle) for a in range(1024)]
    assert sorted(moved) == list(range(base, base + 1024))
    # bytes stay inside their 16-byte unit
    assert all((m ^ (base + a)) & 15 == 0 for a, m in enumerate(moved))


@given(st.sampled_from([32, 64, 128]), st.integers(0, 63))
def test_eight_rows_at_one_k_meet_no_bank_twice(swizzle: int, k: int) -> None:
    # K-major with rows as long as the swizzle: the 8 rows of a core matrix read at one K (16 bytes each) fall in the
    # 8 distinct 16-byte units of a 128-byte bank line (rows of 32 or 64 bytes share a line, the XOR the rest)
    m = SharedMatrix("k", 16, 8 * swizzle, swizzle)
    k %= swizzle // 2
    units = {(m.address(0, row, k, 2) % 128) // 16 for row in range(8)}
    assert len(units) == 8


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="K-major"):
        SharedMatrix("row", 16, 1024)
    with pytest.raises(ValueError, match="swizzle"):
        SharedMatrix("k", 16, 1024, 96)
    with pytest.raises(ValueError, match="multiples of 16"):
        SharedMatrix("k", 8, 1024)


def test_shared_operand_cores_describe_c_alone() -> None:
    c = (("n1", "n2", "m0", "m1", "m2", "m4", "m5"), ("n0", "m3", "n3", "n4", "n5"))
    tc = TensorCore((64, 64, 16), 128, (0, 0, 32), dtypes.half, dtypes.float, swizzle=((), (), c), shared_operands=True)
    assert str(tc) == "WGMMA_64_64_16_half_float"
    with pytest.raises(ValueError, match="layout_A must be"):
        TensorCore((64, 64, 16), 128, (8, 0, 32), dtypes.half, dtypes.float, swizzle=((), (), c), shared_operands=True)
    with pytest.raises(ValueError, match="layout_C"):
        TensorCore(
            (64, 64, 16),
            128,
            (0, 0, 32),
            dtypes.half,
            dtypes.float,
            swizzle=((), (), (c[0], c[1][:-1])),
            shared_operands=True,
        )
