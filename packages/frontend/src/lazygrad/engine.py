"""Execution: compile each scheduled kernel once per device, run it, and report kernel statistics at DEBUG>=2.

`realize(tensors)` is the whole of a realize: the tensors' graphs are kernelized (the scheduler), the live tensors
rebound to what their nodes became, the kernels ordered (the scheduler) and run here, and autograd told what was
computed. `Tensor.realize`, `Tensor.kernelize` and `Tensor.schedule` call these.

A `ScheduleItem` is lowered to an `ExecItem`: a runner (a compiled kernel, or a copy between devices), the buffers
it runs on and the values of its symbolic variables. `run_schedule` runs them in order, skipping kernels that write
no elements (`has_no_work`); while a `TinyJit` captures (see `capturing`), the ExecItems it runs are also recorded
for replay.
"""

from __future__ import annotations

import atexit
import functools
import gc
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from lazygrad.compiling import compile_kernels
from lazygrad.counters import GlobalCounters
from lazygrad.errors import InputError
from lazygrad.gradient import realized_graphs
from lazygrad.multi import device_uops
from lazygrad_codegen import ProgramSpec
from lazygrad_scheduler import ScheduleItem, create_schedule, intermediate_buffers, kernelize, plan_memory
from lazygrad_uop.config import BEAM, DEBUG, NOOPT, TF32, WGMMA
from lazygrad_uop.device import Allocator, Buffer, CompiledDevice, KernelLaunch, MemoryUse, Program
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device, DeviceName, shares_host_memory
from lazygrad_uop.uop import UOp, int_evaluator, sint

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor


def sym_infer(x: sint, var_vals: Mapping[UOp, int]) -> int:
    """The value of size `x` with the variables of `var_vals` substituted."""
    if isinstance(x, int):
        return x
    try:
        return int(int_evaluator(x)(var_vals))
    except KeyError as exc:
        raise InputError(f"no value for a variable of {x.render()}: bind it (Variable(...).bind(value))") from exc


class Runner(Protocol):
    """What an ExecItem runs: called with its buffers (slot order) and variable values."""

    name: str
    device: str

    def __call__(
        self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Mapping[UOp, int] | None = None
    ) -> float | None: ...


@dataclass(frozen=True)
class CompiledRunner:
    """A kernel compiled for one device: its spec and the loaded program."""

    spec: ProgramSpec
    program: Program
    device: str = ""

    @property
    def name(self) -> str:
        """The kernel's name."""
        return self.spec.name

    def vals(self, var_vals: Mapping[UOp, int] | None) -> tuple[int, ...]:
        """The program's variable arguments, in parameter order, from `var_vals`."""
        if not self.spec.vars:
            return ()
        missing = [v.expr for v in self.spec.vars if var_vals is None or v not in var_vals]
        if missing:
            raise InputError(f"kernel {self.spec.name} needs values for variables {missing}; bind them")
        assert var_vals is not None
        return tuple(var_vals[v] for v in self.spec.vars)

    def launch(self, bufs: Sequence[Buffer], var_vals: Mapping[UOp, int] | None = None) -> KernelLaunch:
        """This kernel's launch on `bufs` with `var_vals`, as a device graph takes it."""
        gs = self.spec.global_size
        if not all(isinstance(g, int) for g in gs):
            gs = tuple(sym_infer(g, var_vals or {}) for g in gs)
        handles = tuple(bufs[slot].handle for slot in self.spec.globals)
        return KernelLaunch(self.program, handles, gs, self.spec.local_size, self.vals(var_vals))  # type: ignore[arg-type]

    @functools.cached_property
    def static(self) -> bool:
        """Whether every run launches the same: the program takes no variables, and its launch sizes are ints with
        work to do."""
        gs = self.spec.global_size
        return not self.spec.vars and all(isinstance(g, int) for g in gs) and 0 not in gs

    def __call__(
        self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Mapping[UOp, int] | None = None
    ) -> float | None:
        """Run on `bufs` (slot order) with variable values `var_vals`; with wait=True, return the run time."""
        # a slot whose loads were simplified away (e.g. fully masked) is not a parameter of the program
        handles = [bufs[slot].handle for slot in self.spec.globals]
        spec = self.spec
        if self.static:  # the usual case, and a replay's: nothing to infer
            return self.program(*handles, global_size=spec.global_size, local_size=spec.local_size, wait=wait)
        gs = spec.global_size
        if not all(isinstance(g, int) for g in gs):
            gs = tuple(sym_infer(g, var_vals or {}) for g in gs)
        if 0 in gs:
            # symbolic sizes bound to 0: nothing to compute, and no launch (GPUs reject zero workgroups)
            return 0.0 if wait else None
        return self.program(*handles, global_size=gs, local_size=spec.local_size, vals=self.vals(var_vals), wait=wait)


