"""Linearization: a lowered kernel graph becomes the list of UOps a renderer walks, with `RANGE ... END` pairs around
the ops that run inside each loop.

Placement rule: every op goes in the innermost loop among the loops it depends on, so loop-invariant work is
hoisted out of the loops that don't change it. The loops form a tree:

- the output loops (RANGEs no accumulator reduces over) nest in axis order and enclose everything;
- inside the innermost of them sit the reduce loops, one nest per distinct set of loops that accumulators reduce
  over (a grouped reduction has two: the per-thread loops and the loop over the group's partial results), one after
  another as their dependencies require.

Two ops bend the rule: a `DEFINE_ACC` sits inside every output loop (the accumulator restarts for each output
element) and before the reduce loops it accumulates over, while an op that reads it runs inside those loops; an
`ASSIGN` sits inside its accumulator's reduce loops, and an op that reads it runs after those loops END. Inside the
loop, every op reading the accumulator itself runs before its ASSIGN (it reads the value before this step's update).

Inside each loop, ops and inner loops are ordered by their dependencies, an op as early as it can go if an inner
loop needs it, else after the inner loops (it would only hold registers through them). The list
starts with the kernel's parameters (DEFINE_GLOBALs by slot, DEFINE_VARs by name), then its hardware indices
(SPECIALs, by name) and local buffers (DEFINE_LOCALs), and ends with the SINK.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp


class LinearizeError(RuntimeError):
    """The lowered graph can't be ordered into loops (a codegen bug, or a graph built by hand wrongly)."""


_HOISTED = (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.SPECIAL, Ops.DEFINE_LOCAL)


@dataclass
class _Block:
    """A loop (or the kernel's top level, `loop` None), the ops placed directly in it and the loops inside it."""

    loop: UOp | None
    depth: int
    parent: _Block | None
    ops: list[UOp] = field(default_factory=list)
    children: list[_Block] = field(default_factory=list)


def _sources(u: UOp) -> tuple[UOp, ...]:
    # a DEFINE_ACC names the loops it reduces over; it does not run inside them
    return u.src[:1] if u.op is Ops.DEFINE_ACC else u.src


