"""Kernels split over cores: the `core0` axis rendered as a loop over a caller-given range, the launch that splits
that axis over `CPU_THREADS` threads, the pool behind it, and the choice to keep small kernels on one thread.

The renderer and launch tests use linear programs built by hand (per the linear-program contract in codegen's
README), so that they don't depend on the optimisations codegen chooses; the end-to-end tests go through
`get_program`."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from lazygrad_cpu import threads as threads_module
from lazygrad_cpu.program import MIN_PART_SECONDS, PARTS_PER_THREAD, CPUProgram
from lazygrad_cpu.renderer import CPURenderer
from lazygrad_cpu.threads import COPY_GRAIN, POOL, ThreadPool, memmove, split, thread_count, usable_cores
from lazygrad_uop.config import Context
from lazygrad_uop.device import CompiledDevice
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

RNG = np.random.default_rng(7)


@contextlib.contextmanager
def _patched(obj, name: str, value):
    """`obj.name` set to `value` for the block."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _global(slot: int, size: int) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(size), arg=slot)


def _loop(size: int, axis: int) -> UOp:
    return UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, size),), arg=axis)


def _load(buf: UOp, idx: UOp) -> UOp:
    return UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, buf.dtype, (buf, idx)),))


def _in_order(*anchors: UOp) -> list[UOp]:
    """The anchors in the given order, each after those of its sources not placed yet (a DEFINE_ACC after its
    initial value only: it comes before the loops it names)."""
    out: list[UOp] = []
    placed: set[UOp] = set()

    def place(u: UOp) -> None:
        if u in placed:
            return
        for s in u.src[:1] if u.op is Ops.DEFINE_ACC else u.src:
            place(s)
        placed.add(u)
        out.append(u)

    for a in anchors:
        place(a)
    return out


def scale_program(rows: int, cols: int, split_rows: bool = True) -> list[UOp]:
    """out[i*cols + j] = x[i*cols + j] * 2 + 1, i = core0 (or a loop, without `split_rows`), j a loop."""
    out, x = _global(0, rows * cols), _global(1, rows * cols)
    i = UOp.special(rows, "core0") if split_rows else _loop(rows, 0)
    j = _loop(cols, 1)
    idx = i * cols + j
    store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, idx)), _load(x, idx) * 2.0 + 1.0))
    ends = [UOp(Ops.END, src=(j,))] + ([] if split_rows else [UOp(Ops.END, src=(i,))])
    return _in_order(out, x, i, j, store, *ends, UOp(Ops.SINK, src=(store,), arg="scale"))


def row_sum_program(rows: int, cols: int) -> list[UOp]:
    """out[i] = sum_j x[i*cols + j], i = core0: the reduction runs inside each value of the core axis."""
    out, x = _global(0, rows), _global(1, rows * cols)
    i, j = UOp.special(rows, "core0"), _loop(cols, 1)
    acc = UOp(Ops.DEFINE_ACC, dtypes.float32, (UOp.const(dtypes.float32, 0.0), j), arg=(0,))
    total = UOp(Ops.ASSIGN, dtypes.float32, (acc, acc + _load(x, i * cols + j)))
    store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, i)), total))
    return _in_order(out, x, i, acc, j, total, UOp(Ops.END, src=(j,)), store, UOp(Ops.SINK, src=(store,), arg="rsum"))


def compile_program(cpu: CompiledDevice, uops: list[UOp]) -> tuple[CPUProgram, str]:
    src = cpu.renderer.render(uops)
    return CPUProgram(cpu, uops[-1].arg, cpu.compiler.compile(src)), src


def alloc_like(cpu: CompiledDevice, x: np.ndarray):
    handle = cpu.allocator.alloc(x.nbytes)
    cpu.allocator.copyin(handle, memoryview(np.ascontiguousarray(x)).cast("B"))
    return handle


def read(cpu: CompiledDevice, handle, n: int) -> np.ndarray:
    out = np.empty(n, np.float32)
    cpu.allocator.copyout(memoryview(out).cast("B"), handle)
    return out


# *** the pieces ***


@pytest.mark.parametrize(("n", "parts"), [(10, 3), (3, 8), (1, 1), (7, 7), (1000, 2), (5, 1)])
def test_split_covers_the_range_in_even_contiguous_parts(n: int, parts: int) -> None:
    ranges = split(n, parts)
    assert len(ranges) == min(n, parts)
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [hi - lo for lo, hi in ranges]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_cpu_threads_setting() -> None:
    assert thread_count() == usable_cores() >= 1
    with Context(CPU_THREADS=3):
        assert thread_count() == 3
    with Context(CPU_THREADS=0), pytest.raises(ValueError, match="CPU_THREADS must be a positive"):
        thread_count()


