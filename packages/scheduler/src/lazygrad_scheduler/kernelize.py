"""Cutting a tensor graph into kernels.

`kernelize(sink)` decides which nodes are stored to memory (realized) and which are recomputed inside the kernels
that read them, builds one kernel AST per group of realized nodes, and returns how each realized node *becomes* an
`ASSIGN(target view of its BUFFER, KERNEL)`. Everything not realized fuses into the kernels that use it:

- elementwise chains, and elementwise producers of a reduction, fuse into one kernel;
- elementwise consumers of a reduction fuse as its epilogue while only reshapes stand between them;
- movement ops become ShapeTrackers on the loads at the leaves, so they never copy; a pad over a value that is not 0
  where its loads read 0 (an exp, a reciprocal) also selects that value inside the pad's bounds and 0 outside;
- a reduction read by several kernels, nested inside another reduction, or broadcast back (softmax's max) is stored
  (with the shared value over it as epilogue, unless the kernels share several values over it);
- an elementwise producer that a reduction reads through a broadcast (each element feeding many of its outputs, as
  a matmul's left operand feeds every column) is stored when recomputing it for every read costs more ALU work
  than storing it once and reloading it: GELU before a matmul, softmax's exp before weights @ values; cheap
  producers (a cast, a scale, a bias) still fuse;
- an elementwise value read by several kernels is recomputed unless storing it once moves fewer bytes;
- outputs of one shape that share inputs are computed by one kernel with several STOREs;
- a COPY between devices that share host memory is a load of the (stored) source where it lies (`placement.py`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

from lazygrad_scheduler.placement import reads_in_place
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.shape import device_of, shape_of
from lazygrad_uop.tensor_graph import (
    MOVEMENT,
    apply_movement,
    base_buffer,
    is_kernelized,
    is_leaf,
    is_view_of_leaf,
    leaf_view,
    movement_chain,
    new_buffer,
    view_base,
)
from lazygrad_uop.uop import UOp, sint
from lazygrad_uop.views import ShapeTracker, View


@dataclass(frozen=True)
class Kernel:
    """The arg of a KERNEL node: its AST. The KERNEL's sources are its buffers (outputs first) and inputs."""

    ast: UOp
    n_outputs: int
    n_slots: int

    def __repr__(self) -> str:
        stores = [s for s in self.ast.src if s.op is Ops.STORE]
        return f"Kernel({len(stores)} store{'s' if len(stores) != 1 else ''}, {len(self.ast.toposort)} uops)"


PASSTHROUGH = frozenset({Ops.DETACH})  # identity in the forward graph


# *** deciding what to realize ***


@dataclass
class _Group:
    """What one realized root pulls into its kernel."""

    root: UOp
    members: set[UOp] = field(default_factory=set)
    leaves: set[UOp] = field(default_factory=set)
    reduce_sig: tuple | None = None


def _root_value(root: UOp) -> UOp:
    """The node a realized root computes: CONTIGUOUS and ASSIGN compute their source."""
    if root.op is Ops.CONTIGUOUS:
        return root.src[0]
    if root.op is Ops.ASSIGN:
        return root.src[1]
    return root


# nodes a kernel reads as they are rather than computing: constants, variables
_NOT_COMPUTED = frozenset({Ops.CONST, Ops.DEVICE, Ops.DEFINE_VAR, Ops.BIND})
# ops through which an epilogue still fuses into the reduction below (only these between it and the root)
_KEEPS_PATH = GroupOp.Elementwise | PASSTHROUGH | {Ops.RESHAPE, Ops.COPY}


