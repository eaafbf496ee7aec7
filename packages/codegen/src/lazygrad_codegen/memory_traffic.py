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
    total = 0
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
    return total


def _iterations(gate: UOp | None, loops: list[UOp], trips: list[int]) -> int:
    """In how many iterations of `loops` a read with `gate` reads: all of them, unless the gate depends on nothing
    but (some of) those loops, when the iterations where it holds are counted."""
    everything = math.prod(trips)
    if gate is None:
        return everything
    leaves = {n for n in gate.toposort if n.op in (Ops.RANGE, Ops.SPECIAL, Ops.DEFINE_VAR)}
    if not leaves or not leaves <= set(loops):
        return everything
    used = [(r, t) for r, t in zip(loops, trips, strict=True) if r in leaves]
    if math.prod(t for _, t in used) > 1 << 16:
        return everything
    holds = sum(
        bool(sym_infer(gate, dict(zip((r for r, _ in used), values, strict=True))))
        for values in itertools.product(*(range(t) for _, t in used))
    )
    return holds * everything // math.prod(t for _, t in used)
