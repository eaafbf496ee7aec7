"""Linearization: a lowered kernel graph (a SINK of STOREs over RANGEs, accumulators and loads) becomes the list of
UOps a renderer walks, with `RANGE ... END` pairs around the ops that run inside each loop.

Placement rule: every op goes in the innermost loop among the loops it depends on, so loop-invariant work is
hoisted out of the loops that don't change it. The loops of one kernel form a single nest: the output loops in axis
order, then the reduce loops in axis order. Two ops bend the rule:

- `DEFINE_ACC` sits inside every output loop (the accumulator restarts for each output element) and before the
  reduce loops it accumulates over, while an op that reads it runs inside those reduce loops;
- `ASSIGN` sits inside its accumulator's reduce loops even if the value it folds in doesn't depend on them, and an
  op that reads it depends on the enclosing loops only, so it runs after those reduce loops END.
"""

from __future__ import annotations

from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp


class LinearizeError(RuntimeError):
    """The lowered graph can't be ordered into one loop nest (a codegen bug, or a graph built by hand wrongly)."""


def _loops(sink: UOp) -> tuple[list[UOp], list[UOp]]:
    """The kernel's output loops and reduce loops (those an accumulator runs over), each sorted by axis."""
    ranges = [u for u in sink.toposort if u.op is Ops.RANGE]
    reduce = {r for u in sink.toposort if u.op is Ops.DEFINE_ACC for r in u.src[1:]}
    return sorted((r for r in ranges if r not in reduce), key=lambda r: r.arg), sorted(reduce, key=lambda r: r.arg)


def linearize(sink: UOp) -> list[UOp]:
    """Order the graph under `sink` for rendering. The list starts with the DEFINE_GLOBALs (by slot) and the
    DEFINE_VARs (by name), holds `END` ops closing the loops innermost first, and ends with `sink` itself."""
    output_loops, reduce_loops = _loops(sink)
    nest = output_loops + reduce_loops
    depth_of = {r: d for d, r in enumerate(nest)}

    # scope: the loops an op must sit inside; provides: the loops an op's users inherit from it
    scope: dict[UOp, frozenset[UOp]] = {}
    provides: dict[UOp, frozenset[UOp]] = {}
    for u in sink.toposort:
        # a DEFINE_ACC names the loops it reduces over; it does not run inside them
        srcs = u.src[:1] if u.op is Ops.DEFINE_ACC else u.src
        inherited: frozenset[UOp] = frozenset().union(*(provides[s] for s in srcs))
        if u.op is Ops.RANGE:
            scope[u] = provides[u] = inherited | {u}
        elif u.op is Ops.DEFINE_ACC:
            scope[u] = inherited | set(output_loops)
            # reading the accumulator itself (not its ASSIGN) means reading it while it accumulates
            provides[u] = scope[u] | set(u.src[1:])
        elif u.op is Ops.ASSIGN:
            scope[u] = inherited | set(u.src[0].src[1:])
            provides[u] = scope[u] - set(u.src[0].src[1:])
        else:
            scope[u] = provides[u] = inherited

    def level(u: UOp) -> int:
        return max((depth_of[r] for r in scope[u]), default=-1)

    def provided_level(u: UOp) -> int:
        return max((depth_of[r] for r in provides[u]), default=-1)

    params = sorted((u for u in sink.toposort if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
    params += sorted((u for u in sink.toposort if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg[0])
    at_level: dict[int, list[UOp]] = {d: [] for d in range(-1, len(nest))}
    for u in sink.toposort:
        if u.op not in (Ops.RANGE, Ops.SINK, Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR):
            at_level[level(u)].append(u)

    out: list[UOp] = list(params)
    placed: set[UOp] = set(params)

    def emit(depth: int) -> None:
        ops = at_level[depth]
        if depth + 1 == len(nest):
            before, after = ops, []
        else:
            # an op that reads a value computed inside the next loop (an ASSIGN) must wait for that loop to end
            waits: set[UOp] = set()
            for u in ops:
                if any(s in waits or (s not in placed and s.op is not Ops.RANGE and level(s) > depth) for s in u.src):
                    waits.add(u)
            before, after = [u for u in ops if u not in waits], [u for u in ops if u in waits]
        for u in before:
            out.append(u)
            placed.add(u)
        if depth + 1 < len(nest):
            loop = nest[depth + 1]
            out.append(loop)
            placed.add(loop)
            emit(depth + 1)
            out.append(UOp(Ops.END, src=(loop,)))
        for u in after:
            out.append(u)
            placed.add(u)

    emit(-1)
    _check_order(out, {u: provided_level(u) for u in out if u in provides})
    out.append(sink)
    return out


def _check_order(uops: list[UOp], provided_level: dict[UOp, int]) -> None:
    """Every source is placed before its user, and is visible there (not inside a loop that has already ended)."""
    seen: set[UOp] = set()
    open_loops: list[UOp] = []
    for u in uops:
        for s in u.src[:1] if u.op is Ops.DEFINE_ACC else u.src:
            if s not in seen:
                raise LinearizeError(f"{u.op} is placed before its source {s.op}")
        if u.op is Ops.RANGE:
            open_loops.append(u)
        elif u.op is Ops.END:
            if not open_loops or open_loops[-1] is not u.src[0]:
                raise LinearizeError("loops must END innermost first")
            open_loops.pop()
        elif u.op is not Ops.DEFINE_ACC and any(provided_level[s] >= len(open_loops) for s in u.src):
            raise LinearizeError(f"{u.op} reads a value from a loop that is not open around it")
        seen.add(u)