def _collect(
    root: UOp, realized: set[UOp], must_realize: set[UOp], constant: set[UOp], consulted: set[UOp] | None = None
) -> _Group:
    """The nodes that fuse into `root`'s kernel; reductions that can't fuse, and producers too costly to recompute
    inside its reduction, go into `must_realize`. `constant`: the nodes computed from constants alone. `consulted`
    gets every node whose being realized or not the result depends on: while none of them changes, neither does the
    group."""
    g = _Group(root)
    if consulted is None:
        consulted = set()
    # (node, only elementwise/reshape ops between it and the root, below a reduction, how many of the reduction's
    # iterations read each of its elements: the EXPANDs between them)
    stack: list[tuple[UOp, bool, bool, int]] = [(_root_value(root), True, False, 1)]
    seen: set[tuple[UOp, bool, bool, int]] = set()
    # the walk runs for every group of every round: its set and list methods bound once
    members, leaves, pop, push, see, consult = g.members, g.leaves, stack.pop, stack.append, seen.add, consulted.add
    device = Ops.DEVICE
    while stack:
        item = pop()
        if item in seen:
            continue
        see(item)
        u, path_ok, in_reduce, repeats = item
        consult(u)
        if is_leaf(u) or (u in realized and u is not root):
            leaves.add(u)
            continue
        op = u.op
        if op in _NOT_COMPUTED:
            continue
        # decided from the top down, so the largest such producer is stored, before the reductions under it are
        # found: stored on its own, it takes them as its epilogue instead of reading them back
        if in_reduce and repeats > 1 and _recompute_costs_more(u, repeats, realized, constant, consulted):
            must_realize.add(u)
            leaves.add(u)
            continue
        if op is Ops.REDUCE_AXIS:
            sig = (shape_of(u.src[0]), u.arg[1])
            if in_reduce or not path_ok or (g.reduce_sig is not None and g.reduce_sig != sig):
                must_realize.add(u)
                leaves.add(u)
                continue
            g.reduce_sig = sig
            members.add(u)
            push((u.src[0], False, True, 1))
            continue
        members.add(u)
        keeps = path_ok and op in _KEEPS_PATH
        if in_reduce and op is Ops.EXPAND:
            repeats *= max(1, max_numel(shape_of(u)) // max(1, max_numel(shape_of(u.src[0]))))
        for s in u.src:
            if s.op is not device:
                push((s, keeps, in_reduce, repeats))
    return g


# The cost of computing one element, in cheap ALU ops (an add, a multiply, a compare, a cast): transcendentals are
# library calls or polynomial expansions on most devices, divisions and square roots take several cycles. Ops not
# listed cost 1.
ALU_COST: dict[Ops, int] = {
    **dict.fromkeys((Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.THREEFRY), 16),
    **dict.fromkeys((Ops.SQRT, Ops.RECIP, Ops.IDIV, Ops.MOD), 4),
    Ops.BITCAST: 0,
}
# ALU ops per element read that a reduction's loop does for free: they run while its loads wait on memory, so a cheap
# producer (a cast, a scale, a bias) is recomputed rather than sent through memory
FREE_OPS = 4
# ALU ops that moving one byte through memory is worth: about a CPU's ALU throughput over its memory bandwidth (GPUs
# have more ALU per byte, and there this errs towards storing)
OPS_PER_BYTE = 4
# ALU ops that launching one more kernel is worth (a few microseconds): small producers stay fused
LAUNCH_OPS = 2**14


def _alu_cost(u: UOp, realized: set[UOp], constant: set[UOp], limit: float, consulted: set[UOp]) -> float:
    """ALU ops (in ALU_COST units) to compute one element of `u` in a kernel that loads its leaves, realized nodes and
    reductions (which a reading reduction stores anyway); the count stops once it exceeds `limit`. Ops on constants
    alone cost nothing: codegen folds them. The nodes looked at go into `consulted`."""
    total, stack, seen = 0, [u], set()
    while stack and total <= limit:
        n = stack.pop()
        consulted.add(n)
        if n in seen or n in constant or is_leaf(n) or (n in realized and n is not u) or n.op is Ops.REDUCE_AXIS:
            continue
        seen.add(n)
        if n.op in GroupOp.Elementwise:
            total += ALU_COST.get(n.op, 1)
        stack.extend(s for s in n.src if s.op is not Ops.DEVICE)
    return total


def _recompute_costs_more(u: UOp, repeats: int, realized: set[UOp], constant: set[UOp], consulted: set[UOp]) -> bool:
    """True when `u`, fused into a reduction that reads each of its elements `repeats` times, costs more to recompute
    than to store.

    The loop computes `u` once per iteration, so a `u` read through a broadcast (an EXPAND: a matmul's left operand is
    read once per output column) is computed `repeats` times per element; a pad, a shrink or a stride in between
    repeats nothing (a max-pool's gradient, summed by a BatchNorm's backward). Fused, that is
    `repeats - 1` extra computations of each element, each costing its ALU ops beyond the FREE_OPS that hide under the
    loop's loads; stored, it costs one write and one read of each element (later reads of a broadcast element hit the
    cache, as the loads of its inputs would when fused) and one more kernel launch. Store when the first is more."""
    if u.op not in GroupOp.Elementwise:
        return False
    numel = max_numel(shape_of(u))
    if numel == 0 or repeats <= 1:
        return False
    store = numel * 2 * u.dtype.itemsize * OPS_PER_BYTE + LAUNCH_OPS
    needed = FREE_OPS + store / ((repeats - 1) * numel)  # ALU ops per element that make recomputing cost more
    return _alu_cost(u, realized, constant, needed, consulted) > needed


# ops whose result on all-zero inputs is not zero (or is undefined, like 0 // 0); a variable is not 0 outside a pad
NOT_ZERO_AT_ZERO = frozenset(
    {Ops.EXP2, Ops.LOG2, Ops.RECIP, Ops.IDIV, Ops.MOD, Ops.THREEFRY, Ops.REDUCE_AXIS, Ops.BIND, Ops.DEFINE_VAR}
)


def _fused_nodes(u: UOp, stop: set[UOp] | frozenset[UOp] = frozenset()) -> Iterator[UOp]:
    """`u` and the nodes under it that a kernel computing `u` computes too: down to, not into, leaves and `stop`."""
    stack, seen = [u], set()
    while stack:
        n = stack.pop()
        if n in seen or is_leaf(n) or (n in stop and n is not u):
            continue
        seen.add(n)
        yield n
        stack.extend(n.src)


def _reads_target_elsewhere(assign: UOp) -> bool:
    """True when ASSIGN(target, value) reads target's buffer other than elementwise through the target view itself."""
    target = assign.src[0]
    buf = base_buffer(view_base(target)) if is_leaf(view_base(target)) else None
    stack, seen = [(assign.src[1], False)], set()
    while stack:
        item = stack.pop()
        if item in seen:
            continue
        seen.add(item)
        u, moved = item
        if u is target and not moved:
            continue
        base = view_base(u)
        if is_leaf(base) and base_buffer(base) is buf:
            return True
        if is_leaf(u):
            continue
        moves = moved or u.op in MOVEMENT or u.op is Ops.REDUCE_AXIS
        stack.extend((s, moves) for s in u.src)
    return False


def _assigns_reading_target_elsewhere(assigns: list[UOp], order: list[UOp]) -> set[UOp]:
    """The ASSIGNs of `assigns` for which `_reads_target_elsewhere` holds, found in one pass over `order` (the graph,
    sources first) for all of them rather than a walk of the whole graph under each update.

    A bit per target buffer: `moved[u]` has the bits of the buffers `u` reads (through its leaves' views, down to
    leaves) and `plain[u]` the same along paths without a movement op or reduction, where the target view itself is
    what an update may read. A buffer written by assigns to several different views keeps the per-assign walk."""
    targets: dict[UOp, set[UOp]] = {}  # buffer -> target views assigned
    buf_of_assign: dict[UOp, UOp] = {}
    for a in assigns:
        if is_leaf(view_base(a.src[0])):
            buf_of_assign[a] = buf = base_buffer(view_base(a.src[0]))
            targets.setdefault(buf, set()).add(a.src[0])
    bit = {buf: 1 << i for i, buf in enumerate(b for b, ts in targets.items() if len(ts) == 1)}
    skip = {next(iter(targets[buf])): b for buf, b in bit.items()}  # the target view: not a read of its buffer
    moved: dict[UOp, int] = {}
    plain: dict[UOp, int] = {}
    for u in order:
        base = view_base(u)
        own = bit.get(base_buffer(base), 0) if is_leaf(base) else 0
        m, p = own, own
        if not is_leaf(u):
            if u.op in MOVEMENT or u.op is Ops.REDUCE_AXIS:
                for x in u.src:
                    m |= moved[x]
                p = m
            else:
                for x in u.src:
                    m |= moved[x]
                    p |= plain[x]
        moved[u], plain[u] = m, p & ~skip.get(u, 0)
    out = set()
    for a in assigns:
        buf = buf_of_assign.get(a)
        if buf is None:
            continue  # a target that is no buffer's view: no read of it can match
        if buf in bit:
            if plain[a.src[1]] & bit[buf]:
                out.add(a)
        elif _reads_target_elsewhere(a):
            out.add(a)
    return out


def _bytes_read(node: UOp, group: _Group) -> int:
    """Bytes one kernel reads to recompute `node`: each distinct leaf under it, at `node`'s element count per distinct
    view it is read through (a max-pool's nine window offsets of one input read all of it), or at its own count
    where that is fewer: a leaf broadcast into `node` (a row's mean, a channel's scale) is read from memory once and
    from the cache after."""
    numel = max_numel(shape_of(node))
    # leaf -> the views it is read through, each known by the first movement op on the way down from `node`: the
    # loads push every movement op above them down to the leaves, through elementwise ops (a window offset of a
    # BatchNorm's output reads the convolution's output through that offset)
    views: dict[UOp, set[UOp]] = {}
    stack: list[tuple[UOp, UOp | None]] = [(node, None)]  # (node, the first movement op above it)
    seen: set[tuple[UOp, UOp | None]] = set()
    while stack:
        u, view = item = stack.pop()
        if u in group.leaves or is_leaf(u):
            views.setdefault(u, set()).add(u if view is None else view)
        elif item not in seen and u.op is not Ops.CONST:
            seen.add(item)
            top = u if view is None and u.op in MOVEMENT else view
            stack.extend((s, top) for s in u.src if s.op is not Ops.DEVICE)
    return sum(min(numel * len(v), max_numel(shape_of(leaf))) * leaf.dtype.itemsize for leaf, v in views.items())


def output_root(o: UOp) -> UOp:
    """The node to store for output `o`. A permuted, padded, ... view of a node that is stored anyway (or that would
    need its own kernel behind the view) is stored as that node and read through the view, without a copy."""
    base, chain = view_base(o), movement_chain(o)
    if base is o or base.op is Ops.CONST:
        return o
    if base.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN) or any(m.op is not Ops.RESHAPE for m in chain):
        return base
    return o  # reshapes of a computed value fuse into its kernel, and the output stays an ASSIGN


