"""Launch sizes within a renderer's limits: workgroup indices for output axes whose sizes don't fit the three
dimensions as they are laid out (CUDA and AMDGPU take up to 65,535 workgroups in y and z, 2^31-1 in x).

`fitted_indices` first lays the axes out as `lowerer.hardware_indices` does (innermost axis in x, outer ones merged
into z); when a dimension is then over its limit, every axis is numbered by one linear workgroup index instead, in x
alone where it fits, else in x, y and z (factors of the total), and each axis is recovered from it by division and
remainder."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from lazygrad_uop.uop import UOp, sint

Dims = tuple[sint, sint, sint]


def fits(dims: Sequence[sint], limits: Sequence[int] | None) -> bool:
    """Whether launch dimensions `dims` are within `limits` (None: no limits; symbolic sizes are taken to fit)."""
    if limits is None:
        return True
    return all(not isinstance(d, int) or d <= lim for d, lim in zip(dims, limits, strict=False))


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _split_total(total: int, limits: Sequence[int]) -> tuple[int, int, int] | None:
    """Three dimensions whose product is `total`, each within `limits`, x as large as possible, then y (so the
    division and remainder that recover the axes are by few numbers); None when no such factors exist."""
    for x in reversed(_divisors(total)):
        if x > limits[0]:
            continue
        rest = total // x
        for y in reversed(_divisors(rest)):
            if y <= limits[1] and rest // y <= limits[2]:
                return x, y, rest // y
    return None


def fitted_indices(
    sizes: list[sint],
    prefix: str,
    limits: Sequence[int] | None,
    layout: Callable[[list[sint], str], tuple[list[UOp], Dims]],
) -> tuple[list[UOp], Dims]:
    """SPECIAL indices `<prefix><d>` for axes of `sizes` (outermost first) and the launch dimensions, within
    `limits`: `layout`'s (the lowerer's `hardware_indices`) when they fit, else one linear index folded as the module
    docstring says. Raises NotImplementedError when no layout fits (symbolic sizes, or a total no factors fit)."""
    idxs, dims = layout(sizes, prefix)
    if fits(dims, limits):
        return idxs, dims
    assert limits is not None
    if not all(isinstance(s, int) for s in sizes):
        raise NotImplementedError(
            f"launch dimensions {dims} exceed the renderer's limits {tuple(limits)} and have symbolic sizes, which "
            "can't be folded into fewer dimensions; make the outer axes smaller"
        )
    total = math.prod(int(s) for s in sizes)
    split = _split_total(total, limits)
    if split is None:
        raise NotImplementedError(
            f"{total} workgroups can't be laid out within the renderer's limits {tuple(limits)}; split the kernel"
        )
    x, y, z = split
    linear = UOp.special(x, f"{prefix}0")
    if y > 1:
        linear = linear + UOp.special(y, f"{prefix}1") * x
    if z > 1:
        linear = linear + UOp.special(z, f"{prefix}2") * (x * y)
    out: list[UOp] = []
    place = 1
    # innermost axis varies fastest, as in the unfolded layout
    for s in reversed(sizes):
        q = linear if place == 1 else linear // place
        out.append(q if place * int(s) == total else q % int(s))
        place *= int(s)
    return out[::-1], split
