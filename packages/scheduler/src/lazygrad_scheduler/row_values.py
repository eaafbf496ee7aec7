"""Kernels that compute a row's values one after another: a reduction whose source reads an earlier reduction over
the same rows (softmax's max under its sum of exponentials, layernorm's mean under its variance) runs in the kernel
of the later one, which stores both.

`kernelize` stores a reduction that another reduction reads broadcast back over its rows (its kernel can't loop over
a row inside a loop over the same row); each such value then cost a kernel of its own that reads the whole row.
`merge_row_values` puts the kernel of such a stored value (a *row value*: one element per row, computed from the rows
by reductions with the same shape and axes, or elementwise from other row values) into the kernel of a reduction
that reads it, when every read there is either the row value broadcast along the reduced axes inside a reduction,
or the value itself (reshaped) in the kernel's output. Codegen (`lazygrad_codegen.lowerer`) then runs the
reductions' loops over the row one after another in one kernel, on GPUs with the same workgroup per row, each
reduction's result broadcast to every thread of the row before the next loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from lazygrad_scheduler.kernelize import _Group, _root_value, max_numel
from lazygrad_uop.ops import Ops
from lazygrad_uop.shape import shape_of
from lazygrad_uop.tensor_graph import MOVEMENT, apply_movement, view_base
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker

# roots a kernel can compute inside another one: what `_AstBuilder.node` builds from the node itself
_NOT_INLINED = frozenset({Ops.ASSIGN, Ops.COPY, Ops.CONTIGUOUS})


def _reads_row_value(root_value: UOp, members: set[UOp], value: UOp, sig: tuple) -> bool:
    """Whether every read of `value` in the kernel computing `root_value` (its fused `members`) is one a kernel
    computing `value` too can lower: inside a reduction with signature `sig` (full shape, axes), the value broadcast
    along the reduced axes; outside, the value reshaped."""
    found = False
    stack: list[tuple[UOp, bool, tuple[UOp, ...]]] = [(root_value, False, ())]
    seen: set[tuple[UOp, bool, tuple[UOp, ...]]] = set()
    while stack:
        item = stack.pop()
        if item in seen:
            continue
        seen.add(item)
        u, in_reduce, moves = item
        if u is value:
            found = True
            ops = list(reversed(moves))  # leaf first
            if in_reduce:
                full, axes = sig
                reduced = tuple(1 if i in axes else d for i, d in enumerate(full))
                got = apply_movement(ShapeTracker.from_shape(shape_of(value)), ops)
                if got != ShapeTracker.from_shape(reduced).expand(full):
                    return False
            elif any(m.op is not Ops.RESHAPE for m in ops):
                return False
            continue
        if u is not root_value and u not in members:
            continue
        if u.op is Ops.REDUCE_AXIS:
            stack.append((u.src[0], True, ()))
        elif u.op in MOVEMENT:
            stack.append((u.src[0], in_reduce, (*moves, u)))
        else:
            stack.extend((s, in_reduce, moves) for s in u.src if s.op is not Ops.DEVICE)
    return found


def _joint(a: tuple[tuple | None, int], b: tuple[tuple | None, int]) -> tuple | None:
    """The reduction signature of two kernels of row values (`_Merger._row_kind`) merged: the same shape, at least
    one reduction, all over the same rows; None when they don't merge."""
    if a[1] != b[1] or (a[0] is not None and b[0] is not None and a[0] != b[0]):
        return None
    return a[0] if a[0] is not None else b[0]


def merge_row_values(
    kernels: list[list[UOp]], groups: Mapping[UOp, _Group], direct: Mapping[UOp, set[UOp]]
) -> list[list[UOp]]:
    """`kernels` (lists of roots, producers first) with the kernels of row values moved into the kernel that reads
    them, and kernels of row values over the same rows that don't need each other merged into one where they read a
    common input or one kernel reads both (their reductions then share the loops over the row). `groups` maps each
    root to its `_Group`, `direct` each root to the roots it reads."""
    return _Merger(kernels, groups, direct).run()


