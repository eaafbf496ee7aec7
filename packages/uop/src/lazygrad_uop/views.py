"""Shape views: how a shape indexes a flat buffer, and how movement ops change that without touching data.

A `View` is an affine map from coordinates `c` in `shape` to a buffer index, `offset + sum(c[i] * strides[i])`,
with an optional `mask`: a box `[begin, end)` per dim outside which elements are invalid (they read the padding
value). Reshape, permute, expand, pad, shrink and flip each give a new View. One View can't express every chain
of them (a reshape of a transposed view, say), so a `ShapeTracker` stacks views: `views[-1]` maps the outer shape
onto the flat row-major index space of `views[-2].shape`, and so on down to `views[0]`, which maps into the
buffer. `ShapeTracker.to_indexed_uops` turns the stack into an `(index, valid)` pair of UOps.

Shapes, strides and offsets are `sint`: plain ints are the fast path; symbolic sizes (UOps) flow through the
operations that need no integer reasoning (contiguous reshapes, permute, expand, pad, shrink, flip, indexing),
and the merging rules that need exact arithmetic decline them by returning None, which is always correct.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp, eval_uop, sint

Mask = tuple[tuple[sint, sint], ...]


# *** sint helpers: ints stay ints, UOps get the graph nodes they need and no more ***


def _all_int(xs: Iterable[object]) -> bool:
    return all(isinstance(x, int) for x in xs)


def _is(x: sint, value: int) -> bool:
    """True when `x` is the int `value` (a symbolic size is never known to be)."""
    return isinstance(x, int) and x == value


def _same(a: sint, b: sint) -> bool:
    """True when two sizes are known equal: the same int, or the same symbolic node."""
    return a is b or (isinstance(a, int) and isinstance(b, int) and a == b)


def _full(b: sint, e: sint, s: sint) -> bool:
    """True when the interval [b, e) covers a whole dim of size s."""
    return _is(b, 0) and _same(e, s)


def _mul(a: sint, b: sint) -> sint:
    if _is(a, 1):
        return b
    if _is(b, 1):
        return a
    if _is(a, 0) or _is(b, 0):
        return 0
    return a * b


def _add(a: sint, b: sint) -> sint:
    if _is(a, 0):
        return b
    if _is(b, 0):
        return a
    return a + b


def span(b: sint, e: sint) -> sint:
    """The size of [b, e): an int whenever it folds to one, so (p, p + 1) at a symbolic p is a dim of size 1."""
    if _is(b, 0):
        return e
    if _all_int((b, e)):
        return e - b
    size = e - b
    folded = size.ssimplify()
    return folded if isinstance(folded, int) else size


def prod(xs: Iterable[sint]) -> sint:
    """The product of sizes: an int when all are ints, else a UOp."""
    out: sint = 1
    for x in xs:
        out = _mul(out, x)
    return out


def strides_for_shape(shape: Sequence[sint]) -> tuple[sint, ...]:
    """Row-major strides of a contiguous buffer of `shape`; size-1 dims get stride 0 (they never move)."""
    strides: list[sint] = []
    acc: sint = 1
    for s in reversed(shape):
        strides.append(0 if _is(s, 1) else acc)
        acc = _mul(acc, s)
    return tuple(reversed(strides))


def _check_shape(shape: Sequence[sint], what: str) -> tuple[sint, ...]:
    out = tuple(shape)
    for s in out:
        if isinstance(s, bool) or not isinstance(s, (int, UOp)):
            raise ValueError(f"{what}: dims must be ints or symbolic UOps, got {s!r} in {out}")
        if isinstance(s, int) and s < 0:
            raise ValueError(f"{what}: dims must be >= 0, got {out}")
    return out


def _check_arity(arg: Sequence[object], shape: tuple[sint, ...], what: str) -> None:
    if len(arg) != len(shape):
        raise ValueError(f"{what} needs one entry per dim ({len(shape)} for shape {shape}), got {len(arg)}: {arg}")


def _pairs(arg: Sequence[tuple[sint, sint]], shape: tuple[sint, ...], what: str) -> tuple[tuple[sint, sint], ...]:
    out = tuple(tuple(p) for p in arg)
    _check_arity(out, shape, what)
    if not all(len(p) == 2 and all(isinstance(x, (int, UOp)) and not isinstance(x, bool) for x in p) for p in out):
        raise ValueError(f"{what} takes (before, after) or (begin, end) pairs of ints per dim, got {arg}")
    return out  # type: ignore[return-value]


def _unravel(idx: UOp, shape: tuple[sint, ...]) -> list[UOp]:
    """Row-major coordinates in `shape` of a flat index. The outermost dim skips the modulo: valid indices are in
    range, and invalid ones may map anywhere since their validity is already false."""
    coords: list[UOp] = []
    place: sint = 1
    for d in range(len(shape) - 1, -1, -1):
        s = shape[d]
        if _is(s, 1):
            coords.append(idx.const_like(0))
            continue
        c = idx if _is(place, 1) else idx // place
        coords.append(c if d == 0 else c % s)
        place = _mul(place, s)
    return coords[::-1]


def _flat_interval_box(lo: int, hi: int, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """The smallest box of coordinates (inclusive bounds per dim) holding every flat index in [lo, hi] of `shape`."""
    digits_lo, digits_hi = [], []
    for s in reversed(shape):
        digits_lo.append(lo % s)
        digits_hi.append(hi % s)
        lo, hi = lo // s, hi // s
    digits_lo.reverse()
    digits_hi.reverse()
    box: list[tuple[int, int]] = []
    for d in range(len(shape)):
        box.append((digits_lo[d], digits_hi[d]))
        if digits_lo[d] != digits_hi[d]:
            # the first dim where the ends differ spans between them; every dim inside it wraps around fully
            box.extend((0, t - 1) for t in shape[d + 1 :])
            break
    return box


# *** View ***


@dataclass(frozen=True)
class View:
    """An affine map from `shape` to buffer indices with an optional validity box. Build with `View.create`."""

    shape: tuple[sint, ...]
    strides: tuple[sint, ...]
    offset: sint
    mask: Mask | None
    contiguous: bool

    @staticmethod
    def create(
        shape: Sequence[sint],
        strides: Sequence[sint] | None = None,
        offset: sint = 0,
        mask: Sequence[tuple[sint, sint]] | None = None,
    ) -> View:
        """A canonical view: size-1 dims have stride 0, a mask covering everything is None, a dim masked to one
        element has stride 0 (its contribution moves into the offset), and a view with no valid element has mask
        `((0, 0), ...)`, zero strides and offset 0. Views of zero elements have zero strides, offset 0, no mask."""
        shape = _check_shape(shape, "view shape")
        strides = strides_for_shape(shape) if strides is None else tuple(strides)
        _check_arity(strides, shape, "strides")
        n = len(shape)
        if any(_is(s, 0) for s in shape):
            return View(shape, (0,) * n, 0, None, True)
        strides = tuple(0 if _is(s, 1) else st for s, st in zip(shape, strides, strict=True))
        if mask is not None:
            _check_arity(mask, shape, "mask")
            mask = tuple((b, e) for b, e in mask)
            clamped: list[tuple[sint, sint]] = []
            for s, (b, e) in zip(shape, mask, strict=True):
                if _all_int((s, b, e)):
                    b, e = max(b, 0), min(e, s)
                    if b >= e:
                        return View(shape, (0,) * n, 0, ((0, 0),) * n, False)
                clamped.append((b, e))
            # one valid coordinate: its stride times that coordinate is a constant, so fold it into the offset
            new_strides = list(strides)
            for d, (b, e) in enumerate(clamped):
                if _all_int((b, e)) and e - b == 1 and not _is(strides[d], 0):
                    offset = _add(offset, _mul(b, strides[d]))
                    new_strides[d] = 0
            strides = tuple(new_strides)
            mask = None if all(_full(b, e, s) for (b, e), s in zip(clamped, shape, strict=True)) else tuple(clamped)
        contiguous = _is(offset, 0) and mask is None and strides == strides_for_shape(shape)
        return View(shape, strides, offset, mask, contiguous)

    def substitute(self, mapping: dict[UOp, UOp]) -> View:
        """This view with `mapping` applied to every symbolic size, stride, offset and mask bound (e.g. bound
        variables replaced by their variables, or by their values: sizes left without variables become ints); the
        structure, and so `contiguous`, stays as it is."""

        def sub(x: sint) -> sint:
            if not isinstance(x, UOp):
                return x
            y = x.substitute(mapping)
            # a size left without variables (bound variables replaced by their values) is an int again
            if not any(u.op in (Ops.DEFINE_VAR, Ops.BIND, Ops.RANGE, Ops.SPECIAL) for u in y.toposort):
                return int(eval_uop(y))
            return y

        mask = None if self.mask is None else tuple((sub(b), sub(e)) for b, e in self.mask)
        return View(tuple(map(sub, self.shape)), tuple(map(sub, self.strides)), sub(self.offset), mask, self.contiguous)

    @property
    def empty(self) -> bool:
        """True when no element is valid (every read is padding); a zero-size view is not `empty`, just small."""
        return self.mask is not None and any(_all_int((b, e)) and b >= e for b, e in self.mask)

    def size(self) -> int:
        """The number of elements of the shape (symbolic dims count at their largest value)."""
        out = 1
        for s in self.shape:
            out *= s if isinstance(s, int) else int(s.vmax)
        return out

    def _full_mask(self) -> Mask:
        return self.mask if self.mask is not None else tuple((0, s) for s in self.shape)

    # *** indexing ***

    def to_indexed_uops(self, idxs: Sequence[UOp], valid: UOp | None = None) -> tuple[UOp, UOp]:
        """The buffer index of the element at coordinates `idxs`, and whether it is valid (ANDed onto `valid`)."""
        _check_arity(idxs, self.shape, "to_indexed_uops idxs")
        return _view_indexed(self, tuple(idxs), valid)

    # *** movement ops ***

    def permute(self, order: Sequence[int]) -> View:
        """The view with dims reordered: new dim i is old dim order[i]."""
        order = tuple(order)
        if not _all_int(order) or sorted(order) != list(range(len(self.shape))):
            raise ValueError(
                f"permute order {order} is not a permutation of the {len(self.shape)} dims of {self.shape}"
            )
        mask = None if self.mask is None else tuple(self.mask[o] for o in order)
        return View.create(
            tuple(self.shape[o] for o in order), tuple(self.strides[o] for o in order), self.offset, mask
        )

    def expand(self, new_shape: Sequence[sint]) -> View:
        """The view with size-1 dims repeated to `new_shape` (stride 0); other dims must keep their size."""
        new_shape = _check_shape(new_shape, "expand")
        _check_arity(new_shape, self.shape, "expand shape")
        for s, ns in zip(self.shape, new_shape, strict=True):
            if not (_same(s, ns) or _is(s, 1)):
                raise ValueError(f"can't expand {self.shape} to {new_shape}: only size-1 dims can expand")
        if new_shape == self.shape:
            return self
        mask = None
        if self.mask is not None:
            # size-1 dims are either fully valid or the whole view is empty; both stay so when repeated
            mask = tuple(
                (b, ns if _is(s, 1) and not self.empty else e)
                for (b, e), s, ns in zip(self.mask, self.shape, new_shape, strict=True)
            )
        return View.create(new_shape, self.strides, self.offset, mask)

    def pad(self, arg: Sequence[tuple[sint, sint]]) -> View:
        """The view grown by (before, after) invalid elements per dim."""
        arg = _pairs(arg, self.shape, "pad")
        if any(isinstance(x, int) and x < 0 for p in arg for x in p):
            raise ValueError(f"pad amounts must be >= 0, got {arg}")
        if all(_is(b, 0) and _is(a, 0) for b, a in arg):
            return self
        offset = self.offset
        for (b, _), st in zip(arg, self.strides, strict=True):
            offset = _add(offset, _mul(_mul(b, st), -1))
        shape = tuple(_add(_add(s, b), a) for s, (b, a) in zip(self.shape, arg, strict=True))
        mask = tuple((_add(mb, b), _add(me, b)) for (mb, me), (b, _) in zip(self._full_mask(), arg, strict=True))
        return View.create(shape, self.strides, offset, mask)

    def shrink(self, arg: Sequence[tuple[sint, sint]]) -> View:
        """The view cut to [begin, end) per dim."""
        arg = _pairs(arg, self.shape, "shrink")
        for (b, e), s in zip(arg, self.shape, strict=True):
            if _all_int((b, e, s)) and not 0 <= b <= e <= s:
                raise ValueError(f"shrink {arg} is out of range for shape {self.shape}: need 0 <= begin <= end <= size")
        if all(_full(b, e, s) for (b, e), s in zip(arg, self.shape, strict=True)):
            return self
        offset = self.offset
        for (b, _), st in zip(arg, self.strides, strict=True):
            offset = _add(offset, _mul(b, st))
        shape = tuple(span(b, e) for b, e in arg)
        mask = None
        if self.mask is not None:
            mask = tuple((mb - b, me - b) for (mb, me), (b, _) in zip(self.mask, arg, strict=True))
        return View.create(shape, self.strides, offset, mask)

    def flip(self, arg: Sequence[bool]) -> View:
        """The view with the dims marked True reversed."""
        arg = tuple(arg)
        _check_arity(arg, self.shape, "flip")
        if not all(isinstance(f, bool) for f in arg):
            raise ValueError(f"flip takes one bool per dim, got {arg}")
        if not any(arg):
            return self
        strides, offset, mask = list(self.strides), self.offset, list(self._full_mask())
        for d, f in enumerate(arg):
            if not f:
                continue
            s = self.shape[d]
            offset = _add(offset, _mul(s - 1, strides[d]))
            strides[d] = -strides[d]
            mask[d] = (s - mask[d][1], s - mask[d][0])
        return View.create(self.shape, strides, offset, None if self.mask is None else mask)

    def reshape(self, new_shape: Sequence[sint]) -> View | None:
        """The view with the same elements in row-major order under `new_shape`, or None when one view can't
        express it (a reshape across dims whose strides don't nest, or a mask that isn't a box in the new shape)."""
        new_shape = _check_shape(new_shape, "reshape")
        if _all_int(self.shape) and _all_int(new_shape) and prod(self.shape) != prod(new_shape):
            raise ValueError(
                f"can't reshape {self.shape} ({prod(self.shape)} elements) to {new_shape} ({prod(new_shape)})"
            )
        if new_shape == self.shape:
            return self
        if self.contiguous or any(_is(s, 0) for s in self.shape):
            return View.create(new_shape)
        if not (
            _all_int(self.shape) and _all_int(new_shape) and _all_int(self.strides) and isinstance(self.offset, int)
        ):
            return self._reshape_around_symbolic_dims(new_shape)
        if self.empty:
            # a rank-0 shape has no dim to carry an empty mask
            return View.create(new_shape, mask=((0, 0),) * len(new_shape)) if new_shape else None
        # size-1 dims index nothing: drop them, then match the rest in the smallest groups of equal product
        old = [(s, st, m) for s, st, m in zip(self.shape, self.strides, self._full_mask(), strict=True) if s != 1]
        new = [s for s in new_shape if s != 1]
        offset: int = self.offset
        strides: list[int] = []
        mask: list[tuple[int, int]] = []
        i = j = 0
        while i < len(old):
            i0, j0 = i, j
            po, pn = old[i][0], new[j]
            i, j = i + 1, j + 1
            while po != pn:
                if po < pn:
                    po, i = po * old[i][0], i + 1
                else:
                    pn, j = pn * new[j], j + 1
            merged = _merge_dims(old[i0:i])
            if merged is None:
                return None
            stride, delta, interval = merged
            split = _split_dim(po, stride, interval, new[j0:j])
            if split is None:
                return None
            offset += delta
            strides.extend(split[0])
            mask.extend(split[1])
        it = iter(zip(strides, mask, strict=True))
        out_strides, out_mask = [], []
        for s in new_shape:
            st, m = (0, (0, 1)) if s == 1 else next(it)
            out_strides.append(st)
            out_mask.append(m)
        return View.create(new_shape, out_strides, offset, out_mask)

    def _reshape_around_symbolic_dims(self, new_shape: tuple[sint, ...]) -> View | None:
        """reshape for views with symbolic sizes, strides or offset, when every symbolic dim stays a dim of its own
        (the same node, in the same order, size-1 dims aside): runs of int dims between them are reshaped as the
        int views they are, the symbolic dims keep their strides and masks. Adding or removing size-1 dims, as a
        matmul's broadcasting does, is the common case. None otherwise."""
        if self.empty or any(_is(s, 1) and not _full(b, e, 1) for s, (b, e) in zip(self.shape, self._full_mask())):
            return None  # a size-1 dim that is dropped must not carry validity
        dims = zip(self.shape, self.strides, self._full_mask(), strict=True)
        old = [(s, st, m) for s, st, m in dims if not _is(s, 1)]
        new = [s for s in new_shape if not _is(s, 1)]
        strides: list[sint] = []
        mask: list[tuple[sint, sint]] = []
        offset = self.offset
        i = j = 0
        while i < len(old) or j < len(new):
            i1, j1 = i, j
            while i1 < len(old) and isinstance(old[i1][0], int):
                i1 += 1
            while j1 < len(new) and isinstance(new[j1], int):
                j1 += 1
            run, run_new = old[i:i1], new[j:j1]
            if [s for s, _, _ in run] == run_new:
                strides.extend(st for _, st, _ in run)
                mask.extend(m for _, _, m in run)
            else:
                ints = [x for s, st, m in run for x in (s, st, *m)]
                if prod(s for s, _, _ in run) != prod(run_new) or not _all_int(ints):
                    return None
                part = View.create([s for s, _, _ in run], [st for _, st, _ in run], 0, [m for _, _, m in run])
                part = part.reshape(run_new)
                if part is None or part.empty:
                    return None
                strides.extend(part.strides)
                mask.extend(part._full_mask())
                offset = _add(offset, part.offset)
            if i1 == len(old) and j1 == len(new):
                break
            # the symbolic dims that end both runs must be one dim
            if i1 == len(old) or j1 == len(new) or not _same(old[i1][0], new[j1]):
                return None
            strides.append(old[i1][1])
            mask.append(old[i1][2])
            i, j = i1 + 1, j1 + 1
        it = iter(zip(strides, mask, strict=True))
        out_strides: list[sint] = []
        out_mask: list[tuple[sint, sint]] = []
        for s in new_shape:
            st, m = (0, (0, 1)) if _is(s, 1) else next(it)
            out_strides.append(st)
            out_mask.append(m)
        return View.create(new_shape, out_strides, offset, out_mask)

    # *** composition ***

    def merge(self, outer: View) -> View | None:
        """One view equal to `outer` applied on top of this one (outer's indices are flat row-major positions in
        this view's shape), or None when no single view is."""
        if self.contiguous:
            return outer
        if outer.contiguous and _same(prod(outer.shape), prod(self.shape)):
            return self.reshape(outer.shape)
        if any(_is(s, 0) for s in outer.shape):
            return View.create(outer.shape)
        if not all(
            _all_int(x)
            for x in (
                self.shape,
                outer.shape,
                outer.strides,
                (outer.offset,),
                [v for m in outer._full_mask() for v in m],
            )
        ):
            return None
        if outer.empty or self.empty:
            return View.create(outer.shape, mask=((0, 0),) * len(outer.shape)) if outer.shape else None
        merged = _merge_views(self, outer)
        return merged if merged is not None else _merge_by_digits(self, outer)


