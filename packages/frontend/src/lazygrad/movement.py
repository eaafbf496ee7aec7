"""Movement ops of `Tensor` built from the primitive ones (reshape, expand, permute, pad, shrink, flip): joining and
splitting, repeating, rolling, diagonals, triangles, and the non-constant padding modes. None of them computes; they
only change which element is read where (cat adds zero-padded pieces, which fuse into the kernel that reads them)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from lazygrad.errors import InputError, KindError, RangeError, UnknownModeError
from lazygrad_uop.dtype import least_upper_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

_F = TypeVar("_F", bound=Callable[..., Any])


def _check_axis_type(axis: Any) -> None:
    """An axis (dimension) argument must be an int: a tensor, float or bool there is a mistake (e.g. a tensor passed
    where `dim` goes), which comparisons would otherwise turn into a tensor or a silently truncated number."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise KindError(f"a dimension must be an int, got {type(axis).__name__} {axis!r}")


def _axis(axis: int, ndim: int) -> int:
    _check_axis_type(axis)
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise RangeError(f"dimension {axis} is out of range for a tensor with {ndim} dimensions")
    return axis % max(ndim, 1)


def always_le(a: Any, b: Any) -> bool:
    """a <= b for every value the variables in these sizes may be bound to, not only the bound one: one kernel serves
    every value in the variables' bounds (the JIT replays it with new ones without running Python), so a view is
    memory-safe only when it fits for all of them."""
    if not isinstance(a, UOp) and not isinstance(b, UOp):
        return a <= b
    return (b - a).simplify().vmin >= 0


def show_sizes(x: Any) -> str:
    """Sizes (nested in tuples) for error messages, symbolic ones rendered as expressions rather than graphs."""
    if isinstance(x, UOp):
        return x.render()
    if isinstance(x, (tuple, list)):
        return "(" + ", ".join(map(show_sizes, x)) + ("," if len(x) == 1 else "") + ")"
    return repr(x)


def symbolic_bounds(*sizes: Any) -> str:
    """The variables of symbolic `sizes` with their bounds, for error messages: "n in [1, 40]"."""
    found = {u.src[0] if u.op is Ops.BIND else u for s in sizes if isinstance(s, UOp) for u in s.toposort}
    names = sorted(f"{v.arg[0]} in [{v.arg[1]}, {v.arg[2]}]" for v in found if v.op is Ops.DEFINE_VAR)
    return ", ".join(names) or "no variables"