def linearize(sink: UOp) -> list[UOp]:
    """Order the graph under `sink` for rendering (see the module docstring)."""
    topo = list(sink.toposort)
    position = {u: i for i, u in enumerate(topo)}
    accs = [u for u in topo if u.op is Ops.DEFINE_ACC]
    reduce_nests: list[tuple[UOp, ...]] = []
    for acc in accs:
        nest = tuple(sorted(acc.src[1:], key=lambda r: r.arg))
        if nest and nest not in reduce_nests:
            reduce_nests.append(nest)
    reduced = {r for nest in reduce_nests for r in nest}
    if len(reduced) != sum(len(n) for n in reduce_nests):
        raise LinearizeError("two accumulators reduce over overlapping but different sets of loops")
    output_loops = sorted((u for u in topo if u.op is Ops.RANGE and u not in reduced), key=lambda r: r.arg)

    # the tree of loops
    root = _Block(None, 0, None)
    block_of: dict[UOp, _Block] = {}
    inner = root
    for r in output_loops:
        b = _Block(r, inner.depth + 1, inner)
        inner.children.append(b)
        block_of[r] = inner = b
    for nest in reduce_nests:
        parent = inner
        for r in nest:
            b = _Block(r, parent.depth + 1, parent)
            parent.children.append(b)
            block_of[r] = parent = b

    # scope: the loops an op must sit inside; provides: the loops its users inherit from it
    scope: dict[UOp, frozenset[UOp]] = {}
    provides: dict[UOp, frozenset[UOp]] = {}
    all_outputs = frozenset(output_loops)
    no_loops: frozenset[UOp] = frozenset()
    for u in topo:
        # the union of the sources' loops, which are most often one set shared by all: no new set then
        inherited = no_loops
        for s in _sources(u):
            p = provides[s]
            if p is not inherited and p:
                inherited = p if not inherited else inherited if p <= inherited else inherited | p
        if u.op is Ops.RANGE:
            scope[u] = provides[u] = inherited | {u}
        elif u.op is Ops.DEFINE_ACC:
            scope[u] = inherited | all_outputs
            # reading the accumulator itself (not its ASSIGN) means reading it while it accumulates
            provides[u] = scope[u] | set(u.src[1:])
        elif u.op is Ops.ASSIGN:
            scope[u] = inherited | set(u.src[0].src[1:])
            provides[u] = scope[u] - set(u.src[0].src[1:])
        else:
            scope[u] = provides[u] = inherited

    def deepest(loops: frozenset[UOp], u: UOp) -> _Block:
        best = root
        for r in loops:
            b = block_of[r]
            if b.depth > best.depth:
                best = b
        # every loop of the scope must enclose the chosen one
        for r in loops:
            b, target = best, block_of[r]
            while b is not None and b is not target:
                b = b.parent
            if b is None:
                raise LinearizeError(f"{u.op} depends on loops that are not nested in one another")
        return best

    params = sorted((u for u in topo if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
    params += sorted((u for u in topo if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg[0])
    params += sorted((u for u in topo if u.op is Ops.SPECIAL), key=lambda u: u.arg[0])
    params += [u for u in topo if u.op is Ops.DEFINE_LOCAL]
    placed_in: dict[UOp, _Block] = {}
    # ops share a few scopes: each is placed once
    block_for: dict[frozenset[UOp], _Block] = {}
    for u in topo:
        if u.op in _HOISTED or u.op in (Ops.RANGE, Ops.SINK):
            continue
        if (b := block_for.get(loops := scope[u])) is None:
            b = block_for[loops] = deepest(loops, u)
        placed_in[u] = b
        b.ops.append(u)

    def path(b: _Block) -> list[_Block]:
        out = []
        node: _Block | None = b
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    path_of = {id(b): path(b) for b in (root, *block_of.values())}
    paths = {u: path_of[id(b)] for u, b in placed_in.items()}
    acc_readers: dict[UOp, list[UOp]] = {}
    for u in placed_in:
        if u.op is not Ops.ASSIGN:
            for s in u.src:
                if s.op is Ops.DEFINE_ACC:
                    acc_readers.setdefault(s, []).append(u)

    # the dependencies between the items of each block (its own ops and its child loops): `later` needs `first`.
    # Two ops order items only in their deepest common block, where they sit in different items (an op's own, or
    # the child loop it is in): above it they are in one item, below it one of them is outside
    edges: dict[int, list[tuple[UOp | _Block, UOp | _Block]]] = {id(b): [] for b in (root, *block_of.values())}

    def order(later: UOp, first: UOp) -> None:
        pl, pf = paths[later], paths[first]
        if pl is pf:  # the same block: the most common case
            edges[id(pl[-1])].append((later, first))
            return
        depth = 0
        while depth < len(pl) and depth < len(pf) and pl[depth] is pf[depth]:
            depth += 1
        edges[id(pl[depth - 1])].append(
            (pl[depth] if len(pl) > depth else later, pf[depth] if len(pf) > depth else first)
        )

    for u in placed_in:
        for s in _sources(u):
            # (parameters, hardware indices and loops are no op of a block)
            if s in placed_in:
                order(u, s)
        # an accumulator read while it accumulates (an online reduction's update reads one accumulator's old value
        # for another's new one) is read before its ASSIGN overwrites it in the same loop
        if u.op is Ops.ASSIGN:
            for reader in acc_readers.get(u.src[0], ()):
                if reader is not u:
                    order(u, reader)

    out: list[UOp] = list(params)
    # what the loops' lengths are computed from: needed before the loops, though no op inside them uses it
    bounds = {n for r in topo if r.op is Ops.RANGE for s in r.src for n in s.toposort}

    def emit(b: _Block) -> None:
        keys: dict[int, UOp | _Block] = {}
        prio: dict[int, tuple[int, int]] = {}
        for op in b.ops:
            keys[id(op)], prio[id(op)] = op, (0, position[op])
            if op.op is Ops.GEP and op.src[0].op is Ops.WGMMA:
                # a read of a tensor core's result waits for its instructions (`CStyleLanguage.render_wgmma_wait`):
                # as late as the block allows, so that every chain of the step is issued before the first wait
                prio[id(op)] = (0, position[op] + len(position))
        for child in b.children:
            assert child.loop is not None
            keys[id(child)], prio[id(child)] = child, (1, position[child.loop])
        deps: dict[int, set[int]] = {k: set() for k in keys}
        users: dict[int, set[int]] = {k: set() for k in keys}
        for later, first in edges[id(b)]:
            deps[id(later)].add(id(first))
            users[id(first)].add(id(later))
        if b.children:
            # an op that no inner loop needs runs after the loops: a load of a value used only once the reduction is
            # done (the weights an optimizer step updates, a residual added to a gradient) would otherwise be held in
            # registers through the whole loop
            feeds = {id(child) for child in b.children}
            stack = list(feeds)
            while stack:
                for first in deps[stack.pop()]:
                    if first not in feeds:
                        feeds.add(first)
                        stack.append(first)
            for op in b.ops:
                if id(op) not in feeds and op not in bounds:
                    prio[id(op)] = (2, position[op])
        ready = [(prio[k], k) for k, d in deps.items() if not d]
        heapq.heapify(ready)
        done = 0
        while ready:
            _, k = heapq.heappop(ready)
            done += 1
            it = keys[k]
            if isinstance(it, _Block):
                assert it.loop is not None
                out.append(it.loop)
                emit(it)
                out.append(UOp(Ops.END, src=(it.loop,)))
            else:
                out.append(it)
            for user in users[k]:
                deps[user].discard(k)
                if not deps[user]:
                    heapq.heappush(ready, (prio[user], user))
        if done != len(keys):
            raise LinearizeError("the ops and loops of one loop depend on each other in a cycle")

    emit(root)
    _check_order(out, provides)
    out.append(sink)
    return out


def _check_order(uops: list[UOp], provides: dict[UOp, frozenset[UOp]]) -> None:
    """Every source is placed before its user, and is visible there (not inside a loop that has already ended)."""
    seen: set[UOp] = set()
    open_loops: list[UOp] = []
    open_set: set[UOp] = set()
    for u in uops:
        for s in _sources(u):
            if s not in seen:
                raise LinearizeError(f"{u.op} is placed before its source {s.op}")
        if u.op is Ops.RANGE:
            open_loops.append(u)
            open_set.add(u)
        elif u.op is Ops.END:
            if not open_loops or open_loops[-1] is not u.src[0]:
                raise LinearizeError("loops must END innermost first")
            open_set.discard(open_loops.pop())
        elif u.op is not Ops.DEFINE_ACC:
            for s in u.src:
                loops = provides.get(s)
                if loops and not loops <= open_set and not loops - open_set <= {u}:
                    raise LinearizeError(f"{u.op} reads a value from a loop that is not open around it")
        seen.add(u)
