"""`TinyJit`: run a function's kernels again without running the function.

The first call runs the function as usual (compiling its kernels). The second runs it while recording every
`ExecItem` it executes (`engine.capturing`); the recording is then memory-planned (intermediates that no tensor can
read afterwards share memory where their lifetimes don't overlap) and batched into device graphs where the device
has a graph type. Later calls only swap in the new input buffers and variable values and replay the recording:
no graph building, scheduling or compiling, one native call per batch of kernels.

Inputs are the tensors among the arguments (positional, then keyword in name order) and bound variables
(`Variable("n", 1, 64).bind(5)`) given directly or inside the inputs' shapes; each call must pass tensors of the same
shapes, dtypes, devices and views (`JitError` otherwise). Every replay returns new tensors: a result of an earlier
call, and the numpy arrays read from it, keep their values. The replay writes its results into the buffers of the
previous call's when nothing can read those any more (no tensor, graph or numpy array refers to them), else into
new buffers, so keeping results costs an allocation and nothing else does. Python-side effects and values that
aren't inputs (tensors created inside the function from host data, `.numpy()` results) are frozen at the capture:
pass what changes as a tensor or a bound variable. Python numbers, strings, None and tuples or lists of them given as
arguments are compared with the capture's: a different one raises `JitError` naming it (the capture computed with
the old value). Random numbers are not frozen: the generator's state is a
device tensor that a captured kernel advances, so each replay draws the next numbers (see `lazygrad.random`).
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from lazygrad import index_checks
from lazygrad.counters import GlobalCounters
from lazygrad.engine import CompiledRunner, ExecItem, capturing, report_graph
from lazygrad.gradient import realized_graphs
from lazygrad.multi import device_uops
from lazygrad.tensor import Tensor, _all_tensors
from lazygrad_scheduler import plan_memory
from lazygrad_uop.config import DEBUG, JIT
from lazygrad_uop.device import Buffer, GraphError, GraphRunner, KernelLaunch
from lazygrad_uop.dtype import DType
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.shape import device_of
from lazygrad_uop.tensor_graph import (
    apply_movement,
    attach_buffer,
    base_buffer,
    buffer_of,
    is_kernelized,
    leaf_view,
    new_buffer,
    view_base,
)
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


class _Slot:
    """Where a returned tensor goes in the kept structure of a jitted function's return value."""


def _with_tensors(x: Any, new: Iterator[Any]) -> Any:
    """`x` with its tensors (in `_flat_tensors` order), or `_Slot`s, replaced by the next ones of `new`."""
    if isinstance(x, (Tensor, _Slot)):
        return next(new)
    if isinstance(x, (tuple, list)):
        return type(x)(_with_tensors(v, new) for v in x)
    if isinstance(x, dict):
        out = {}
        for k in sorted(x, key=str):
            out[k] = _with_tensors(x[k], new)
        return {k: out[k] for k in x}
    return x


