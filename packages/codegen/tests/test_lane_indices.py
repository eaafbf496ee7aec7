"""The indices of a view's vector lanes from one symbolic expression (`lowerer.lane_offsets`): where the index is
affine in the lane variables every lane is one shared base plus a constant offset, elsewhere the expression with the
lane's constants substituted; either way every lane's index and validity equal what numpy's movement ops give for
that element. Reference: a numpy array of flat buffer positions moved by the same ops, -1 marking padding."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import event, example, given, settings
from hypothesis import strategies as st_

from lazygrad_codegen.lowerer import lane_offsets
from lazygrad_codegen.vectors import split_offset
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.uop import UOp, eval_uop
from lazygrad_uop.views import ShapeTracker


def _apply(op: tuple, arr: np.ndarray, tracker: ShapeTracker) -> tuple[np.ndarray, ShapeTracker]:
    """One movement op on the numpy reference and on the tracker."""
    kind, arg = op
    if kind == "permute":
        return arr.transpose(arg), tracker.permute(arg)
    if kind == "flip":
        return np.flip(arr, [d for d, f in enumerate(arg) if f]), tracker.flip(arg)
    if kind == "pad":
        return np.pad(arr, arg, constant_values=-1), tracker.pad(arg)
    if kind == "shrink":
        return arr[tuple(slice(b, e) for b, e in arg)], tracker.shrink(arg)
    if kind == "expand":
        return np.broadcast_to(arr, arg), tracker.expand(arg)
    return arr.reshape(arg), tracker.reshape(arg)


@st_.composite
def moved_views(draw: st_.DrawFn) -> tuple[np.ndarray, ShapeTracker]:
    """A small buffer moved by a random chain of movement ops: (reference array, tracker)."""
    shape = tuple(draw(st_.lists(st_.integers(1, 4), min_size=1, max_size=3)))
    arr = np.arange(int(np.prod(shape))).reshape(shape)
    tracker = ShapeTracker.from_shape(shape)
    for _ in range(draw(st_.integers(0, 4))):
        s = arr.shape
        kind = draw(st_.sampled_from(["permute", "flip", "pad", "shrink", "expand", "reshape"]))
        if kind == "permute":
            arg: object = tuple(draw(st_.permutations(range(len(s)))))
        elif kind == "flip":
            arg = tuple(draw(st_.lists(st_.booleans(), min_size=len(s), max_size=len(s))))
        elif kind == "pad":
            arg = tuple((draw(st_.integers(0, 2)), draw(st_.integers(0, 2))) for _ in s)
        elif kind == "shrink":
            arg = tuple((b, draw(st_.integers(b + 1, n))) for n in s for b in [draw(st_.integers(0, n - 1))])
        elif kind == "expand":
            if 1 not in s:
                continue
            arg = tuple(draw(st_.integers(1, 3)) if n == 1 else n for n in s)
        else:
            # regroup the elements: split the total into up to three factors
            total, dims = int(np.prod(s)), []
            for _ in range(draw(st_.integers(0, 2))):
                factors = [f for f in range(2, total + 1) if total % f == 0]
                if not factors:
                    break
                f = draw(st_.sampled_from(factors))
                dims.append(f)
                total //= f
            arg = (*dims, total)
        if int(np.prod(arr.shape)) > 200:
            break
        arr, tracker = _apply((kind, arg), arr, tracker)
    return arr, tracker


def _lanes(arr: np.ndarray, tracker: ShapeTracker, lane_dims: list[int]):
    """lane_offsets of `tracker` with `lane_dims` as lane variables and the other dims as loop variables: (the
    result, the loop variables, the coordinates of the lanes)."""
    shape = arr.shape
    variables = {d: UOp.variable(f"lane:{d}", 0, shape[d] - 1) for d in lane_dims}
    loops = {d: UOp.variable(f"i{d}", 0, shape[d] - 1) for d in range(len(shape)) if d not in variables}
    idxs = [variables.get(d, loops.get(d)) for d in range(len(shape))]
    coords = [dict(zip(lane_dims, c, strict=True)) for c in itertools.product(*(range(shape[d]) for d in lane_dims))]
    return lane_offsets(*tracker.to_indexed_uops(idxs), variables, coords), loops, coords


def _check_against_numpy(arr: np.ndarray, out, loops: dict, coords: list) -> None:
    """Every lane's index and validity, at every value of the loop variables, against the numpy reference."""
    assert len(out) == len(coords)
    for loop_values in itertools.product(*(range(arr.shape[d]) for d in loops)):
        env = dict(zip(loops.values(), loop_values, strict=True))
        at = dict(zip(loops, loop_values, strict=True))
        for coord, (idx, valid) in zip(coords, out, strict=True):
            expected = int(arr[tuple({**at, **coord}[d] for d in range(arr.ndim))])
            # (a lane variable left in either would make eval_uop fail: every lane is in its constants)
            assert bool(eval_uop(valid, env)) == (expected != -1)
            if expected != -1:
                assert eval_uop(idx, env) == expected