@dataclass(frozen=True)
class BufferCopy:
    """Copies a whole buffer to one of the same size, possibly on another device: with the allocator's `_transfer`
    when both buffers' allocators are of one kind that implements it (device to device, no host), else through host
    memory."""

    device: str

    @property
    def name(self) -> str:
        """What the copy is, for DEBUG output."""
        return "copy"

    def __call__(
        self, bufs: Sequence[Buffer], wait: bool = False, var_vals: Mapping[UOp, int] | None = None
    ) -> float | None:
        """Copy bufs[1] into bufs[0]; with wait=True, return the seconds it took."""
        dest, src = bufs[0], bufs[1]
        st = time.perf_counter()
        if direct_transfer(dest, src):
            assert dest.allocator is not None
            dest.allocator._transfer(dest.handle, src.handle, src.nbytes, Device[src.device], Device[dest.device])
        else:
            host = memoryview(bytearray(src.nbytes))
            src.copyout(host)
            dest.copyin(host)
        if wait:
            Device[dest.device].synchronize()
        return time.perf_counter() - st if wait else None


def direct_transfer(dest: Buffer, src: Buffer) -> bool:
    """Whether a copy from `src` to `dest` can skip the host: two devices of one kind (CPU:0 and CPU:1, CUDA:0 and
    CUDA:1) whose allocator implements `_transfer`."""
    if src.nbytes != dest.nbytes or dest.allocator is None or src.allocator is None:
        return False
    if DeviceName.parse(src.device).base != DeviceName.parse(dest.device).base:
        return False
    return type(dest.allocator)._transfer is not Allocator._transfer


@dataclass
class ExecItem:
    """One step of running a schedule: `runner` on `bufs` with the variable values `var_vals`."""

    runner: CompiledRunner | BufferCopy
    bufs: list[Buffer]
    var_vals: dict[UOp, int] = field(default_factory=dict)

    def run(self, var_vals: Mapping[UOp, int] | None = None, wait: bool = False) -> float | None:
        """Run it (allocating buffers without memory); `var_vals` override the item's own values. With wait=True
        (or DEBUG>=2, which also prints a line about it), return the run time in seconds."""
        for b in self.bufs:
            if not b.is_allocated:
                b.allocate()
        vals = self.var_vals if not var_vals else {**self.var_vals, **var_vals}
        elapsed = self.runner(self.bufs, wait=wait or DEBUG >= 2, var_vals=vals)
        GlobalCounters.add(1, *self.cost(vals), elapsed)
        if DEBUG >= 2 and elapsed is not None:
            self.report(elapsed, vals)
        return elapsed

    def cost(self, var_vals: Mapping[UOp, int]) -> tuple[int, int]:
        """(ALU operations, bytes moved) of one run with `var_vals`: a kernel's estimates, or a copy's bytes."""
        r = self.runner
        if isinstance(r, CompiledRunner):
            est = r.spec.estimates
            return sym_infer(est.ops, var_vals), sym_infer(est.mem, var_vals)
        return 0, 2 * self.bufs[0].nbytes

    def report(self, seconds: float, var_vals: Mapping[UOp, int]) -> None:
        """Print the DEBUG=2 line of one run that took `seconds`."""
        r = self.runner
        if isinstance(r, CompiledRunner):
            _report(r.spec.name, self.bufs[0].device, seconds, *self.cost(var_vals))
        else:
            dest, src = self.bufs[0], self.bufs[1]
            _report(f"copy {dest.nbytes} bytes {src.device} -> {dest.device}", dest.device, seconds, 0, 2 * dest.nbytes)


