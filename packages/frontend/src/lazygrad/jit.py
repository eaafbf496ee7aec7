"""`TinyJit`: run a function's kernels again without running the function.

The first call runs the function as usual (compiling its kernels). The second runs it while recording every
`ExecItem` it executes (`engine.capturing`); the recording is then memory-planned (intermediates that no tensor can
read afterwards share memory where their lifetimes don't overlap) and batched into device graphs where the device
has a graph type. Later calls only swap in the new input buffers and variable values and replay the recording:
no graph building, scheduling or compiling, one native call per batch of kernels.

Inputs are the tensors among the arguments (positional, then keyword in name order) and bound variables
(`Variable("n", 1, 64).bind(5)`) given directly or inside the inputs' shapes; each call must pass tensors of the same
shapes, dtypes, devices and views (`JitError` otherwise). What the function returns is returned again by every
replay: the same tensors, whose buffers the replay overwrote. Python-side effects and values that aren't inputs
(Python numbers, tensors created inside the function from host data, `.numpy()` results) are frozen at the
capture: pass what changes as a tensor or a bound variable. Random numbers are not frozen: the generator's state is a
device tensor that a captured kernel advances, so each replay draws the next numbers (see `lazygrad.random`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from lazygrad.counters import GlobalCounters
from lazygrad.engine import CompiledRunner, ExecItem, capturing, report_graph
from lazygrad.gradient import realized_graphs
from lazygrad.multi import device_uops
from lazygrad.tensor import Tensor, _all_tensors
from lazygrad_scheduler import buffer_of, is_kernelized
from lazygrad_scheduler.kernelize import apply_movement, base_buffer, leaf_view, view_base
from lazygrad_scheduler.memory import plan_memory
from lazygrad_uop.config import DEBUG, JIT
from lazygrad_uop.device import Buffer, GraphError, GraphRunner, KernelLaunch
from lazygrad_uop.dtype import DType
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker

R = TypeVar("R")


class JitError(RuntimeError):
    """A jitted function was called with inputs that don't match the ones it was captured with, or can't be
    captured."""


@dataclass(frozen=True)
class InputSpec:
    """What a replay needs to stay the same about an input tensor: its view of its buffer (with variables unbound),
    dtype and device."""

    st: ShapeTracker
    dtype: DType
    device: str

    def describe(self) -> str:
        shape = tuple(d if isinstance(d, int) else d.render() for d in self.st.shape)
        return f"shape {shape}, {self.dtype!r} on {self.device}"


def _flat_tensors(x: Any) -> list[Tensor]:
    """The tensors in a (nested) tuple, list or dict, in order."""
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _flat_tensors(v)]
    if isinstance(x, dict):
        return [t for k in sorted(x, key=str) for t in _flat_tensors(x[k])]
    return []


def _prepare_inputs(args: tuple, kwargs: dict) -> tuple[list[Buffer], list[InputSpec], dict[UOp, int]]:
    """Realize the tensor inputs; their buffers, specs and the variable values they (and bound args) carry."""
    values = [*args, *(kwargs[k] for k in sorted(kwargs))]
    given = [v for v in values if isinstance(v, Tensor)]
    var_vals = {v.src[0]: v.src[1].arg for v in values if isinstance(v, UOp) and v.op is Ops.BIND}
    unrealized = [t for t in given if any(view_base(u).op is not Ops.BUFFER for u in device_uops(t.uop))]
    if unrealized:
        Tensor.realize(*unrealized)
    # a tensor on several devices is one input per device
    tensors = [p for t in given for p in ([Tensor(u) for u in t.uop.src] if t.uop.op is Ops.MULTI else [t])]
    bufs, specs = [], []
    for t in tensors:
        base = view_base(t.uop)
        if base.op is not Ops.BUFFER:
            raise JitError(f"input {t!r} could not be realized into a buffer of its own; pass t.contiguous()")
        chain, u = [], t.uop
        while u is not base:
            chain.append(u)
            u = u.src[0]
        st = apply_movement(leaf_view(base), chain[::-1])
        binds = st.binds()
        for b in binds:
            var_vals[b.src[0]] = b.src[1].arg
        if binds:
            st = st.substitute({b: b.src[0] for b in binds})
        buf = buffer_of(base)
        if not buf.is_allocated:
            buf.allocate()
        bufs.append(buf)
        specs.append(InputSpec(st, t.dtype, t.device))
    return bufs, specs, var_vals


def _held_buffers() -> set[Buffer]:
    """The buffers that live tensors can read: everything a tensor's graph reaches without entering a KERNEL, and
    through realized tensors the graphs autograd keeps for them (a backward may compute those again)."""
    held: set[Buffer] = set()
    seen: set[UOp] = set()
    stack = [t.uop for t in list(_all_tensors)]
    origins = realized_graphs.mapping
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op is Ops.VIEW and (origin := origins.get(u)) is not None:
            stack.append(origin)
        if u.op is Ops.BUFFER:
            held.add(buffer_of(u))
        elif is_kernelized(u):
            held.add(buffer_of(base_buffer(u)))
        else:
            stack.extend(u.src)
    return held


def _outputs(ei: ExecItem) -> list[Buffer]:
    """The buffers an ExecItem writes: a kernel's outputs, a copy's destination."""
    r = ei.runner
    if isinstance(r, CompiledRunner):
        return [ei.bufs[j] for j in r.spec.outs]
    return ei.bufs[:1]


def _written_first(items: list[ExecItem]) -> set[Buffer]:
    """The buffers whose first use in `items` only writes them: their earlier contents don't matter."""
    first: dict[Buffer, bool] = {}
    for ei in items:
        r = ei.runner
        if isinstance(r, CompiledRunner):
            outs, ins = set(r.spec.outs), set(r.spec.ins)
            writes = {j for j in range(len(ei.bufs)) if j in outs and j not in ins}
        else:
            writes = {0}
        for j, b in enumerate(ei.bufs):
            first.setdefault(b, j in writes)
    return {b for b, w in first.items() if w}