def _one_base(out) -> bool:
    return len({split_offset(idx)[0] for idx, _ in out}) == 1


@settings(max_examples=150, deadline=None)
@given(moved_views(), st_.data())
def test_lane_indices_match_numpy(view, data) -> None:
    arr, tracker = view
    lane_dims = data.draw(st_.lists(st_.sampled_from(range(arr.ndim)), min_size=1, max_size=arr.ndim, unique=True))
    out, loops, coords = _lanes(arr, tracker, lane_dims)
    event("lanes as one base plus offsets" if _one_base(out) else "lanes substituted one by one")
    _check_against_numpy(arr, out, loops, coords)


def test_contiguous_lanes_are_offsets() -> None:
    arr = np.arange(4 * 8).reshape(4, 8)
    out, _, _ = _lanes(arr, ShapeTracker.from_shape((4, 8)), [1])
    assert _one_base(out)
    assert [split_offset(idx)[1] for idx, _ in out] == list(range(8))


def test_padding_validity_per_lane() -> None:
    # a padded dim as lanes: the validity reads the lane, and each lane gets its own (folded) validity
    arr = np.pad(np.arange(6).reshape(2, 3), ((0, 0), (1, 1)), constant_values=-1)
    out, loops, coords = _lanes(arr, ShapeTracker.from_shape((2, 3)).pad(((0, 0), (1, 1))), [1])
    assert _one_base(out)
    assert [bool(eval_uop(valid, {loops[0]: 0})) for _, valid in out] == [x != -1 for x in arr[0]]
    _check_against_numpy(arr, out, loops, coords)


def test_lanes_under_a_modulo_are_substituted() -> None:
    # a lane folded with a loop into one dim of a reshape: (loop * 3 + lane) % 4 is no base plus offset, so each
    # lane gets the expression with its constant in place of the variable
    tracker = ShapeTracker.from_shape((4, 3)).permute((1, 0)).reshape((12,)).reshape((4, 3))
    arr = np.arange(12).reshape(4, 3).T.reshape(4, 3)
    out, loops, coords = _lanes(arr, tracker, [1])
    assert not _one_base(out)
    _check_against_numpy(arr, out, loops, coords)


@settings(max_examples=200, deadline=None)
@given(st_.integers(-(2**31), 2**31 - 1), st_.integers(1, 64), st_.integers(-(2**40), 2**40), st_.integers(0, 2**40))
@example(c=2**31 - 1, scale=3, outer=0, big=7)  # b + c overflows int32: left whole
@example(c=5, scale=2, outer=-9, big=2**33)
def test_widened_sums_split_into_base_and_offset(c: int, scale: int, outer: int, big: int) -> None:
    # a 64-bit index a + cast(b + c), b an int32 expression (a lane's offset in a tile): the constant comes out where
    # b + c can't overflow, and then base + offset is the index for every value of the variables
    x, y = UOp.variable("x", 0, 7), UOp.variable("y", 0, 3)
    b = x * scale
    idx = (y.cast(dtypes.long) * big + outer) + (b + c).cast(dtypes.long)
    base, offset = split_offset(idx)
    fits = b.vmax + c <= 2**31 - 1
    assert offset == (c if fits else 0)
    for xv, yv in itertools.product(range(8), range(4)):
        env = {x: xv, y: yv}
        want = yv * big + outer + xv * scale + c
        if fits:
            assert (eval_uop(base, env) if base is not None else 0) + offset == want
