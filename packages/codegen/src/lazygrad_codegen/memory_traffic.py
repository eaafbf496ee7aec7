"""Offline measures of a GPU kernel's memory traffic, read from its linear program and launch sizes, without running
it: how many bytes its loads fetch from global memory. Divided by the FLOPs of the computation it gives the tiling
quality of a matmul (the default fp16 kernel loads 1/64 byte per FLOP on a 128x128 workgroup tile: each element
loaded is used 128 times from local memory and registers).

The count is what the loads ask for, before any cache: every LOAD from a `DEFINE_GLOBAL` counts its bytes once per
thread of the launch and per iteration of the loops around it. Loads behind a gate or inside an `IF` count as made
(an upper bound, exact when nothing is masked)."""

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
    source INDEX's valid."""
    if u.op is Ops.LOAD:
        return u.src[2] if len(u.src) == 3 else (u.src[0].src[2] if len(u.src[0].src) == 3 else None)
    return u.src[1].src[2] if len(u.src[1].src) == 3 else None


def _reads(u: UOp) -> int:
    """Bytes one thread's execution of global read `u` asks for (0 when `u` does not read global memory)."""
    if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.DEFINE_GLOBAL:
        return u.dtype.itemsize
    if u.op is Ops.ASYNC_COPY and u.src[1].src[0].op is Ops.DEFINE_GLOBAL:
        return int(u.arg) * u.src[1].src[0].dtype.base.itemsize
    return 0


def global_load_bytes(uops: Sequence[UOp], global_size: Sequence[sint], local_size: Sequence[int]) -> int:
    """Bytes the loads (and asynchronous copies) of the linear program `uops` fetch from global memory when launched
    as `global_size` workgroups of `local_size` threads. A read whose gate depends only on the loops around it (the
    last step of a pipeline fetches nothing) is counted in the iterations where the gate holds; any other gated read
    counts as made. ValueError when a loop's trip count or a launch size is symbolic."""
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
