"""Offline measures of a GPU kernel's memory traffic, read from its linear program and launch sizes, without running
it: how many bytes its loads fetch from global memory. Divided by the FLOPs of the computation it gives the tiling
quality of a matmul (the default fp16 kernel loads 1/64 byte per FLOP on a 128x128 workgroup tile: each element
loaded is used 128 times from local memory and registers).

The count is what the loads ask for, before any cache: every LOAD from a `DEFINE_GLOBAL` counts its bytes once per
thread of the launch and per iteration of the loops around it. Loads behind a gate or inside an `IF` count as made
(an upper bound, exact when nothing is masked).

`sector_use` measures coalescing the same way: the share of the 32-byte sectors a warp's loads and stores touch
that they use (a transpose whose lanes each read their own row uses an eighth of them)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from lazygrad_codegen.selection import conjuncts
from lazygrad_uop.ops import Ops
from lazygrad_uop.symbolic import sym_infer
from lazygrad_uop.uop import UOp, sint


def _gate(u: UOp) -> UOp | None:
    """The condition under which a global read reads anything: a LOAD's gate or its INDEX's valid, an ASYNC_COPY's
    source INDEX's valid, a TMA_LOAD's gate (the one thread that starts it)."""
    if u.op is Ops.TMA_LOAD:
        return u.src[3]
    if u.op is Ops.LOAD:
        return u.src[2] if len(u.src) == 3 else (u.src[0].src[2] if len(u.src[0].src) == 3 else None)
    return u.src[1].src[2] if len(u.src[1].src) == 3 else None


def _access(u: UOp) -> tuple[UOp, UOp | None, int, int] | None:
    """(element index, gate, bytes per lane, bytes per element) of a global read or write, None for anything else."""
    if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.DEFINE_GLOBAL:
        index, gate, size = u.src[0], _gate(u), u.dtype.itemsize
    elif u.op is Ops.STORE and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.DEFINE_GLOBAL:
        index, size = u.src[0], u.src[1].dtype.itemsize
        gate = index.src[2] if len(index.src) == 3 else None
    elif u.op is Ops.ASYNC_COPY and u.src[1].src[0].op is Ops.DEFINE_GLOBAL:
        index, gate, size = u.src[1], _gate(u), int(u.arg) * u.src[1].src[0].dtype.base.itemsize
    else:
        return None
    return index.src[1], gate, size, index.src[0].dtype.base.itemsize


def _reads(u: UOp) -> int:
    """Bytes one thread's execution of global read `u` asks for (0 when `u` does not read global memory): a
    TMA_LOAD's whole box."""
    if u.op is Ops.TMA_LOAD:
        return u.arg.box_bytes
    access = None if u.op is Ops.STORE else _access(u)
    return 0 if access is None else access[2]


def global_load_bytes(uops: Sequence[UOp], global_size: Sequence[sint], local_size: Sequence[int]) -> int:
    """Bytes the loads (asynchronous copies, TMA boxes) of the linear program `uops` fetch from global memory when
    launched as `global_size` workgroups of `local_size` threads. A read whose gate depends only on the loops around
    it (the last step of a pipeline fetches nothing) is counted in the iterations where the gate holds; any other
    gated read counts as made. ValueError when a loop's trip count or a launch size is symbolic."""
    if not all(isinstance(s, int) for s in (*global_size, *local_size)):
        raise ValueError(f"launch sizes must be ints to count the loads, got {global_size} x {local_size}")
    threads = math.prod(global_size) * math.prod(local_size)  # type: ignore[arg-type]
    loops: list[UOp] = []
    total: float = 0
    for u in uops:
        if u.op is Ops.RANGE:
            if u.src[0].op is not Ops.CONST:
                raise ValueError("a loop of symbolic length: bind its variables before counting the loads")
            loops.append(u)
        elif u.op is Ops.END:
            loops.pop()
        elif (size := _reads(u)) > 0:
            trips = [int(r.src[0].arg) for r in loops]
            total += size * _iterations(_gate(u), loops, trips) * threads
    return round(total)