def choose_realized(outputs: list[UOp]) -> tuple[set[UOp], dict[UOp, _Group]]:
    """The nodes to store, and what each one's kernel contains."""
    sink = UOp(Ops.SINK, src=tuple(outputs))
    order = list(sink.toposort)
    realized: set[UOp] = {output_root(o) for o in outputs if not is_view_of_leaf(o)}
    for u in order:
        if u.op is Ops.CONTIGUOUS or (u.op is Ops.ASSIGN and not is_kernelized(u)):
            realized.add(u)
        if u.op is Ops.COPY and reads_in_place(u):
            # kernels on the target device read the source where it lies, through any view (a stored copy is such a
            # kernel too): the source must be stored
            if not is_view_of_leaf(u.src[1]):
                realized.add(output_root(u.src[1]))
        elif u.op is Ops.COPY:
            realized.add(u)
            # a copy moves whole buffers: its source must be stored, contiguous and complete
            if not _is_whole_leaf(u.src[1]):
                realized.add(u.src[1])
    # an in-place update may only read its target at the element it writes; otherwise compute the value first
    assigns = [u for u in realized if u.op is Ops.ASSIGN]
    realized |= {a.src[1] for a in _assigns_reading_target_elsewhere(assigns, order)}
    constant: set[UOp] = set()
    for u in order:  # sources first
        if u.op is Ops.CONST or (u.op in _CONSTANT_FOLDING and all(s in constant for s in u.src)):
            constant.add(u)
    return _Fusion(realized, constant, order).run()