def test_pool_runs_every_part_once_on_several_threads_and_raises_their_errors() -> None:
    pool = ThreadPool()
    seen: dict[tuple[int, int], list[int]] = {}

    def job(lo: int, hi: int) -> None:
        start = time.thread_time()
        while time.thread_time() - start < 0.01:  # work long enough that one thread can't run every part alone
            pass
        seen.setdefault((lo, hi), []).append(threading.get_ident())

    parts = split(48, 12)
    own = pool.run(job, parts, 4)
    assert sorted(seen) == parts and all(len(ids) == 1 for ids in seen.values())
    threads = {ids[0] for ids in seen.values()}
    assert threading.get_ident() in threads and 2 <= len(threads) <= 4
    assert own is not None and own[0] >= 0.01 and own[1] == 4

    def fails(lo: int, hi: int) -> None:
        if lo > 0:
            raise ZeroDivisionError(f"part {lo}")

    with pytest.raises(ZeroDivisionError, match="part"):
        pool.run(fails, parts, 4)
    seen.clear()
    pool.run(job, parts, 4)  # a failed launch leaves the pool usable
    assert sorted(seen) == parts


def test_a_slow_thread_runs_fewer_parts() -> None:
    pool, main = ThreadPool(), threading.get_ident()
    ran: list[int] = []

    def job(lo: int, hi: int) -> None:
        ran.append(threading.get_ident())
        time.sleep(0.05 if threading.get_ident() == main else 0.001)  # this thread as if the OS gave it less time

    pool.run(job, split(40, 20), 2)
    assert len(ran) == 20 and ran.count(main) < 5


def test_one_thread_runs_every_part_here() -> None:
    pool, ran = ThreadPool(), []
    own = pool.run(lambda lo, hi: ran.append((lo, hi, threading.get_ident())), split(10, 5), 1)
    assert [(lo, hi) for lo, hi, _ in ran] == split(10, 5)
    assert {t for _, _, t in ran} == {threading.get_ident()} and own is not None and own[1] == 2


def test_a_busy_pool_runs_a_second_launch_on_its_own_thread() -> None:
    pool = ThreadPool()
    inner: list[set[int]] = []

    def outer(lo: int, hi: int) -> None:
        time.sleep(0.01)  # keeps the launch, and so the pool, busy while the inner launch runs
        if lo == 0:
            threads: set[int] = set()
            pool.run(lambda a, b: threads.add(threading.get_ident()), split(4, 4), 4)
            inner.append(threads)

    pool.run(outer, split(2, 2), 2)
    assert len(inner) == 1 and len(inner[0]) == 1  # one thread: whichever took part 0


# *** rendering ***


def _signature(src: str) -> str:
    return next(line for line in src.splitlines() if line.startswith("define "))


def test_every_cpu_kernel_takes_the_core_range_last(cpu) -> None:
    prg, loops_only = compile_program(cpu, scale_program(4, 8, split_rows=False))
    assert "(ptr %data0, ptr %data1, i32 %core_start, i32 %core_end)" in _signature(loops_only)
    assert "%core0" not in loops_only
    assert prg.arity == 2
    _, split_src = compile_program(cpu, scale_program(4, 8))
    assert "(ptr %data0, ptr %data1, i32 %core_start, i32 %core_end)" in _signature(split_src)
    assert "%core0 = phi i32 [%core_start" in split_src


def test_a_call_with_the_wrong_parameters_is_an_error_not_a_crash(cpu) -> None:
    prg, _ = compile_program(cpu, scale_program(4, 8))
    handles = [cpu.allocator.alloc(128) for _ in range(3)]
    with pytest.raises(ValueError, match="takes 2 buffers and variables, got 3 buffers and 0"):
        prg(*handles, global_size=(4, 1, 1))
    with pytest.raises(ValueError, match="got 2 buffers and 1 variable"):
        prg(*handles[:2], global_size=(4, 1, 1), vals=(3,))
    prg(*handles[:2], global_size=(4, 1, 1))


