"""Compiling a schedule's kernels: on a worker thread or in worker processes the binaries are byte for byte those of
compiling one by one, and a worker process's failures come back as errors or a fallback with a warning;
a warm cache in a new process generates nothing again and a damaged binary entry is recompiled, never loaded; the
progress line shows only where it should, and is erased."""

from __future__ import annotations

import io
import itertools
import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from lazygrad import Tensor
from lazygrad import compiling as comp
from lazygrad_codegen import program_cache
from lazygrad_uop.config import Context
from lazygrad_uop.diskcache import CACHE_VERSION
from lazygrad_uop.registry import Device

_fresh = itertools.count(1)


def fresh_graph(n: int = 3) -> tuple[Tensor, np.ndarray]:
    """A lazy tensor needing several kernels none compiled before in this process (a new size each call), and its
    value computed by numpy."""
    size = 40 + next(_fresh) * 7
    rng = np.random.default_rng(size)
    a, b = rng.standard_normal((size, n * 4), dtype=np.float32), rng.standard_normal((n * 4, size), dtype=np.float32)
    x, y = Tensor(a), Tensor(b)
    out = ((x @ y).relu() + 1).sum(axis=1) * x.max(axis=1) - (x.exp().mean() * 2)
    want = (np.maximum(a @ b, 0) + 1).sum(axis=1) * a.max(axis=1) - np.exp(a).mean() * 2
    return out, want


def cpu_jobs() -> list[tuple[str, object]]:
    out, _ = fresh_graph()
    return [(si.bufs[0].device, si.ast) for si in out.schedule() if si.ast.op.name != "COPY"]


def test_worker_thread_gives_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = cpu_jobs()
    assert len(jobs) >= 3
    compiler = Device[jobs[0][0]].compiler
    threads: list[str] = []
    real = type(compiler).compile

    def recording(self: object, src: str) -> bytes:
        threads.append(threading.current_thread().name)
        return real(self, src)

    monkeypatch.setattr(type(compiler), "compile", recording)
    with Context(DISABLE_COMPILER_CACHE=1, PROGRESS=0):
        one_by_one = comp.compile_kernels(jobs, parallel=False)
        assert not any(t.startswith("lazygrad-compile") for t in threads)
        threads.clear()
        together = comp.compile_kernels(jobs, parallel=True)
    if compiler.threadsafe:
        assert all(t.startswith("lazygrad-compile") for t in threads)
    assert [s.src for s, _ in one_by_one] == [s.src for s, _ in together]
    assert [lib for _, lib in one_by_one] == [lib for _, lib in together]


def test_worker_processes_give_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = cpu_jobs()
    compiler = Device[jobs[0][0]].compiler
    if compiler.worker_factory() is None:
        pytest.skip(f"{type(compiler).__name__} compiles in this process only")
    monkeypatch.setattr(comp, "PROCESS_MIN_KERNELS", 1)
    with Context(DISABLE_COMPILER_CACHE=1, PROGRESS=0, COMPILE_PROCESSES=2):
        one_by_one = comp.compile_kernels(jobs, parallel=False)
        in_workers = comp.compile_kernels(jobs, parallel=True)
        pool = comp._worker_pool()
    assert pool is not None and 1 <= len(pool[0]._all) <= 2  # the workers did compile them
    assert [s.src for s, _ in one_by_one] == [s.src for s, _ in in_workers]
    assert [lib for _, lib in one_by_one] == [lib for _, lib in in_workers]
    with Context(COMPILE_PROCESSES=0):
        assert comp._worker_pool() is None


def test_worker_process_errors_and_a_lost_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    from lazygrad_uop.compile_workers import WorkerLostError, WorkerPool
    from lazygrad_uop.device import CompileError

    jobs = cpu_jobs()
    compiler = Device[jobs[0][0]].compiler
    if compiler.worker_factory() is None:
        pytest.skip(f"{type(compiler).__name__} compiles in this process only")
    src = comp.compile_kernels(jobs[:1], parallel=False)[0][0].src
    monkeypatch.setenv("DEBUG", "7")  # the worker prints assembly: on its stderr, never into its answers
    pool = WorkerPool(1)
    try:
        assert pool.compile(*compiler.worker_factory(), src) == compiler.compile(src)
        with pytest.raises(CompileError, match="rejected"):
            pool.compile(*compiler.worker_factory(), "this is not LLVM IR")
        (worker,) = pool._all
        worker.proc.kill()
        worker.proc.wait()
        with pytest.raises(WorkerLostError):
            pool.compile(*compiler.worker_factory(), src)
        assert len(pool._all) == 0 and pool.lost
        assert pool.compile(*compiler.worker_factory(), src) == compiler.compile(src)  # a new worker starts
    finally:
        pool.close()
    # a worker that can't start is lost too
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    pool = WorkerPool(1)
    with pytest.raises(WorkerLostError, match="could not start"):
        pool.compile(*compiler.worker_factory(), src)
    assert pool.lost and len(pool._all) == 0
    monkeypatch.undo()
    # the compile pipeline goes on in this process, with a warning once, then without trying workers again
    pool = WorkerPool(1)
    try:
        worker = pool._take()
        pool._idle.put(worker)
        worker.proc.kill()
        worker.proc.wait()
        with Context(DISABLE_COMPILER_CACHE=1):
            with pytest.warns(RuntimeWarning, match="compiling in this process"):
                assert comp._compile_in_worker(pool, compiler, src) == compiler.compile(src)
            assert comp._compile_in_worker(pool, compiler, src) == compiler.compile(src)
        assert len(pool._all) == 0
    finally:
        pool.close()