# ops whose result is a constant when all of their sources are
_CONSTANT_FOLDING = GroupOp.Elementwise | MOVEMENT | PASSTHROUGH


class _Fusion:
    """The rounds of `choose_realized`, each adding nodes to store until no group wants more, done incrementally.

    A group depends only on whether the nodes its walk looked at (`consulted`) are stored, so a round recollects just
    the groups that looked at a newly stored node; the groups sharing each node (`owners`) are kept up to date as
    groups change, and a round looks only at the nodes shared by several groups. The outcome is the one of
    recollecting every group every round."""

    def __init__(self, realized: set[UOp], constant: set[UOp], order: list[UOp]) -> None:
        self.realized, self.constant, self.order = realized, constant, order
        self.pos = {u: i for i, u in enumerate(order)}
        self.groups: dict[UOp, _Group] = {}
        self.must: dict[UOp, set[UOp]] = {}  # root -> what its group wants stored
        self.watchers: dict[UOp, set[UOp]] = {}  # node -> roots whose group consulted it
        self.consulted: dict[UOp, set[UOp]] = {}
        self.owners: dict[UOp, set[UOp]] = {}  # node -> roots whose group has it as a member
        self.shared: set[UOp] = set()  # nodes with two or more owners
        self.bytes_read: dict[UOp, dict[UOp, int]] = {}  # root -> {node: _bytes_read(node, its group)}
        # whether each shared node is worth storing, decided when first needed and again only after a group it is a
        # member of changed (`dirty`: the members of the groups recollected since their node was last decided)
        self.worth_storing: dict[UOp, bool] = {}
        self.dirty: set[UOp] = set()

    def run(self) -> tuple[set[UOp], dict[UOp, _Group]]:
        stale = set(self.realized)
        while True:
            self._recollect(stale)
            wanted = set().union(*self.must.values()) - self.realized
            if not wanted:
                wanted = self._shared_to_store()
                if not wanted:
                    return self.realized, self.groups
            self.realized |= wanted
            stale = set(wanted).union(*(self.watchers.get(u, ()) for u in wanted))

    def _recollect(self, roots: set[UOp]) -> None:
        for r in roots:
            if _byte_copy(r) or r not in self.realized:
                continue
            if (old := self.groups.get(r)) is not None:
                self.dirty |= old.members
                for m in old.members:
                    self.owners[m].discard(r)
                    if len(self.owners[m]) < 2:
                        self.shared.discard(m)
                for c in self.consulted[r]:
                    self.watchers[c].discard(r)
            must: set[UOp] = set()
            consulted: set[UOp] = set()
            g = self.groups[r] = _collect(r, self.realized, must, self.constant, consulted)
            self.must[r], self.consulted[r] = must, consulted
            self.bytes_read.pop(r, None)
            for c in consulted:
                self.watchers.setdefault(c, set()).add(r)
            self.dirty |= g.members
            for m in g.members:
                owners = self.owners.setdefault(m, set())
                owners.add(r)
                if len(owners) >= 2:
                    self.shared.add(m)

    def _shared_to_store(self) -> set[UOp]:
        """Shared nodes worth storing: any reduction read by several kernels; elementwise values when cheaper. One per
        device: a kernel's group holds nodes of its own device only (a copy's source is stored; a read in place goes
        no further than the views over it), so storing a node changes no other device's groups, and a round per device
        at once decides what rounds one after another would (a step on n devices needs n times fewer rounds).

        Whether a shared node is worth storing depends on its owners' groups alone (who they are, their leaves, the
        stored nodes among what they consulted, which includes everything under it down to stored nodes and leaves),
        so it is decided again only for the members of the groups recollected since it was decided."""
        realized, has_reduce = self.realized, _ReductionsBelow(self.realized)
        worth_storing, dirty = self.worth_storing, self.dirty
        chosen: dict[str | tuple[str, ...] | None, UOp] = {}
        # from the outputs down: store the largest shared subgraph first
        for u in sorted(self.shared, key=self.pos.__getitem__, reverse=True):
            if u in realized or u.op in MOVEMENT or (device := device_of(u)) in chosen:
                continue
            if u in dirty or (worth := worth_storing.get(u)) is None:
                worth = worth_storing[u] = has_reduce(u) or self._cheaper_stored(u)
                dirty.discard(u)
            if not worth:
                continue
            if has_reduce(u):
                gs = [self.groups[r] for r in self.owners[u]]
                chosen[device] = _shared_reduction_root(u, gs, self.owners, realized, self.pos)
                continue
            chosen[device] = u
        return set(chosen.values())

    def _cheaper_stored(self, u: UOp) -> bool:
        """Whether storing shared elementwise node `u` once moves fewer bytes than each owner recomputing it, counting
        the launch of the kernel that may store it (a mask of a few labels, read by a loss's kernels, is recomputed)."""
        owners = self.owners[u]
        k = len(owners)
        stored = max_numel(shape_of(u)) * u.dtype.itemsize
        recompute = 0
        for r in owners:
            memo = self.bytes_read.setdefault(r, {})
            if (n := memo.get(u)) is None:
                n = memo[u] = _bytes_read(u, self.groups[r])
            recompute += n
        return stored * (k + 1) + recompute // k + LAUNCH_OPS // OPS_PER_BYTE < recompute


