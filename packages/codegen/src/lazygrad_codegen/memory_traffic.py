"""Offline measures of a GPU kernel's memory traffic, read from its linear program and launch sizes, without running
it: how many bytes its loads fetch from global memory. Divided by the FLOPs of the computation it gives the tiling
quality of a matmul (the default fp16 kernel loads 1/64 byte per FLOP on a 128x128 workgroup tile: each element
loaded is used 128 times from local memory and registers).

The count is what the loads ask for, before any cache: every LOAD from a `DEFINE_GLOBAL` counts its bytes once per
thread of the launch and per iteration of the loops around it. Loads behind a gate or inside an `IF` count as made
(an upper bound, exact when nothing is masked)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp, sint


def global_load_bytes(uops: Sequence[UOp], global_size: Sequence[sint], local_size: Sequence[int]) -> int:
    """Bytes the loads of the linear program `uops` fetch from global memory when launched as `global_size`
    workgroups of `local_size` threads. ValueError when a loop's trip count or a launch size is symbolic."""
    if not all(isinstance(s, int) for s in (*global_size, *local_size)):
        raise ValueError(f"launch sizes must be ints to count the loads, got {global_size} x {local_size}")
    threads = math.prod(global_size) * math.prod(local_size)  # type: ignore[arg-type]
    trips: list[int] = []
    total = 0
    for u in uops:
        if u.op is Ops.RANGE:
            end = u.src[0]
            if end.op is not Ops.CONST:
                raise ValueError("a loop of symbolic length: bind its variables before counting the loads")
            trips.append(int(end.arg))
        elif u.op is Ops.END:
            trips.pop()
        elif u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.DEFINE_GLOBAL:
            total += u.dtype.itemsize * math.prod(trips) * threads
    return total