class _Merger:
    """The state of `merge_row_values`: which kernel each root is in now, each kernel's kind (`_row_kind`), inputs
    and the kernels it reads (cached; a merge forgets the dependencies, which it changes for the kernels reading it)."""

    def __init__(self, kernels: list[list[UOp]], groups: Mapping[UOp, _Group], direct: Mapping[UOp, set[UOp]]) -> None:
        self.kernels = [list(k) for k in kernels]
        self.groups, self.direct = groups, direct
        self.home = {r: i for i, k in enumerate(self.kernels) for r in k}
        self.kinds = [self._row_kind(k) for k in self.kernels]
        self.rows = [i for i, kind in enumerate(self.kinds) if kind is not None]
        self.inputs: dict[int, set[UOp]] = {}
        self.deps: dict[int, set[int]] = {}

    def run(self) -> list[list[UOp]]:
        for i in self.rows:
            while (j := self._partner(i)) is not None:
                self.kernels[i] = self.kernels[j] + self.kernels[i]
                for r in self.kernels[j]:
                    self.home[r] = i
                self.kernels[j] = []
                self.kinds[i], self.kinds[j] = self._row_kind(self.kernels[i]), None
                self.inputs.pop(i, None)
                self.deps.clear()
        return [k for k in self.kernels if k]

    def _partner(self, i: int) -> int | None:
        """An earlier kernel to merge into kernel `i`: one whose row values it reads, or a sibling."""
        kind = self.kinds[i]
        # only a kernel with a reduction takes others in: one of elementwise values of rows reads them as it would
        # read any stored value (a reduction's elementwise consumers stay out of its kernel, as they did)
        if kind is None or kind[0] is None:
            return None
        read = self._deps(i)
        for j in sorted(read):
            other = self.kinds[j]
            if other is None or (sig := _joint(kind, other)) is None or not self._reads_only_rows(j, i, sig):
                continue
            if not self._path_through_other(i, j) and not self._path_through_other(j, i):
                return j
        for j in self.rows:
            if j >= i:
                break
            if j in read or self.kinds[j] != kind:
                continue
            if self._inputs(i).isdisjoint(self._inputs(j)) and not self._read_together(i, j):
                continue
            if not self._path_through_other(i, j, direct_too=True) and not self._path_through_other(
                j, i, direct_too=True
            ):
                return j
        return None

    def _read_together(self, i: int, j: int) -> bool:
        """Whether some kernel reads both kernel `i` and kernel `j` (log_softmax's backward: the sum of the incoming
        gradient and the max and sum of exponentials of the input, both read by the gradient's kernel)."""
        return any(i in self._deps(k) and j in self._deps(k) for k, roots in enumerate(self.kernels) if roots)

    def _inputs(self, i: int) -> set[UOp]:
        if i not in self.inputs:
            self.inputs[i] = {view_base(x) for r in self.kernels[i] for x in self.groups[r].leaves}
        return self.inputs[i]

    def _row_kind(self, kernel: list[UOp]) -> tuple[tuple | None, int] | None:
        """(reduction signature or None, element count) of a kernel whose roots, all of one size, are computed (not
        ASSIGN, COPY or CONTIGUOUS) by reductions of one signature, or elementwise (None); None for any other
        kernel."""
        # (an in-place update stays a kernel of its own: what it may read of its target is decided for it alone)
        if not kernel or any(r not in self.groups or r.op in _NOT_INLINED for r in kernel):
            return None
        # (each output is stored in the kernel's output shape, the reduced shape: a reshape of it is as good)
        if len(shapes := {max_numel(shape_of(r)) for r in kernel}) != 1:
            return None
        sigs = {self.groups[r].reduce_sig for r in kernel} - {None}
        if len(sigs) > 1:
            return None
        return next(iter(sigs), None), shapes.pop()

    def _reads_only_rows(self, j: int, i: int, sig: tuple) -> bool:
        """Whether every read of kernel `j`'s roots in kernel `i` is one a kernel computing them too can lower."""
        for r2 in self.kernels[i]:
            g2 = self.groups[r2]
            for r1 in self.kernels[j]:
                if r1 in g2.leaves and not _reads_row_value(_root_value(r2), g2.members, r1, sig):
                    return False
        return True

    def _deps(self, i: int) -> set[int]:
        if i not in self.deps:
            read = {self.home[x] for r in self.kernels[i] for x in self.direct.get(r, ()) if x in self.home}
            self.deps[i] = read - {i}
        return self.deps[i]

    def _path_through_other(self, start: int, end: int, direct_too: bool = False) -> bool:
        """Whether kernel `start` needs kernel `end` through some third kernel (or at all, with `direct_too`): merged,
        they would need that kernel and it them."""
        stack = [d for d in self._deps(start) if d != end]
        if direct_too and end in self._deps(start):
            return True
        seen = set(stack)
        while stack:
            k = stack.pop()
            for d in self._deps(k):
                if d == end:
                    return True
                if d not in seen and d != start:
                    seen.add(d)
                    stack.append(d)
        return False
