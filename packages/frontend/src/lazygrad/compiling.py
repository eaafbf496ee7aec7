"""Compiling the kernels of a schedule before it runs: each distinct kernel once, code generation on this thread
(through the program cache, `lazygrad_codegen.program_cache`) while the sources already generated compile beside it,
and one progress line on stderr while it takes. A realize with at least `PROCESS_MIN_KERNELS` kernels first
generates the programs no cache holds on forked workers, one per core (`program_cache.generate_programs`; Linux,
without BEAM), which a model's first step spent most of its time on.

Where they compile: for compilers that allow threads (`Compiler.threadsafe`), on a worker thread; when a realize
has at least `PROCESS_MIN_KERNELS` kernels to compile and the compiler can be rebuilt in another process
(`Compiler.worker_factory`), in worker processes, one per core (`COMPILE_PROCESSES` sets the number; 0: none), which
llvmlite needs to use more than one core. The binaries are the same everywhere: each depends on its source alone.

`PROGRESS`: 1 shows the line, 0 never does, -1 (the default) shows it when stderr is a terminal. The line appears
only when a realize (or a JIT capture) compiles more than `PROGRESS_MIN_KERNELS` kernels, and is erased when the
compile is done.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TextIO

from lazygrad_codegen import ProgramSpec
from lazygrad_codegen.program_cache import cached_program, generate_programs
from lazygrad_uop.compile_workers import WorkerLostError, WorkerPool
from lazygrad_uop.config import ContextVar
from lazygrad_uop.device import CompiledDevice, Compiler
from lazygrad_uop.registry import Device
from lazygrad_uop.uop import UOp

PROGRESS = ContextVar("PROGRESS", -1)
"""The compile progress line: 1 on, 0 off, -1 on when stderr is a terminal."""
PROGRESS_MIN_KERNELS = 4
"""Fewer kernels than this compile without a progress line: they take well under a second."""
COMPILE_PROCESSES = ContextVar("COMPILE_PROCESSES", -1)
"""Worker processes that compile kernels: -1 (the default) one per core this process may run on, 0 none."""
PROCESS_MIN_KERNELS = 16
"""A realize with fewer kernels to compile than this keeps them in this process: starting workers costs more."""


class ProgressLine:
    """One line on `stream`, rewritten in place as kernels finish compiling: `compiling kernels  12/59  3.1 s`.
    `close()` erases it. Safe to update from several threads."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.stream, self.done = total, stream, 0
        self.start = time.perf_counter()
        self._lock = threading.Lock()
        self._width = 0
        self._draw()

    def _draw(self) -> None:
        text = f"lazygrad: compiling kernels {self.done:>{len(str(self.total))}}/{self.total}  "
        text += f"{time.perf_counter() - self.start:.1f} s"
        # pad over what a longer earlier line left, then return to the line's start
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = max(self._width, len(text))

    def advance(self) -> None:
        """One more kernel compiled."""
        with self._lock:
            self.done += 1
            self._draw()

    def close(self) -> None:
        """Erase the line."""
        with self._lock:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()


def progress_for(total: int, stream: TextIO | None = None) -> ProgressLine | None:
    """A progress line for compiling `total` kernels, or None where none should show (see the module docstring)."""
    stream = sys.stderr if stream is None else stream
    if total < PROGRESS_MIN_KERNELS or PROGRESS.value == 0:
        return None
    if PROGRESS.value < 0:
        try:
            if not stream.isatty():
                return None
        except (AttributeError, ValueError):  # a replaced or closed stream: not a terminal
            return None
    return ProgressLine(total, stream)


_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _compile_pool() -> ThreadPoolExecutor:
    # one worker: the compilers that allow threads (LLVM through llvmlite) serialise their own calls, so a second
    # worker would only wait; the gain is compiling while this thread generates the next kernel's code. A forked
    # child inherits the pool but not its thread, so it makes its own.
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="lazygrad-compile"))
        return _pool[1]


def _process_count() -> int:
    if COMPILE_PROCESSES.value >= 0:
        return COMPILE_PROCESSES.value
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


_workers: tuple[int, int, WorkerPool, ThreadPoolExecutor] | None = None


def _worker_pool() -> tuple[WorkerPool, ThreadPoolExecutor] | None:
    """The worker processes and the threads that wait on them (one each), made on first use; None when there are
    to be none. A forked child makes its own."""
    global _workers
    n = _process_count()
    if n < 1:
        return None
    with _pool_lock:
        if _workers is None or _workers[:2] != (os.getpid(), n):
            if _workers is not None and _workers[0] == os.getpid():
                _workers[2].close()
            threads = ThreadPoolExecutor(max_workers=n, thread_name_prefix="lazygrad-compile-wait")
            _workers = (os.getpid(), n, WorkerPool(n), threads)
        return _workers[2], _workers[3]


def _compile_in_worker(pool: WorkerPool, compiler: Compiler, src: str) -> bytes:
    """`compiler.compile_cached(src)` with the compile in a worker process; in this one if a worker failed (with a
    warning the first time)."""
    factory = compiler.worker_factory()
    assert factory is not None

    def compile(source: str) -> bytes:
        if pool.lost:
            return compiler.compile(source)
        try:
            return pool.compile(*factory, source)
        except WorkerLostError as exc:
            warnings.warn(f"{exc}; compiling in this process instead", RuntimeWarning, stacklevel=2)
            return compiler.compile(source)

    return compiler.compile_cached(src, compile)


def compile_kernels(jobs: Sequence[tuple[str, UOp]], parallel: bool = True) -> list[tuple[ProgramSpec, bytes]]:
    """The program and binary of each (device, kernel AST) in `jobs`, in order. Code is generated in order on this
    thread; with `parallel`, sources compile meanwhile on a worker thread or in worker processes (see the module
    docstring) for compilers that allow it. The binaries are the same either way (each depends on its source
    alone)."""
    progress = progress_for(len(jobs))
    pending: list[tuple[ProgramSpec, Future[bytes] | bytes]] = []
    many = parallel and len(jobs) >= PROCESS_MIN_KERNELS
    workers = _worker_pool() if many else None
    if many:
        # the programs no cache holds, generated on every core first; the loop below then finds each in memory
        generate_programs([(ast, Device[device].renderer) for device, ast in jobs], _process_count())
    try:
        for device, ast in jobs:
            dev: CompiledDevice = Device[device]
            spec = cached_program(ast, dev.renderer)
            if workers is not None and dev.compiler.worker_factory() is not None:
                fut = workers[1].submit(_compile_in_worker, workers[0], dev.compiler, spec.src)
                if progress is not None:
                    fut.add_done_callback(lambda _: progress.advance())
                pending.append((spec, fut))
            elif parallel and dev.compiler.threadsafe:
                fut = _compile_pool().submit(dev.compiler.compile_cached, spec.src)
                if progress is not None:
                    fut.add_done_callback(lambda _: progress.advance())
                pending.append((spec, fut))
            else:
                pending.append((spec, dev.compiler.compile_cached(spec.src)))
                if progress is not None:
                    progress.advance()
        return [(spec, lib if isinstance(lib, bytes) else lib.result()) for spec, lib in pending]
    finally:
        # after a failure, what still runs finishes before the line is erased (its callback draws on it)
        for _, lib in pending:
            if isinstance(lib, Future) and not lib.cancel():
                lib.exception()
        if progress is not None:
            progress.close()
