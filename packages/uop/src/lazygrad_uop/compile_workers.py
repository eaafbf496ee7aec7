"""Compiling in other processes, so that a schedule's kernels compile on every core even where a compiler can run only
one compile at a time per process (llvmlite runs every call into LLVM under one lock).

A worker is `python -m lazygrad_uop.compile_workers`, a plain child process: it imports nothing of the parent's
program (no re-run of an unguarded script, as `multiprocessing`'s spawn would do) and forks nothing that holds
threads. It reads requests from its stdin and answers on a private copy of its stdout (its own stdout goes to
stderr, so a compiler that prints, `DEBUG=7`, can't break the protocol). A request is a pickled
`(factory, args, src)`: the worker builds `factory(*args)` once per distinct (factory, args) and answers
`("ok", binary)` or `("error", message)`.

`WorkerPool(n)` in the parent holds up to n workers, started on first use, each used by one thread at a time;
`compile(factory, args, src)` blocks the calling thread (not the GIL) until a free worker answers.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

from lazygrad_uop.device import CompileError

_HEADER = struct.Struct("<Q")


def _send(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    """The next message on `stream`; EOFError when the other side has gone."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("the stream ended")
    (size,) = _HEADER.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the stream ended inside a message")
    return pickle.loads(data)


class _Worker:
    """One child process and its pipes."""

    def __init__(self) -> None:
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lazygrad_uop.compile_workers"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
        except OSError as exc:  # no interpreter to start (an embedded or frozen program), or no processes left
            raise WorkerLostError(f"a compile worker process could not start ({exc})") from exc

    def compile(self, factory: Callable[..., Any], args: tuple, src: str) -> bytes:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            _send(self.proc.stdin, (factory, args, src))
            status, payload = _receive(self.proc.stdout)
        except (EOFError, OSError, pickle.PickleError) as exc:
            raise WorkerLostError(f"a compile worker process ended or broke its protocol ({exc})") from exc
        if status != "ok":
            raise CompileError(payload)
        return payload

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


class WorkerLostError(RuntimeError):
    """A compile worker process died or answered garbage; the caller compiles in its own process instead."""


class WorkerPool:
    """Up to `size` worker processes, started as needed and kept until `close()` (or the interpreter's exit)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._all: list[_Worker] = []  # the running workers, busy or idle
        self._pid = os.getpid()
        # whether a worker has been lost: callers may stop sending work here (a worker that can't start would
        # otherwise fail again for every kernel)
        self.lost = False
        atexit.register(self.close)

    def _take(self) -> _Worker:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if len(self._all) < self.size:
                w = _Worker()
                self._all.append(w)
                return w
        return self._idle.get()

    def compile(self, factory: Callable[..., Any], args: tuple, src: str) -> bytes:
        """`factory(*args).compile(src)`, in a worker process. Raises CompileError as the compiler does, and
        WorkerLostError when the worker failed or could not start (a failed one is not reused)."""
        try:
            w = self._take()
        except WorkerLostError:
            self.lost = True
            raise
        try:
            lib = w.compile(factory, args, src)
        except WorkerLostError:
            w.close()
            self.lost = True
            with self._lock:
                self._all.remove(w)
            raise
        except BaseException:
            self._idle.put(w)
            raise
        self._idle.put(w)
        return lib

    def close(self) -> None:
        """End every worker (in the process that started them: a forked child's copy of the pool leaves them)."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            workers, self._all = self._all, []
        for w in workers:
            w.close()


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    compilers: dict[tuple, Any] = {}
    while True:
        try:
            factory, args, src = _receive(requests)
        except EOFError:
            return
        try:
            key = (factory, args)
            if (compiler := compilers.get(key)) is None:
                compiler = compilers[key] = factory(*args)
            answer: tuple[str, Any] = ("ok", compiler.compile(src))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the parent, raised as a CompileError
            answer = ("error", str(exc) if isinstance(exc, CompileError) else f"{type(exc).__name__}: {exc}")
        _send(answers, answer)


def main() -> None:
    """The worker: serve requests on stdin until it closes."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # what a compiler prints goes to stderr
    _serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