class _ReductionsBelow:
    """`_has_reduce(u, realized)` for many nodes under one `realized`, each node's answer computed once."""

    def __init__(self, realized: set[UOp]) -> None:
        self.realized = realized
        self.memo: dict[UOp, bool] = {}

    def __call__(self, u: UOp) -> bool:
        if is_leaf(u):
            return False
        if u.op is Ops.REDUCE_AXIS:
            return True
        return any(self._below(s) for s in u.src)

    def _below(self, root: UOp) -> bool:
        # a node fused under the one asked about: stored ones and leaves stop the walk
        memo, realized = self.memo, self.realized
        stack = [root]
        while stack:
            n = stack[-1]
            if n in memo:
                stack.pop()
                continue
            if is_leaf(n) or n in realized:
                memo[n] = False
                stack.pop()
                continue
            if n.op is Ops.REDUCE_AXIS:
                memo[n] = True
                stack.pop()
                continue
            todo = [s for s in n.src if s not in memo]
            if todo:
                stack.extend(todo)
                continue
            memo[n] = any(memo[s] for s in n.src)
            stack.pop()
        return memo[root]


def _shared_reduction_root(
    u: UOp, gs: list[_Group], owners: Mapping[UOp, Collection[UOp]], realized: set[UOp], pos: Mapping[UOp, int]
) -> UOp:
    """What to store for `u`, a shared node that holds a reduction: `u` (its kernel finishes the reduction with u's ops
    as epilogue), unless the kernels sharing it share other values over the same reduction too (a sigmoid's pieces,
    read by a forward and a backward kernel): storing each of those would compute the reduction once per piece, so
    the reduction is stored instead, once."""
    below = set(_fused_nodes(u, realized))
    reductions = {n for n in below if n.op is Ops.REDUCE_AXIS}
    others = {v for g in gs for v in g.members if v not in below and v not in realized and v.op not in MOVEMENT}
    for v in sorted(others, key=pos.__getitem__, reverse=True):
        if len(owners.get(v, ())) >= 2 and (common := reductions.intersection(_fused_nodes(v, realized))):
            return max(common, key=pos.__getitem__)  # the outermost: the others are stored by later rounds if need be
    return u


# *** building kernel ASTs ***


