"""Ordering kernels: `create_schedule` turns a kernelized graph into `ScheduleItem`s in an order that runs every
kernel after the kernels it reads and every in-place update after the reads of the value it overwrites."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from lazygrad_uop.device import Buffer
from lazygrad_uop.ops import Ops
from lazygrad_uop.tensor_graph import base_buffer, buffer_of, is_kernelized
from lazygrad_uop.uop import UOp


@dataclass(frozen=True)
class ScheduleItem:
    """One kernel to run: its AST, its buffers in parameter order (outputs first), and the values of the symbolic
    variables (DEFINE_VAR) its AST uses."""

    ast: UOp
    bufs: tuple[Buffer, ...]
    var_vals: dict[UOp, int] = field(default_factory=dict, hash=False)

    @property
    def outputs(self) -> tuple[Buffer, ...]:
        """The buffers the kernel writes."""
        return self.bufs[: self.ast_outputs]

    @property
    def ast_outputs(self) -> int:
        """How many of `bufs` the kernel writes."""
        return 1 if self.ast.op is Ops.COPY else sum(1 for s in self.ast.src if s.op is Ops.STORE)


class ScheduleError(RuntimeError):
    """The kernels can't be ordered: in-place updates that read each other's old values in a cycle."""


def _kernel_buffers(kernel: UOp) -> list[UOp]:
    """The BUFFER node behind each parameter slot of a KERNEL."""
    return [s if s.op is Ops.BUFFER else base_buffer(s) for s in kernel.src[: kernel.arg.n_slots]]


def create_schedule(sink: UOp) -> tuple[list[ScheduleItem], list[UOp]]:
    """The kernels under `sink` in a valid order, and the ASSIGN nodes they complete (in the same order)."""
    assigns = [u for u in sink.toposort if is_kernelized(u)]
    kernel_of = {a: a.src[1] for a in assigns}
    kernels = list(dict.fromkeys(kernel_of.values()))
    deps: dict[UOp, set[UOp]] = {k: set() for k in kernels}
    for k in kernels:
        deps[k] |= {s.src[1] for s in k.src if is_kernelized(s)}
    # write-after-read: a kernel that overwrites buffer B in place runs after the kernels that read B's old value
    slots = {k: _kernel_buffers(k) for k in kernels}
    writers: dict[UOp, list[UOp]] = {}
    for k in kernels:
        for b in slots[k][: k.arg.n_outputs]:
            writers.setdefault(b, []).append(k)
    for k in kernels:
        for s in k.src[k.arg.n_outputs : k.arg.n_slots]:
            if s.op is Ops.BUFFER:
                for w in writers.get(s, []):
                    if w is not k and w not in _ancestors(k, deps):
                        deps[w].add(k)
    order = _toposort(kernels, deps, slots, writers)
    items = [ScheduleItem(k.arg.ast, tuple(buffer_of(b) for b in slots[k]), _var_vals(k)) for k in order]
    done = [a for k in order for a in assigns if kernel_of[a] is k]
    return items, done


def _var_vals(kernel: UOp) -> dict[UOp, int]:
    """The values of the variables a KERNEL's AST uses, from the BINDs among its sources."""
    return {s.src[0]: s.src[1].arg for s in kernel.src[kernel.arg.n_slots :] if s.op is Ops.BIND}


def _ancestors(k: UOp, deps: dict[UOp, set[UOp]]) -> set[UOp]:
    seen, stack = set(), [k]
    while stack:
        for d in deps[stack.pop()]:
            if d not in seen:
                seen.add(d)
                stack.append(d)
    return seen


def _toposort(
    kernels: list[UOp], deps: dict[UOp, set[UOp]], slots: dict[UOp, list[UOp]], writers: dict[UOp, list[UOp]]
) -> list[UOp]:
    """Every kernel after its `deps`, in an order that keeps little memory held: of the kernels ready to run, the one
    that frees the most bytes (buffers it is the last to read) less those it writes first, ties in `kernels`' order.
    So a kernel whose inputs are ready early but whose output is read late (a window matrix that only the backward
    pass reads) waits for its reader, and one that lets a big buffer go (a weight gradient, the last reader of a
    saved activation) runs as soon as it can. `slots`: each kernel's BUFFER per parameter slot; `writers`: the
    kernels writing each buffer."""
    index = {k: i for i, k in enumerate(kernels)}
    outs = {k: set(slots[k][: k.arg.n_outputs]) for k in kernels}
    ins = {k: set(slots[k][k.arg.n_outputs : k.arg.n_slots]) - outs[k] for k in kernels}
    readers: dict[UOp, list[UOp]] = {}
    for k in kernels:
        for b in ins[k]:
            if b in writers:  # a buffer this schedule writes: the last kernel to read it frees it
                readers.setdefault(b, []).append(k)
    unread = {b: len(rs) for b, rs in readers.items()}
    nbytes = {b: buffer_of(b).nbytes for b in {*writers, *readers}}
    allocated: set[UOp] = set()
    waiting = {k: len(deps[k]) for k in kernels}
    dependents: dict[UOp, list[UOp]] = {k: [] for k in kernels}
    for k in kernels:
        for d in deps[k]:
            dependents[d].append(k)
    heap: list[tuple[int, int, int, UOp]] = []  # (bytes held after, order in `kernels`, version, kernel)
    version: dict[UOp, int] = {}

    def push(k: UOp) -> None:
        freed = sum(nbytes[b] for b in ins[k] if unread.get(b) == 1)
        new = sum(nbytes[b] for b in outs[k] if b not in allocated)
        version[k] = version.get(k, 0) + 1
        heapq.heappush(heap, (new - freed, index[k], version[k], k))

    for k in kernels:
        if waiting[k] == 0:
            push(k)
    order: list[UOp] = []
    placed: set[UOp] = set()
    while heap:
        *_, ver, k = heapq.heappop(heap)
        if k in placed or ver != version[k]:
            continue  # placed, or pushed again since with a new gain
        placed.add(k)
        order.append(k)
        allocated.update(outs[k])
        changed = {w for b in outs[k] for w in writers[b]}
        for b in ins[k]:
            if b in unread:
                unread[b] -= 1
                if unread[b] == 1:
                    changed.update(readers[b])
        for d in dependents[k]:
            waiting[d] -= 1
            if waiting[d] == 0:
                changed.add(d)
        for c in changed:
            if c not in placed and waiting[c] == 0:
                push(c)
    if len(order) < len(kernels):
        raise ScheduleError("in-place updates depend on each other's old values in a cycle; realize one first")
    return order
