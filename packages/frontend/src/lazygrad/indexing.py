"""Indexing of `Tensor`: `t[...]` and `t[...] = v` with ints, slices (any step), None, `...`, integer and boolean
tensors in any combination (PyTorch's rules), and gather, scatter, scatter_reduce, one_hot, masked_select, nonzero.

Basic indices (ints, slices, None) are movement ops. A tensor index selects by comparing it with an arange: a one-hot
mask, a `where` and a sum over the indexed dimension, which runs on every device with no gather instruction. `t[idx]`,
gather and `nn.Embedding` compare with `kernel_iota`, an arange made of constants and movement ops that the
kernel computes from its loop index, with the (wrapped) indices stored first (`stored`): codegen then turns a read's
reduction into one load per output (`lazygrad_codegen.selection`) instead of a loop costing the index's size times the
indexed dimension's. Boolean indices have data-dependent shapes: they are turned into integer indices, which reads the
mask back to the host (torch synchronizes there too). Integer indices out of range are found on the device and raise
IndexError at the next read (`lazygrad.index_checks`; `INDEX_CHECKS=0` turns that off, and they then select nothing,
giving 0).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from lazygrad.errors import InputError, KindError, RangeError
from lazygrad.index_checks import record as record_index_check
from lazygrad.movement import always_le, concrete_sizes, show_sizes, symbolic_bounds
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.tensor_graph import view_base
from lazygrad_uop.uop import UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

# entries of a parsed index: ("none",), ("empty",) for a False scalar, ("slice", start, stop, step), ("int", i),
# ("tensor", t) for an integer tensor over one dimension
_Entry = tuple[Any, ...]


def _index_dtype(n: int) -> Any:
    return dtypes.int32 if n < 2**31 else dtypes.int64


def _slice_length(start: Any, stop: Any, step: int) -> Any:
    """How many elements a parsed slice selects; a symbolic slice has step 1 and start <= stop always."""
    if isinstance(start, UOp) or isinstance(stop, UOp):
        return (stop - start).ssimplify()
    return len(range(start, stop, step))


def _sequence_as_tuple(index: list) -> bool:
    """Whether a list index means a tuple of indices, by PyTorch's (and older numpy's) rule: a short list holding a
    slice, None, ..., a tensor or another sequence does (`t[[a, b]]` is `t[a, b]`, `t[[(0,), (1,)]]` is
    `t[(0,), (1,)]`); a list of plain ints is one integer index."""
    return len(index) < 32 and any(
        i is None or i is Ellipsis or isinstance(i, (slice, list, tuple)) or hasattr(i, "uop") for i in index
    )


def _is_int_tensor(t: Tensor) -> bool:
    return dtypes.is_int(t.dtype)


def stored(t: Tensor) -> Tensor:
    """`t` as a buffer read: itself where it is a view of a buffer already, else a stored copy. One-hot lookups
    store their indices: the scheduler weighs recomputing index math (a cast, negatives wrapped) for every row they are
    compared with against storing, and would store the whole (indices x rows) mask, a buffer codegen can't see
    through, so its loop over the rows would stay."""
    return t if view_base(t.uop).op is Ops.BUFFER else t.contiguous()


def kernel_iota(cls: type[Tensor], n: int, dtype: DType, device: str) -> Tensor:
    """0..n-1 of integer `dtype` built from constants and movement ops only, so that a kernel reading it computes it
    from its loop index instead of loading a buffer (which `Tensor.arange` is): a comparison with it is a one-hot
    selection codegen can lower to one load. Bit b of every position is the constant 2**b, padded so that it is there
    only at the positions that have that bit: log2(n) masked constants, no memory."""
    bits = (n - 1).bit_length() if n > 1 else 0
    if bits == 0:
        return cls.zeros(n, dtype=dtype, device=device)
    p = 1 << bits
    out: Tensor | None = None
    for b in range(bits):
        # blocks of 2**b positions, alternately without and with bit b
        bit = cls.full((p >> (b + 1), 1, 1 << b), 1 << b, dtype=dtype, device=device)
        bit = bit.pad(((0, 0), (1, 0), (0, 0))).reshape(p).shrink(((0, n),))
        out = bit if out is None else out + bit
    assert out is not None
    return out


class IndexingMixin:
    """Indexing ops of `Tensor` (mixed into it; see `lazygrad.tensor`)."""

    __slots__ = ()

    # *** parsing an index ***

    def _as_index_tensor(self: Tensor, i: Any) -> Tensor:
        t = i if isinstance(i, type(self)) else type(self)(np.asarray(i), device=self.device)
        if t.device != self.device:
            t = t.to(self.device)
        if not (dtypes.is_int(t.dtype) or dtypes.is_bool(t.dtype)):
            raise RangeError(f"tensors used as indices must be integer or bool tensors, got {t.dtype!r}")
        return t

    def _parse_index(self: Tensor, index: Any) -> list[_Entry]:
        """The index as a list of entries, one per dimension it touches, Ellipsis expanded and bool tensors turned
        into integer tensors (one per dimension they cover)."""
        if isinstance(index, list) and _sequence_as_tuple(index):
            index = tuple(index)
        elif isinstance(index, list) or isinstance(index, (type(self), np.ndarray)):
            index = (index,)
        elif not isinstance(index, tuple):
            index = (index,)
        items: list[Any] = []
        for i in index:
            if isinstance(i, (list, tuple, np.ndarray, type(self))) and not (isinstance(i, np.ndarray) and i.ndim == 0):
                items.append(self._as_index_tensor(i))
            elif isinstance(i, (bool, np.bool_)):
                items.append(bool(i))
            elif isinstance(i, (int, np.integer)) or (isinstance(i, np.ndarray) and i.ndim == 0):
                items.append(int(i))
            elif isinstance(i, UOp) and i.op is not Ops.CONST and dtypes.is_int(i.dtype):
                items.append(i)  # a symbolic position (an expression of bound variables)
            elif i is None or i is Ellipsis or isinstance(i, slice):
                items.append(i)
            else:
                raise RangeError(
                    f"index {i!r} of type {type(i).__name__} is not supported: use ints, slices, None, ..., "
                    "or integer/bool tensors, lists or arrays"
                )
        if sum(i is Ellipsis for i in items) > 1:
            raise RangeError("an index can only have a single ellipsis ('...')")

        def consumed(i: Any) -> int:
            if isinstance(i, type(self)):
                return i.ndim if dtypes.is_bool(i.dtype) else 1
            return 0 if i is None or i is Ellipsis or isinstance(i, bool) else 1

        n_used = sum(consumed(i) for i in items)
        if n_used > self.ndim:
            raise RangeError(f"too many indices for a tensor of {self.ndim} dimensions: the index covers {n_used}")
        fill = [slice(None)] * (self.ndim - n_used)
        ellipsis = [k for k, i in enumerate(items) if i is Ellipsis]  # `in` would compare tensors elementwise
        if ellipsis:
            e = ellipsis[0]
            items = items[:e] + fill + items[e + 1 :]
        else:
            items = items + fill
        entries: list[_Entry] = []
        dim = 0
        for i in items:
            if i is None or i is True:
                entries.append(("none",))
            elif i is False:
                entries.append(("empty",))
            elif isinstance(i, slice):
                entries.append(("slice", *self._slice_indices(i, dim)))
                dim += 1
            elif isinstance(i, (int, UOp)):
                entries.append(("int", self._int_index(i, dim)))
                dim += 1
            elif dtypes.is_bool(i.dtype):
                covered = self.shape[dim : dim + i.ndim]
                if i.shape != covered:
                    raise RangeError(
                        f"boolean index of shape {i.shape} doesn't match the indexed dimensions {covered} "
                        f"(dimensions {dim}..{dim + i.ndim - 1})"
                    )
                # data-dependent shape: the positions of the true elements are read back from the device
                for pos in np.nonzero(i.numpy()):
                    entries.append(("tensor", type(self)(pos.astype(np.int64), device=self.device)))
                if i.ndim == 0:
                    entries.append(("none",) if i.item() else ("empty",))
                dim += i.ndim
            else:
                entries.append(("tensor", i))
                dim += 1
        return entries

    def _slice_indices(self: Tensor, s: slice, dim: int) -> tuple[Any, Any, int]:
        """(start, stop, step) of slice `s` over dimension `dim`, as slice.indices gives them; with a symbolic bound
        or size, only step 1, and no clamping: the slice must fit for every value its variables may be bound to."""
        size = self.shape[dim]
        if not any(isinstance(p, UOp) for p in (s.start, s.stop, s.step, size)):
            return s.indices(size)
        if s.step is not None and s.step != 1:
            raise RangeError(
                f"slice {show_sizes((s.start, s.stop, s.step))} of dimension {dim} (size {show_sizes(size)}) has a "
                "symbolic bound or size, which needs step 1"
            )

        def bound(p: Any, default: Any) -> Any:
            if p is None or isinstance(p, UOp):
                return default if p is None else p
            return int(p) + size if int(p) < 0 else int(p)  # negative counts from the end, as in Python

        start, stop = bound(s.start, 0), bound(s.stop, size)
        if not (always_le(0, start) and always_le(start, stop) and always_le(stop, size)):
            raise RangeError(
                f"slice [{show_sizes(s.start)}:{show_sizes(s.stop)}] of dimension {dim} (size {show_sizes(size)}) "
                f"leaves [0, size] for some values in its variables' bounds ({symbolic_bounds(start, stop, size)}); "
                "a symbolic slice is not clamped, so narrow the bounds so that 0 <= start <= stop <= size"
            )
        return start, stop, 1

    def _int_index(self: Tensor, i: int | UOp, dim: int) -> int | UOp:
        """Integer index `i` of dimension `dim` as a position in [0, size): checked for every value the variables
        in it or in the size may be bound to."""
        size = self.shape[dim]
        if isinstance(i, int) and isinstance(size, int):
            if not -size <= i < size:
                raise RangeError(f"index {i} is out of bounds for dimension {dim} with size {size}")
            return i % size
        pos = i + size if isinstance(i, int) and i < 0 else i
        if not (always_le(0, pos) and always_le(pos + 1, size)):
            raise RangeError(
                f"index {show_sizes(i)} of dimension {dim} (size {show_sizes(size)}) is out of bounds for some values "
                f"in its variables' bounds ({symbolic_bounds(pos, size)}); narrow the bounds"
            )
        return pos

    # *** reading ***

    def _basic_view(self: Tensor, entries: list[_Entry]) -> tuple[Tensor, list[int]]:
        """The view selected by the ints, slices and Nones of `entries`, and the position in it of each dimension
        that a tensor index still has to select from."""
        t, dim, out_shape, tensor_pos = self, 0, [], []
        for e in entries:
            if e[0] == "none":
                out_shape.append(1)
                continue
            if e[0] == "empty":
                out_shape.append(0)
                continue
            positions = e[1:3] if e[0] == "slice" else e[1:2] if e[0] == "int" else ()
            if any(isinstance(x, UOp) for x in (*positions, t.shape[dim] if positions else 0)):
                # symbolic positions or size: step 1 (checked in _parse_index), a shrink
                box: list[Any] = [None] * t.ndim
                box[dim] = e[1:3] if e[0] == "slice" else (e[1], e[1] + 1)
                t = t.shrink(box)
                if e[0] == "slice":
                    out_shape.append(t.shape[dim])
            elif e[0] == "slice":
                t = t._slice_dim(dim, *e[1:])
                out_shape.append(t.shape[dim])
            elif e[0] == "int":
                t = t._slice_dim(dim, e[1], e[1] + 1, 1)
            else:
                tensor_pos.append(len(out_shape))
                out_shape.append(t.shape[dim])
            dim += 1
        if any(e[0] == "empty" for e in entries):
            t = t.reshape(-1).shrink(((0, 0),))  # a False index selects nothing
        return t.reshape(out_shape), tensor_pos

    def __getitem__(self: Tensor, index: Any) -> Tensor:
        """Indexing with PyTorch's rules: ints, slices (any step), None, `...`, integer and bool tensors (or lists
        and numpy arrays of them). Integer indices of several tensor indices broadcast together; their dimensions go
        where the first one was if they are adjacent, else first."""
        entries = self._parse_index(index)
        view, pos = self._basic_view(entries)
        if not pos:
            return view
        idx = [e[1] for e in entries if e[0] == "tensor"]
        return view._take(idx, pos)

    def _take(self: Tensor, idx: list[Tensor], pos: list[int]) -> Tensor:
        """self indexed by integer tensors `idx` at dimensions `pos` (all others kept whole)."""
        from lazygrad.tensor import _broadcast_shape

        bshape = _broadcast_shape(*(i.shape for i in idx))
        sizes = [self.shape[p] for p in pos]
        if symbolic := [(p, d) for p, d in zip(pos, sizes) if isinstance(d, UOp)]:
            raise NotImplementedError(
                f"indexing with a tensor needs an int size in the dimension it selects from, but dimension "
                f"{symbolic[0][0]} of shape {show_sizes(self.shape)} is symbolic ({symbolic_bounds(symbolic[0][1])})"
            )
        rest = [d for i, d in enumerate(self.shape) if i not in pos]
        consecutive = pos[-1] - pos[0] == len(pos) - 1
        m = math.prod(sizes)
        if m == 0 or math.prod(bshape) == 0 or math.prod(rest) == 0:
            out = type(self).zeros(*bshape, *rest, dtype=self.dtype, device=self.device)
        else:
            idt = _index_dtype(m)
            flat, stride = None, 1
            for p, i, n in zip(reversed(pos), reversed(idx), reversed(sizes)):
                record_index_check(f"indexing dimension {p} of a tensor of shape {self.shape}", i, -n, n)
                i = i.cast(idt)
                i = (i < 0).where(i + n, i) * stride
                flat = i if flat is None else flat + i
                stride *= n
            assert flat is not None
            x = self.permute(pos + [i for i in range(self.ndim) if i not in pos]).reshape(m, *rest)
            out = x._select_rows(stored(flat)._broadcast_to(bshape))
        if consecutive and pos[0] > 0:
            nb = len(bshape)
            before = list(range(nb, nb + pos[0]))
            out = out.permute(before + list(range(nb)) + list(range(nb + pos[0], out.ndim)))
        return out

    def _select_rows(self: Tensor, flat: Tensor) -> Tensor:
        """Rows self[flat] of a tensor (m, *rest), for a stored integer tensor `flat` of any shape (positions in
        [0, m) select, others give 0): flat.shape + rest."""
        m, rest = self.shape[0], self.shape[1:]
        iota = kernel_iota(type(self), m, flat.dtype, self.device)
        onehot = flat.reshape(*flat.shape, 1).eq(iota).reshape(*flat.shape, m, *(1,) * len(rest))
        x = self.reshape(*(1,) * flat.ndim, m, *rest)
        return onehot._pick(x, flat.ndim)

    def _pick(self: Tensor, x: Tensor, axis: int) -> Tensor:
        """The element of `x` along `axis` where this one-hot mask is true (0 where it is nowhere true)."""
        chosen = self.where(x, x.zeros_like() if dtypes.is_bool(x.dtype) else 0)
        if dtypes.is_bool(x.dtype):
            return chosen.max(axis)
        # exactly one term is nonzero, so summing in the element type is exact
        return chosen.sum(axis, dtype=x.dtype)

    # *** writing ***

    def __setitem__(self: Tensor, index: Any, value: Any) -> None:
        """`t[index] = value`: the selected elements become `value` (broadcast, cast to this tensor's dtype), in place
        through `assign`. With repeated tensor indices the last write wins."""
        if (
            isinstance(index, type(self))
            and dtypes.is_bool(index.dtype)
            and index.shape == self.shape[: index.ndim]
            and (not isinstance(value, type(self)) or value.numel() == 1)
        ):
            # a mask over leading dimensions and one value: a where, with no read-back of the mask
            v = value.reshape(()) if isinstance(value, type(self)) else value
            mask = index.reshape(*index.shape, *(1,) * (self.ndim - index.ndim))
            self.assign(mask.where(self._const_like(v) if not isinstance(v, type(self)) else v.cast(self.dtype), self))
            return
        entries = self._parse_index(index)
        if any(e[0] == "tensor" for e in entries):
            self.assign(self._scatter_flat(index, value))
            return
        view, _ = self._basic_view(entries)
        if view.numel() == 0:
            return
        sliced = [e for e in entries if e[0] in ("slice", "int")]
        shape = [1 if e[0] == "int" else _slice_length(*e[1:]) for e in sliced]
        v = self._value_for(value, view.shape).reshape(shape)
        mask = type(self).full(shape, True, dtype=dtypes.bool, device=self.device)
        for d, e in enumerate(sliced):
            start, stop, step = (e[1], e[1] + 1, 1) if e[0] == "int" else e[1:]
            v = v._unslice_dim(d, start, stop, step, self.shape[d])
            mask = mask._unslice_dim(d, start, stop, step, self.shape[d])
        self.assign(mask.where(v, self))

    def _value_for(self: Tensor, value: Any, shape: tuple[int, ...]) -> Tensor:
        """`value` as a tensor of this tensor's dtype broadcast to `shape` (extra leading size-1 dims dropped)."""
        v = value if isinstance(value, type(self)) else type(self)(value, device=self.device, dtype=self.dtype)
        v = v.cast(self.dtype)
        while v.ndim > len(shape) and v.shape[0] == 1:
            v = v.reshape(v.shape[1:])
        try:
            return v._broadcast_to(shape)
        except ValueError:
            raise InputError(f"can't assign a value of shape {v.shape} to an index of shape {shape}") from None

    def _unslice_dim(self: Tensor, dim: int, start: int, stop: int, step: int, size: int) -> Tensor:
        """The inverse of `_slice_dim`: this tensor placed at the sliced positions of a dimension of `size`, zeros
        (False) elsewhere."""
        if any(isinstance(x, UOp) for x in (start, stop, size, self.shape[dim])):
            # step 1 and within the size for every value of the variables (checked in _parse_index)
            pad: list[tuple[Any, Any]] = [(0, 0)] * self.ndim
            pad[dim] = (start, (size - start - self.shape[dim]).ssimplify())
            return self.pad(pad)
        if step < 0:
            return self._unslice_dim(dim, size - 1 - start, size - 1 - stop, -step, size).flip(dim)
        n = self.shape[dim]
        t = self
        if step > 1:
            pad = [(0, 0)] * (t.ndim + 1)
            pad[dim + 1] = (0, step - 1)
            t = t.unsqueeze(dim + 1).pad(pad)
            t = t.reshape(t.shape[:dim] + (n * step,) + t.shape[dim + 2 :])
        keep = min(t.shape[dim], size - start)
        box: list[tuple[int, int] | None] = [None] * t.ndim
        box[dim] = (0, keep)
        pad = [(0, 0)] * t.ndim
        pad[dim] = (start, size - start - keep)
        return t.shrink(box).pad(pad)

    def _scatter_flat(self: Tensor, index: Any, value: Any) -> Tensor:
        """This tensor with `value` written at `index` (any index): the flat position of every indexed element is
        found by indexing an arange, then matched against every position (the last write wins)."""
        n = self.numel()
        idt = _index_dtype(n)
        arange = type(self).arange
        selected = arange(n, dtype=idt, device=self.device).reshape(self.shape)[index]
        k = selected.numel()
        if k == 0:
            return self
        positions, v = selected.flatten(), self._value_for(value, selected.shape).flatten()
        hits = positions.reshape(1, k).eq(arange(n, dtype=idt, device=self.device).reshape(n, 1))
        order = arange(k, dtype=idt, device=self.device).reshape(1, k)
        last = hits.where(order, -1).max(1, keepdim=True)
        chosen = hits.logical_and(order.eq(last))
        new = chosen._pick(v.reshape(1, k), 1)
        return (last.reshape(n) >= 0).where(new, self.flatten()).reshape(self.shape)

    # *** gather and scatter ***

    def _onehot_along(self: Tensor, n: int, selecting: bool, what: str) -> Tensor:
        """For an integer index tensor: its one-hot mask over `n` positions as a new last dimension (negative
        indices count from the end). `selecting`: the mask will be reduced over the `n` positions (a read), so it is
        built for codegen's one-hot selections (stored indices, an arange the kernel computes); a scatter reduces it
        over the index instead, where loading the arange is cheaper than computing its bits."""
        record_index_check(what, self, -n, n)
        i = self.cast(_index_dtype(n))
        i = (i < 0).where(i + n, i)
        if selecting:
            return stored(i).unsqueeze(-1).eq(kernel_iota(type(self), n, i.dtype, self.device))
        return i.unsqueeze(-1).eq(type(self).arange(n, dtype=i.dtype, device=self.device))

    def _check_index_shape(self: Tensor, dim: int, index: Tensor, what: str) -> int:
        from lazygrad.movement import _axis

        d = _axis(dim, self.ndim)
        if not _is_int_tensor(index):
            raise RangeError(f"{what} needs an integer index tensor, got {index.dtype!r}")
        if index.ndim != self.ndim:
            raise InputError(
                f"{what} needs an index with as many dimensions as the tensor ({self.ndim}), got {index.ndim}"
            )
        if any(i > s for k, (i, s) in enumerate(zip(index.shape, self.shape)) if k != d):
            raise InputError(f"{what} index of shape {index.shape} is larger than the tensor {self.shape} off dim {d}")
        return d

    @concrete_sizes("gather")
    def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """out[i][j][k] = self[index[i][j][k]][j][k] for dim=0 (and so on), as torch.gather."""
        d = self._check_index_shape(dim, index, "gather")
        n = self.shape[d]
        x = self.shrink(tuple(None if k == d else (0, s) for k, s in enumerate(index.shape)))
        # the indexed dimension last, matched against the one-hot mask's last dimension
        x = x.movedim(d, -1).unsqueeze(d)
        return index._onehot_along(n, selecting=True, what=f"gather along dimension {d} of size {n}")._pick(x, -1)

    def _scatter_parts(self: Tensor, d: int, index: Tensor, src: Any, what: str) -> tuple[Tensor, Tensor, Tensor]:
        """The one-hot mask (index shape + N) of where each index element writes, the source values shaped to
        broadcast against it, and the mask moved to this tensor's layout reduced over `d`: where anything writes."""
        n = self.shape[d]
        hits = index._onehot_along(n, selecting=False, what=f"{what} along dimension {d} of size {n}")
        if isinstance(src, type(self)):
            if src.ndim != self.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
                raise InputError(f"scatter source of shape {src.shape} is smaller than the index {index.shape}")
            vals = src.shrink(tuple((0, s) for s in index.shape)).cast(self.dtype)
        else:
            vals = self._const_like(src)._broadcast_to(index.shape)
        return hits, vals.unsqueeze(-1), self._from_index_layout(hits.max(d), d)

    def _from_index_layout(self: Tensor, t: Tensor, d: int) -> Tensor:
        """A reduction over `d` of an (index shape + N) tensor moved into this tensor's layout, padded (0/False)
        beyond the index's extent."""
        t = t.movedim(-1, d)
        return t.pad(tuple((0, s - i) for s, i in zip(self.shape, t.shape)))

    @concrete_sizes("scatter")
    def scatter(self: Tensor, dim: int, index: Tensor, src: Any, reduce: str | None = None) -> Tensor:
        """self[index[i][j]][j] = src[i][j] for dim=0 (and so on), as torch.scatter; `src` may be a scalar.
        reduce="add" or "multiply" combines with the existing values instead. Repeated indices: the last wins."""
        d = self._check_index_shape(dim, index, "scatter")
        if reduce is not None:
            if reduce not in ("add", "multiply"):
                raise InputError(f"scatter reduce must be 'add' or 'multiply', got {reduce!r}")
            return self.scatter_reduce(dim, index, src, "sum" if reduce == "add" else "prod")
        hits, vals, written = self._scatter_parts(d, index, src, "scatter")
        order = type(self).arange(index.shape[d], device=self.device)
        order = order.reshape(*(1,) * d, index.shape[d], *(1,) * (index.ndim - d - 1), 1)
        last = hits.where(order, -1).max(d, keepdim=True)
        chosen = hits.logical_and(order.eq(last))
        new = chosen._pick(vals._broadcast_to(hits.shape), d)
        return written.where(self._from_index_layout(new, d), self)

    @concrete_sizes("scatter_reduce")
    def scatter_reduce(
        self: Tensor, dim: int, index: Tensor, src: Any, reduce: str, include_self: bool = True
    ) -> Tensor:
        """Combine `src` into self at `index` along `dim` with reduce "sum", "prod", "mean", "amax" or "amin", as
        torch.scatter_reduce (include_self=False leaves the existing values out where something is written)."""
        d = self._check_index_shape(dim, index, "scatter_reduce")
        hits, vals, written = self._scatter_parts(d, index, src, "scatter_reduce")
        vals = vals._broadcast_to(hits.shape)
        dt = self.dtype
        if reduce in ("sum", "mean"):
            acc = hits.where(vals, 0).sum(d, dtype=dt)
            out = self._from_index_layout(acc, d)
            if include_self:
                out = out + self
            if reduce == "mean":
                count = self._from_index_layout(hits.sum(d, dtype=dtypes.int32), d) + int(include_self)
                count = count.maximum(1).cast(dt)
                out = out / count if dtypes.is_float(dt) else out.floordiv(count)
        elif reduce == "prod":
            out = self._from_index_layout(hits.where(vals, 1)._reduce(Ops.MUL, d, False), d)
            if include_self:
                out = out * self
        elif reduce in ("amax", "amin"):
            lo_hi = dtypes.min(dt) if reduce == "amax" else dtypes.max(dt)
            picked = hits.where(vals, lo_hi)
            acc = picked.max(d) if reduce == "amax" else picked.min(d)
            out = self._from_index_layout(acc, d)
            if include_self:
                out = out.maximum(self) if reduce == "amax" else out.minimum(self)
        else:
            raise InputError(f"scatter_reduce reduce must be sum, prod, mean, amax or amin, got {reduce!r}")
        return written.where(out.cast(dt), self)

    # *** selections with data-dependent shapes and one-hot ***

    @concrete_sizes("masked_select")
    def masked_select(self: Tensor, mask: Tensor, size: int | None = None, fill_value: Any = 0) -> Tensor:
        """The elements where `mask` (broadcast with self) is true, as a 1-d tensor. Without `size` that reads the
        mask back (the length depends on it); with `size` nothing is read: the first `size` selected elements, then
        `fill_value` up to `size` (JAX's `size=` argument), so the result can stay lazy and inside a TinyJit."""
        x, m = self._broadcasted_pair(mask)
        if size is None:
            return x.flatten()[m.flatten()]
        return x.flatten()._first_selected(m.flatten(), size, fill_value)

    def _first_selected(self: Tensor, m: Tensor, size: int, fill_value: Any) -> Tensor:
        """Of 1-d self, the elements where 1-d bool `m` is true, in order, as (size,): each output k sums the one
        element whose running count of true values is k + 1 (an (size, n) comparison, no data-dependent shape)."""
        if size < 0:
            raise InputError(f"size must be non-negative, got {size}")
        n = self.shape[0]
        rank = m.cast(dtypes.int32).cumsum().cast(dtypes.int32) - 1  # position of each selected element
        k = type(self).arange(size, dtype=dtypes.int32, device=self.device).reshape(size, 1)
        hit = m.reshape(1, n).logical_and(rank.reshape(1, n).eq(k))
        found = hit.any(-1)
        picked = hit.where(self.reshape(1, n), 0).sum(-1).cast(self.dtype)
        return found.where(picked, type(self)(fill_value, device=self.device, dtype=self.dtype))

    def _broadcasted_pair(self: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        from lazygrad.tensor import _broadcast_shape

        shape = _broadcast_shape(self.shape, mask.shape)
        return self._broadcast_to(shape), mask.bool()._broadcast_to(shape)

    @concrete_sizes("nonzero")
    def nonzero(self: Tensor, size: int | None = None, fill_value: int = 0) -> Tensor:
        """The indices of the nonzero elements, shape (count, ndim), int64. Without `size` that reads the values back;
        with `size` the shape is (size, ndim): the first `size` indices, then rows of `fill_value` (JAX's `size=`),
        computed lazily."""
        if size is not None:
            if size < 0:
                raise InputError(f"size must be non-negative, got {size}")
            if self.ndim == 0 or self.numel() == 0:
                return type(self).full((size, self.ndim), fill_value, dtype=dtypes.int64, device=self.device)
            flat = type(self).arange(self.numel(), dtype=dtypes.int64, device=self.device)
            first = flat._first_selected(self.flatten().ne(0), size, -1)
            strides = [math.prod(self.shape[d + 1 :]) for d in range(self.ndim)]
            out = type(self).stack(*((first // strides[d]) % self.shape[d] for d in range(self.ndim)), dim=-1)
            return (first.reshape(size, 1) < 0).where(fill_value, out)
        pos = np.stack(np.nonzero(self.numpy()), axis=-1) if self.ndim else np.zeros((int(self.item() != 0), 0))
        return type(self)(pos.astype(np.int64).reshape(-1, self.ndim), device=self.device)

    def one_hot(self: Tensor, num_classes: int = -1) -> Tensor:
        """One-hot int64 vectors of an integer tensor's values in a new last dimension (num_classes=-1: the largest
        value + 1, which reads the values back)."""
        if not _is_int_tensor(self):
            raise KindError(f"one_hot needs an integer tensor, got {self.dtype!r}")
        return self._one_hot(num_classes, "one_hot")

    def _one_hot(self: Tensor, num_classes: int, what: str) -> Tensor:
        if num_classes == -1:
            num_classes = int(self.max().item()) + 1 if self.numel() else 0
        record_index_check(f"{what} with {num_classes} classes", self, 0, num_classes)
        arange = type(self).arange(num_classes, dtype=self.dtype, device=self.device)
        return self.unsqueeze(-1).eq(arange).cast(dtypes.int64)