def test_other_hardware_indices_are_rejected(cpu) -> None:
    renamed = [u.replace(arg=("gidx0", 4)) if u.op is Ops.SPECIAL else u for u in scale_program(4, 8)]
    with pytest.raises(NotImplementedError, match="gidx0"):
        cpu.renderer.render(renamed)


@pytest.mark.parametrize(("start", "end"), [(2, 5), (0, 9), (8, 9), (4, 4), (6, 3)])
def test_the_kernel_runs_exactly_the_given_range_of_core0(cpu, start: int, end: int) -> None:
    rows, cols = 9, 17
    prg, _ = compile_program(cpu, scale_program(rows, cols))
    x = RNG.standard_normal((rows, cols)).astype(np.float32)
    out, inp = cpu.allocator.alloc(x.nbytes), alloc_like(cpu, x)
    fxn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)(prg._address)
    fxn(out.addr, inp.addr, start, end)
    expect = np.zeros_like(x)
    expect[start:end] = x[start:end] * 2 + 1
    np.testing.assert_array_equal(read(cpu, out, x.size).reshape(rows, cols), expect)


# *** launches ***


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_split_launch_matches_numpy(cpu, threads: int, rows: int) -> None:
    cols = 33
    x = RNG.standard_normal((rows, cols)).astype(np.float32)
    (scale, _), (row_sum, _) = (
        compile_program(cpu, scale_program(rows, cols)),
        compile_program(cpu, row_sum_program(rows, cols)),
    )
    inp, out, sums = alloc_like(cpu, x), cpu.allocator.alloc(x.nbytes), cpu.allocator.alloc(rows * 4)
    with Context(CPU_THREADS=threads):
        scale.item_seconds = row_sum.item_seconds = 1.0  # as if large: split even these small kernels
        assert scale.threads_for(rows) == min(threads, rows)
        scale(out, inp, global_size=(rows, 1, 1))
        row_sum(sums, inp, global_size=(rows, 1, 1))
    np.testing.assert_array_equal(read(cpu, out, x.size).reshape(rows, cols), x * 2 + 1)
    np.testing.assert_allclose(read(cpu, sums, rows), x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_large_kernels_use_every_thread_and_small_ones_stay_on_one(cpu) -> None:
    rows, cols = 64, 16
    prg, _ = compile_program(cpu, scale_program(rows, cols))
    x = np.ones((rows, cols), np.float32)
    inp, out = alloc_like(cpu, x), cpu.allocator.alloc(x.nbytes)
    with Context(CPU_THREADS=4):
        assert prg.threads_for(rows) == 4  # not measured yet: split
        small = []
        # 4 KiB take well under a microsecond; retried, since a busy machine may preempt one launch
        for _ in range(5):
            elapsed = prg(out, inp, global_size=(rows, 1, 1), wait=True)
            assert isinstance(elapsed, float) and elapsed > 0
            assert prg.item_seconds is not None
            small.append(prg.threads_for(rows) == 1)
        assert any(small)
        prg.item_seconds = MIN_PART_SECONDS  # one value of core0 is worth a part of its own
        assert prg.threads_for(rows) == 4
        assert prg.threads_for(3) == 3
        prg.item_seconds = MIN_PART_SECONDS / 100
        assert prg.threads_for(1000) == 4 and prg.threads_for(250) == 2 and prg.threads_for(50) == 1
        # a few parts per thread, each worth a wake-up
        assert len(prg.parts_for(10_000)) == 4 * PARTS_PER_THREAD
        assert len(prg.parts_for(1000)) == 10 and len(prg.parts_for(50)) == 1
    with Context(CPU_THREADS=1):
        prg.item_seconds = 1.0
        assert prg.threads_for(rows) == 1


def test_launch_sizes_are_checked(cpu) -> None:
    prg, _ = compile_program(cpu, scale_program(4, 4))
    handles = (cpu.allocator.alloc(64), cpu.allocator.alloc(64))
    assert prg(*handles, global_size=(0, 1, 1), wait=True) == 0.0  # an empty core axis runs nothing
    for bad in [{"global_size": (4, 2, 1)}, {"global_size": (-1, 1, 1)}, {"local_size": (2, 1, 1)}]:
        with pytest.raises(ValueError, match="split over cores along one axis"):
            prg(*handles, **bad)


def test_launches_from_several_python_threads(cpu) -> None:
    rows, cols = 96, 256
    prg, _ = compile_program(cpu, row_sum_program(rows, cols))
    xs = [RNG.standard_normal((rows, cols)).astype(np.float32) for _ in range(4)]
    ins = [alloc_like(cpu, x) for x in xs]
    outs = [cpu.allocator.alloc(rows * 4) for _ in xs]
    errors: list[BaseException] = []

    def launch(i: int) -> None:
        try:
            for _ in range(20):
                prg.item_seconds = 1.0  # keep splitting, so that launches meet a busy pool
                prg(outs[i], ins[i], global_size=(rows, 1, 1))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    workers = [threading.Thread(target=launch, args=(i,)) for i in range(len(xs))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_allclose(read(cpu, out, rows), x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)
    assert not POOL._busy.locked()


# *** end to end: kernels as codegen makes them ***


def _scale_kernel(k, rows: int, cols: int) -> UOp:
    st = k.st(rows, cols)
    x = k.load(1, dtypes.float32, st)
    return k.sink(k.store(0, x * k.const(2.0, dtypes.float32, st) + k.const(1.0, dtypes.float32, st), st))


def _reduce_kernel(k, rows: int, cols: int, axis: int) -> UOp:
    x = k.load(1, dtypes.float32, k.st(rows, cols))
    return k.sink(k.store(0, k.reduce(x, Ops.ADD, (axis,)), k.st(*((1, cols) if axis == 0 else (rows, 1)))))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_codegen_kernels_split_over_cores_match_numpy(run_with_spec, k, threads: int) -> None:
    rows, cols = 67, 45
    x = RNG.standard_normal((rows, cols)).astype(np.float32)
    with Context(CPU_THREADS=threads):
        out, spec = run_with_spec(_scale_kernel(k, rows, cols), {1: x})
        assert any(u.op is Ops.SPECIAL and u.arg[0] == "core0" for u in spec.uops)
        assert spec.global_size[0] > 1 and spec.src.count("%core_start") >= 2
        np.testing.assert_array_equal(out[0].reshape(rows, cols), x * 2 + 1)
        for axis in (0, 1):
            out, spec = run_with_spec(_reduce_kernel(k, rows, cols, axis), {1: x})
            assert spec.global_size[0] > 1
            np.testing.assert_allclose(out[0], x.astype(np.float64).sum(axis=axis), rtol=1e-5, atol=1e-5)


def test_cpu_renderer_has_threads_and_no_local() -> None:
    assert CPURenderer.has_threads and not CPURenderer.has_local and not CPURenderer.has_shared


@settings(max_examples=40, deadline=None)
@given(
    size=hs.integers(0, 3 * COPY_GRAIN + 17),
    src_offset=hs.integers(0, 63),
    dest_offset=hs.integers(0, 63),
    threads=hs.integers(1, 3),
)
def test_parallel_memmove_copies_every_byte_once(size: int, src_offset: int, dest_offset: int, threads: int) -> None:
    """Copies from and to any alignment, split into parts of whole grains over the threads (the threshold lowered
    to 0 so that small copies split too), leave every byte copied and none beside them touched."""
    src = RNG.integers(0, 256, size + src_offset, dtype=np.uint8)
    dest = np.full(size + dest_offset + 8, 7, np.uint8)
    with Context(CPU_THREADS=threads), _patched(threads_module, "PARALLEL_COPY_MIN_BYTES", 0):
        memmove(dest.ctypes.data + dest_offset, src.ctypes.data + src_offset, size)
    np.testing.assert_array_equal(dest[dest_offset : dest_offset + size], src[src_offset:])
    assert (dest[:dest_offset] == 7).all() and (dest[dest_offset + size :] == 7).all()


def test_large_copies_use_every_thread(cpu) -> None:
    """A copy of at least PARALLEL_COPY_MIN_BYTES runs one part per thread; a smaller one runs on this thread."""
    seen: list[tuple[int, int]] = []
    real = POOL.run

    def spy(job, parts, threads):
        seen.append((len(parts), threads))
        return real(job, parts, threads)

    n = threads_module.PARALLEL_COPY_MIN_BYTES
    data = RNG.integers(0, 256, n, dtype=np.uint8)
    handle = cpu.allocator.alloc(n)
    with Context(CPU_THREADS=2), _patched(POOL, "run", spy):
        cpu.allocator.copyin(handle, memoryview(data))
        out = np.empty_like(data)
        cpu.allocator.copyout(memoryview(out), handle)
        cpu.allocator.copyin(handle, memoryview(data[: n - 1]))
    np.testing.assert_array_equal(out, data)
    assert seen == [(2, 2), (2, 2)]