_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _plain_value(v: Any) -> bool:
    """Whether `v` is a value the capture computed with and a replay can compare: Python scalars, strings, None,
    and tuples or lists of them."""
    if isinstance(v, (tuple, list)):
        return all(_plain_value(x) for x in v)
    return isinstance(v, _PLAIN) and not isinstance(v, UOp)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _parameter_names(fxn: Callable[..., Any]) -> list[str]:
    """The names of `fxn`'s positional parameters (empty where Python can't tell), to name arguments in errors."""
    try:
        params = inspect.signature(fxn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _plain_arguments(names: list[str], args: tuple, kwargs: dict) -> dict[str, Any]:
    """The plain (see `_plain_value`) arguments of a call, by the name that says which argument it is."""
    out = {}
    for i, v in enumerate(args):
        if _plain_value(v):
            name = names[i] if i < len(names) else None
            out[f"argument {i}" + (f" ({name!r})" if name else "")] = v
    for k in sorted(kwargs):
        if _plain_value(kwargs[k]):
            out[f"keyword argument {k!r}"] = kwargs[k]
    return out


# an input's spec (its view of its buffer, variables unbound) and the (variable, value) pairs it binds, per tensor
# node: a replay with the same inputs skips rebuilding them, and compares the specs by identity. Weak keys: an entry
# goes with the node (its value never holds it)
_input_views: weakref.WeakKeyDictionary[UOp, tuple[InputSpec, tuple[tuple[UOp, int], ...]]] = (
    weakref.WeakKeyDictionary()
)


def _input_view(u: UOp, base: UOp) -> tuple[InputSpec, tuple[tuple[UOp, int], ...]]:
    """The spec of tensor node `u`, a view of its buffer node `base` (with variables unbound), and the values it
    binds."""
    if (hit := _input_views.get(u)) is not None:
        return hit
    chain, v = [], u
    while v is not base:
        chain.append(v)
        v = v.src[0]
    st = apply_movement(leaf_view(base), chain[::-1])
    binds = st.binds()
    if binds:
        st = st.substitute({b: b.src[0] for b in binds})
    spec = InputSpec(st, u.dtype, device_of(u))  # type: ignore[arg-type]
    out = _input_views[u] = (spec, tuple((b.src[0], b.src[1].arg) for b in binds))
    return out


def _prepare_inputs(args: tuple, kwargs: dict) -> tuple[list[Buffer], list[InputSpec], dict[UOp, int]]:
    """Realize the tensor inputs; their buffers, specs and the variable values they (and bound args) carry."""
    values = [*args, *(kwargs[k] for k in sorted(kwargs))] if kwargs else args
    given = [v for v in values if isinstance(v, Tensor)]
    var_vals = {v.src[0]: v.src[1].arg for v in values if isinstance(v, UOp) and v.op is Ops.BIND}
    unrealized = [t for t in given if any(view_base(u).op is not Ops.BUFFER for u in device_uops(t.uop))]
    if unrealized:
        Tensor.realize(*unrealized)
    bufs, specs = [], []
    # a tensor on several devices is one input per device
    for u in (p for t in given for p in device_uops(t.uop)):
        base = view_base(u)
        if base.op is not Ops.BUFFER:
            raise JitError(f"input {Tensor(u)!r} could not be realized into a buffer of its own; pass t.contiguous()")
        spec, binds = _input_view(u, base)
        if binds:
            var_vals.update(binds)
        buf = buffer_of(base)
        if not buf.is_allocated:
            buf.allocate()
        bufs.append(buf)
        specs.append(spec)
    return bufs, specs, var_vals


def _held_buffers(excluding: tuple[Tensor, ...] = ()) -> set[Buffer]:
    """The buffers that live tensors (other than `excluding`) can read: everything a tensor's graph reaches without
    entering a KERNEL, and through realized tensors the graphs autograd keeps for them (a backward may compute those
    again)."""
    held: set[Buffer] = set()
    seen: set[UOp] = set()
    skip = {id(t) for t in excluding}
    stack = [t.uop for t in list(_all_tensors) if id(t) not in skip]
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
        self.fixed: tuple[int, int] | None = None
        self.varying: list[ExecItem] = []

    def cost(self, var_vals: dict[UOp, int], var_items: set[int]) -> tuple[int, int]:
        """(ALU operations, bytes moved) of one replay of the step with `var_vals`: the items that take no replay
        variable are summed once (their estimates can't change), the others each call. A decoding step of GPT-2
        replays 303 kernels of which about 75 take the position."""
        if self.fixed is None:
            fixed = [ei.cost(ei.var_vals) for i, ei in self.items if i not in var_items]
            self.fixed = (sum(c[0] for c in fixed), sum(c[1] for c in fixed))
            self.varying = [ei for i, ei in self.items if i in var_items]
        ops, mem = self.fixed
        for ei in self.varying:
            o, m = ei.cost({**ei.var_vals, **var_vals})
            ops, mem = ops + o, mem + m
        return ops, mem


class _Result:
    """A buffer a replay writes and returns (its tensors read it): where it sits in the captured items, the stand-in
    for it in the returned tensors' graphs, and the BUFFER node of the last call's result: the capture's weakly (its
    caller owns that graph), a replay's held (the capture reuses it while nothing else can reach it, see
    `CapturedJit._reachable_results`)."""

    def __init__(self, buf: Buffer, slots: list[tuple[int, int]], placeholder: UOp, node: UOp) -> None:
        self.buf, self.slots, self.placeholder = buf, slots, placeholder
        self.captured: weakref.ref[UOp] = weakref.ref(node)
        self.node: UOp | None = None
        self.fresh = False  # whether this call's replay writes a buffer other than the last call's

    def buffer_read(self) -> bool:
        """Whether the Buffer has references beyond the capture's own (a numpy array of it holds one). The capture's
        own: one per slot in the items, `self.buf`, the capture's `written` set, getrefcount's argument, and the
        node table's entry for a held node attached to it."""
        return sys.getrefcount(self.buf) > len(self.slots) + 3 + (self.node is not None)


def _rebuilt(template: UOp, mapping: dict[UOp, UOp]) -> UOp:
    """`template` with its stand-ins replaced; a plain VIEW of one (the usual result), or a tensor on several devices
    made of such views, without a graph walk."""
    if template.op is Ops.VIEW and template.src[0] in mapping:
        return template.replace(src=(mapping[template.src[0]],))
    if template.op is Ops.MULTI and all(p.op is Ops.VIEW and p.src[0] in mapping for p in template.src):
        return template.replace(src=tuple(p.replace(src=(mapping[p.src[0]],)) for p in template.src))
    return template.substitute(mapping)


class CapturedJit:
    """A captured function: its ExecItems (memory-planned), where the input buffers sit in them, and the steps that
    replay them (device graphs or single items)."""

    def __init__(self, items: list[ExecItem], input_bufs: list[Buffer], var_names: set[UOp], ret: Any) -> None:
        self.items = items
        index = {b: k for k, b in enumerate(input_bufs)}
        # (item, slot, input) for every place an input buffer is used
        self.input_slots = [(i, j, index[b]) for i, ei in enumerate(items) for j, b in enumerate(ei.bufs) if b in index]
        self.input_items = {i for i, _, _ in self.input_slots}
        # what a replay writes: autograd can't go through a value computed before it that reads these
        self.written = {b for ei in items for b in _outputs(ei)}
        self.var_items = {i for i, ei in enumerate(items) if var_names & ei.var_vals.keys()}
        self.steps: list[_GraphStep | int] = self._build_steps()
        self.last: tuple[list[Buffer], dict[UOp, int]] | None = None
        self.checks: list[index_checks.IndexCheck] = []
        # the graphs of the last replay's returned tensors (None for one returned as it is), held (see `returned`);
        # the nodes of them that reach a result, with the number of references the capture holds to each
        self._roots: list[UOp | None] | None = None
        self._ours: tuple[UOp, ...] = ()
        self._own_refs: tuple[int, ...] = ()
        self._track_results(ret, set(input_bufs))

    def _track_results(self, ret: Any, inputs: set[Buffer]) -> None:
        """Find the buffers the replays write and return (not inputs, not read by other live tensors, e.g. updated
        parameters), and keep the returned tensors as graphs over stand-ins for them, so that no reference of the
        capture keeps a call's result alive."""
        outs = _flat_tensors(ret)
        others = _held_buffers(excluding=tuple(outs))
        slots: dict[Buffer, list[tuple[int, int]]] = {}
        for i, ei in enumerate(self.items):
            for j, b in enumerate(ei.bufs):
                slots.setdefault(b, []).append((i, j))
        self.outputs: list[_Result] = []
        stand_ins: dict[UOp, UOp] = {}
        # a tensor on several devices returns one buffer per device
        for base in (view_base(p) for t in outs for p in device_uops(t.uop)):
            if base.op is not Ops.BUFFER or base in stand_ins:
                continue
            buf = buffer_of(base)
            if buf in self.written and buf not in inputs and buf not in others and buf in slots:
                stand_ins[base] = new_buffer(buf.device, buf.size, buf.dtype)
                self.outputs.append(_Result(buf, slots[buf], stand_ins[base], base))
        # a returned tensor over no result (an input, a parameter) is returned as it is; the others are rebuilt
        self.templates: list[UOp | Tensor] = [
            t.uop.substitute(stand_ins) if any(b in stand_ins for b in t.uop.toposort) else t for t in outs
        ]
        self.differentiable = {k for k, t in enumerate(outs) if realized_graphs.mapping.get(t.uop) is not None}
        self.ret = _with_tensors(ret, iter([_Slot() for _ in outs]))

    def _reachable_results(self) -> set[int]:
        """The results (indices into `outputs`) of the last call that something other than the capture can still
        read through a graph node. After the capture: its result node is alive. After a replay, whose result graphs
        the capture holds: some node of them has more references than the capture's own (a tensor, another graph,
        a cache holds it) and reaches the result's BUFFER node. Extra references only ever make a result count as
        read (a new buffer for the next call), never the reverse."""
        if self._roots is None:
            return {k for k, r in enumerate(self.outputs) if r.captured() is not None}
        # getrefcount sees its argument besides the capture's own references (indexing holds no other)
        ours, refs = self._ours, self._own_refs
        held = [ours[i] for i in range(len(ours)) if sys.getrefcount(ours[i]) - 1 > refs[i]]
        if not held:
            return set()
        index = {r.node: k for k, r in enumerate(self.outputs)}
        ours = set(ours)
        reached: set[int] = set()
        seen: set[UOp] = set()
        while held:
            n = held.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in index:
                reached.add(index[n])
            held.extend(s for s in n.src if s in ours)
        return reached

    def _fresh_results(self) -> set[int]:
        """Before a replay: a new buffer for each result the last call's outputs still need; the items that changed."""
        changed: set[int] = set()
        reachable = self._reachable_results()
        for k, r in enumerate(self.outputs):
            r.fresh = k in reachable or r.buffer_read()
            if not r.fresh:
                continue
            r.node = None  # the last call's node stays with whoever reads it
            new = Buffer(r.buf.device, r.buf.size, r.buf.dtype, r.buf.options).allocate()
            for i, j in r.slots:
                self.items[i].bufs[j] = new
                changed.add(i)
            self.written.discard(r.buf)
            self.written.add(new)
            r.buf = new
        return changed

    def returned(self) -> Any:
        """After a replay: the function's return value, new tensors over this call's result buffers. Where nothing
        can read the last call's results any more, their graph nodes are those of this call's too (new nodes cost
        more than the replay of a small kernel)."""
        if self._roots is None or any(r.fresh for r in self.outputs):
            mapping: dict[UOp, UOp] = {}
            for r in self.outputs:
                if r.node is None:
                    r.node = new_buffer(r.buf.device, r.buf.size, r.buf.dtype)
                    attach_buffer(r.node, r.buf)
                mapping[r.placeholder] = r.node
            self._roots = [None if isinstance(t, Tensor) else _rebuilt(t, mapping) for t in self.templates]
            self._count_own_refs()
        tensors = [t if isinstance(t, Tensor) else Tensor(u) for t, u in zip(self.templates, self._roots, strict=True)]
        if self.differentiable:
            # the graph a result was computed from is the capture's: a backward through it must refuse, as through
            # any value a replay wrote, rather than treat the result as a constant
            realized_graphs.commit({tensors[k].uop: None for k in self.differentiable}, set())
        return _with_tensors(self.ret, iter(tensors))

    def _count_own_refs(self) -> None:
        """Note the nodes of the held result graphs that reach a result's BUFFER node, and how many references to
        each the capture itself holds: one from each of those nodes' sources that is it, one per root that is it,
        one from the result holding it, one from `_ours`."""
        assert self._roots is not None
        results = {r.node for r in self.outputs}
        reaches: dict[UOp, bool] = {}
        stack: list[tuple[UOp, bool]] = [(u, False) for u in self._roots if u is not None]
        while stack:  # sources first, iteratively; nothing under a result's node reaches a result
            n, ready = stack.pop()
            if n in reaches:
                continue
            if n in results or ready:
                reaches[n] = n in results or any(reaches[s] for s in n.src)
            else:
                stack.append((n, True))
                stack.extend((s, False) for s in n.src if s not in reaches)
        own = {n: 1 for n, r in reaches.items() if r}
        for n in list(own):
            for s in n.src:
                if s in own:
                    own[s] += 1
        for u in self._roots:
            if u in own:
                own[u] += 1
        for r in self.outputs:
            own[r.node] += 1  # type: ignore[index]
        self._ours, self._own_refs = tuple(own), tuple(own.values())

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
        # results still read get buffers of their own first, so the graphs autograd keeps for them stay valid
        changed = self._fresh_results()
        if len(realized_graphs):
            realized_graphs.invalidate(self.written)
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
            GlobalCounters.add(len(step.items), *step.cost(var_vals, self.var_items), elapsed)
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
        self.names = _parameter_names(fxn)
        functools.update_wrapper(self, fxn)  # type: ignore[arg-type]
        self.reset()

    def reset(self) -> None:
        """Forget the capture: the next call runs the function again, the one after captures it anew."""
        self.cnt = 0
        self.captured: CapturedJit | None = None
        self.specs: list[InputSpec] | None = None
        self.var_names: set[UOp] = set()
        self.plain: dict[str, Any] | None = None
        # the last call's tensor arguments (weakly: an input must not outlive its caller's use of it) and what
        # `_prepare_inputs` made of them: a replay on the same tensors, the usual loop, reuses it
        self._last_inputs: tuple[tuple[weakref.ref[UOp], ...], tuple[list[Buffer], list[InputSpec], dict]] | None = None

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
            if old is not new and old != new:  # the same input node gives the same (cached) spec
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

    def _check_plain(self, plain: dict[str, Any]) -> None:
        """Python values among the arguments must be the capture's: its kernels computed with those."""
        if self.plain is None:
            self.plain = plain
            return
        for name in sorted(self.plain.keys() | plain.keys()):
            if name not in plain or name not in self.plain or not _same_value(self.plain[name], plain[name]):
                was, now = self.plain.get(name, "(no such argument)"), plain.get(name, "(not given)")
                raise JitError(
                    f"{name} of the jitted function {getattr(self.fxn, '__name__', '')!r} was {was!r} when it was "
                    f"captured and is {now!r} now: the captured kernels compute with {was!r}. Pass a value that "
                    "changes as a Tensor (or a bound Variable for a size), or call .reset() on the jit"
                )

    def _inputs(
        self, args: tuple, kwargs: dict, tensors_only: bool
    ) -> tuple[list[Buffer], list[InputSpec], dict[UOp, int]]:
        """`_prepare_inputs` of the call, or the last call's where it passed the same tensor nodes, all realized (a
        node of a realized tensor always views the same buffer), and nothing else (`tensors_only`)."""
        last = self._last_inputs
        if (
            tensors_only
            and last is not None
            and len(last[0]) == len(args)
            and all(ref() is a.uop for ref, a in zip(last[0], args, strict=True))
            and all(b.is_allocated for b in last[1][0])
        ):
            return last[1]
        prepared = _prepare_inputs(args, kwargs)
        self._last_inputs = (tuple(weakref.ref(a.uop) for a in args), prepared) if tensors_only else None
        return prepared

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        if not JIT:
            return self.fxn(*args, **kwargs)
        tensors_only = not kwargs and all(isinstance(a, Tensor) for a in args)
        bufs, specs, var_vals = self._inputs(args, kwargs, tensors_only)
        self._check(specs, var_vals)
        # a call of tensors alone, to a function captured with no plain argument, has none to compare
        if self.plain is None or self.plain or not tensors_only:
            self._check_plain(_plain_arguments(self.names, args, kwargs))
        if self.cnt == 0:
            ret = self.fxn(*args, **kwargs)
            checks = _realize_with_checks(ret)
        elif self.cnt == 1:
            if len({id(b) for b in bufs}) != len(bufs):
                raise JitError("two tensor inputs of the jitted function share a buffer; pass each as its own tensor")
            index_checks.verify()  # checks of earlier work must not be captured with this function's
            items: list[ExecItem] = []
            with capturing(items):
                ret = self.fxn(*args, **kwargs)
                checks = _realize_with_checks(ret)
            self.captured = CapturedJit(_planned(_grouped_by_device(items), bufs), bufs, set(var_vals), ret)
            self.captured.last = (list(bufs), dict(var_vals))
            # the captured kernels compute the index checks again on every replay, into the same buffers
            self.captured.checks = checks
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
            checks = self.captured.checks
            ret = self.captured.returned()
            if var_vals:  # only a capture with variables can have results of symbolic shape
                for t in _flat_tensors(ret):
                    _rebind(t, var_vals)
        self.cnt += 1
        # a jitted call's return synchronises as a read does: an index found out of range raises here
        for c in checks:
            c.raise_if_failed()
        return ret


def _realize_with_checks(ret: Any) -> list[index_checks.IndexCheck]:
    """Realize the returned tensors and the index checks the call recorded, in one schedule; the checks."""
    checks = index_checks.take_pending()
    if (outs := _flat_tensors(ret)) or checks:
        Tensor.realize(*outs, *(c.worst for c in checks))
    return checks


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