class _GraphStep:
    """Consecutive captured kernels run as one device graph."""

    def __init__(self, graph: GraphRunner, items: list[tuple[int, ExecItem]]) -> None:
        self.graph, self.items = graph, items


class CapturedJit:
    """A captured function: its ExecItems (memory-planned), where the input buffers sit in them, and the steps that
    replay them (device graphs or single items)."""

    def __init__(self, items: list[ExecItem], input_bufs: list[Buffer], var_names: set[UOp], ret: Any) -> None:
        self.items, self.ret = items, ret
        index = {b: k for k, b in enumerate(input_bufs)}
        # (item, slot, input) for every place an input buffer is used
        self.input_slots = [(i, j, index[b]) for i, ei in enumerate(items) for j, b in enumerate(ei.bufs) if b in index]
        self.input_items = {i for i, _, _ in self.input_slots}
        # what a replay writes: autograd can't go through a value computed before it that reads these
        self.written = {b for ei in items for b in _outputs(ei)}
        self.var_items = {i for i, ei in enumerate(items) if var_names & ei.var_vals.keys()}
        self.steps: list[_GraphStep | int] = self._build_steps()
        self.last: tuple[list[Buffer], dict[UOp, int]] | None = None

    def _build_steps(self) -> list[_GraphStep | int]:
        steps: list[_GraphStep | int] = []
        run: list[tuple[int, ExecItem]] = []

        def flush() -> None:
            if len(run) >= 2 and (graph := _make_graph(run)) is not None:
                steps.append(_GraphStep(graph, list(run)))
            else:
                steps.extend(i for i, _ in run)
            run.clear()

        for i, ei in enumerate(self.items):
            graphable = (
                JIT.value < 2 and isinstance(ei.runner, CompiledRunner) and _graph_type(ei.runner.device) is not None
            )
            if run and (not graphable or ei.runner.device != run[0][1].runner.device):
                flush()
            if graphable:
                run.append((i, ei))
            else:
                steps.append(i)
        flush()
        return steps

    def __call__(self, input_bufs: list[Buffer], var_vals: dict[UOp, int]) -> None:
        """Replay with `input_bufs` in place of the captured inputs and the variable values `var_vals`."""
        if len(realized_graphs):
            realized_graphs.invalidate(self.written)
        changed: set[int] = set()
        if self.last is None or any(a is not b for a, b in zip(self.last[0], input_bufs, strict=True)):
            for i, j, k in self.input_slots:
                self.items[i].bufs[j] = input_bufs[k]
            changed |= self.input_items
        if self.last is None or self.last[1] != var_vals:
            changed |= self.var_items
        self.last = (list(input_bufs), dict(var_vals))
        wait = DEBUG >= 2
        for step in self.steps:
            if isinstance(step, int):
                self.items[step].run(var_vals)
                continue
            updates = {k: _launch(ei, var_vals) for k, (i, ei) in enumerate(step.items) if i in changed}
            if updates:
                step.graph.update(updates)
            elapsed = step.graph(wait=wait)
            costs = [ei.cost({**ei.var_vals, **var_vals}) for _, ei in step.items]
            GlobalCounters.add(len(costs), sum(c[0] for c in costs), sum(c[1] for c in costs), elapsed)
            if wait and elapsed is not None:
                report_graph(type(step.graph).__name__, step.graph.device.device, len(step.items), elapsed)


