"""Ordering kernels: `create_schedule` turns a kernelized graph into `ScheduleItem`s in an order that runs every
kernel after the kernels it reads and every in-place update after the reads of the value it overwrites."""

from __future__ import annotations

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
    writers: dict[UOp, list[UOp]] = {}
    for k in kernels:
        for b in _kernel_buffers(k)[: k.arg.n_outputs]:
            writers.setdefault(b, []).append(k)
    for k in kernels:
        for s in k.src[k.arg.n_outputs : k.arg.n_slots]:
            if s.op is Ops.BUFFER:
                for w in writers.get(s, []):
                    if w is not k and w not in _ancestors(k, deps):
                        deps[w].add(k)
    order = _toposort(kernels, deps)
    items = [ScheduleItem(k.arg.ast, tuple(buffer_of(b) for b in _kernel_buffers(k)), _var_vals(k)) for k in order]
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


def _toposort(kernels: list[UOp], deps: dict[UOp, set[UOp]]) -> list[UOp]:
    order: list[UOp] = []
    placed: set[UOp] = set()
    remaining = list(kernels)
    while remaining:
        ready = [k for k in remaining if deps[k] <= placed]
        if not ready:
            raise ScheduleError("in-place updates depend on each other's old values in a cycle; realize one first")
        for k in ready:
            order.append(k)
            placed.add(k)
        remaining = [k for k in remaining if k not in placed]
    return order