class _AstBuilder:
    """Builds the AST of one kernel: STOREs of its roots over LOADs of its leaves."""

    def __init__(
        self,
        roots: list[UOp],
        group: _Group,
        leaf_nodes: dict[UOp, UOp],
        load_views: dict[tuple[UOp, tuple[UOp, ...], bool], ShapeTracker] | None = None,
    ) -> None:
        self.roots, self.group, self.leaf_nodes = roots, group, leaf_nodes
        # (leaf, movement path, read inside a reduction) -> the view its load reads through: shared by the kernels of
        # one kernelize, which read the same tensors through the same views (forward, backward, update)
        self.load_views = {} if load_views is None else load_views
        self.buffers: list[UOp] = []  # base BUFFER per slot
        self.slot_nodes: list[UOp] = []  # what each slot reads: a BUFFER, or the ASSIGN whose kernel writes it
        self.extra_deps: list[UOp] = []  # kernelized leaves of an output buffer: earlier writes to order after
        self.memo: dict[tuple, UOp] = {}
        self.zero_memo: dict[UOp, bool] = {}
        self.reduce_out: tuple[int, ...] | None = None
        if group.reduce_sig is not None:
            full, axes = group.reduce_sig
            self.reduce_out = tuple(1 if i in axes else d for i, d in enumerate(full))

    def slot(self, buf: UOp, leaf: UOp | None = None) -> UOp:
        if buf not in self.buffers:
            self.buffers.append(buf)
            self.slot_nodes.append(leaf if leaf is not None else buf)
        elif leaf is not None and is_kernelized(leaf) and leaf not in self.slot_nodes and leaf not in self.extra_deps:
            self.extra_deps.append(leaf)
        i = self.buffers.index(buf)
        return UOp(Ops.DEFINE_GLOBAL, buf.dtype.ptr(buf.arg), arg=i)

    def build(self, outputs: list[tuple[UOp, ShapeTracker]]) -> UOp:
        for out_buf, _ in outputs:
            self.slot(out_buf)
        stores = []
        for root, (out_buf, out_st) in zip(self.roots, outputs):
            value = self.node(_root_value(root), (), False)
            st = out_st if self.reduce_out is None else out_st.reshape(self.reduce_out)
            view = UOp(Ops.VIEW, arg=st)
            stores.append(UOp(Ops.STORE, dtypes.void, (self.slot(out_buf), view, value)))
        return UOp(Ops.SINK, src=tuple(stores))

    def to_kernel_space(self, st: ShapeTracker, in_reduce: bool) -> ShapeTracker:
        if not in_reduce and self.reduce_out is not None and st.shape != self.reduce_out:
            return st.reshape(self.reduce_out)
        return st

    def node(self, u: UOp, path: tuple[UOp, ...], in_reduce: bool) -> UOp:
        """The AST of `u` seen through movement ops `path` (root first)."""
        key = (u, path, in_reduce)
        if key in self.memo:
            return self.memo[key]
        if u in self.leaf_nodes or is_leaf(u):
            leaf = self.leaf_nodes.get(u, u)
            if (st := self.load_views.get((leaf, path, in_reduce))) is None:
                st = apply_movement(leaf_view(leaf), list(reversed(path)))
                if in_reduce and len(st.views) > 1 and _permuted(st.views[0]):
                    # windows of windows over a buffer stored in another order (a strided convolution's input
                    # gradient by phases over a channels-last copy): the reduction's operand as few views as they
                    # merge into, one for staged copies. Only there: the CPU's window matrices, elementwise, ran
                    # slower from a merged view (7 -> 12 ms), and its NCHW phases were not measured faster
                    st = st.simplify()
                self.load_views[leaf, path, in_reduce] = st
            buf = base_buffer(leaf)
            out = UOp(Ops.LOAD, u.dtype, (self.slot(buf, leaf), UOp(Ops.VIEW, arg=self.to_kernel_space(st, in_reduce))))
        elif u.op is Ops.CONST:
            st = apply_movement(ShapeTracker.from_shape(()), list(reversed(path)))
            out = UOp(Ops.CONST, u.dtype, (UOp(Ops.VIEW, arg=self.to_kernel_space(st, in_reduce)),), u.arg)
        elif u.op in MOVEMENT:
            out = self.node(u.src[0], (*path, u), in_reduce)
            if u.op is Ops.PAD and self._changes_zero(u.src[0]):
                out = self._gate(out, u, path, in_reduce)
        elif u.op in PASSTHROUGH:
            out = self.node(u.src[0], path, in_reduce)
        elif u.op is Ops.COPY:  # a read in place of another device's buffer (see placement.py)
            out = self.node(u.src[1], path, in_reduce)
        elif u.op is Ops.REDUCE_AXIS:
            out = UOp(Ops.REDUCE_AXIS, u.dtype, (self.node(u.src[0], (), True),), u.arg)
        elif u.op in GroupOp.Elementwise:
            out = UOp(u.op, u.dtype, tuple(self.node(s, path, in_reduce) for s in u.src), u.arg)
        else:
            raise NotImplementedError(f"{u.op} can't be part of a kernel yet")
        self.memo[key] = out
        return out

    def _changes_zero(self, u: UOp) -> bool:
        """Whether `u`, computed in this kernel from loads that read 0 (and constants, masked alike), may not be 0:
        a PAD over it is then more than the masks its loads get."""
        if (known := self.zero_memo.get(u)) is not None:
            return known
        if u in self.leaf_nodes or is_leaf(u) or u in self.group.leaves or u.op is Ops.CONST:
            out = False
        else:
            out = u.op in NOT_ZERO_AT_ZERO or any(self._changes_zero(s) for s in u.src if s.op is not Ops.DEVICE)
        self.zero_memo[u] = out
        return out

    def _gate(self, value: UOp, pad: UOp, path: tuple[UOp, ...], in_reduce: bool) -> UOp:
        """`value`, read through `pad` and then `path`, selected where the pad's source lies and 0 in the padding: a
        pad over exp(x) holds 0s where exp of its masked loads would give 1s."""
        shape = shape_of(pad.src[0])
        st = ShapeTracker.from_shape(())
        if shape:
            st = st.reshape((1,) * len(shape)).expand(shape)
        view = UOp(Ops.VIEW, arg=self.to_kernel_space(apply_movement(st, [pad, *reversed(path)]), in_reduce))
        inside = UOp(Ops.CONST, dtypes.bool, (view,), True)
        return UOp(
            Ops.WHERE,
            value.dtype,
            (inside, value, UOp(Ops.CONST, value.dtype, (view,), dtypes.as_const(0, value.dtype))),
        )