def _graph_type(device: str) -> type[GraphRunner] | None:
    graph = getattr(Device[device], "graph", None)
    # a graph type that follows the GraphRunner contract; others (older device packages) are not used
    return graph if isinstance(graph, type) and issubclass(graph, GraphRunner) else None


def _launch(ei: ExecItem, var_vals: dict[UOp, int]) -> KernelLaunch:
    assert isinstance(ei.runner, CompiledRunner)
    return ei.runner.launch(ei.bufs, {**ei.var_vals, **var_vals} if var_vals else ei.var_vals)


def _make_graph(run: list[tuple[int, ExecItem]]) -> GraphRunner | None:
    """A device graph of the run's kernels, or None when the device declines them."""
    ei0 = run[0][1]
    assert isinstance(ei0.runner, CompiledRunner)
    graph_type = _graph_type(ei0.runner.device)
    if graph_type is None:
        return None
    for _, ei in run:
        for b in ei.bufs:
            if not b.is_allocated:
                b.allocate()
    try:
        return graph_type(Device[ei0.runner.device], [_launch(ei, {}) for _, ei in run])
    except GraphError:
        return None


class TinyJit(Generic[R]):
    """Wrap a function whose work is tensor operations so that, from its third call on, calling it replays the
    captured kernels on the new inputs (see the module docstring). `JIT=0` turns capturing off: the function then
    simply runs each time; `JIT=2` replays without device graphs, one kernel call at a time. Works as a decorator,
    also on methods."""

    def __init__(self, fxn: Callable[..., R]) -> None:
        self.fxn = fxn
        functools.update_wrapper(self, fxn)  # type: ignore[arg-type]
        self.reset()

    def reset(self) -> None:
        """Forget the capture: the next call runs the function again, the one after captures it anew."""
        self.cnt = 0
        self.captured: CapturedJit | None = None
        self.specs: list[InputSpec] | None = None
        self.var_names: set[UOp] = set()

    @property
    def jit_cache(self) -> list[ExecItem]:
        """The captured ExecItems (empty before the capture)."""
        return self.captured.items if self.captured is not None else []

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self.__call__, obj)

    def _check(self, specs: list[InputSpec], var_vals: dict[UOp, int]) -> None:
        if self.specs is None:
            self.specs, self.var_names = specs, set(var_vals)
            return
        if len(specs) != len(self.specs):
            raise JitError(f"this jitted function was captured with {len(self.specs)} tensor inputs, got {len(specs)}")
        for k, (old, new) in enumerate(zip(self.specs, specs, strict=True)):
            if old != new:
                raise JitError(
                    f"tensor input {k} of the jitted function {getattr(self.fxn, '__name__', '')!r} changed: captured "
                    f"with {old.describe()}, called with {new.describe()}"
                    + (
                        ""
                        if old.st.shape != new.st.shape or old.dtype != new.dtype or old.device != new.device
                        else " (the same shape but another view of its buffer; pass .contiguous())"
                    )
                    + "; call .reset() on the jit, or jit one function per input signature"
                )
        if set(var_vals) != self.var_names:
            raise JitError(
                f"the jitted function was captured with variables {sorted(v.expr for v in self.var_names)}, "
                f"called with {sorted(v.expr for v in var_vals)}"
            )

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        if not JIT:
            return self.fxn(*args, **kwargs)
        bufs, specs, var_vals = _prepare_inputs(args, kwargs)
        self._check(specs, var_vals)
        if self.cnt == 0:
            ret = self.fxn(*args, **kwargs)
            if outs := _flat_tensors(ret):
                Tensor.realize(*outs)
        elif self.cnt == 1:
            if len({id(b) for b in bufs}) != len(bufs):
                raise JitError("two tensor inputs of the jitted function share a buffer; pass each as its own tensor")
            items: list[ExecItem] = []
            with capturing(items):
                ret = self.fxn(*args, **kwargs)
                if outs := _flat_tensors(ret):
                    Tensor.realize(*outs)
            self.captured = CapturedJit(_planned(_grouped_by_device(items), bufs), bufs, set(var_vals), ret)
            self.captured.last = (list(bufs), dict(var_vals))
            if DEBUG >= 1:
                steps = self.captured.steps
                graphs = sum(isinstance(s, _GraphStep) for s in steps)
                print(
                    f"JIT captured {len(items)} kernels of {getattr(self.fxn, '__name__', 'a function')} "
                    f"({graphs} device graphs, {len(steps) - graphs} single steps)"
                )
        else:
            assert self.captured is not None
            self.captured(bufs, var_vals)
            ret = self.captured.ret
            if var_vals:  # only a capture with variables can have results of symbolic shape
                for t in _flat_tensors(ret):
                    _rebind(t, var_vals)
        self.cnt += 1
        return ret


