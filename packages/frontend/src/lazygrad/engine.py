"""Execution: compile each scheduled kernel once per device, run it, and report kernel statistics at DEBUG>=2."""

from __future__ import annotations

import atexit
import time
from dataclasses import dataclass

from lazygrad_codegen import ProgramSpec, get_program
from lazygrad_scheduler import ScheduleItem
from lazygrad_uop.config import DEBUG
from lazygrad_uop.device import Buffer, CompiledDevice, Program
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.uop import UOp


@dataclass(frozen=True)
class CompiledRunner:
    """A kernel compiled for one device: its spec and the loaded program."""

    spec: ProgramSpec
    program: Program

    def __call__(self, bufs: tuple[Buffer, ...], wait: bool = False) -> float | None:
        """Run on `bufs` (slot order); with wait=True, return the kernel's run time in seconds."""
        # a slot whose loads were simplified away (e.g. fully masked) is not a parameter of the program
        handles = [bufs[slot].handle for slot in self.spec.globals]
        return self.program(
            *handles, global_size=self.spec.global_size, local_size=self.spec.local_size, vals=(), wait=wait
        )


_runners: dict[tuple[str, UOp], CompiledRunner] = {}


def get_runner(device: str, ast: UOp) -> CompiledRunner:
    """The compiled program for kernel `ast` on `device`, built on first use."""
    key = (device, ast)
    if (runner := _runners.get(key)) is None:
        dev: CompiledDevice = Device[device]
        spec = get_program(ast, dev.renderer)
        lib = dev.compiler.compile_cached(spec.src)
        runner = _runners[key] = CompiledRunner(spec, dev.runtime(spec.name, lib))
    return runner


@dataclass
class _Stats:
    kernels: int = 0
    seconds: float = 0.0
    ops: int = 0
    mem: int = 0


_stats = _Stats()


def _copy(si: ScheduleItem) -> None:
    dest, src = si.bufs
    host = memoryview(bytearray(src.nbytes))
    src.copyout(host)
    dest.copyin(host)


def run_schedule(items: list[ScheduleItem]) -> None:
    """Run every item in order, allocating buffers as they are first needed."""
    for si in items:
        for b in si.bufs:
            if not b.is_allocated:
                b.allocate()
        if si.ast.op is Ops.COPY:
            st = time.perf_counter()
            _copy(si)
            if DEBUG >= 2:
                _report(
                    f"copy {si.bufs[0].nbytes} bytes {si.bufs[1].device} -> {si.bufs[0].device}",
                    si.bufs[0].device,
                    time.perf_counter() - st,
                    0,
                    2 * si.bufs[0].nbytes,
                )
            continue
        runner = get_runner(si.bufs[0].device, si.ast)
        elapsed = runner(si.bufs, wait=DEBUG >= 2)
        if DEBUG >= 2 and elapsed is not None:
            _report(runner.spec.name, si.bufs[0].device, elapsed, runner.spec.estimates.ops, runner.spec.estimates.mem)


def _report(name: str, device: str, seconds: float, ops: int, mem: int) -> None:
    _stats.kernels += 1
    _stats.seconds += seconds
    _stats.ops += ops
    _stats.mem += mem
    s = max(seconds, 1e-9)
    print(
        f"*** {device:8s} {_stats.kernels:4d} {name:34s} {seconds * 1e3:9.3f} ms "
        f"{ops / s * 1e-9:9.2f} GFLOPS {mem / s * 1e-9:8.2f} GB/s"
    )


@atexit.register
def _summary() -> None:
    if DEBUG >= 2 and _stats.kernels:
        s = max(_stats.seconds, 1e-9)
        print(
            f"*** total: {_stats.kernels} kernels in {_stats.seconds * 1e3:.3f} ms, "
            f"{_stats.ops / s * 1e-9:.2f} GFLOPS, {_stats.mem / s * 1e-9:.2f} GB/s"
        )


def device_of_name(name: str | None) -> str:
    """The canonical device name for `name`, or the default device."""
    return Device.DEFAULT if name is None else Device.canonicalize(name)