def _permuted(view: View) -> bool:
    """Whether `view` reads its buffer out of order: its strides (of the dims it moves along) not descending, as an
    (N, C, H, W) view of a channels-last buffer."""
    strides = [abs(st) for st, n in zip(view.strides, view.shape) if isinstance(st, int) and st != 0 and n != 1]
    return strides != sorted(strides, reverse=True)


def _same_kernel(a: _Group, b: _Group) -> bool:
    """Outputs that can share one kernel: same shapes, reduction, independent, and reading a common input."""
    ra, rb = _root_value(a.root), _root_value(b.root)
    if a.root.op is Ops.ASSIGN or b.root.op is Ops.ASSIGN:
        return False
    if shape_of(ra) != shape_of(rb) or a.reduce_sig != b.reduce_sig:
        return False
    if a.root in b.leaves or b.root in a.leaves:
        return False
    shared = {view_base(x) for x in a.leaves} & {view_base(x) for x in b.leaves}
    return bool(shared)


def kernelize(outputs: list[UOp]) -> dict[UOp, UOp]:
    """Kernelize the graph under `outputs`: returns {realized node: ASSIGN(target view of BUFFER, KERNEL)}.

    Substituting that map into the graph makes every reader of a realized node LOAD its buffer.
    """
    realized, groups = choose_realized(outputs)
    out_roots = {output_root(o) for o in outputs}
    pos = {u: i for i, u in enumerate(UOp(Ops.SINK, src=tuple(outputs)).toposort)}
    direct = {r: {x for x in (groups[r].leaves if r in groups else {r.src[1]}) if x in realized} for r in realized}
    by_pos = sorted(realized, key=pos.__getitem__)
    needs = _transitive_bits(by_pos, direct)
    bit = {r: 1 << i for i, r in enumerate(by_pos)}
    # merge outputs that neither needs into multi-store kernels. Only outputs computed by a group, not ASSIGNs, and
    # of one shape and reduction can share a kernel (`_same_kernel`), so each looks only among the kernels started by
    # such outputs of its own shape and reduction, in the order they were started
    kernels: list[list[UOp]] = []
    mergeable: dict[tuple, list[list[UOp]]] = {}
    for r in by_pos:
        if r not in out_roots or r not in groups or r.op is Ops.ASSIGN:
            kernels.append([r])
            continue
        candidates = mergeable.setdefault((shape_of(_root_value(r)), groups[r].reduce_sig), [])
        for k in candidates:
            if all(_same_kernel(groups[x], groups[r]) and not needs[r] & bit[x] and not needs[x] & bit[r] for x in k):
                k.append(r)
                break
        else:
            kernels.append([r])
            candidates.append(kernels[-1])
    # imported here: row_values builds on this module's helpers
    from lazygrad_scheduler.row_values import merge_row_values

    kernels = merge_row_values(kernels, groups, direct)
    becomes: dict[UOp, UOp] = {}
    load_views: dict[tuple[UOp, tuple[UOp, ...], bool], ShapeTracker] = {}
    for roots in _kernel_order(kernels, direct, pos):
        if _byte_copy(roots[0]):
            becomes[roots[0]] = _copy_kernel(roots[0], becomes)
            continue
        members = set().union(*(groups[r].members for r in roots))
        sig = next((groups[r].reduce_sig for r in roots if groups[r].reduce_sig is not None), None)
        merged = _Group(roots[0], members, set().union(*(groups[r].leaves for r in roots)), sig)
        leaf_nodes = {leaf: becomes[leaf] for leaf in merged.leaves if leaf in becomes}
        outs: list[tuple[UOp, ShapeTracker]] = []
        targets: list[UOp] = []
        for r in roots:
            if r.op is Ops.ASSIGN:
                target = r.src[0]
                leaf = view_base(target)
                if not is_leaf(leaf):
                    raise ValueError("assign target must be a realized tensor (or a view of one); realize it first")
                buf = base_buffer(leaf)
                st = apply_movement(leaf_view(leaf), movement_chain(target))
                outs.append((buf, st))
                targets.append(UOp(Ops.VIEW, r.dtype, (buf,), st))
            else:
                shape = shape_of(r)
                buf = new_buffer(_device(r), max_numel(shape), r.dtype)
                st = ShapeTracker.from_shape(shape)
                outs.append((buf, st))
                targets.append(UOp(Ops.VIEW, r.dtype, (buf,), st))
        builder = _AstBuilder(roots, merged, leaf_nodes, load_views)
        ast, binds = unbind_ast(builder.build(outs))
        srcs = (*builder.slot_nodes, *builder.extra_deps, *binds)
        kernel = UOp(Ops.KERNEL, src=srcs, arg=Kernel(ast, len(roots), len(builder.slot_nodes)))
        for r, t in zip(roots, targets):
            becomes[r] = UOp(Ops.ASSIGN, r.dtype, (t, kernel))
    return becomes