def _rebind(t: Tensor, var_vals: dict[UOp, int]) -> None:
    """Give a returned tensor's views this call's variable values: a result whose shape is symbolic was captured with
    the values of the capture, and the replay wrote it with these."""
    views = [u for u in t.uop.toposort if u.op is Ops.VIEW and u.arg.binds()]
    if not views:
        return
    binds = {b for v in views for b in v.arg.binds() if b.src[0] in var_vals}
    mapping = {b: b.src[0].bind(var_vals[b.src[0]]) for b in binds}
    t.uop = t.uop.substitute({v: v.replace(arg=v.arg.substitute(mapping)) for v in views})


def _reads_writes(ei: ExecItem) -> tuple[set[Buffer], set[Buffer]]:
    """The memory (base buffers) an ExecItem reads and writes."""
    r = ei.runner
    ins, outs = (r.spec.ins, r.spec.outs) if isinstance(r, CompiledRunner) else ((1,), (0,))
    base = [b.base if b.base is not None else b for b in ei.bufs]
    return {base[j] for j in ins}, {base[j] for j in outs}


def _grouped_by_device(items: list[ExecItem]) -> list[ExecItem]:
    """`items` in an order that keeps each device's kernels together where the dependencies allow. A step on
    several devices (a sharded model) runs their kernels interleaved; replayed in that order, no two consecutive
    kernels share a device and none could run as a device graph. Each item still comes after every item it depends
    on: those that write what it reads, and those that read or write what it writes."""
    if len({ei.runner.device for ei in items}) < 2:
        return items
    deps: list[set[int]] = []
    last_write: dict[Buffer, int] = {}
    readers: dict[Buffer, list[int]] = {}
    for j, ei in enumerate(items):
        reads, writes = _reads_writes(ei)
        d = {last_write[b] for b in reads | writes if b in last_write}
        d.update(i for b in writes for i in readers.get(b, ()))
        deps.append(d)
        for b in reads:
            readers.setdefault(b, []).append(j)
        for b in writes:
            last_write[b], readers[b] = j, []
    waiting = [len(d) for d in deps]
    dependents: list[list[int]] = [[] for _ in items]
    for j, d in enumerate(deps):
        for i in d:
            dependents[i].append(j)
    ready = {j for j, w in enumerate(waiting) if w == 0}
    order: list[int] = []
    device = items[0].runner.device
    while ready:
        # the earliest ready kernel of the device that ran last, else the earliest ready item of any kind
        same = [j for j in ready if items[j].runner.device == device and isinstance(items[j].runner, CompiledRunner)]
        j = min(same) if same else min(ready)
        ready.remove(j)
        device = items[j].runner.device
        order.append(j)
        for k in dependents[j]:
            waiting[k] -= 1
            if waiting[k] == 0:
                ready.add(k)
    assert len(order) == len(items), "captured items that depend on each other in a cycle"
    return [items[j] for j in order]


def _planned(items: list[ExecItem], inputs: list[Buffer]) -> list[ExecItem]:
    """`items` with their intermediates sharing memory: buffers written before being read, that no tensor (and no
    input) can reach after the capture."""
    candidates = _written_first(items) - _held_buffers() - set(inputs)
    plan = plan_memory([ei.bufs for ei in items], candidates)
    return [ExecItem(ei.runner, [plan.get(b, b) for b in ei.bufs], ei.var_vals) for ei in items]
