"""Memory planning: intermediate buffers whose lifetimes don't overlap share memory.

A list of kernels runs in order; an intermediate is written by one of them and read by later ones, and nothing reads
it after the last. `plan_memory` gives every intermediate a view of a shared block: walking the kernels in order,
an intermediate takes a free block at its first use (the smallest that is big enough, else the largest free one,
grown to fit, else a new one) and gives it back after its last use. Blocks are planned before any is allocated, so
growing one is free. A deep chain of kernels then needs two blocks, not one buffer per kernel.

Which buffers are intermediates is the caller's knowledge: `intermediate_buffers` finds them for one realize (the
new buffers of a kernelize that no live graph reads afterwards); the JIT finds them for a captured function.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lazygrad_uop.device import Allocator, Buffer, BufferSpec
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.tensor_graph import base_buffer, buffer_of, is_kernelized
from lazygrad_uop.uop import UOp


@dataclass
class _Block:
    """Memory shared by intermediates with disjoint lifetimes; `nbytes` grows to the largest of them."""

    device: str
    nbytes: int
    users: list[Buffer] = field(default_factory=list)


def _supports_views(device: str) -> bool:
    from lazygrad_uop.registry import Device  # opens the device on first use

    return type(Device[device].allocator)._offset is not Allocator._offset


def plan_memory(uses: Sequence[Iterable[Buffer]], candidates: Collection[Buffer]) -> dict[Buffer, Buffer]:
    """{intermediate: the buffer to use instead}, for the `candidates` among the buffers of `uses` (one entry per
    kernel, in run order). Each replacement is a view at offset 0 of a shared block, or, on devices whose allocator
    has no sub-buffers, another intermediate of the same size and dtype whose lifetime is over.

    The caller guarantees that a candidate's contents matter only from its first use (which writes it) to its last,
    and that nothing else reads it. Views, buffers with special options and empty buffers are left alone."""
    first: dict[Buffer, int] = {}
    last: dict[Buffer, int] = {}
    for i, bufs in enumerate(uses):
        for b in bufs:
            if b in candidates and b.base is None and b.nbytes > 0 and b.options == BufferSpec():
                first.setdefault(b, i)
                last[b] = i
    if not first:
        return {}
    starts: dict[int, list[Buffer]] = {}
    ends: dict[int, list[Buffer]] = {}
    for b, i in first.items():
        starts.setdefault(i, []).append(b)
    for b, i in last.items():
        ends.setdefault(i, []).append(b)
    views = {b.device: _supports_views(b.device) for b in first}
    free: dict[str, list[_Block]] = {}
    block_of: dict[Buffer, _Block] = {}
    blocks: list[_Block] = []
    for i in range(len(uses)):
        for b in starts.get(i, ()):
            pool = free.setdefault(b.device, [])
            block = _take(pool, b, views[b.device])
            if block is None:
                block = _Block(b.device, b.nbytes)
                blocks.append(block)
            block.nbytes = max(block.nbytes, b.nbytes)
            block.users.append(b)
            block_of[b] = block
        for b in ends.get(i, ()):
            free[b.device].append(block_of[b])
    plan: dict[Buffer, Buffer] = {}
    for block in blocks:
        if views[block.device]:
            base = Buffer(block.device, block.nbytes, dtypes.uint8)
            plan.update({b: Buffer(b.device, b.size, b.dtype, base=base) for b in block.users})
        else:
            # same size and dtype throughout (see _take): the first user's buffer serves them all
            plan.update({b: block.users[0] for b in block.users[1:]})
    return plan


def _take(pool: list[_Block], b: Buffer, views: bool) -> _Block | None:
    """Remove from `pool` and return the block `b` should use, or None when it needs a new one."""
    if views:
        fits = [k for k in pool if k.nbytes >= b.nbytes]
        block = min(fits, key=lambda k: k.nbytes) if fits else max(pool, key=lambda k: k.nbytes, default=None)
    else:
        same = (b.size, b.dtype)
        block = next((k for k in pool if (k.users[0].size, k.users[0].dtype) == same), None)
    if block is not None:
        pool.remove(block)
    return block


def planned_bytes(plan: Mapping[Buffer, Buffer]) -> int:
    """The bytes of the distinct memory `plan` maps its buffers to."""
    bases = {id(v.base if v.base is not None else v): v.base if v.base is not None else v for v in plan.values()}
    return sum(b.nbytes for b in bases.values())


def intermediate_buffers(becomes: Mapping[UOp, UOp], live: Iterable[UOp]) -> set[Buffer]:
    """The buffers that kernelize's result `becomes` creates and that no graph in `live` reads once its kernels ran:
    the values computed only for other kernels of the same schedule, which `plan_memory` may overlap.

    `live` are the graphs of every tensor that can still be read (after `becomes` was substituted into them). A
    graph holds a buffer it reaches without going through a KERNEL: a kernel's own inputs are read when it runs, and
    are free once every kernel that reads them did."""
    new = {base_buffer(a): a for root, a in becomes.items() if root.op is not Ops.ASSIGN and is_kernelized(a)}
    if not new:
        return set()
    held: set[UOp] = set()
    seen: set[UOp] = set()
    stack = list(live)
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if is_kernelized(u):
            held.add(base_buffer(u))
            stack.append(u.src[0])
        elif u.op is Ops.BUFFER:
            held.add(u)
        else:
            stack.extend(u.src)
    return {buffer_of(b) for b in new if b not in held}