# An index expression is a pure function of a (hashable, immutable) view and interned index nodes, and codegen asks
# for the same ones again and again: per lane of a kernel (the views under a tracker's last one see the same
# unravelled coordinates), and for kernels that share a shape. About half the calls of a ResNet training step hit.
# Bounded, and what it keeps alive is index arithmetic, never a buffer.
@functools.lru_cache(maxsize=1 << 12)
def _view_indexed(view: View, idxs: tuple[UOp, ...], valid: UOp | None) -> tuple[UOp, UOp]:
    """`View.to_indexed_uops`, for arity-checked `idxs`."""
    if idxs:
        dt = idxs[0].dtype
    else:
        # with no coordinates, the offset alone is the index: int64 when it doesn't fit int32
        fits = isinstance(view.offset, UOp) or -(2**31) <= view.offset < 2**31
        dt = dtypes.int32 if fits else dtypes.int64
    if view.empty:
        return UOp.const(dt, 0), UOp.const(dtypes.bool, False)
    idx: UOp | None = None
    for i, st in zip(idxs, view.strides, strict=True):
        if _is(st, 0):
            continue
        term = i if _is(st, 1) else i * st
        idx = term if idx is None else idx + term
    if idx is None:
        idx = UOp.const(dt, view.offset) if isinstance(view.offset, int) else view.offset
    elif not _is(view.offset, 0):
        idx = idx + view.offset
    if view.mask is not None:
        for i, s, (b, e) in zip(idxs, view.shape, view.mask, strict=True):
            if not _is(b, 0):
                cond = i > b - 1 if isinstance(b, int) else i >= b
                valid = cond if valid is None else valid & cond
            if not _same(e, s):
                cond = i < e
                valid = cond if valid is None else valid & cond
    return idx, UOp.const(dtypes.bool, True) if valid is None else valid


