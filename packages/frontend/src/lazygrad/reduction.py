"""Reductions of `Tensor` beyond sum/max/min/mean: statistics, softmax and logsumexp, scans (cumsum, cumprod,
cummax, ...), arg-extremes, sorting, top-k and einsum.

Everything is REDUCE_AXIS over compositions of elementwise and movement ops:
- a scan of n elements reduces an (n, n) triangle of where-masked copies; long scans are split into blocks of about
  sqrt(n) scanned twice, so the work stays O(n sqrt n);
- argmax finds the first position equal to the max with a reversed arange;
- sort and topk rank each element by counting the ones that go before it (an (n, n) comparison, stable, nan last
  as in torch), then place each by a one-hot match of its rank. That costs O(n^2) per row: fine for the sizes
  models sort (top-k logits, a few thousand), not for sorting millions of elements.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lazygrad.errors import InputError, RangeError
from lazygrad.movement import _check_axis_type, concrete_sizes
from lazygrad_uop.dtype import DType, dtypes, least_upper_float, sum_dtype, to_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

_SCAN_DIRECT = 256  # scans up to this length reduce one triangle; longer ones are blocked


def _axis(axis: int, ndim: int) -> int:
    _check_axis_type(axis)
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise RangeError(f"dimension {axis} is out of range for a tensor with {ndim} dimensions")
    return axis % max(ndim, 1)


def _before(p: Tensor, q: Tensor, descending: bool) -> Tensor:
    """p strictly before q in sorted order, nan counting as the largest value."""
    if descending:
        p, q = q, p
    less = p < q
    if dtypes.is_float(p.dtype):
        less = less.logical_or(q.isnan().logical_and(p.isnan().logical_not()))
    return less


def _same(p: Tensor, q: Tensor) -> Tensor:
    eq = p.eq(q)
    return eq.logical_or(p.isnan().logical_and(q.isnan())) if dtypes.is_float(p.dtype) else eq


_SCAN_IDENTITY = {"sum": 0, "prod": 1, "logsumexp": -math.inf}


class ReductionMixin:
    """Reductions of `Tensor` (mixed into it; see `lazygrad.tensor`)."""

    __slots__ = ()

    # *** truth ***

    def any(self: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """True where any element over `axis` is nonzero."""
        n = self.numel()
        # max has no value over nothing; a count of the true elements has (a symbolic size may be 0)
        return self.bool().max(axis, keepdim) if isinstance(n, int) and n else self.bool().sum(axis, keepdim).bool()

    def all(self: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """True where every element over `axis` is nonzero."""
        return self.logical_not().any(axis, keepdim).logical_not()

    def isclose(self: Tensor, other: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Tensor:
        """|self - other| <= atol + rtol * |other| elementwise, as torch.isclose (infinities equal themselves only)."""
        a, b = self._broadcasted(other)
        if not dtypes.is_float(a.dtype):
            return a.eq(b)
        # with an infinity the difference is inf or nan, and inf <= inf: only equal infinities are close
        within = ((a - b).abs() <= atol + rtol * b.abs()).logical_and(a.isfinite().logical_and(b.isfinite()))
        close = a.eq(b).logical_or(within)
        return close.logical_or(a.isnan().logical_and(b.isnan())) if equal_nan else close

    def allclose(self: Tensor, other: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
        """True when every element is close (see isclose); reads the result back."""
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    # *** statistics ***

    def _reduced_count(self: Tensor, axis: int | Sequence[int] | None, keepdim: bool) -> int | Tensor:
        """How many elements a reduction over `axis` combines: an int, or for a symbolic dim among them a float tensor
        shaped as `self.sum(axis, keepdim)`, whose value follows the variable's bound value."""
        axes = range(self.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
        dims = [self.shape[_axis(a, self.ndim)] for a in axes] if self.ndim else []
        if all(isinstance(d, int) for d in dims):
            return math.prod(dims)
        # a sum of ones over the same axes: the count is then computed in the kernel for whatever value the variable
        # is bound to (one compile for all), and it fuses into the kernel of the sum it divides
        ones = type(self).full(self.shape, 1.0, dtype=least_upper_float(self.dtype), device=self.device)
        return ones.sum(axis, keepdim)

    def var(
        self: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False, correction: float = 1
    ) -> Tensor:
        """Variance over `axis`, divided by (n - correction): 1 gives the unbiased estimate (torch's default)."""
        x = self.cast(least_upper_float(self.dtype))
        squares = (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim)
        n = x._reduced_count(axis, keepdim)
        return squares.div((n - correction).maximum(0) if isinstance(n, type(self)) else max(n - correction, 0))

    def std(
        self: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False, correction: float = 1
    ) -> Tensor:
        """Standard deviation over `axis` (see var)."""
        return self.var(axis, keepdim, correction).sqrt()

    def var_mean(
        self: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False, correction: float = 1
    ) -> tuple[Tensor, Tensor]:
        """(var, mean) over `axis`."""
        return self.var(axis, keepdim, correction), self.cast(least_upper_float(self.dtype)).mean(axis, keepdim)

    def std_mean(
        self: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False, correction: float = 1
    ) -> tuple[Tensor, Tensor]:
        """(std, mean) over `axis`."""
        return self.std(axis, keepdim, correction), self.cast(least_upper_float(self.dtype)).mean(axis, keepdim)

    # *** softmax family ***

    def _shifted_max(self: Tensor, axis: int | Sequence[int] | None) -> Tensor:
        """The max over `axis` (kept), without gradient, with infinities replaced by 0 so that x - max stays finite."""
        m = self.max(axis, keepdim=True).detach()
        return m.isinf().where(0.0, m)

    def logsumexp(self: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """log(sum(exp(x))) over `axis`, computed stably."""
        x = self.cast(least_upper_float(self.dtype))
        if isinstance(count := x._reduced_count(axis, keepdim), int) and count == 0:
            # the log of an empty sum, as torch (an empty axis has no max to shift by)
            return type(self).full(x.sum(axis, keepdim).shape, -math.inf, dtype=x.dtype, device=x.device)
        m = x._shifted_max(axis)
        out = (x - m).exp().sum(axis, keepdim=True).log() + m
        return out if keepdim else out.reshape(x.sum(axis).shape)

    def softmax(self: Tensor, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """exp(x) / sum(exp(x)) over `axis` (computed in `dtype` if given)."""
        x = self.cast(to_dtype(dtype)) if dtype is not None else self.cast(least_upper_float(self.dtype))
        if x.numel() == 0:
            # nothing to normalise (torch gives the empty tensor too); a max over an empty axis has no value
            return x
        e = (x - x.max(axis, keepdim=True).detach()).exp()
        return e / e.sum(axis, keepdim=True)

    def softmin(self: Tensor, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """softmax(-x) over `axis`, as torch.nn.functional.softmin (computed in `dtype` if given)."""
        x = self.cast(to_dtype(dtype)) if dtype is not None else self.cast(least_upper_float(self.dtype))
        return (-x).softmax(axis)

    def log_softmax(self: Tensor, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """x - logsumexp(x) over `axis` (computed in `dtype` if given)."""
        x = self.cast(to_dtype(dtype)) if dtype is not None else self.cast(least_upper_float(self.dtype))
        if x.numel() == 0:
            return x
        # (x - max) - log(sum): the shifted values keep their precision where x - logsumexp would round at the
        # magnitude of the max (log_softmax of [1000, 1001] to an ulp of 1001). The max itself, infinite or not
        # (a row of -inf, or one holding +inf, is NaN as in torch): codegen then computes the max and the sum in one
        # loop over the row (`lazygrad_codegen.online_reductions`)
        shifted = x - x.max(axis, keepdim=True).detach()
        return shifted - shifted.exp().sum(axis, keepdim=True).log()

    # *** scans ***

    def _scan_last(self: Tensor, kind: str) -> Tensor:
        """Inclusive scan along the last axis with "sum", "prod", "max" or "min"."""
        n = self.shape[-1]
        identity = _SCAN_IDENTITY.get(kind, dtypes.min(self.dtype) if kind == "max" else dtypes.max(self.dtype))
        if isinstance(n, UOp):
            # scanned at the largest size n can take, padded with the identity: the first n outputs don't see the
            # padding, and the int size picks the scan's strategy once for every value of n
            top, lead = int(n.vmax), self.shape[:-1]
            padded = self.pad(((0, 0),) * len(lead) + ((0, top - n),), value=identity)
            return padded._scan_last(kind).shrink(tuple((0, d) for d in lead) + ((0, n),))
        if n <= 1:
            return self
        if n <= _SCAN_DIRECT:
            arange = type(self).arange(n, device=self.device)
            tri = arange.reshape(1, n) <= arange.reshape(n, 1)  # [i, j]: element j counts toward output i
            window = tri.where(self.unsqueeze(-2), identity)
            return window._reduce_kind(kind, -1)
        block = math.isqrt(n - 1) + 1
        nb = math.ceil(n / block)
        lead = self.shape[:-1]
        x = self.pad(((0, 0),) * len(lead) + ((0, nb * block - n),), value=identity).reshape(*lead, nb, block)
        inner = x._scan_last(kind)
        totals = inner.shrink(tuple((0, d) for d in (*lead, nb)) + ((block - 1, block),)).reshape(*lead, nb)
        # what the blocks before each one contribute: an exclusive scan of the totals
        before = totals._scan_last(kind).pad(((0, 0),) * len(lead) + ((1, 0),), value=identity)
        before = before.shrink(tuple((0, d) for d in lead) + ((0, nb),)).unsqueeze(-1)
        combined = {"sum": inner + before, "prod": inner * before, "logsumexp": inner.logaddexp(before)}.get(kind)
        if combined is None:
            combined = inner.maximum(before) if kind == "max" else inner.minimum(before)
        return combined.reshape(*lead, nb * block).shrink(tuple((0, d) for d in lead) + ((0, n),))

    def _reduce_kind(self: Tensor, kind: str, axis: int) -> Tensor:
        if kind == "sum":
            return self._reduce(Ops.ADD, axis, False)
        if kind == "prod":
            return self._reduce(Ops.MUL, axis, False)
        if kind == "logsumexp":
            return self.logsumexp(axis)
        return self.max(axis) if kind == "max" else self.min(axis)

    def _scan(self: Tensor, kind: str, axis: int) -> Tensor:
        d = _axis(axis, self.ndim)  # a 0-d tensor takes axis 0 or -1, as in torch
        if self.ndim == 0:
            return self
        return self.movedim(d, -1)._scan_last(kind).movedim(-1, d)

    def cumsum(self: Tensor, axis: int = 0, dtype: DType | str | None = None) -> Tensor:
        """Running sum along `axis`; bools and integers sum to int64, half precision accumulates in float32."""
        if dtype is not None:
            out_dt = to_dtype(dtype)
        elif dtypes.is_int(self.dtype) or dtypes.is_bool(self.dtype):
            out_dt = dtypes.uint64 if self.dtype == dtypes.uint64 else dtypes.int64
        else:
            out_dt = self.dtype
        work = sum_dtype(out_dt)
        return self.cast(work)._scan("sum", axis).cast(out_dt)

    def cumprod(self: Tensor, axis: int = 0, dtype: DType | str | None = None) -> Tensor:
        """Running product along `axis`; bools and integers multiply in int64."""
        dt = to_dtype(dtype) if dtype is not None else dtypes.int64 if not dtypes.is_float(self.dtype) else self.dtype
        return self.cast(dt)._scan("prod", axis)

    def _cum_extreme(self: Tensor, axis: int, kind: str) -> tuple[Tensor, Tensor]:
        if self.numel() == 0:
            _axis(axis, self.ndim)
            return self, self.zeros_like(dtypes.int64)  # nothing to scan: empty values and indices, as torch
        values = self._scan(kind, axis)
        if self.ndim == 0:
            return values, type(self)(0, device=self.device, dtype=dtypes.int64)
        d = _axis(axis, self.ndim)
        n = self.shape[d]
        x, v = self.movedim(d, -1), values.movedim(d, -1)
        arange = type(self).arange(n, device=self.device)
        tri = arange.reshape(1, n) <= arange.reshape(n, 1)
        # the last position at or before i holding the running extreme (torch's tie rule)
        hit = tri.logical_and(_same(x.unsqueeze(-2), v.unsqueeze(-1)))
        idx = hit.where(arange.reshape(1, n), -1).max(-1)
        return values, idx.movedim(-1, d).cast(dtypes.int64)

    def cummax(self: Tensor, axis: int = 0) -> tuple[Tensor, Tensor]:
        """(running max, the index where it was last reached) along `axis`."""
        return self._cum_extreme(axis, "max")

    def cummin(self: Tensor, axis: int = 0) -> tuple[Tensor, Tensor]:
        """(running min, the index where it was last reached) along `axis`."""
        return self._cum_extreme(axis, "min")

    def logcumsumexp(self: Tensor, axis: int = 0) -> Tensor:
        """log(cumsum(exp(x))) along `axis`: a scan of logaddexp, so each prefix is shifted by its own max (one max
        for all would underflow the prefixes far below it: [0, 100] would lose the 0)."""
        return self.cast(least_upper_float(self.dtype))._scan("logsumexp", axis)

    # *** arg-extremes ***

    def _arg_extreme(self: Tensor, axis: int | None, keepdim: bool, largest: bool) -> Tensor:
        if axis is None:
            return self.flatten()._arg_extreme(0, False, largest)
        if self.ndim == 0:
            return type(self)(0, device=self.device, dtype=dtypes.int64)
        d = _axis(axis, self.ndim)
        n = self.shape[d]
        if n == 0:
            raise InputError(f"{'argmax' if largest else 'argmin'} of an empty dimension {d} has no answer")
        m = self.max(d, keepdim=True) if largest else self.min(d, keepdim=True)
        hit = self.eq(m)
        if dtypes.is_float(self.dtype):
            hit = hit.logical_or(self.isnan())  # a nan is the extreme (and the only kind equal to a nan max)
        # top - i at position i (top >= n, so every position counts): the max over the hits is the first of them;
        # a symbolic n counts down from its largest value, as the result must be an int expression of the tensor
        top = n if isinstance(n, int) else int(n.vmax)
        countdown = (top - type(self).arange(n, device=self.device)).reshape(n, *(1,) * (self.ndim - d - 1))
        first = hit.where(countdown, 0).max(d, keepdim)
        return (top - first).cast(dtypes.int64)

    def argmax(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """The index (int64) of the first largest element along `axis` (of the flattened tensor if None)."""
        return self._arg_extreme(axis, keepdim, True)

    def argmin(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """The index (int64) of the first smallest element along `axis` (of the flattened tensor if None)."""
        return self._arg_extreme(axis, keepdim, False)

    # *** sorting ***

    def _ranks(self: Tensor, descending: bool) -> Tensor:
        """The sorted position of each element along the last axis (stable: ties keep their order)."""
        n = self.shape[-1]
        mine, other = self.unsqueeze(-1), self.unsqueeze(-2)  # [..., i, j]: element i against element j
        arange = type(self).arange(n, device=self.device)
        earlier = arange.reshape(1, n) < arange.reshape(n, 1)
        goes_first = _before(other, mine, descending).logical_or(_same(other, mine).logical_and(earlier))
        return goes_first.sum(-1, dtype=dtypes.int32)

    def _by_rank(self: Tensor, k: int, descending: bool) -> tuple[Tensor, Tensor]:
        """The first `k` elements in sorted order along the last axis and their indices."""
        n = self.shape[-1]
        arange = type(self).arange
        place = self._ranks(descending).unsqueeze(-1).eq(arange(k, device=self.device))  # [..., i, r]
        values = place._pick(self.unsqueeze(-1), -2)
        indices = place._pick(arange(n, dtype=dtypes.int64, device=self.device).reshape(n, 1), -2)
        return values, indices

    def sort(self: Tensor, dim: int = -1, descending: bool = False, stable: bool = True) -> tuple[Tensor, Tensor]:
        """(sorted values, their original indices as int64) along `dim`; always stable, nan sorts last (first
        when descending), as torch.sort(stable=True)."""
        if self.ndim == 0:
            return self, type(self)(0, device=self.device, dtype=dtypes.int64)
        d = _axis(dim, self.ndim)
        x = self.movedim(d, -1)
        values, indices = x._by_rank(x.shape[-1], descending)
        return values.movedim(-1, d), indices.movedim(-1, d)

    def argsort(self: Tensor, dim: int = -1, descending: bool = False, stable: bool = True) -> Tensor:
        """The indices (int64) that sort the tensor along `dim`."""
        return self.sort(dim, descending, stable)[1]

    @concrete_sizes("topk")
    def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Tensor, Tensor]:
        """(the k largest (or smallest) values along `dim`, in order, and their indices as int64)."""
        if self.ndim == 0:
            if k > 1:
                raise InputError(f"topk k={k} is larger than the 1 element of a 0-d tensor")
            return self, type(self)(0, device=self.device, dtype=dtypes.int64)
        d = _axis(dim, self.ndim)
        if not 0 <= k <= self.shape[d]:
            raise InputError(f"topk k={k} is out of range for dimension {d} of size {self.shape[d]}")
        x = self.movedim(d, -1)
        values, indices = x._by_rank(k, largest)
        return values.movedim(-1, d), indices.movedim(-1, d)

    # *** einsum ***

    @staticmethod
    @concrete_sizes("einsum")
    def einsum(formula: str, *operands: Any, dtype: DType | str | None = None) -> Tensor:
        """Einstein summation, as torch.einsum: "ij,jk->ik", implicit outputs ("ij,jk"), "..." broadcasting and
        repeated labels within an operand (diagonals). Operands are multiplied out and summed in one reduction."""
        one_list = len(operands) == 1 and isinstance(operands[0], (list, tuple))
        ops: list[Tensor] = list(operands[0]) if one_list else list(operands)
        eq = formula.replace(" ", "")
        lhs, arrow, rhs = eq.partition("->")
        inputs = lhs.split(",")
        if len(inputs) != len(ops):
            raise InputError(f"einsum formula {formula!r} has {len(inputs)} operands, got {len(ops)} tensors")
        n_ell = 0
        for term, t in zip(inputs, ops):
            if "..." in term:
                n_ell = max(n_ell, t.ndim - len(term.replace("...", "")))
        ell = [chr(0x3B1 + i) for i in range(n_ell)]  # labels for the "..." dims, distinct from any ASCII letter
        labels: list[list[str]] = []
        for term, t in zip(inputs, ops):
            if "..." in term:
                head, _, tail = term.partition("...")
                k = t.ndim - len(head) - len(tail)
                labs = [*head, *ell[n_ell - k :], *tail]
            else:
                labs = list(term)
            if len(labs) != t.ndim or not all(c.isalpha() for c in labs):
                raise InputError(f"einsum term {term!r} doesn't describe a tensor of shape {t.shape}")
            labels.append(labs)
        if arrow:
            out = [*rhs.replace("...", "\0")]
            out = [c for o in out for c in (ell if o == "\0" else [o])]
        else:
            counts: dict[str, int] = {}
            for labs in labels:
                for c in labs:
                    if c not in ell:
                        counts[c] = counts.get(c, 0) + 1
            out = ell + sorted(c for c, k in counts.items() if k == 1)
        # repeated labels within one operand take its diagonal
        for i, (labs, t) in enumerate(zip(labels, ops)):
            while len(set(labs)) != len(labs):
                c = next(c for c in labs if labs.count(c) > 1)
                a = labs.index(c)
                b = labs.index(c, a + 1)
                t = t.diagonal(0, a, b)
                labs = [x for j, x in enumerate(labs) if j not in (a, b)] + [c]
            labels[i], ops[i] = labs, t
        sizes: dict[str, int] = {}
        for labs, t in zip(labels, ops):
            for c, s in zip(labs, t.shape):
                if sizes.get(c, 1) not in (1, s) and s != 1:
                    raise InputError(f"einsum label {c!r} has sizes {sizes[c]} and {s}")
                sizes[c] = max(sizes.get(c, 1), s)
        if any(c not in sizes for c in out) or len(set(out)) != len(out):
            raise InputError(f"einsum output {rhs!r} names a label no input has, or one twice")
        order = out + [c for c in sizes if c not in out]
        aligned = []
        for labs, t in zip(labels, ops):
            t = t.permute([labs.index(c) for c in order if c in labs])
            aligned.append(t.reshape([sizes[c] if c in labs else 1 for c in order]))
        prod = functools.reduce(lambda a, b: a * b, aligned)
        prod = prod._broadcast_to(tuple(sizes[c] for c in order))
        summed = tuple(range(len(out), len(order)))
        if dtype is None and not dtypes.is_float(prod.dtype):
            dtype = prod.dtype  # integer einsums keep their type, as in torch
        res = prod.sum(summed, dtype=dtype) if summed else prod
        return res.cast(to_dtype(dtype)) if dtype is not None else res