def max_numel(shape: tuple[sint, ...]) -> int:
    """The most elements `shape` can have: symbolic dims count at the largest value of their variables, so that one
    buffer (and one kernel) serves every value they are bound to."""
    return math.prod(d if isinstance(d, int) else int(d.vmax) for d in shape)


def unbind_ast(ast: UOp) -> tuple[UOp, tuple[UOp, ...]]:
    """`ast` with each bound variable in its views replaced by the variable itself, and the BINDs that were there
    (sorted by name). The AST is then the same for every value, so it compiles once; the KERNEL carries the BINDs,
    and the schedule passes their values to the program."""
    views = [u for u in ast.toposort if u.op is Ops.VIEW and isinstance(u.arg, ShapeTracker)]
    binds = set().union(*(v.arg.binds() for v in views))
    if not binds:
        return ast, ()
    by_var: dict[UOp, UOp] = {}
    for b in binds:
        if (other := by_var.setdefault(b.src[0], b)) is not b:
            raise ValueError(
                f"variable {b.src[0].expr!r} is bound to {other.src[1].arg} and to {b.src[1].arg} in one kernel; "
                "bind each variable to one value per realize"
            )
    mapping = {b: b.src[0] for b in binds}
    ast = ast.substitute({v: v.replace(arg=v.arg.substitute(mapping)) for v in views})
    return ast, tuple(sorted(binds, key=lambda b: b.src[0].expr))


def _transitive_bits(by_pos: list[UOp], direct: dict[UOp, set[UOp]]) -> dict[UOp, int]:
    """For each root, every root it needs, directly or through others, as a bit set (bit i: `by_pos[i]`). `by_pos`
    is sources first, so what a root needs directly is done before it: one pass, each root's set the union of its
    direct needs' sets."""
    index = {r: i for i, r in enumerate(by_pos)}
    out: dict[UOp, int] = {}
    for r in by_pos:
        bits = 0
        for d in direct[r]:
            bits |= out[d] | 1 << index[d]
        out[r] = bits
    return out


def _kernel_order(kernels: list[list[UOp]], direct: dict[UOp, set[UOp]], pos: dict[UOp, int]) -> list[list[UOp]]:
    """Kernels ordered so that each is built after the kernels whose outputs it reads: of those whose inputs are
    built, the one whose last root comes first in the graph."""
    home = {r: i for i, k in enumerate(kernels) for r in k}
    waiting = [0] * len(kernels)  # kernels each still waits for
    users: list[list[int]] = [[] for _ in kernels]
    for i, k in enumerate(kernels):
        deps = {home[d] for r in k for d in direct[r]} - {i}
        waiting[i] = len(deps)
        for d in deps:
            users[d].append(i)
    last = [max(pos[r] for r in k) for k in kernels]  # distinct: each root is in one kernel
    ready = [(last[i], i) for i in range(len(kernels)) if not waiting[i]]
    heapq.heapify(ready)
    order: list[list[UOp]] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(kernels[i])
        for j in users[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, (last[j], j))
    assert len(order) == len(kernels), "kernels that need each other: merging made a cycle"
    return order


def _is_whole_leaf(u: UOp) -> bool:
    base = view_base(u)
    if not is_leaf(base):
        return False
    st = apply_movement(leaf_view(base), movement_chain(u))
    return st.contiguous and st.size == base_buffer(base).arg


def _byte_copy(u: UOp) -> bool:
    """Whether `u` is a COPY that moves bytes between devices (a kernel of its own), not a read in place."""
    return u.op is Ops.COPY and not reads_in_place(u)


def _copy_kernel(copy: UOp, becomes: dict[UOp, UOp]) -> UOp:
    """ASSIGN(new buffer on the target device, KERNEL(COPY)): a byte copy between devices."""
    src = becomes.get(copy.src[1], copy.src[1])
    shape = shape_of(copy)
    out = new_buffer(copy.src[0].arg, max_numel(shape), copy.dtype)
    leaf = view_base(src)
    ast = UOp(Ops.COPY, copy.dtype, (UOp(Ops.DEVICE, arg=copy.src[0].arg), src))
    kernel = UOp(Ops.KERNEL, src=(out, leaf if is_kernelized(leaf) else base_buffer(leaf)), arg=Kernel(ast, 1, 2))
    return UOp(Ops.ASSIGN, copy.dtype, (UOp(Ops.VIEW, copy.dtype, (out,), ShapeTracker.from_shape(shape)), kernel))


def _device(u: UOp) -> str:
    dev = device_of(u)
    if dev is None:
        raise ValueError("can't tell which device this tensor lives on")
    return dev