def _merge_dims(dims: list[tuple[int, int, tuple[int, int]]]) -> tuple[int, int, tuple[int, int] | None] | None:
    """Dims (size, stride, valid interval) as one dim: (stride, offset change, valid interval or None if full).

    Works when the valid box is one run of row-major positions, that is: outer dims pinned to one coordinate,
    then one dim valid on an interval, then fully valid dims, and the strides from that dim inward nest."""
    k = next((d for d, (_, _, (b, e)) in enumerate(dims) if e - b > 1), len(dims) - 1)
    if any((b, e) != (0, s) for s, _, (b, e) in dims[k + 1 :]):
        return None
    if any(dims[d][1] != dims[d + 1][1] * dims[d + 1][0] for d in range(k, len(dims) - 1)):
        return None
    stride = dims[-1][1]
    places = [prod(s for s, _, _ in dims[d + 1 :]) for d in range(len(dims))]
    base = sum(dims[d][2][0] * places[d] for d in range(k))
    delta = sum(dims[d][1] * dims[d][2][0] for d in range(k)) - stride * base
    lo, hi = base + dims[k][2][0] * places[k], base + dims[k][2][1] * places[k]
    size = places[0] * dims[0][0]
    return stride, delta, None if (lo, hi) == (0, size) else (lo, hi)