def _iterations(gate: UOp | None, loops: list[UOp], trips: list[int]) -> int | float:
    """In how many iterations of `loops` a read with `gate` reads, on average over a workgroup's threads. Of the
    gate's terms (an AND), those that depend on nothing but (some of) those loops and the thread's index in its
    workgroup (`lidx`: the threads past the end of a tile's copies, the steps past the end of a pipeline) are
    counted exactly, over the iterations and threads where they hold; any other term (a view's validity: padding,
    edges) counts as holding."""
    everything = math.prod(trips)
    if gate is None:
        return everything
    lengths = dict(zip(loops, trips, strict=True))
    exact: list[UOp] = []
    for term in conjuncts(gate):
        leaves = {n for n in term.toposort if n.op in (Ops.RANGE, Ops.SPECIAL, Ops.DEFINE_VAR)}
        local = {n for n in leaves if n.op is Ops.SPECIAL and str(n.arg[0]).startswith("lidx")}
        if leaves and leaves <= set(loops) | local:
            exact.append(term)
    if not exact:
        return everything
    leaves = {n for t in exact for n in t.toposort if n.op in (Ops.RANGE, Ops.SPECIAL)}
    used = [(n, lengths[n] if n in lengths else int(n.arg[1])) for n in leaves]
    if math.prod(t for _, t in used) > 1 << 12:
        return everything
    holds = sum(
        all(bool(sym_infer(t, dict(zip((r for r, _ in used), values, strict=True)))) for t in exact)
        for values in itertools.product(*(range(t) for _, t in used))
    )
    return holds * everything / math.prod(t for _, t in used)


# *** coalescing ***

SECTOR_BYTES = 32  # what a GPU's memory moves per access: a warp's load or store costs the sectors its lanes touch
WARP = 32


def _thread_values(global_size: Sequence[int], local_size: Sequence[int], lane: int) -> dict[str, int]:
    """The launch indices of thread `lane` of the first warp of the middle workgroup (clear of the edges a view pads
    at, which the first could lie on): `lidx0` counts fastest, CUDA's threadIdx.x."""
    out, rest = {f"gidx{d}": size // 2 for d, size in enumerate(global_size)}, lane
    for d, size in enumerate(local_size):
        out[f"lidx{d}"], rest = rest % size, rest // size
    return out


def sector_use(uops: Sequence[UOp], global_size: Sequence[sint], local_size: Sequence[int]) -> float:
    """The share of the bytes in the 32-byte sectors that one warp's global loads, stores and asynchronous copies
    touch which they use: 1.0 when the warp reads and writes whole sectors (coalesced), 1/8 when each lane's 4 bytes
    lie in a sector of their own. The warp is the first of the middle workgroup, in the first iteration of the loops
    around each access, lanes whose gate fails touching nothing; its accesses of one buffer in one direction inside
    the same loops count together, as many times as those loops run. Loads and stores at a small share move that
    many times the bytes they use between the caches and memory. An access whose address or gate depends on a
    loaded value (an embedding's gather) is left out. ValueError when a launch size is symbolic."""
    if not all(isinstance(s, int) for s in (*global_size, *local_size)):
        raise ValueError(f"launch sizes must be ints to place the warp, got {global_size} x {local_size}")
    threads = min(WARP, math.prod(local_size))  # type: ignore[arg-type]
    lanes = [_thread_values(global_size, local_size, lane) for lane in range(threads)]  # type: ignore[arg-type]
    # per buffer, direction and loop nest, the bytes the warp's accesses use: the sectors one access leaves part of
    # are the next one's (a thread's tile of a transpose), which the caches keep; each group counts as many times as
    # its loops run (a matmul's copies once per step of its reduction, its stores once)
    groups: dict[tuple[UOp, bool, tuple[UOp, ...]], set[int]] = {}
    trips: dict[tuple[UOp, ...], int] = {}
    loops: list[UOp] = []
    for u in uops:
        if u.op is Ops.RANGE:
            loops.append(u)
        elif u.op is Ops.END and loops:
            loops.pop()
        if (access := _access(u)) is None:
            continue
        index, gate, size, itemsize = access
        if any(n.op is Ops.LOAD for root in (index, gate) if root is not None for n in root.toposort):
            continue  # an address or gate read from memory (a gather by index): where it falls is data, not code
        nest = tuple(loops)
        trips[nest] = math.prod(int(r.src[0].arg) if r.src[0].op is Ops.CONST else 1 for r in nest)
        leaves = {n for root in (index, gate) if root is not None for n in root.toposort if n.op in _LEAVES}
        used = groups.setdefault((_buffer(u), u.op is Ops.STORE, nest), set())
        for lane in lanes:
            env = {n: (lane.get(str(n.arg[0]), 0) if n.op is Ops.SPECIAL else 0) for n in leaves}
            if gate is not None and not sym_infer(gate, env):
                continue
            start = int(sym_infer(index, env)) * itemsize
            used.update(range(start, start + size))
    touched = sum(trips[k[2]] * SECTOR_BYTES * len({b // SECTOR_BYTES for b in used}) for k, used in groups.items())
    return sum(trips[k[2]] * len(used) for k, used in groups.items()) / touched if touched else 1.0


def _buffer(u: UOp) -> UOp:
    return (u.src[1] if u.op is Ops.ASYNC_COPY else u.src[0]).src[0]


_LEAVES = (Ops.RANGE, Ops.SPECIAL, Ops.DEFINE_VAR)
