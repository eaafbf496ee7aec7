"""Shape views against numpy: random chains of movement ops must map every element exactly as numpy's reshape,
transpose, broadcast_to, pad, slicing and flip do, masks included; plus merging, simplification, sizes, strides
and argument errors."""

from __future__ import annotations

import importlib.util
import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazygrad_uop.dtype import dtypes
from lazygrad_uop.uop import UOp, eval_uop
from lazygrad_uop.views import ShapeTracker, View, linear_strides, strides_for_shape

# keeps per-element evaluation with eval_uop fast enough for hundreds of chains
MAX_ELEMENTS = 360
PAD = -1  # np.arange never produces it, so it marks padding in the reference

HAS_SYMBOLIC = importlib.util.find_spec("lazygrad_uop.symbolic") is not None

Op = tuple[str, Any]


# *** the reference: the same ops on numpy arrays of buffer positions ***


def np_apply(arr: np.ndarray, op: Op) -> np.ndarray:
    name, arg = op
    if name == "reshape":
        return arr.reshape(arg)
    if name == "permute":
        return arr.transpose(arg)
    if name == "expand":
        return np.broadcast_to(arr, arg)
    if name == "pad":
        return np.pad(arr, arg, constant_values=PAD) if arr.ndim else arr
    if name == "shrink":
        return arr[tuple(slice(b, e) for b, e in arg)]
    if name == "flip":
        axes = tuple(d for d, f in enumerate(arg) if f)
        return np.flip(arr, axes) if axes else arr
    raise AssertionError(name)


def st_apply(tracker: ShapeTracker, op: Op) -> ShapeTracker:
    return getattr(tracker, op[0])(op[1])


def run_chain(shape: tuple[int, ...], ops: list[Op]) -> tuple[ShapeTracker, np.ndarray]:
    tracker, ref = ShapeTracker.from_shape(shape), np.arange(math.prod(shape)).reshape(shape)
    for op in ops:
        tracker, ref = st_apply(tracker, op), np_apply(ref, op)
        assert tracker.shape == ref.shape
    return tracker, ref


def mapping(tracker: ShapeTracker, simplify: bool = False) -> np.ndarray:
    """The buffer index each element reads, PAD where invalid, computed by evaluating the tracker's UOps."""
    idxs = [UOp.range(s, d) for d, s in enumerate(tracker.shape)]
    idx, valid = tracker.to_indexed_uops(idxs, simplify=simplify)
    # one expression: PAD exactly where invalid (a valid index is never negative, so a wrong one can't hide)
    read = valid.where(idx, PAD)
    out = np.empty(tracker.shape, dtype=np.int64)
    for coord in itertools.product(*(range(s) for s in tracker.shape)):
        out[coord] = eval_uop(read, dict(zip(idxs, coord, strict=True)))
    return out


def assert_canonical(view: View) -> None:
    """The invariants View.create promises."""
    assert len(view.strides) == len(view.shape)
    for s, stride in zip(view.shape, view.strides, strict=True):
        if s == 1:
            assert stride == 0
    if 0 in view.shape:
        assert view.strides == (0,) * len(view.shape) and view.offset == 0 and view.mask is None
    if view.mask is not None:
        assert len(view.mask) == len(view.shape)
        assert any((b, e) != (0, s) for (b, e), s in zip(view.mask, view.shape, strict=True))
        if view.empty:
            assert view.mask == ((0, 0),) * len(view.shape) and view.offset == 0
        else:
            assert all(0 <= b < e <= s for (b, e), s in zip(view.mask, view.shape, strict=True))
    plain = view.offset == 0 and view.mask is None and view.strides == strides_for_shape(view.shape)
    assert view.contiguous == (plain or 0 in view.shape)


