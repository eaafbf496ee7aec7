"""`CPUGraph`, the CPU device's graph type: kernel launches replayed by one native function that calls every kernel
in order, so a replay costs one ctypes call instead of one per kernel.

The function is generated as LLVM IR and compiled like a kernel. It takes three tables, `void graph(ptr fns, ptr
bufs, ptr ints)`: the kernels' addresses, their buffer addresses, and their int32 arguments (variable values, then
the `[start, end)` range of core0). It loads each kernel's arguments from the tables at fixed positions, so the IR
depends only on how many arguments each kernel takes (and is cached on disk like any kernel), and a replay with
another input or other variable values only rewrites table entries.

A launch big enough to be worth several cores (`CPUProgram.threads_for`, from the time its kernel took so far)
stays a call of its program, which splits it over the thread pool; the kernels between such launches are batched.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping, Sequence
from typing import Any

from lazygrad_cpu.compiler import LLVMCompiler
from lazygrad_cpu.program import CPUProgram, engine_of
from lazygrad_uop.device import CompiledDevice, GraphError, GraphRunner, KernelLaunch

_GraphFunction = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def graph_ir(name: str, arities: Sequence[tuple[int, int]]) -> str:
    """LLVM IR of `void @name(ptr %fns, ptr %bufs, ptr %ints)`, calling kernel i (of `arities[i] = (buffers, ints)`)
    with its arguments read from the tables, in order."""
    lines = [f"define void @{name}(ptr %fns, ptr %bufs, ptr %ints) nounwind {{", "entry:"]
    b = n = 0
    for i, (nbufs, nints) in enumerate(arities):
        lines += [f"  %f{i}.p = getelementptr ptr, ptr %fns, i64 {i}", f"  %f{i} = load ptr, ptr %f{i}.p"]
        args = []
        for j in range(nbufs):
            lines += [
                f"  %b{i}.{j}.p = getelementptr ptr, ptr %bufs, i64 {b}",
                f"  %b{i}.{j} = load ptr, ptr %b{i}.{j}.p",
            ]
            args.append(f"ptr %b{i}.{j}")
            b += 1
        for j in range(nints):
            lines += [
                f"  %n{i}.{j}.p = getelementptr i32, ptr %ints, i64 {n}",
                f"  %n{i}.{j} = load i32, ptr %n{i}.{j}.p",
            ]
            args.append(f"i32 %n{i}.{j}")
            n += 1
        lines.append(f"  call void %f{i}({', '.join(args)})")
    lines += ["  ret void", "}"]
    return "\n".join(lines) + "\n"


_GRAPH_COMPILER = LLVMCompiler()


class _Batch:
    """Consecutive launches run by one generated native function."""

    def __init__(self, device: CompiledDevice, launches: list[tuple[int, KernelLaunch]]) -> None:
        self.index = [i for i, _ in launches]
        # int arguments per launch: its variable values, then core0's range
        arities = [(len(launch.bufs), len(launch.vals) + 2) for _, launch in launches]
        self.buf_at, self.int_at = [], []
        nb = ni = 0
        for nbufs, nints in arities:
            self.buf_at.append(nb)
            self.int_at.append(ni)
            nb, ni = nb + nbufs, ni + nints
        for _, launch in launches:
            arity = getattr(launch.program, "arity", None)
            if arity is not None and arity != len(launch.bufs) + len(launch.vals):
                raise GraphError(
                    f"kernel {launch.program.name} takes {arity} buffers and variables, the launch has "
                    f"{len(launch.bufs)} buffers and {len(launch.vals)} values"
                )
        self.fns = (ctypes.c_void_p * len(launches))(*(_address(launch.program) for _, launch in launches))
        self.bufs = (ctypes.c_void_p * max(nb, 1))()
        self.ints = (ctypes.c_int32 * max(ni, 1))()
        for k, (_, launch) in enumerate(launches):
            self.write(k, launch)
        # the graph function is LLVM IR whatever renders the kernels (a renderer plugin may bring another compiler)
        lib = _GRAPH_COMPILER.compile_cached(graph_ir("graph", arities))
        # loaded like a kernel: MCJIT starts from an empty module and takes the object file
        self._engine = engine_of(lib)
        self.fxn = _GraphFunction(self._engine.get_function_address("graph"))
        # the kernels' code lives in their programs' engines: keep them loaded while this batch can call them
        self.programs = [launch.program for _, launch in launches]

    def write(self, k: int, launch: KernelLaunch) -> None:
        """Put the arguments of the batch's k-th launch in the tables."""
        for j, h in enumerate(launch.bufs):
            self.bufs[self.buf_at[k] + j] = h.addr
        at = self.int_at[k]
        for j, v in enumerate(launch.vals):
            self.ints[at + j] = int(v)
        self.ints[at + len(launch.vals)] = 0
        self.ints[at + len(launch.vals) + 1] = int(launch.global_size[0])

    def __call__(self) -> None:
        self.fxn(self.fns, self.bufs, self.ints)


def _address(program: Any) -> int:
    if not isinstance(program, CPUProgram):
        raise GraphError(f"a CPU graph runs CPU programs, got {type(program).__name__}")
    return program._address


class CPUGraph(GraphRunner):
    """Launches of CPU kernels, replayed by generated native functions (see the module docstring)."""

    def __init__(self, device: CompiledDevice, launches: Sequence[KernelLaunch]) -> None:
        super().__init__(device, launches)
        for launch in self.launches:
            if tuple(launch.global_size[1:]) != (1, 1) or tuple(launch.local_size) != (1, 1, 1):
                raise GraphError(f"CPU launches have global_size (n, 1, 1), local_size 1; got {launch}")
        # each step is a batch of launches, or the index of a launch to split over cores
        self.steps: list[_Batch | int] = []
        self.batch_of: dict[int, tuple[_Batch, int]] = {}
        pending: list[tuple[int, KernelLaunch]] = []
        for i, launch in enumerate(self.launches):
            if _threads(launch) > 1:
                self._flush(pending)
                self.steps.append(i)
            else:
                pending.append((i, launch))
        self._flush(pending)

    def _flush(self, pending: list[tuple[int, KernelLaunch]]) -> None:
        if pending:
            batch = _Batch(self.device, pending)
            self.steps.append(batch)
            self.batch_of.update({i: (batch, k) for k, (i, _) in enumerate(pending)})
            pending.clear()

    def update(self, changes: Mapping[int, KernelLaunch]) -> None:
        """Replace launch `i` by `changes[i]` for the next replays: rewrites its entries of the tables."""
        super().update(changes)
        for i, launch in changes.items():
            if i in self.batch_of:
                batch, k = self.batch_of[i]
                batch.write(k, launch)

    def __call__(self, wait: bool = False) -> float | None:
        """Run every launch in order; the kernels have finished when it returns. With `wait`, return the seconds."""
        st = time.perf_counter()
        for step in self.steps:
            if isinstance(step, int):
                launch = self.launches[step]
                launch.program(*launch.bufs, global_size=launch.global_size, vals=launch.vals)
            else:
                step()
        return time.perf_counter() - st if wait else None


def _threads(launch: KernelLaunch) -> int:
    """How many cores the program would split this launch over now."""
    threads_for = getattr(launch.program, "threads_for", None)
    return 1 if threads_for is None else threads_for(int(launch.global_size[0]))