_runners: dict[tuple[str, UOp, int, int, int, int], CompiledRunner] = {}


def get_runner(device: str, ast: UOp) -> CompiledRunner:
    """The compiled program for kernel `ast` on `device`, built on first use."""
    # a program found under other opt settings (or tensor cores allowed by TF32 or WGMMA) is another program
    key = (device, ast, BEAM.value, NOOPT.value, TF32.value, WGMMA.value)
    if (runner := _runners.get(key)) is None:
        compile_runners([(device, ast)])
        runner = _runners[key]
    return runner


def compile_runners(jobs: Sequence[tuple[str, UOp]]) -> None:
    """Compile the (device, kernel AST) pairs of `jobs` that have no runner yet, all together (see
    `lazygrad.compiling`: code generation overlapped with compiling, one progress line)."""
    settings = (BEAM.value, NOOPT.value, TF32.value, WGMMA.value)
    todo = list(dict.fromkeys(job for job in jobs if (*job, *settings) not in _runners))
    for (device, ast), (spec, lib) in zip(todo, compile_kernels(todo)):
        dev: CompiledDevice = Device[device]
        _runners[(device, ast, *settings)] = CompiledRunner(spec, dev.load_program(spec.name, lib), device)


@dataclass
class _Stats:
    kernels: int = 0
    seconds: float = 0.0
    ops: int = 0
    mem: int = 0


_stats = _Stats()


def lower_schedule_item(si: ScheduleItem, plan: Mapping[Buffer, Buffer] | None = None) -> ExecItem:
    """The ExecItem that runs `si` (compiling its kernel on first use), with buffers replaced as `plan` says."""
    bufs = list(si.bufs) if not plan else [plan.get(b, b) for b in si.bufs]
    if si.ast.op is Ops.COPY:
        return ExecItem(BufferCopy(si.bufs[0].device), bufs, si.var_vals)
    device = si.bufs[0].device
    for b in si.bufs[1:]:
        # a kernel takes other devices' buffers only where it reads them in place (host memory, see placement.py)
        if b.device != device and not shares_host_memory(device, b.device):
            raise InputError(
                f"a kernel on {device} uses a buffer on {b.device}, which {device} can't address; move the tensor "
                f"there first (.to({device!r}))"
            )
    return ExecItem(get_runner(device, si.ast), bufs, si.var_vals)


def has_no_work(si: ScheduleItem) -> bool:
    """Whether `si` writes nothing: every output holds zero elements. Such a kernel is never compiled or launched
    (a GPU rejects a launch of zero workgroups); whatever reads its outputs reads no elements either."""
    return all(b.size == 0 for b in si.outputs)


# while a TinyJit captures, the ExecItems that run are appended here
_captured: list[ExecItem] | None = None


@contextmanager
def capturing(into: list[ExecItem]) -> Iterator[None]:
    """Record into `into` every ExecItem that `run_schedule` runs inside the `with` block."""
    global _captured
    if _captured is not None:
        raise RuntimeError("a TinyJit function can't call another one while it is being captured")
    _captured = into
    try:
        yield
    finally:
        _captured = None


def is_capturing() -> bool:
    """Whether a TinyJit is capturing the kernels that run now."""
    return _captured is not None


def run_schedule(items: list[ScheduleItem], intermediates: Collection[Buffer] = ()) -> None:
    """Run every item in order, allocating buffers as they are first needed. The `intermediates` (buffers nothing
    reads after the schedule, see `lazygrad_scheduler.memory`) share memory where their lifetimes don't overlap,
    also while a JIT captures: the capture records each kernel with its own buffers (the JIT plans the memory of the
    whole captured function itself, from their lifetimes) while the run uses the shared ones, so that the capturing
    call needs no more memory than a plain one."""
    plan = plan_memory([si.bufs for si in items], intermediates) if intermediates else None
    compile_runners([(si.bufs[0].device, si.ast) for si in items if si.ast.op is not Ops.COPY])
    for si in items:
        if has_no_work(si):
            continue
        ei = lower_schedule_item(si, plan)
        if _captured is not None:
            _captured.append(ExecItem(ei.runner, list(si.bufs), ei.var_vals) if plan else ei)
        ei.run()