# *** random chains ***


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def dim_sizes(hi: int) -> st.SearchStrategy[int]:
    """Sizes 0..hi, with 0 rare: a zero anywhere empties the whole tensor and ends the interesting part of a chain."""
    # hypothesis favours the ends of a range, so the rare zero sits in the middle of it
    return st.integers(0, 10 * hi).map(lambda x: 0 if x == 5 * hi else x % hi + 1)


@st.composite
def reshape_target(draw: st.DrawFn, size: int) -> tuple[int, ...]:
    if size == 0:
        dims = draw(st.lists(dim_sizes(6), min_size=1, max_size=4))
        dims[draw(st.integers(0, len(dims) - 1))] = 0
        return tuple(dims)
    factors = draw(st.permutations(_prime_factors(size)))
    rank = draw(st.integers(1 if factors else 0, 4))
    dims = [1] * rank
    for f in factors:
        dims[draw(st.integers(0, rank - 1))] *= f
    for _ in range(draw(st.integers(0, 2))):
        dims.insert(draw(st.integers(0, len(dims))), 1)
    return tuple(dims)


@st.composite
def movement_op(draw: st.DrawFn, shape: tuple[int, ...]) -> Op:
    size, rank = math.prod(shape), len(shape)
    name = draw(st.sampled_from(["reshape", "permute", "expand", "pad", "shrink", "flip", "reshape"]))
    if name == "reshape":
        return name, draw(reshape_target(size))
    if name == "permute":
        return name, tuple(draw(st.permutations(range(rank))))
    if name == "expand":
        new = tuple(draw(dim_sizes(4)) if s == 1 else s for s in shape)
        return name, new if math.prod(new) <= MAX_ELEMENTS else shape
    if name == "pad":
        arg = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in shape)
        grown = math.prod(s + b + a for s, (b, a) in zip(shape, arg, strict=True))
        return name, arg if grown <= MAX_ELEMENTS else tuple((0, 0) for _ in shape)
    if name == "shrink":
        arg = []
        for s in shape:
            b = draw(st.integers(0, max(0, s - 1)))
            e = draw(st.integers(min(b + 1, s), s))
            # now and then an empty range, which makes the whole view empty
            arg.append((b, b if draw(st.integers(0, 15)) == 7 else e))
        return name, tuple(arg)
    return name, tuple(draw(st.booleans()) for _ in shape)


