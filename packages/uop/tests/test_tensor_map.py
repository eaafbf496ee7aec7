"""`TensorMap`, a tensor as Hopper's tensor memory accelerator copies boxes of it: the driver's rules it checks, and
where each element comes from (against numpy's strided view of the same buffer) and lands (against the swizzle written
out bit by bit)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lazygrad_uop.device import TensorMap
from lazygrad_uop.dtype import dtypes

OK = TensorMap(dtypes.float16, 0, (4096, 512), (1, 4096), (64, 128))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"dims": (4097, 512), "strides": (1, 4097)}, "multiple of 16 bytes"),
        ({"box": (128, 128)}, "at most the swizzle"),
        ({"box": (4, 128)}, "multiple of 16"),
        ({"box": (64, 512)}, "box extent"),
        ({"strides": (2, 4096)}, "contiguous"),
        ({"offset": 3}, "offset"),
        ({"swizzle": 16}, "swizzle"),
        ({"dims": (8,) * 6, "strides": (1,) + (8,) * 5, "box": (8,) * 6}, "1 to 5 dims"),
        ({"dims": (0, 512)}, "positive"),
    ],
)
def test_maps_the_driver_would_refuse_raise(change: dict, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        dataclasses.replace(OK, **change)


@settings(max_examples=60, deadline=None)
@given(
    dims=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    pads=st.lists(st.integers(0, 2), min_size=3, max_size=3),
    offset=st.integers(0, 3),
    coords=st.lists(st.integers(-3, 12), min_size=3, max_size=3),
)
def test_elements_are_numpys_strided_view(dims: list[int], pads: list[int], offset: int, coords: list[int]) -> None:
    # float32 rows padded to 16 bytes: the strides a map allows
    item, strides, step = 4, [1], 1
    for d, pad in zip(dims[:-1], pads, strict=False):
        step = -(-(step * d) // 4) * 4 + 4 * pad
        strides.append(step)
    span = offset * 4 + sum((d - 1) * s for d, s in zip(dims, strides, strict=True)) + 1
    buf = np.arange(span, dtype=np.float32)
    view = np.lib.stride_tricks.as_strided(
        buf[offset * 4 :], shape=dims[::-1], strides=[s * item for s in strides[::-1]]
    )
    m = TensorMap(dtypes.float32, offset * 4, tuple(dims), tuple(strides), tuple([4, *[1] * (len(dims) - 1)]), 0)
    c = coords[: len(dims)]
    inside = all(0 <= x < d for x, d in zip(c, dims, strict=True))
    got = m.element(c)
    assert (got is None) == (not inside)
    if inside:
        assert buf[got] == view[tuple(c[::-1])]


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_boxes_land_row_major_with_their_rows_swizzled(swizzle: int) -> None:
    # a box of 16-bit elements, rows `swizzle` bytes wide (16 unswizzled), from byte 1024 of local memory
    width = (swizzle or 16) // 2
    m = TensorMap(dtypes.float16, 0, (width, 64), (1, width), (width, 16), swizzle)
    for position in range(width * 16):
        byte = 1024 + 2 * position
        line, unit = byte // 128, (byte // 16) % 8
        moved = unit ^ (line % (swizzle // 16)) if swizzle else unit
        assert m.destination(1024, position) == (byte // 128) * 128 + moved * 16 + byte % 16
    assert m.box_bytes == width * 16 * 2