def _split_dim(
    size: int, stride: int, interval: tuple[int, int] | None, sizes: list[int]
) -> tuple[list[int], list[tuple[int, int]]] | None:
    """One dim of `size` split row-major into `sizes`: their strides and masks, or None when the valid interval
    isn't a box in the split dims."""
    places = [prod(sizes[d + 1 :]) for d in range(len(sizes))]
    strides = [stride * p for p in places]
    if interval is None:
        return strides, [(0, s) for s in sizes]
    lo, hi = interval
    # the outermost dim whose place divides both ends; dims inside it are fully valid, dims outside it pinned
    k = next(d for d in range(len(sizes)) if lo % places[d] == 0 and hi % places[d] == 0)
    block = places[k] * sizes[k]
    if lo // block != (hi - 1) // block:
        return None
    mask = [((lo // places[d]) % sizes[d], (lo // places[d]) % sizes[d] + 1) for d in range(k)]
    start = (lo // places[k]) % sizes[k]
    mask.append((start, start + (hi - lo) // places[k]))
    mask.extend((0, s) for s in sizes[k + 1 :])
    return strides, mask


def _merge_views(inner: View, outer: View) -> View | None:
    """`outer` on top of `inner` as one view, both with int fields, neither empty nor contiguous-trivial.

    On its valid box, outer reads flat positions `base + sum(|stride| * d)` with each d counting from 0. When the
    strides nest, that is a shrink of `inner` reshaped so each stride is the place value of one dim; replaying
    that reshape and shrink on `inner`, then permute, expand, flip and pad to outer's layout, gives the merge."""
    # View.merge checked that these are all ints
    shape, strides = [int(s) for s in outer.shape], [int(st) for st in outer.strides]
    mask = [(int(b), int(e)) for b, e in outer._full_mask()]
    total, base = int(prod(inner.shape)), int(outer.offset)
    moving: list[int] = []  # outer dims that move the flat position
    for d, (st, (b, e)) in enumerate(zip(strides, mask, strict=True)):
        if st != 0 and e - b > 1:
            moving.append(d)
        base += st * (e - 1 if st < 0 and e - b > 1 else b)
    if base < 0:
        return None
    order = sorted(moving, key=lambda d: -abs(strides[d]))
    places = [abs(strides[d]) for d in order]
    # the dim with place value p sits between the next-larger place (or the whole buffer) and p
    y_shape: list[int] = []
    bigger = total
    for p in places:
        if bigger % p != 0:
            return None
        y_shape.append(bigger // p)
        bigger = p
    y_shape.append(bigger)
    counts = [mask[d][1] - mask[d][0] for d in order] + [1]
    digits = []
    rest = base
    for s in reversed(y_shape):
        digits.append(rest % s)
        rest //= s
    digits.reverse()
    if rest != 0 or any(dg + n > s for dg, n, s in zip(digits, counts, y_shape, strict=True)):
        return None
    view = inner.reshape(tuple(y_shape))
    if view is None:
        return None
    view = view.shrink(tuple((dg, dg + n) for dg, n in zip(digits, counts, strict=True)))
    view = view.reshape(tuple(counts[:-1]))
    if view is None:
        return None
    # now dims are the moving outer dims by decreasing place; put them in outer's order, 1s for the others
    view = view.permute(tuple(sorted(range(len(order)), key=lambda k: order[k])))
    valid_counts = tuple(e - b for b, e in mask)
    view = view.reshape(tuple(c if d in moving else 1 for d, c in enumerate(valid_counts)))
    if view is None:
        return None
    view = view.expand(valid_counts)
    view = view.flip(tuple(d in moving and strides[d] < 0 for d in range(len(shape))))
    return view.pad(tuple((b, s - e) for (b, e), s in zip(mask, shape, strict=True)))


def _merge_by_digits(inner: View, outer: View) -> View | None:
    """`outer` on top of `inner` as one view when each of outer's steps moves inner's dims by fixed amounts that
    never carry: written in the mixed radix of inner's shape, the position outer starts at plus every step times its
    largest count stays inside each dim. Each inner coordinate is then its start plus a sum of outer coordinates
    times those digits, so the buffer index is affine in outer's coordinates. This is the window view over an input
    (`_pool`'s repeat-and-reshape), whose steps each move two dims of the repeated input at once (a row and its
    repeat), which `_merge_views` can't nest. Validity: an inner mask on a dim that no outer dim moves is a constant,
    on a dim one outer dim moves an interval of it; a mask on a dim several move (padding under overlapping
    windows) is no box, and gives None. Outer's strides must not be negative, inner's fields must be ints."""
    fields = (*inner.strides, inner.offset, *(v for m in inner._full_mask() for v in m))
    if not _all_int(fields) or any(int(st) < 0 for st in outer.strides) or int(outer.offset) < 0:
        return None
    ishape = [int(s) for s in inner.shape]
    places = [int(prod(ishape[j + 1 :])) for j in range(len(ishape))]
    total = places[0] * ishape[0] if ishape else 1

    def digits(x: int) -> list[int] | None:
        return None if x >= total else [x // p % s for p, s in zip(places, ishape, strict=True)]

    mask = [(int(b), int(e)) for b, e in outer._full_mask()]
    strides = [int(st) for st in outer.strides]
    base = digits(int(outer.offset) + sum(st * b for st, (b, _) in zip(strides, mask, strict=True)))
    if base is None:
        return None
    steps: list[list[int]] = []
    reach, movers = list(base), [[] for _ in ishape]  # type: list[int], list[list[int]]
    for d, (st, (b, e)) in enumerate(zip(strides, mask, strict=True)):
        step = digits(st) if e - b > 1 else [0] * len(ishape)
        if step is None:
            return None
        steps.append(step)
        for j, a in enumerate(step):
            if a:
                reach[j] += a * (e - b - 1)
                movers[j].append(d)
    if any(r >= s for r, s in zip(reach, ishape, strict=True)):
        return None
    istrides = [int(st) for st in inner.strides]
    new_strides = [sum(a * st for a, st in zip(step, istrides, strict=True)) for step in steps]
    offset = int(inner.offset) + sum(c * st for c, st in zip(base, istrides, strict=True))
    offset -= sum(b * st for (b, _), st in zip(mask, new_strides, strict=True))
    bounds = [list(m) for m in mask]
    for j, (ib, ie) in enumerate(inner._full_mask()):
        ib, ie = int(ib), int(ie)
        if (ib, ie) == (0, ishape[j]):
            continue
        if not movers[j]:
            if not ib <= base[j] < ie:
                return View.create(outer.shape, mask=((0, 0),) * len(outer.shape))
            continue
        if len(movers[j]) > 1:
            return None
        d = movers[j][0]
        a, b = steps[d][j], mask[d][0]
        # ib <= base + a * (i - b) < ie
        bounds[d][0] = max(bounds[d][0], b + -(-(ib - base[j]) // a))
        bounds[d][1] = min(bounds[d][1], b + -(-(ie - base[j]) // a))
    return View.create(outer.shape, new_strides, offset, [tuple(m) for m in bounds])


# *** ShapeTracker ***


@dataclass(frozen=True)
class ShapeTracker:
    """A stack of views: `views[-1]` indexes the flat positions of `views[-2].shape`, ..., `views[0]` the buffer."""

    views: tuple[View, ...]

    def __post_init__(self) -> None:
        # a tuple keeps the tracker hashable, so it can be a UOp arg
        object.__setattr__(self, "views", tuple(self.views))
        if not self.views:
            raise ValueError("a ShapeTracker needs at least one view")

    @staticmethod
    def from_shape(shape: Sequence[sint]) -> ShapeTracker:
        """The contiguous tracker of `shape`."""
        return ShapeTracker((View.create(tuple(shape)),))

    @property
    def shape(self) -> tuple[sint, ...]:
        """The shape the tracker presents."""
        return self.views[-1].shape

    @property
    def size(self) -> sint:
        """The number of elements of `shape`."""
        return prod(self.shape)

    @property
    def contiguous(self) -> bool:
        """True when the tracker reads its buffer in order: one contiguous view, no offset, no mask."""
        return len(self.views) == 1 and self.views[0].contiguous

    def _with_last(self, view: View) -> ShapeTracker:
        """Replace the last view; a contiguous last view is only a reshape of the one below, so fold it in."""
        if view.contiguous and len(self.views) > 1 and _same(prod(view.shape), prod(self.views[-2].shape)):
            if (folded := self.views[-2].reshape(view.shape)) is not None:
                return ShapeTracker((*self.views[:-2], folded))
        return ShapeTracker((*self.views[:-1], view))

    # *** movement ops ***

    def reshape(self, new_shape: Sequence[sint]) -> ShapeTracker:
        """The tracker reshaped; a new view is stacked when the last one can't express it."""
        new = self.views[-1].reshape(new_shape)
        if new is None:
            return ShapeTracker((*self.views, View.create(tuple(new_shape))))
        return self._with_last(new)

    def permute(self, order: Sequence[int]) -> ShapeTracker:
        """The tracker with dims reordered: new dim i is old dim order[i]."""
        return self._with_last(self.views[-1].permute(order))

    def expand(self, new_shape: Sequence[sint]) -> ShapeTracker:
        """The tracker with size-1 dims repeated to `new_shape`."""
        return self._with_last(self.views[-1].expand(new_shape))

    def pad(self, arg: Sequence[tuple[sint, sint]]) -> ShapeTracker:
        """The tracker grown by (before, after) invalid elements per dim."""
        return self._with_last(self.views[-1].pad(arg))

    def shrink(self, arg: Sequence[tuple[sint, sint]]) -> ShapeTracker:
        """The tracker cut to [begin, end) per dim."""
        return self._with_last(self.views[-1].shrink(arg))

    def flip(self, arg: Sequence[bool]) -> ShapeTracker:
        """The tracker with the dims marked True reversed."""
        return self._with_last(self.views[-1].flip(arg))

    def reduce(self, axes: Iterable[int]) -> tuple[sint, ...]:
        """The shape after reducing over `axes`: those dims become 1."""
        axes = set(axes)
        if not all(isinstance(a, int) and 0 <= a < len(self.shape) for a in axes):
            raise ValueError(f"reduce axes {sorted(axes, key=str)} out of range for shape {self.shape}")
        return tuple(1 if d in axes else s for d, s in enumerate(self.shape))

    # *** composition ***

    def simplify(self) -> ShapeTracker:
        """The same mapping with consecutive views merged wherever their composition is one view."""
        views = list(self.views)
        changed = True
        while changed:
            changed = False
            for i in range(len(views) - 1, 0, -1):
                if (merged := views[i - 1].merge(views[i])) is not None:
                    views[i - 1 : i + 1] = [merged]
                    changed = True
                    break
        return self if len(views) == len(self.views) else ShapeTracker(tuple(views))

    def __add__(self, other: ShapeTracker) -> ShapeTracker:
        """`other` applied on top of this tracker: other's buffer indices are flat positions in `self.shape`."""
        if not isinstance(other, ShapeTracker):
            return NotImplemented
        need, have = other.real_size(), self.size
        if isinstance(have, int) and need > have:
            raise ValueError(f"can't stack a tracker reading {need} elements on one of shape {self.shape} ({have})")
        return ShapeTracker(self.views + other.views).simplify()

    # *** indexing ***

    def to_indexed_uops(self, idxs: Sequence[UOp] | None = None, simplify: bool = False) -> tuple[UOp, UOp]:
        """The buffer index and validity of the element at `idxs` (default: a RANGE per dim, axis i for dim i).

        The expressions are built plainly; `simplify=True` runs the symbolic engine on both."""
        if idxs is None:
            idxs = [UOp.range(s, d) for d, s in enumerate(self.shape)]
        _check_arity(idxs, self.shape, "to_indexed_uops idxs")
        if any(_is(s, 0) for s in self.shape):
            # nothing is read; and the views below, as small, would unravel by a zero place value
            return UOp.const(idxs[0].dtype, 0), UOp.const(dtypes.bool, False)
        idx, valid = self.views[-1].to_indexed_uops(idxs)
        for view in reversed(self.views[:-1]):
            idx, valid = view.to_indexed_uops(_unravel(idx, view.shape), valid)
        if simplify:
            idx, valid = idx.simplify(), valid.simplify()
        return idx, valid

    def real_strides(self, ignore_valid: bool = False, simplify: bool = False) -> tuple[sint | None, ...]:
        """Per dim, how far the buffer index moves when that coordinate grows by one, or None where the move isn't
        one constant (or, unless `ignore_valid`, where the coordinate decides validity).

        A tracker that stays several views after `.simplify()` is read off its index expression: the plain one by
        default, where dims that pass through an unravel come back None, or with `simplify=True` the symbolic
        engine's rewrite, which finds the strides that survive it."""
        st = self.simplify()
        if len(st.views) == 1:
            v = st.views[0]
            mask = v._full_mask()
            return tuple(
                None if not ignore_valid and not _full(b, e, s) else stride
                for stride, (b, e), s in zip(v.strides, mask, v.shape, strict=True)
            )
        idxs = [UOp.range(s, d) for d, s in enumerate(self.shape)]
        idx, valid = st.to_indexed_uops(idxs, simplify=simplify)
        return linear_strides(idx, valid, idxs, ignore_valid)

    def unit_stride_axes(self, ignore_valid: bool = False, simplify: bool = False) -> list[int]:
        """The dims along which the buffer index moves by exactly one (see `real_strides`)."""
        return [d for d, st in enumerate(self.real_strides(ignore_valid, simplify)) if _is(st, 1)]

    def real_size(self) -> int:
        """One past the largest buffer index a valid element reads: how many elements the buffer must hold.

        Exact when the tracker simplifies to one view; for stacks it is an upper bound, found by carrying the
        bounding box of reachable coordinates from the outer view inward."""
        st = self.simplify()
        if any(_is(s, 0) for s in st.shape):
            return 0
        fields = [
            x for v in st.views for x in (*v.shape, *v.strides, v.offset, *(c for m in v._full_mask() for c in m))
        ]
        if not _all_int(fields):
            idx, valid = st.to_indexed_uops()
            return 0 if valid.vmax is False else int(idx.vmax) + 1
        box: list[tuple[int, int]] | None = None
        for k in range(len(st.views) - 1, -1, -1):
            v = st.views[k]
            lo_idx = hi_idx = v.offset
            for d, (s, stride, (b, e)) in enumerate(zip(v.shape, v.strides, v._full_mask(), strict=True)):
                lo, hi = (0, s - 1) if box is None else box[d]
                lo, hi = max(lo, b), min(hi, e - 1)
                if lo > hi:
                    return 0
                lo_idx += min(stride * lo, stride * hi)
                hi_idx += max(stride * lo, stride * hi)
            if k == 0:
                return hi_idx + 1
            box = _flat_interval_box(lo_idx, hi_idx, st.views[k - 1].shape)
        raise AssertionError("unreachable: the loop returns at views[0]")

    def substitute(self, mapping: dict[UOp, UOp]) -> ShapeTracker:
        """This tracker with `mapping` applied to the symbolic fields of every view (see `View.substitute`)."""
        return ShapeTracker(tuple(v.substitute(mapping) for v in self.views))

    def binds(self) -> set[UOp]:
        """The bound variables (BIND) appearing in any view's shape, strides, offset or mask."""
        out: set[UOp] = set()
        for v in self.views:
            for x in (*v.shape, *v.strides, v.offset, *(c for m in v.mask or () for c in m)):
                if isinstance(x, UOp):
                    out.update(u for u in x.toposort if u.op is Ops.BIND)
        return out

    def vars(self) -> set[UOp]:
        """The variables (DEFINE_VAR) appearing in any view's shape, strides, offset or mask."""
        out: set[UOp] = set()
        for v in self.views:
            for x in (*v.shape, *v.strides, v.offset, *(c for m in v.mask or () for c in m)):
                if isinstance(x, UOp):
                    out.update(u for u in x.toposort if u.op is Ops.DEFINE_VAR)
        return out


# *** reading strides off an index expression ***


def _linear_term(term: UOp, pos: dict[UOp, int]) -> tuple[int, sint] | None:
    """(dim, coefficient) when `term` is an index variable times factors free of index variables, else None."""
    if term in pos:
        return pos[term], 1
    if term.op is Ops.MUL:
        for a, b in (term.src, term.src[::-1]):
            if not any(u in pos for u in b.toposort) and (inner := _linear_term(a, pos)) is not None:
                return inner[0], _mul(inner[1], b.arg if b.op is Ops.CONST else b)
    return None


def linear_strides(idx: UOp, valid: UOp, idxs: Sequence[UOp], ignore_valid: bool = False) -> tuple[sint | None, ...]:
    """Per index variable in `idxs`, its constant coefficient in the sum `idx`: 0 where it doesn't appear, None where
    it appears other than as `idx_i * c` (or, unless `ignore_valid`, in `valid`). Works on simplified or
    unsimplified expressions; simplified ones reveal more."""
    pos = {u: d for d, u in enumerate(idxs)}
    strides: list[sint | None] = [0] * len(idxs)
    terms, stack = [], [idx]
    while stack:
        t = stack.pop()
        if t.op is Ops.ADD:
            stack.extend(t.src)
        else:
            terms.append(t)
    for t in terms:
        if not any(u in pos for u in t.toposort):
            continue
        if (lin := _linear_term(t, pos)) is not None:
            d, coeff = lin
            cur = strides[d]
            if cur is not None:
                strides[d] = _add(cur, coeff)
        else:
            for u in t.toposort:
                if u in pos:
                    strides[pos[u]] = None
    if not ignore_valid:
        for u in valid.toposort:
            if u in pos:
                strides[pos[u]] = None
    return tuple(strides)