@st.composite
def chains(draw: st.DrawFn, min_ops: int = 1, max_ops: int = 8) -> tuple[tuple[int, ...], list[Op]]:
    dims: list[int] = []
    # rank 0 is rare for the same reason: a scalar has few interesting chains
    for _ in range(draw(st.integers(0, 10).map(lambda x: 0 if x == 5 else x % 5 + 1))):
        dims.append(draw(dim_sizes(max(1, min(6, MAX_ELEMENTS // max(1, math.prod(dims)))))))
    shape = tuple(dims)
    ops, cur = [], shape
    for _ in range(draw(st.integers(min_ops, max_ops))):
        op = draw(movement_op(cur))
        ops.append(op)
        cur = np_apply(np.empty(cur), op).shape
    return shape, ops


PROPERTY = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(chains())
def test_chain_matches_numpy(chain: tuple[tuple[int, ...], list[Op]]) -> None:
    """Every element maps to numpy's buffer position (or padding); simplify keeps that; sizes and strides agree."""
    shape, ops = chain
    tracker, ref = run_chain(shape, ops)
    for view in tracker.views:
        assert_canonical(view)
    np.testing.assert_array_equal(mapping(tracker), ref)

    simple = tracker.simplify()
    assert len(simple.views) <= len(tracker.views) and simple.shape == tracker.shape
    if len(simple.views) < len(tracker.views):
        np.testing.assert_array_equal(mapping(simple), ref)

    valid = ref != PAD
    needed = int(ref[valid].max()) + 1 if valid.any() else 0
    if len(simple.views) == 1:
        assert tracker.real_size() == needed
    else:
        assert tracker.real_size() >= needed

    check_real_strides(tracker, ref)


def check_real_strides(tracker: ShapeTracker, ref: np.ndarray, simplify: bool = False) -> None:
    """A stride the tracker reports must be the step numpy shows between neighbours along that dim."""
    for ignore_valid in (False, True):
        for d, stride in enumerate(tracker.real_strides(ignore_valid, simplify)):
            if stride is None or ref.shape[d] < 2:
                continue
            lo = ref.take(range(ref.shape[d] - 1), axis=d)
            hi = ref.take(range(1, ref.shape[d]), axis=d)
            both = (lo != PAD) & (hi != PAD)
            assert np.all((hi - lo)[both] == stride), (d, stride)
            if not ignore_valid:
                assert np.array_equal(lo == PAD, hi == PAD), f"dim {d} decides validity but has stride {stride}"
    assert tracker.unit_stride_axes() == [d for d, s in enumerate(tracker.real_strides()) if s == 1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains(min_ops=2), st.data())
def test_compose_matches_whole_chain(chain: tuple[tuple[int, ...], list[Op]], data: st.DataObject) -> None:
    """`st1 + st2`, with st2 built on st1's shape, maps like applying both halves of the chain to one tracker."""
    shape, ops = chain
    k = data.draw(st.integers(1, len(ops) - 1))
    first, ref_first = run_chain(shape, ops[:k])
    second, _ = run_chain(first.shape, ops[k:])
    _, ref = run_chain(shape, ops)
    np.testing.assert_array_equal(mapping(first + second), ref)
    assert ref_first.size == first.size


@pytest.mark.skipif(not HAS_SYMBOLIC, reason="lazygrad_uop.symbolic is not there yet")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_chain_matches_numpy_simplified(chain: tuple[tuple[int, ...], list[Op]]) -> None:
    """The symbolic engine's rewrite of the index and validity still maps every element like numpy."""
    shape, ops = chain
    tracker, ref = run_chain(shape, ops)
    np.testing.assert_array_equal(mapping(tracker, simplify=True), ref)
    check_real_strides(tracker, ref, simplify=True)


# *** merging: what must stay one view, and what can't ***


def test_permute_permute_is_one_view() -> None:
    t = ShapeTracker.from_shape((2, 3, 4)).permute((2, 0, 1)).permute((1, 2, 0))
    assert t.views == (View.create((2, 3, 4)),) and t.contiguous
    t = ShapeTracker.from_shape((2, 3, 4)).permute((1, 0, 2)).permute((2, 0, 1))
    assert len(t.views) == 1 and t.shape == (4, 3, 2) and t.views[0].strides == (1, 4, 12)


def test_pad_then_matching_shrink_is_the_original() -> None:
    t = ShapeTracker.from_shape((3, 5)).pad(((1, 2), (0, 3))).shrink(((1, 4), (0, 5)))
    assert t.views == (View.create((3, 5)),) and t.contiguous


def test_shrink_then_pad_keeps_one_masked_view() -> None:
    t = ShapeTracker.from_shape((4, 5)).shrink(((1, 3), (2, 5))).pad(((1, 1), (2, 0)))
    assert len(t.views) == 1
    assert t.views[0].mask == ((1, 3), (2, 5)) and t.views[0].offset == 0


def test_reshape_of_contiguous_is_one_contiguous_view() -> None:
    t = ShapeTracker.from_shape((2, 3, 4)).reshape((4, 6)).reshape((1, 24, 1)).reshape((2, 12))
    assert t.views == (View.create((2, 12)),)


def test_reshape_splitting_and_merging_strided_dims_stays_one_view() -> None:
    t = ShapeTracker.from_shape((4, 6)).permute((1, 0)).reshape((2, 3, 2, 2))
    assert len(t.views) == 1 and t.views[0].strides == (3, 1, 12, 6)
    t = ShapeTracker.from_shape((4, 6)).shrink(((0, 4), (0, 3))).reshape((2, 2, 3))
    assert len(t.views) == 1 and t.views[0].strides == (12, 6, 1)


def test_reshape_after_transpose_needs_two_views() -> None:
    t = ShapeTracker.from_shape((2, 3)).permute((1, 0)).reshape((6,))
    assert len(t.views) == 2
    np.testing.assert_array_equal(mapping(t), np.arange(6).reshape(2, 3).T.reshape(6))
    assert len(t.simplify().views) == 2


def test_reshape_back_folds_the_stacked_view() -> None:
    t = ShapeTracker.from_shape((2, 3)).permute((1, 0)).reshape((6,)).reshape((3, 2))
    assert len(t.views) == 1 and t.views[0].strides == (1, 3)


def test_masked_reshapes() -> None:
    # padding a whole row lines up with the new dims: one view
    t = ShapeTracker.from_shape((4,)).pad(((0, 4),)).reshape((2, 4))
    assert len(t.views) == 1 and t.views[0].mask == ((0, 1), (0, 4))
    # padding one element at each end is not a box in (2, 3): two views
    t = ShapeTracker.from_shape((4,)).pad(((1, 1),)).reshape((2, 3))
    assert len(t.views) == 2
    np.testing.assert_array_equal(mapping(t), np.pad(np.arange(4), (1, 1), constant_values=PAD).reshape(2, 3))


def test_expand_then_reshape() -> None:
    t = ShapeTracker.from_shape((1, 3)).expand((4, 3))
    assert len(t.reshape((4, 3, 1)).views) == 1
    assert len(t.reshape((12,)).views) == 2


def test_simplify_merges_views_that_compose_to_one() -> None:
    # a transpose read through a transposed layout is the plain layout again
    stacked = ShapeTracker((View.create((2, 3)).permute((1, 0)), View.create((3, 2)).permute((1, 0))))
    assert stacked.simplify().views == (View.create((2, 3)),)
    np.testing.assert_array_equal(mapping(stacked), np.arange(6).reshape(2, 3))
    # a shrink and a flip of a transposed layout stay one (masked, strided) view
    outer = View.create((3, 2)).shrink(((1, 3), (0, 2))).flip((True, False)).pad(((1, 0), (0, 0)))
    stacked = ShapeTracker((View.create((2, 3)).permute((1, 0)), outer))
    merged = stacked.simplify()
    assert len(merged.views) == 1
    np.testing.assert_array_equal(mapping(merged), mapping(stacked))
    # a transposed read of a transposed layout that doesn't line up stays two views
    stacked = ShapeTracker((View.create((2, 3)).permute((1, 0)), View.create((2, 3)).permute((1, 0))))
    assert len(stacked.simplify().views) == 2


def window_ops(lead: tuple[int, ...], ins: tuple[int, ...], k, s, d) -> list[Op]:
    """The movement ops of overlapping windows (the frontend's `_pool`): the input repeated, cut into rows that each
    start `d` further along it, then `o` windows of stride `s` per row; (*lead, *out, *k) at the end."""
    outs = [(n - dd * (kk - 1) - 1) // ss + 1 for n, kk, ss, dd in zip(ins, k, s, d, strict=True)]
    rows = [n * max(1, -(-(o * ss - dd) // n)) + dd for n, o, ss, dd in zip(ins, outs, s, d, strict=True)]
    reps = [-(-(kk * r) // n) for kk, r, n in zip(k, rows, ins, strict=True)]
    keep = tuple((0, v) for v in lead)
    nl = len(lead)
    return [
        ("reshape", (*lead, *(v for n in ins for v in (1, n)))),
        ("expand", (*lead, *(v for e, n in zip(reps, ins, strict=True) for v in (e, n)))),
        ("reshape", (*lead, *(e * n for e, n in zip(reps, ins, strict=True)))),
        ("shrink", keep + tuple((0, kk * r) for kk, r in zip(k, rows, strict=True))),
        ("reshape", (*lead, *(v for kk, r in zip(k, rows, strict=True) for v in (kk, r)))),
        ("shrink", keep + tuple(v for kk, o, ss in zip(k, outs, s, strict=True) for v in ((0, kk), (0, o * ss)))),
        ("reshape", (*lead, *(v for kk, o, ss in zip(k, outs, s, strict=True) for v in (kk, o, ss)))),
        ("shrink", keep + tuple(v for kk, o in zip(k, outs, strict=True) for v in ((0, kk), (0, o), (0, 1)))),
        ("reshape", (*lead, *(v for kk, o in zip(k, outs, strict=True) for v in (kk, o)))),
        ("permute", (*range(nl), *(nl + 2 * i + 1 for i in range(len(k))), *(nl + 2 * i for i in range(len(k))))),
    ]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_overlapping_windows_merge_to_one_view(data: st.DataObject) -> None:
    """Overlapping windows (kernel, stride, dilation) over a stored input, whose steps each move two dims of the
    repeated input at once, are one view with overlapping strides (`_merge_by_digits`); over a padded input they
    stay two where padding lies under windows that overlap. Both map every element like numpy's windows."""
    nd = data.draw(st.integers(1, 2))
    lead = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    k = tuple(data.draw(st.integers(1, 3)) for _ in range(nd))
    s = tuple(data.draw(st.integers(1, 2)) for _ in range(nd))
    d = tuple(data.draw(st.integers(1, 2)) for _ in range(nd))
    ins = tuple(data.draw(st.integers(dd * (kk - 1) + 1, dd * (kk - 1) + 5)) for kk, dd in zip(k, d, strict=True))
    pads = tuple((data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1))) for _ in range(nd))
    padded = any(b or a for b, a in pads)
    base = tuple(n - b - a for n, (b, a) in zip(ins, pads, strict=True))
    if any(v < 1 for v in base) or math.prod((*lead, *ins)) * math.prod(k) > 4 * MAX_ELEMENTS:
        return
    ops: list[Op] = [("pad", (*((0, 0) for _ in lead), *pads))] if padded else []
    tracker, ref = run_chain((*lead, *base), ops + window_ops(lead, ins, k, s, d))
    # numpy's windows of the same (padded) input
    src = np.arange(math.prod((*lead, *base))).reshape(*lead, *base)
    src = np.pad(src, ((0, 0),) * len(lead) + pads, constant_values=PAD)
    win = np.lib.stride_tricks.sliding_window_view(
        src, tuple(dd * (kk - 1) + 1 for kk, dd in zip(k, d, strict=True)), axis=tuple(range(len(lead), len(lead) + nd))
    )
    win = win[(..., *(slice(None, None, ss) for ss in s), *(slice(None, None, dd) for dd in d))]
    np.testing.assert_array_equal(ref, win)
    simple = tracker.simplify()
    np.testing.assert_array_equal(mapping(simple), win)
    if not padded:
        assert len(simple.views) == 1, simple
    check_real_strides(tracker, ref)


def test_windows_of_a_stored_input_have_their_strides() -> None:
    """A 3x3 window (stride 1) of a stored (8, 10, 10, 4) channels-last input, read as (N, C, H, W): one view whose
    strides are the input's own, the windows overlapping (a step along the window and along the output move the
    same address)."""
    ops: list[Op] = [("permute", (0, 3, 1, 2)), *window_ops((8, 4), (10, 10), (3, 3), (1, 1), (1, 1))]
    tracker, _ = run_chain((8, 10, 10, 4), ops)
    (view,) = tracker.simplify().views
    assert view.shape == (8, 4, 8, 8, 3, 3) and view.strides == (400, 1, 40, 4, 40, 4) and view.mask is None


def test_windows_of_windows_simplify_to_one_view() -> None:
    """Windows of windows of a stored channels-last input (a stride-2 convolution's input gradient by phases: two
    taps, then two phases, of a padded output gradient), applied as movement nodes (`apply_movement`, as kernels
    read their leaves) stack views, which `simplify` merges into one that maps every element like numpy's windows."""
    from lazygrad_uop.ops import Ops
    from lazygrad_uop.tensor_graph import apply_movement

    names = {"reshape": Ops.RESHAPE, "expand": Ops.EXPAND, "permute": Ops.PERMUTE, "shrink": Ops.SHRINK}
    n, h, c = 2, 7, 4
    ops: list[Op] = [("permute", (0, 3, 1, 2)), *window_ops((n, c), (h, h), (2, 2), (1, 1), (1, 1))]
    # (n, c, 6, 6, 2, 2) -> the taps first, then windows of 2 over the 6 positions
    ops += [("permute", (0, 1, 4, 5, 2, 3)), *window_ops((n, c, 2, 2), (h - 1, h - 1), (2, 2), (1, 1), (1, 1))]
    _, ref = run_chain((n, h, h, c), ops)
    nodes = [UOp(names[op], dtypes.float32, (), arg) for op, arg in ops]
    moved = apply_movement(ShapeTracker.from_shape((n, h, h, c)), nodes)
    assert len(moved.views) > 2 and len(moved.simplify().views) == 1, moved
    np.testing.assert_array_equal(mapping(moved), ref)
    np.testing.assert_array_equal(mapping(moved.simplify()), ref)


def test_empty_and_zero_size_views_are_canonical() -> None:
    v = View.create((3, 4)).shrink(((1, 1), (0, 4)))
    assert v.shape == (0, 4) and v.strides == (0, 0) and v.mask is None and v.contiguous
    empty = View.create((2,)).pad(((0, 2),)).shrink(((2, 4),))
    assert empty.empty and empty.mask == ((0, 0),) and empty.strides == (0,) and empty.offset == 0
    assert View.create((3,), (1,), 0, ((2, 2),)) == View.create((3,), (7,), 5, ((1, 0),))
    # a rank-0 shape can't carry an empty mask, so reshaping to it stacks a view and still reads as padding
    t = ShapeTracker.from_shape((0,)).pad(((1, 0),)).reshape(())
    assert t.real_size() == 0
    _, valid = t.to_indexed_uops()
    assert eval_uop(valid) is False


def test_one_valid_coordinate_folds_into_the_offset() -> None:
    v = View.create((4, 5)).shrink(((2, 3), (0, 5))).pad(((1, 1), (0, 0)))
    assert v.strides == (0, 1) and v.offset == 10 and v.mask == ((1, 2), (0, 5))


# *** sizes, strides, reduce, variables ***


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([], 24),
        ([("shrink", ((0, 1), (1, 3), (1, 3)))], 2 * 4 + 2 + 1),
        ([("flip", (True, False, True)), ("shrink", ((0, 1), (0, 3), (0, 4)))], 24),
        ([("pad", ((1, 1), (0, 0), (2, 2)))], 24),
        ([("permute", (2, 0, 1)), ("reshape", (4, 6)), ("shrink", ((0, 1), (0, 6)))], 21),
        ([("shrink", ((0, 2), (0, 3), (0, 0)))], 0),
    ],
)
def test_real_size(ops: list[Op], expected: int) -> None:
    tracker, ref = run_chain((2, 3, 4), ops)
    assert tracker.real_size() == expected
    valid = ref != PAD
    assert expected == (int(ref[valid].max()) + 1 if valid.any() else 0)


def test_real_strides() -> None:
    base = ShapeTracker.from_shape((3, 4))
    assert base.real_strides() == (4, 1) and base.unit_stride_axes() == [1]
    assert base.permute((1, 0)).real_strides() == (1, 4)
    assert base.reshape((3, 4, 1)).expand((3, 4, 5)).real_strides() == (4, 1, 0)
    padded = base.pad(((0, 0), (1, 0)))
    assert padded.real_strides() == (4, None)
    assert padded.real_strides(ignore_valid=True) == (4, 1)
    assert base.flip((True, False)).real_strides() == (-4, 1)
    # two views: dims that pass through the unravel are not one constant stride
    stacked = base.permute((1, 0)).reshape((12,)).reshape((2, 6)).expand((2, 6)).reshape((2, 1, 6)).expand((2, 5, 6))
    assert len(stacked.views) == 2
    assert stacked.real_strides()[1] == 0


def test_linear_strides_reads_sums_of_scaled_indices() -> None:
    a, b, c = (UOp.range(4, d) for d in range(3))
    idx = a * 3 + b + a * 2 + 7 + (c // 2)
    valid = b < 3
    assert linear_strides(idx, valid, [a, b, c]) == (5, None, None)
    assert linear_strides(idx, valid, [a, b, c], ignore_valid=True) == (5, 1, None)


def test_reduce_and_size() -> None:
    t = ShapeTracker.from_shape((2, 3, 4))
    assert t.reduce((0, 2)) == (1, 3, 1) and t.size == 24
    assert View.create((2, 3)).size() == 6
    with pytest.raises(ValueError, match="reduce axes"):
        t.reduce((3,))


def test_symbolic_shapes_flow_through() -> None:
    n = UOp.variable("n", 1, 8)
    t = ShapeTracker.from_shape((n, 3))
    assert t.vars() == {n}
    assert t.views[0].strides == (3, 1)
    moved = t.permute((1, 0)).reshape((3, n, 1)).pad(((0, 0), (1, 0), (0, 0)))
    assert moved.vars() == {n}
    idxs = [UOp.range(s, d) for d, s in enumerate(moved.shape)]
    idx, valid = moved.to_indexed_uops(idxs)
    nv = 5
    ref = np.pad(np.arange(nv * 3).reshape(nv, 3).T.reshape(3, nv, 1), ((0, 0), (1, 0), (0, 0)), constant_values=PAD)
    for coord in itertools.product(*(range(s) for s in ref.shape)):
        env = {n: nv, **dict(zip(idxs, coord, strict=True))}
        got = eval_uop(idx, env) if eval_uop(valid, env) else PAD
        assert got == ref[coord]
    assert t.contiguous and t.reshape((n * 3,)).contiguous


@st.composite
def symbolic_reshapes(draw: st.DrawFn) -> tuple[int, list[int], int, tuple[int, ...], list[tuple[int, int]]]:
    """A shape of int dims and one symbolic dim (at `at`), a permutation, a shrink of the int dims, and the value the
    symbolic dim takes; the reshape afterwards keeps the symbolic dim whole and regroups the int dims around it."""
    ints = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    at = draw(st.integers(0, len(ints)))
    perm = tuple(draw(st.permutations(range(len(ints) + 1))))
    shrink = [(b, draw(st.integers(b + 1, s))) for s in ints for b in [draw(st.integers(0, s - 1))]]
    return at, ints, draw(st.integers(1, 5)), perm, shrink


@PROPERTY
@given(symbolic_reshapes(), st.data())
def test_reshape_around_a_symbolic_dim_matches_the_int_view(case, data: st.DataObject) -> None:
    """A view with a symbolic dim, permuted and shrunk, reshaped with the symbolic dim kept whole: it reads the
    same elements as the same ops on the int view where the variable has its value."""
    at, ints, value, perm, shrink = case
    n = UOp.variable("n", 1, 5)
    trackers = []
    for size in (n, value):
        shape = (*ints[:at], size, *ints[at:])
        arg = [*shrink[:at], (0, size), *shrink[at:]]
        trackers.append(ShapeTracker.from_shape(shape).shrink(tuple(arg)).permute(perm))
    sym, concrete = trackers
    # the int runs between (and around) the symbolic dim, each reshaped on its own, size-1 dims added anywhere
    pos = next(i for i, s in enumerate(sym.shape) if not isinstance(s, int))
    before, after = concrete.shape[:pos], concrete.shape[pos + 1 :]
    new_before = data.draw(reshape_target(math.prod(before))) if before else ()
    new_after = data.draw(reshape_target(math.prod(after))) if after else ()
    int_strides = all(isinstance(x, int) for x in sym.views[-1].strides)
    sym, concrete = sym.reshape((*new_before, n, *new_after)), concrete.reshape((*new_before, value, *new_after))
    assert sym.shape[len(new_before)] is n
    # with int strides the int dims regroup as in the int view, so no view is stacked that the int view doesn't
    # need (at value 1 the int view can merge more; symbolic strides, as in a contiguous view with the variable in
    # an inner dim, are not regrouped yet)
    if value > 1 and int_strides:
        assert len(sym.views) <= len(concrete.views), (sym, concrete)
    ref = mapping(concrete)
    idxs = [UOp.range(value if s is n else s, d) for d, s in enumerate(sym.shape)]
    idx, valid = sym.to_indexed_uops(idxs)
    for coord in itertools.product(*(range(s) for s in ref.shape)):
        env = {n: value, **dict(zip(idxs, coord, strict=True))}
        assert (eval_uop(idx, env) if eval_uop(valid, env) else PAD) == ref[coord], coord


# *** errors ***


@pytest.mark.parametrize(
    ("op", "arg", "match"),
    [
        ("permute", (0, 0, 1), "not a permutation"),
        ("permute", (0, 1), "not a permutation"),
        ("permute", (0, 1, 3), "not a permutation"),
        ("reshape", (5, 5), "can't reshape"),
        ("reshape", (-1, 24), "must be >= 0"),
        ("expand", (4, 3, 4), "only size-1 dims"),
        ("expand", (2, 3), "one entry per dim"),
        ("pad", ((0, 0), (-1, 0), (0, 0)), "must be >= 0"),
        ("pad", ((0, 0),), "one entry per dim"),
        ("pad", ((0, 0, 0), (0, 0), (0, 0)), "pairs"),
        ("shrink", ((0, 2), (0, 4), (0, 4)), "out of range"),
        ("shrink", ((1, 0), (0, 3), (0, 4)), "out of range"),
        ("shrink", ((0, 2), (0, 3)), "one entry per dim"),
        ("flip", (True, False), "one entry per dim"),
        ("flip", (1, 0, 0), "one bool per dim"),
    ],
)
def test_bad_arguments_raise(op: str, arg: Any, match: str) -> None:
    t = ShapeTracker.from_shape((2, 3, 4))
    with pytest.raises(ValueError, match=match):
        getattr(t, op)(arg)
    with pytest.raises(ValueError, match=match):
        getattr(t.views[0], op)(arg)


def test_bad_construction_raises() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        View.create((2, -3))
    with pytest.raises(ValueError, match="one entry per dim"):
        View.create((2, 3), strides=(1,))
    with pytest.raises(ValueError, match="one entry per dim"):
        View.create((2, 3), mask=((0, 1),))
    with pytest.raises(ValueError, match="at least one view"):
        ShapeTracker(())
    with pytest.raises(ValueError, match="one entry per dim"):
        ShapeTracker.from_shape((2, 3)).to_indexed_uops([UOp.range(2, 0)])
    with pytest.raises(ValueError, match="can't stack"):
        _ = ShapeTracker.from_shape((2, 3)) + ShapeTracker.from_shape((7,))


def test_index_dtype_follows_the_index_variables() -> None:
    i = UOp.range(6, 0, dtypes.int64)
    idx, valid = ShapeTracker.from_shape((6,)).flip((True,)).to_indexed_uops([i])
    assert idx.dtype == dtypes.int64 and valid.dtype == dtypes.bool
    assert [eval_uop(idx, {i: k}) for k in range(6)] == [5, 4, 3, 2, 1, 0]