def concrete_sizes(op: str) -> Callable[[_F], _F]:
    """Mark an op that needs int sizes: called with a tensor (self included) that has a symbolic dim, it raises a
    NotImplementedError naming `op` and that dim, where it would otherwise fail somewhere inside."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            for a in (*args, *kwargs.values()):
                shape = getattr(a, "shape", None) if hasattr(a, "uop") else None
                for i, d in enumerate(shape or ()):
                    if isinstance(d, UOp):
                        raise NotImplementedError(
                            f"{op} needs int sizes, but dimension {i} of its argument of shape {show_sizes(shape)} is "
                            f"symbolic ({symbolic_bounds(d)}); pad it to its largest value (an int size) first"
                        )
            return fn(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return wrap


def _simplified(size: Any) -> Any:
    """A size in the symbolic engine's canonical form (an int when it folds to one), so that equal symbolic sizes
    built different ways are one expression."""
    return size.ssimplify() if isinstance(size, UOp) else size


def _tensors(first: Any, rest: Sequence[Any], dim: int | None, what: str) -> tuple[list[Tensor], int | None]:
    """The tensors and dimension of `Tensor.cat(a, b)`, `a.cat(b)`, `Tensor.cat([a, b])` and torch's
    `Tensor.cat([a, b], dim)` alike (dim None: the function takes no dimension)."""
    from lazygrad.tensor import Tensor

    if isinstance(first, (list, tuple)):
        if rest and dim is None:
            raise KindError(f"{what} takes one sequence of tensors or tensors as arguments, not both")
        if len(rest) > 1 or (rest and (isinstance(rest[0], bool) or not isinstance(rest[0], (int, np.integer)))):
            got = ", ".join(type(r).__name__ for r in rest)
            raise KindError(
                f"{what}(tensors, dim) takes one int dim after the sequence of tensors, got {got}; put every tensor "
                "in the sequence"
            )
        ts, dim = list(first), (rest[0] if rest else dim)
    else:
        ts = [first, *rest]
    for t in ts:
        if not isinstance(t, Tensor):
            raise KindError(f"{what} joins tensors, got a {type(t).__name__}")
    return ts, dim


def _groups(side: str) -> list[str | list[str]]:
    """The dims of one side of a rearrange pattern, a name or a parenthesized group: "b (h w) ..." -> ["b",
    ["h", "w"], "..."]."""
    out, group = [], None
    for tok in side.replace("(", " ( ").replace(")", " ) ").split():
        if tok == "(":
            if group is not None:
                raise InputError(f"rearrange groups can't nest: {side!r}")
            group = []
        elif tok == ")":
            if group is None:
                raise InputError(f"unbalanced ')' in rearrange pattern {side!r}")
            out.append(group)
            group = None
        elif group is not None:
            group.append(tok)
        else:
            out.append(tok)
    if group is not None:
        raise InputError(f"unbalanced '(' in rearrange pattern {side!r}")
    return out


def _with_ellipsis(groups: list[str | list[str]], ell: list[str]) -> list[list[str]]:
    """One list of names per dim, "..." replaced by the names of the dims it stands for: a dim each where it stands
    alone, one merged dim inside parentheses."""
    out: list[list[str]] = []
    for g in groups:
        if g == "...":
            out.extend([v] for v in ell)
        elif isinstance(g, str):
            out.append([g])
        else:
            out.append([v for t in g for v in (ell if t == "..." else [t])])
    return out


def _sizes(shape: Any) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(s) for s in shape)


class MovementMixin:
    """Movement ops of `Tensor` (mixed into it; see `lazygrad.tensor`)."""

    __slots__ = ()

    # *** joining and splitting ***

    def cat(self: Tensor, *others: Tensor, dim: int = 0) -> Tensor:
        """The tensors joined along `dim` (types promoted as in torch.cat); `Tensor.cat([a, b])` works too."""
        ts, dim = _tensors(self, others, dim, "cat")
        if not ts:
            raise InputError("cat needs at least one tensor")
        first = ts[0]
        d = _axis(dim, first.ndim)
        dt = least_upper_dtype(*(t.dtype for t in ts))
        for t in ts:
            if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d):
                raise InputError(f"cat needs equal shapes except in dimension {d}, got {[t.shape for t in ts]}")
        ts = [t.cast(dt) for t in ts]
        if len(ts) == 1:
            return ts[0]
        total = _simplified(sum(t.shape[d] for t in ts))
        out, offset = None, 0
        for t in ts:
            pad = [(0, 0)] * t.ndim
            pad[d] = (offset, _simplified(total - offset - t.shape[d]))
            offset = _simplified(offset + t.shape[d])
            pairs = tuple(pad)
            piece = t._padded(pairs)
            # each position is covered by exactly one piece: later pieces select their own range over what came
            # before (adding zero-padded pieces instead would turn -0.0 into +0.0; a padded-away region may hold
            # anything, since a later piece always covers it)
            out = piece if out is None else t._padding_mask(pairs).where(piece, out)
        assert out is not None
        return out

    def stack(self: Tensor, *others: Tensor, dim: int = 0) -> Tensor:
        """The tensors (of one shape) stacked along a new dimension `dim`; `Tensor.stack([a, b])` works too."""
        ts, dim = _tensors(self, others, dim, "stack")
        if not ts:
            raise InputError("stack needs at least one tensor")
        if any(t.shape != ts[0].shape for t in ts):
            raise InputError(f"stack needs tensors of one shape, got {[t.shape for t in ts]}")
        d = _axis(dim, ts[0].ndim + 1)
        return ts[0].unsqueeze(d).cat(*(t.unsqueeze(d) for t in ts[1:]), dim=d)

    @concrete_sizes("split")
    def split(self: Tensor, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        """Pieces along `dim`: of `sizes` each (the last may be smaller), or of the listed sizes."""
        d = _axis(dim, self.ndim)
        n = self.shape[d]
        if isinstance(sizes, int):
            if sizes <= 0:
                raise InputError(f"split size must be positive, got {sizes}")
            sizes = [min(sizes, n - i) for i in range(0, n, sizes)] or [0]
        if sum(sizes) != n:
            raise InputError(f"split sizes {list(sizes)} don't add up to dimension {d}'s size {n}")
        out, start = [], 0
        for s in sizes:
            box: list[tuple[int, int] | None] = [None] * self.ndim
            box[d] = (start, start + s)
            out.append(self.shrink(box))
            start += s
        return tuple(out)

    @concrete_sizes("chunk")
    def chunk(self: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        """Split into `chunks` pieces of ceil(size / chunks) (fewer when they run out, as in torch.chunk)."""
        if chunks <= 0:
            raise InputError(f"chunk needs a positive number of chunks, got {chunks}")
        n = self.shape[_axis(dim, self.ndim)]
        return self.split(max(math.ceil(n / chunks), 1), dim)

    def unbind(self: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
        """The slices along `dim`, each without that dimension."""
        d = _axis(dim, self.ndim)
        return tuple(t.squeeze(d) for t in self.split(1, d)) if self.shape[d] else ()

    def meshgrid(self: Tensor, *others: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
        """Coordinate grids of 1-d tensors, as torch.meshgrid ("ij": matrix indexing, "xy": Cartesian)."""
        ts, _ = _tensors(self, others, None, "meshgrid")
        if indexing not in ("ij", "xy"):
            raise InputError(f"meshgrid indexing must be 'ij' or 'xy', got {indexing!r}")
        if indexing == "xy" and len(ts) >= 2:
            ts[0], ts[1] = ts[1], ts[0]
        shape = tuple(t.numel() for t in ts)
        grids = []
        for i, t in enumerate(ts):
            view = [1] * len(ts)
            view[i] = shape[i]
            grids.append(t.reshape(view).expand(shape))
        if indexing == "xy" and len(ts) >= 2:
            grids[0], grids[1] = grids[1], grids[0]
        return tuple(grids)

    # *** repeating and rolling ***

    def repeat(self: Tensor, *repeats: Any) -> Tensor:
        """The tensor tiled `repeats[i]` times along each dimension (extra leading repeats add dimensions), as
        torch.Tensor.repeat."""
        reps = _sizes(repeats)
        if len(reps) < self.ndim:
            raise InputError(f"repeat needs at least {self.ndim} repeat counts for shape {self.shape}, got {reps}")
        if any(r < 0 for r in reps):
            raise InputError(f"repeat counts must be non-negative, got {reps}")
        base = self.reshape((1,) * (len(reps) - self.ndim) + self.shape)
        interleaved = tuple(v for d in base.shape for v in (1, d))
        expanded = tuple(v for r, d in zip(reps, base.shape) for v in (r, d))
        return base.reshape(interleaved).expand(expanded).reshape(tuple(r * d for r, d in zip(reps, base.shape)))

    def tile(self: Tensor, *dims: Any) -> Tensor:
        """As repeat, but fewer counts than dimensions repeat the last ones (torch.tile)."""
        reps = _sizes(dims)
        return self.repeat((1,) * (self.ndim - len(reps)) + reps)

    def repeat_interleave(self: Tensor, repeats: int, dim: int | None = None) -> Tensor:
        """Each element repeated `repeats` times in a row along `dim` (the flattened tensor if dim is None)."""
        x = self.flatten() if dim is None else self
        d = 0 if dim is None else _axis(dim, x.ndim)
        shape = x.shape
        expanded = shape[: d + 1] + (repeats,) + shape[d + 1 :]
        out = x.unsqueeze(d + 1).expand(expanded)
        return out.reshape(shape[:d] + (shape[d] * repeats,) + shape[d + 1 :])

    @concrete_sizes("roll")
    def roll(self: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """Elements shifted cyclically by `shifts` along `dims` (the flattened tensor if dims is None)."""
        if dims is None:
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(shifts) != len(dims):
            raise InputError(f"roll needs one shift per dimension, got shifts {shifts} and dims {dims}")
        out = self
        for s, dim in zip(shifts, dims):
            d = _axis(dim, self.ndim)
            n = self.shape[d]
            if n == 0 or s % n == 0:
                continue
            head, tail = out.split([n - s % n, s % n], d)
            out = tail.cat(head, dim=d)
        return out

    # *** shapes ***

    def unflatten(self: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
        """Dimension `dim` split into `sizes` (one may be -1)."""
        d = _axis(dim, self.ndim)
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1 :])

    def movedim(self: Tensor, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
        """Dimensions `source` moved to positions `destination`, the others keeping their order."""
        src = [_axis(s, self.ndim) for s in ((source,) if isinstance(source, int) else source)]
        dst = [_axis(s, self.ndim) for s in ((destination,) if isinstance(destination, int) else destination)]
        if len(src) != len(dst):
            raise InputError(f"movedim needs as many sources as destinations, got {src} and {dst}")
        rest = iter(i for i in range(self.ndim) if i not in src)
        placed = dict(zip(dst, src))
        return self.permute([placed[i] if i in placed else next(rest) for i in range(self.ndim)])

    def moveaxis(self: Tensor, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
        """Alias of movedim."""
        return self.movedim(source, destination)

    def swapaxes(self: Tensor, axis0: int, axis1: int) -> Tensor:
        """Alias of transpose."""
        return self.transpose(axis0, axis1)

    def expand_as(self: Tensor, other: Tensor) -> Tensor:
        """expand(other.shape)."""
        return self.expand(other.shape)

    def reshape_as(self: Tensor, other: Tensor) -> Tensor:
        """reshape(other.shape)."""
        return self.reshape(other.shape)

    @concrete_sizes("unfold")
    def unfold(self: Tensor, dim: int, size: int, step: int) -> Tensor:
        """The windows of `size` elements every `step` along `dim`: that dim counts the windows and a new last dim
        holds each window, as torch.Tensor.unfold."""
        d = _axis(dim, self.ndim)
        if size > self.shape[d] or size < 0 or step <= 0:
            raise InputError(f"unfold of size {size}, step {step} doesn't fit dimension {d} of size {self.shape[d]}")
        if size == 0:
            # (n // step + 1) empty windows, as torch: nothing to read, but still a view of self (for autograd)
            shape = (*self.shape[:d], self.shape[d] // step + 1, *self.shape[d + 1 :], 0)
            return self.shrink(tuple((0, 0) if i == d else None for i in range(self.ndim))).reshape(shape)
        return self.movedim(d, -1)._pool((size,), (step,), (1,)).movedim(-2, d)

    @concrete_sizes("rearrange")
    def rearrange(self: Tensor, formula: str, **sizes: int) -> Tensor:
        """einops-style rearrangement: "b c (h w) -> b h w c", with `sizes` for split groups (h=4), "1" for a unit
        dimension and "..." for the dimensions the pattern doesn't name."""
        lhs, arrow, rhs = formula.partition("->")
        if not arrow:
            raise InputError(f"rearrange formula {formula!r} needs '->'")
        left, right = _groups(lhs), _groups(rhs)
        n_ell = self.ndim - sum(1 for g in left if g != "...")
        ell = [f"...{i}" for i in range(max(n_ell, 0))]
        left, right = _with_ellipsis(left, ell), _with_ellipsis(right, ell)
        if len(left) != self.ndim:
            raise InputError(f"rearrange pattern {lhs.strip()!r} doesn't describe {self.ndim} dimensions")
        known = dict(sizes)
        for g, n in zip(left, self.shape):
            missing = [v for v in g if v != "1" and v not in known]
            if len(missing) > 1:
                raise InputError(f"rearrange can't split a dimension of {n} into {g}: give all sizes but one")
            for v in missing:
                known[v] = n // max(math.prod(known[w] for w in g if w not in ("1", v)), 1)
            if math.prod(known[v] for v in g if v != "1") != n:
                raise InputError(f"rearrange group {g} doesn't multiply to the dimension's size {n}")
        src = [v for g in left for v in g if v != "1"]
        dst = [v for g in right for v in g if v != "1"]
        if sorted(src) != sorted(dst) or len(set(src)) != len(src):
            raise InputError(f"rearrange needs each name once on both sides, got {src} and {dst}")
        x = self.reshape([known[v] for v in src]).permute([src.index(v) for v in dst])
        return x.reshape([math.prod(known[v] for v in g if v != "1") for g in right])

    # *** diagonals and triangles ***

    @concrete_sizes("diagonal")
    def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The diagonal of dims (dim1, dim2), `offset` above the main one, as a last dimension (torch.diagonal)."""
        a, b = _axis(dim1, self.ndim), _axis(dim2, self.ndim)
        if a == b:
            raise InputError(f"diagonal needs two different dimensions, got {dim1} and {dim2}")
        x = self.movedim((a, b), (-2, -1))
        rows, cols = x.shape[-2:]
        r0, c0 = max(-offset, 0), max(offset, 0)
        n = max(0, min(rows - r0, cols - c0))
        lead = x.shape[:-2]
        if n == 0:
            return x.shrink(tuple((0, d) for d in lead) + ((0, 0), (0, 0))).reshape(*lead, 0)
        sq = x.shrink(tuple((0, d) for d in lead) + ((r0, r0 + n), (c0, c0 + n))).reshape(*lead, n * n)
        # rows of n + 1 elements start each at the next diagonal element
        padded = sq.pad(tuple((0, 0) for _ in lead) + ((0, n),)).reshape(*lead, n, n + 1)
        return padded.shrink(tuple((0, d) for d in lead) + ((0, n), (0, 1))).reshape(*lead, n)

    def diag(self: Tensor, diagonal: int = 0) -> Tensor:
        """A 1-d tensor as the diagonal of a square matrix, or the diagonal of a 2-d one (torch.diag)."""
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise InputError(f"diag needs a 1-d or 2-d tensor, got shape {self.shape}")
        n, k = self.shape[0], abs(diagonal)
        if n == 0:
            return type(self).zeros(k, k, dtype=self.dtype, device=self.device)
        # rows of n + 1 elements, each the value and n zeros, flattened: the value lands on the next diagonal element
        m = self.reshape(n, 1).pad(((0, 0), (0, n))).reshape(n * (n + 1)).shrink(((0, n * n),)).reshape(n, n)
        return m.pad(((0, k), (k, 0)) if diagonal > 0 else ((k, 0), (0, k)))

    def _triangle_mask(self: Tensor, diagonal: int, upper: bool) -> Tensor:
        if self.ndim < 2:
            raise InputError(f"triu/tril need at least 2 dimensions, got shape {self.shape}")
        rows, cols = self.shape[-2:]
        arange = type(self).arange
        r = arange(rows, device=self.device).reshape(rows, 1)
        c = arange(cols, device=self.device).reshape(1, cols)
        return (c - r >= diagonal) if upper else (c - r <= diagonal)

    def triu(self: Tensor, diagonal: int = 0) -> Tensor:
        """The upper triangle of the last two dims (elements with column - row >= diagonal), zeros elsewhere."""
        return self._triangle_mask(diagonal, True).where(self, self.zeros_like())

    def tril(self: Tensor, diagonal: int = 0) -> Tensor:
        """The lower triangle of the last two dims (elements with column - row <= diagonal), zeros elsewhere."""
        return self._triangle_mask(diagonal, False).where(self, self.zeros_like())

    def masked_fill(self: Tensor, mask: Tensor, value: Any) -> Tensor:
        """`value` where `mask` is true, the tensor elsewhere (keeping this tensor's dtype)."""
        fill = value.cast(self.dtype) if isinstance(value, type(self)) else self._const_like(value)
        return mask.bool().where(fill, self)

    # *** padding modes ***

    def _pad_mode(self: Tensor, pairs: tuple[tuple[int, int], ...], mode: str) -> Tensor:
        """Padding that repeats the tensor's own elements: reflect, replicate or circular (torch.nn.functional.pad)."""
        if mode not in ("reflect", "replicate", "circular"):
            raise UnknownModeError(f"pad mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
        x = self
        for d, (before, after) in enumerate(pairs):
            crop = (max(0, -before), max(0, -after))
            before, after = max(before, 0), max(after, 0)
            if mode == "circular" and any(crop):
                # negative circular padding crops first, as with constant padding (as torch does)
                x = x.shrink(tuple((crop[0], n - crop[1]) if i == d else None for i, n in enumerate(x.shape)))
                crop = (0, 0)
            x = x._pad_mode_dim(d, before, after, mode)
            if any(crop):
                # reflect and replicate reflect or repeat the whole input, then crop the result, as torch does
                x = x.shrink(tuple((crop[0], n - crop[1]) if i == d else None for i, n in enumerate(x.shape)))
        return x

    def _pad_mode_dim(self: Tensor, d: int, before: int, after: int, mode: str) -> Tensor:
        """Pad dimension `d` by non-negative amounts with reflect, replicate or circular."""
        x = self
        if not before and not after:
            return x
        n = x.shape[d]
        if mode == "circular" and n and max(before, after) > n:
            # wraps around more than once: the periodic extension, from enough copies of x side by side
            reps = -(-max(before, after) // n)
            tiled = x.repeat(*(reps if i == d else 1 for i in range(x.ndim)))
            m = tiled.shape[d]
            left = tiled.shrink(tuple((m - before, m) if i == d else None for i in range(x.ndim)))
            right = tiled.shrink(tuple((0, after) if i == d else None for i in range(x.ndim)))
            return left.cat(x, right, dim=d)
        limit = n - 1 if mode == "reflect" else n
        if mode == "reflect" and (before > limit or after > limit):
            raise InputError(
                f"{mode} padding of ({before}, {after}) is too large for dimension {d} of size {n}: "
                f"it can be at most {limit}"
            )
        if n == 0:
            raise InputError(f"{mode} padding needs a non-empty dimension {d}")

        def part(start: int, stop: int, x: Tensor = x, d: int = d) -> Tensor:
            return x.shrink(tuple((start, stop) if i == d else None for i in range(x.ndim)))

        if mode == "reflect":
            left, right = part(1, before + 1).flip(d), part(n - 1 - after, n - 1).flip(d)
        elif mode == "replicate":
            edge_shape = list(x.shape)
            edge_shape[d] = before
            left = part(0, 1).expand(edge_shape)
            edge_shape[d] = after
            right = part(n - 1, n).expand(edge_shape)
        else:
            left, right = part(n - before, n), part(0, after)
        return left.cat(x, right, dim=d)