def test_results_through_the_pipeline_match_numpy() -> None:
    out, want = fresh_graph(4)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-3)


def test_compile_error_propagates_and_nothing_is_left_running(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = cpu_jobs()
    compiler = Device[jobs[0][0]].compiler
    from lazygrad_uop.device import CompileError

    def failing(self: object, src: str) -> bytes:
        raise CompileError("injected")

    monkeypatch.setattr(type(compiler), "compile", failing)
    with Context(DISABLE_COMPILER_CACHE=1, PROGRESS=0), pytest.raises(CompileError, match="injected"):
        comp.compile_kernels(jobs)


# *** the progress line ***


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def shown_at_end(text: str) -> str:
    """What a terminal shows on the last line after `text`: what follows the last carriage return."""
    return text.rsplit("\r", 1)[-1].strip()


def test_progress_line_counts_and_is_erased(monkeypatch: pytest.MonkeyPatch) -> None:
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    jobs = cpu_jobs()
    with Context(PROGRESS=-1):
        comp.compile_kernels(jobs)
    text = term.getvalue()
    assert f"compiling kernels {len(jobs)}/{len(jobs)}" in text
    assert f" 0/{len(jobs)}" in text  # drawn before the first kernel finished
    assert shown_at_end(text) == ""


@pytest.mark.parametrize("setting", [0, -1])
def test_no_progress_when_off_or_not_a_terminal(monkeypatch: pytest.MonkeyPatch, setting: int) -> None:
    stream = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", stream if setting == -1 else Terminal())
    with Context(PROGRESS=setting):
        comp.compile_kernels(cpu_jobs())
    assert (stream if setting == -1 else sys.stderr).getvalue() == ""


def test_progress_forced_on_where_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    out, want = fresh_graph()
    with Context(PROGRESS=1):
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-3)
    err = capsys.readouterr().err
    assert "compiling kernels" in err and shown_at_end(err) == ""
    with Context(PROGRESS=1):  # the same kernels again: nothing to compile, no line
        again, _ = fresh_graph()
        (again * 1).numpy()
        capsys.readouterr()
        Tensor(np.ones(3, np.float32)).exp().numpy()  # one kernel: too few for a line
    assert "compiling" not in capsys.readouterr().err


def test_progress_for_thresholds() -> None:
    with Context(PROGRESS=1):
        assert comp.progress_for(comp.PROGRESS_MIN_KERNELS - 1, Terminal()) is None
        assert comp.progress_for(comp.PROGRESS_MIN_KERNELS, io.StringIO()) is not None
    with Context(PROGRESS=-1):
        assert comp.progress_for(10, io.StringIO()) is None
        line = comp.progress_for(10, Terminal())
        assert line is not None
        line.close()


# *** a warm cache in a new process ***

SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    from lazygrad import Tensor
    from lazygrad_codegen import program_cache
    generated = []
    real = program_cache.get_program
    program_cache.get_program = lambda ast, *a: generated.append(1) or real(ast, *a)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 11), dtype=np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ((Tensor(a) * 3).exp().sum(axis=0) + Tensor(a).max()).numpy()
    want = np.exp(a * 3).sum(axis=0) + a.max()
    print(json.dumps({"ok": bool(np.allclose(got, want, rtol=1e-4)), "generated": len(generated),
                      "warnings": [str(w.message) for w in caught]}))
    """
)


def run_fresh_process(cachedir: Path) -> dict:
    env = {**os.environ, "CACHEDIR": str(cachedir), "PROGRESS": "0"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]  # a bad binary handed to the loader would kill the process
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_warm_cache_in_a_new_process_and_damaged_binaries(tmp_path: Path) -> None:
    cold = run_fresh_process(tmp_path)
    assert cold["ok"] and cold["generated"] >= 1 and not cold["warnings"]
    warm = run_fresh_process(tmp_path)
    assert warm["ok"] and warm["generated"] == 0 and not warm["warnings"]
    # every binary replaced by a valid pickle of the wrong bytes: detected by the checksum, recompiled
    with sqlite3.connect(tmp_path / "lazygrad" / "cache.db") as conn:
        conn.execute(f"UPDATE compiler_v{CACHE_VERSION} SET val = ?", (pickle.dumps(b"\x7fELF" + b"\xcc" * 64),))
    damaged = run_fresh_process(tmp_path)
    assert damaged["ok"] and len(damaged["warnings"]) == 1 and "checksum" in damaged["warnings"][0]
    assert run_fresh_process(tmp_path)["warnings"] == []  # the recompiled binaries were stored again


def test_program_cache_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []
    real = program_cache.get_program
    monkeypatch.setattr(program_cache, "get_program", lambda ast, *a: seen.append(ast) or real(ast, *a))
    jobs = cpu_jobs()
    with Context(PROGRAM_CACHE=0, PROGRESS=0):
        comp.compile_kernels(jobs)
        comp.compile_kernels(jobs)
    assert len(seen) == 2 * len(jobs)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_compiles_on_its_own_worker() -> None:
    comp.compile_kernels(cpu_jobs())  # the parent's worker thread exists now
    jobs = cpu_jobs()
    pid = os.fork()
    if pid == 0:  # the child: compile new kernels, exit 0 only when they are right
        code = 1
        try:
            with Context(PROGRESS=0):
                out, want = fresh_graph()
                code = 0 if np.allclose(out.numpy(), want, rtol=1e-4, atol=1e-3) and comp.compile_kernels(jobs) else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120  # a child waiting on the parent's (absent) worker would hang: fail instead
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child never finished compiling")
    assert os.waitstatus_to_exitcode(done[1]) == 0
