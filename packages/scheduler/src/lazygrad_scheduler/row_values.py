"""Kernels that compute a row's values one after another: a reduction whose source reads an earlier reduction over
the same rows (softmax's max under its sum of exponentials, layernorm's mean under its variance) runs in the kernel
of the later one, which stores both.

`kernelize` stores a reduction that another reduction reads broadcast back over its rows (its kernel can't loop over
a row inside a loop over the same row); each such value then cost a kernel of its own that reads the whole row.
`merge_row_values` puts the kernel of such a stored value (a *row value*: one element per row, computed from the rows
by reductions with the same shape and axes, or elementwise from other row values) into the kernel that reads it,
when every read there is either the row value broadcast along the reduced axes inside a reduction, or the value
itself (reshaped) in the kernel's output. Codegen (`lazygrad_codegen.lowerer`) then runs the reductions' loops over
the row one after another in one kernel, on GPUs with the same workgroup per row, each reduction's result broadcast to
every thread of the row before the next loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from lazygrad_scheduler.kernelize import MOVEMENT, _Group, _root_value, apply_movement
from lazygrad_uop.ops import Ops
from lazygrad_uop.shape import shape_of
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


def merge_row_values(
    kernels: list[list[UOp]], groups: Mapping[UOp, _Group], needs: Mapping[UOp, set[UOp]]
) -> list[list[UOp]]:
    """`kernels` (lists of roots, producers first) with the kernels of row values moved into the kernel that reads
    them (see the module docstring). `groups` maps each root to its `_Group`, `needs` each root to the roots it needs,
    directly or not."""
    kernels = [list(k) for k in kernels]
    home = {r: i for i, k in enumerate(kernels) for r in k}
    for i in range(len(kernels)):
        changed = True
        while changed:
            changed = False
            for r2 in list(kernels[i]):
                g2 = groups.get(r2)
                if g2 is None:
                    continue
                for r1 in sorted(g2.leaves, key=lambda r: home.get(r, -1)):
                    j = home.get(r1)
                    if j is None or j == i or not kernels[j]:
                        continue
                    if _can_merge(kernels[j], kernels[i], groups, needs):
                        kernels[i] = kernels[j] + kernels[i]
                        for r in kernels[j]:
                            home[r] = i
                        kernels[j] = []
                        changed = True
                        break
                if changed:
                    break
    return [k for k in kernels if k]


def _can_merge(k1: list[UOp], k2: list[UOp], groups: Mapping[UOp, _Group], needs: Mapping[UOp, set[UOp]]) -> bool:
    """Whether kernel `k1` (its roots) can run inside kernel `k2`, which reads it."""
    roots = k1 + k2
    # (an in-place update stays a kernel of its own: what it may read of its target is decided for it alone)
    if any(r not in groups or r.op in _NOT_INLINED for r in roots):
        return False
    if len({shape_of(r) for r in roots}) != 1:
        return False
    sigs = {groups[r].reduce_sig for r in roots} - {None}
    if len(sigs) != 1:
        return False  # values of rows come from a reduction, all over the same rows
    (sig,) = sigs
    inside, outside = set(k1), set(k2)
    # a kernel that needs k1 and is needed by k2 would then need itself
    for r in k2:
        for x in needs[r] - inside - outside:
            if needs.get(x, set()) & inside:
                return False
    reads = False
    for r2 in k2:
        g2 = groups[r2]
        for r1 in k1:
            if r1 in g2.leaves:
                if not _reads_row_value(_root_value(r2), g2.members, r1, sig):
                    return False
                reads = True
    return reads