def kernelize_tensors(tensors: Sequence[Tensor]) -> None:
    """Cut the graphs of `tensors` into kernels: each realized node becomes ASSIGN(buffer, KERNEL) in every live
    tensor's graph. Runs nothing."""
    # tensor.py imports this module (Tensor.realize comes here); the live tensors are known only there
    from lazygrad.tensor import _apply_becomes, _requires_grad_uops, _separate_twins

    _separate_twins(list(tensors))
    becomes = kernelize(_device_uops(tensors))
    realized_graphs.commit(*realized_graphs.plan(becomes, _requires_grad_uops()))
    _apply_becomes(becomes)


def schedule_tensors(tensors: Sequence[Tensor]) -> list[ScheduleItem]:
    """The kernels that realize `tensors`, in order (kernelizes them; runs nothing)."""
    kernelize_tensors(tensors)
    items, _ = create_schedule(UOp(Ops.SINK, src=tuple(_device_uops(tensors))))
    return items


def realize(tensors: Iterable[Tensor]) -> None:
    """Compute `tensors` in one schedule, so that they can share kernels."""
    with _cycle_collector_paused():
        _realize_now(list(tensors))


def _realize_now(tensors: list[Tensor]) -> None:
    from lazygrad.tensor import _apply_becomes, _requires_grad_uops, _separate_twins

    _separate_twins(tensors)
    becomes = kernelize(_device_uops(tensors))
    # autograd keeps going through what this realize computes (see RealizedGraphs)
    origins, written = realized_graphs.plan(becomes, _requires_grad_uops())
    changed = _apply_becomes(becomes)
    items, done = create_schedule(UOp(Ops.SINK, src=tuple(_device_uops(tensors))))
    # buffers that only kernels of this schedule read can share memory (the other tensors, and the graphs kept
    # for autograd, can't reach them)
    live = [*(t.uop for t in changed), *(v for v in origins.values() if v is not None)]
    run_schedule(items, intermediate_buffers(becomes, live))
    _apply_becomes({a: a.src[0] for a in done})
    realized_graphs.commit(origins, written)


def _device_uops(tensors: Iterable[Tensor]) -> list[UOp]:
    """The single-device graphs of `tensors`: the parts of those on several devices, the others as they are."""
    return [u for t in tensors for u in device_uops(t.uop)]


@contextmanager
def _cycle_collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a realize builds, schedules and compiles: those make and drop many
    thousands of graph nodes, which reference counting frees (they form no cycles), and the collector's passes over
    them cost about a quarter of a model's first step."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _report(name: str, device: str, seconds: float, ops: int, mem: int) -> None:
    _stats.kernels += 1
    _stats.seconds += seconds
    _stats.ops += ops
    _stats.mem += mem
    s = max(seconds, 1e-9)
    print(
        f"*** {device:8s} {_stats.kernels:4d} {name:34s} {seconds * 1e3:9.3f} ms "
        f"{ops / s * 1e-9:9.2f} GFLOPS {mem / s * 1e-9:8.2f} GB/s "
        f"mem {MemoryUse.used.get(device, 0) / 1e6:8.2f} MB"
    )


def report_graph(name: str, device: str, kernels: int, seconds: float) -> None:
    """The DEBUG=2 line of a device graph that ran `kernels` kernels in `seconds`."""
    _report(f"{name} ({kernels} kernels)", device, seconds, 0, 0)


@atexit.register
def _summary() -> None:
    if DEBUG >= 2 and _stats.kernels:
        s = max(_stats.seconds, 1e-9)
        peak = ", ".join(f"{d} {b / 1e6:.2f} MB" for d, b in sorted(MemoryUse.peak.items()))
        print(
            f"*** total: {_stats.kernels} kernels in {_stats.seconds * 1e3:.3f} ms, "
            f"{_stats.ops / s * 1e-9:.2f} GFLOPS, {_stats.mem / s * 1e-9:.2f} GB/s, peak memory {peak}"
        )


def device_of_name(name: str | None) -> str:
    """The canonical device name for `name`, or the default device. A name with a renderer ("CPU:C") selects that
    renderer for the device, as `DEV=CPU:C` does."""
    return Device.DEFAULT if name is None else Device.select(name)
