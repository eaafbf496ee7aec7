"""Integer division that never traps: the lowering rule that gives `IDIV` and `MOD` one defined result everywhere.

Hardware and C leave two integer divisions undefined, and x86 (the CPU device) kills the process with SIGFPE on
both: a zero divisor, and the most negative value of a signed type divided by -1 (the quotient does not fit). On
every device lazygrad defines them as numpy does:

- `x IDIV 0 == 0` and `x MOD 0 == 0`;
- `MIN IDIV -1 == MIN` (the quotient wraps) and `MIN MOD -1 == 0`.

The rule runs on the lowered kernel, before any renderer sees it, so every renderer (LLVM IR, C, CUDA, OpenCL,
Metal, AMDGPU) and the PYTHON interpreter compute the same thing. It costs nothing where the symbolic bounds of the
divisor exclude 0 (a positive constant, the index math of every view) and, for signed types, exclude -1 or the
dividend excludes the minimum: those divisions are left as they are. Otherwise the divisor is replaced by 1 where it
is 0 or -1 (a division that cannot trap), and the quotient is fixed up with a select: 0 for a zero divisor, the
negated dividend (wrapping) for -1. The remainder needs no fix-up: anything `MOD 1` is 0.
"""

from __future__ import annotations

from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.pattern import PatternMatcher, UPat, graph_rewrite
from lazygrad_uop.uop import UOp


def _can_be(u: UOp, value: int) -> bool:
    return u.vmin <= value <= u.vmax  # type: ignore[operator]


def _guard(ctx: set[UOp], d: UOp, a: UOp, b: UOp) -> UOp | None:
    if d in ctx or not dtypes.is_int(d.dtype):
        return None
    zero = _can_be(b, 0)
    # MIN / -1 overflows: only a signed divisor that can be -1 and a dividend that can be the type's minimum
    overflow = not dtypes.is_unsigned(d.dtype) and _can_be(b, -1) and _can_be(a, dtypes.min(d.dtype.scalar()))
    if not (zero or overflow):
        return None
    bad = b.eq(0) if zero else None
    if overflow:
        bad = b.eq(-1) if bad is None else bad | b.eq(-1)
    assert bad is not None
    one = b.const_like(1)
    safe = UOp(d.op, d.dtype, (a, bad.where(one, b)), d.arg)
    ctx.add(safe)
    if d.op is Ops.MOD:
        return safe
    quotient = b.eq(-1).where(-a, safe) if overflow else safe
    return b.eq(0).where(b.const_like(0), quotient) if zero else quotient


division_rules = PatternMatcher(
    [
        (UPat((Ops.IDIV, Ops.MOD), src=(UPat.var("a"), UPat.var("b")), name="d"), _guard),
    ]
)
"""Rewrites every integer IDIV/MOD whose divisor can be 0 (or -1 with a dividend that can be the minimum) into a
division that cannot trap; use with `graph_rewrite(sink, division_rules, ctx=set())`."""


def guard_divisions(sink: UOp) -> UOp:
    """`sink` with every integer division that could trap given its defined result (see the module docstring)."""
    return graph_rewrite(sink, division_rules, ctx=set(), name="guard integer division")
