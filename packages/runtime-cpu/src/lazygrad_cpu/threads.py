"""Running one kernel on several cores: a persistent pool of worker threads that call the kernel on contiguous
parts of its `core0` range, and the `CPU_THREADS` setting that sizes it.

Python threads run a compiled kernel truly in parallel because ctypes releases the GIL for the duration of a
foreign call; the pool only pays the cost of waking its workers (tens of microseconds), which is why small kernels
stay on the calling thread. The range is cut into a few more parts than there are threads, and each thread takes
the next part not yet taken: on a machine whose cores other processes also use, a thread that gets less time runs
fewer parts instead of holding up the whole launch."""

from __future__ import annotations

import ctypes
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from lazygrad_uop.config import CPU_THREADS


def usable_cores() -> int:
    """The number of cores this process may run on (its CPU affinity where the OS reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return os.cpu_count() or 1


def thread_count() -> int:
    """The current `CPU_THREADS`, checked."""
    n = CPU_THREADS.value
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"CPU_THREADS must be a positive number of threads, got {n!r}")
    return n


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """`[0, n)` cut into `parts` contiguous, non-empty ranges whose sizes differ by at most one (fewer parts when
    `n < parts`)."""
    parts = max(min(parts, n), 1)
    bounds = [n * i // parts for i in range(parts + 1)]
    return list(itertools.pairwise(bounds))


Job = Callable[[int, int], object]
Parts = Iterator[tuple[int, int]]


def _drain(job: Job, parts: Parts) -> tuple[float, int] | None:
    """Run `job` on parts taken from the shared iterator `parts` until none is left (taking one is atomic under the
    GIL); the CPU seconds and size of the first part this thread ran, None if it ran none.

    CPU time of this thread, not wall time: waiting for the GIL after the call, or for a core that another process
    holds, is not work the part needed, and counting it would make a small kernel look worth splitting."""
    first = None
    for start, end in parts:
        t = time.thread_time()
        job(start, end)
        if first is None:
            first = (time.thread_time() - t, end - start)
    return first


class _Worker(threading.Thread):
    def __init__(self, index: int) -> None:
        super().__init__(name=f"lazygrad-cpu-{index}", daemon=True)
        self.jobs: queue.SimpleQueue[tuple[Job, Parts, queue.SimpleQueue[BaseException | None]]] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            job, parts, done = self.jobs.get()
            try:
                _drain(job, parts)
            except BaseException as exc:  # noqa: BLE001 - handed to the launching thread, which raises it
                done.put(exc)
            else:
                done.put(None)


class ThreadPool:
    """Worker threads that run parts of one launch alongside the launching thread.

    One launch at a time: a second thread that launches while the pool is busy runs its kernel alone instead of
    waiting. Workers are started on first need and kept; a forked child starts with none."""

    def __init__(self) -> None:
        self._workers: list[_Worker] = []
        self._busy = threading.Lock()

    def _forget_workers(self) -> None:
        # threads don't survive fork: the child needs a fresh pool and a free lock
        self._workers = []
        self._busy = threading.Lock()

    def run(self, job: Job, parts: Sequence[tuple[int, int]], threads: int) -> tuple[float, int] | None:
        """Call `job(start, end)` once per part on up to `threads` threads (this one and `threads - 1` workers),
        each taking the next part not yet taken, and return when all are done; an exception raised by any call is
        raised here. Returns the CPU seconds and size of the first part this thread ran (None if the workers took
        them all): what that much of the work costs, without the pool's overhead."""
        threads = max(min(threads, len(parts)), 1)
        if threads == 1 or not self._busy.acquire(blocking=False):
            return _drain(job, iter(parts))
        try:
            while len(self._workers) < threads - 1:
                worker = _Worker(len(self._workers))
                worker.start()
                self._workers.append(worker)
            todo, done = iter(parts), queue.SimpleQueue[BaseException | None]()
            for worker in self._workers[: threads - 1]:
                worker.jobs.put((job, todo, done))
            error: BaseException | None = None
            own = None
            try:
                own = _drain(job, todo)
            except BaseException as exc:  # noqa: BLE001 - the workers' parts must finish before raising
                error = exc
            for _ in range(threads - 1):
                error = done.get() or error
            if error is not None:
                raise error
            return own
        finally:
            self._busy.release()


POOL = ThreadPool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=POOL._forget_workers)


# copies this large are split over the pool's threads: one core's memcpy reads and writes about half of what two
# cores' do (22 against 42 GB/s counted on the 2-core Xeon measured), and waking the workers costs less than a part
PARALLEL_COPY_MIN_BYTES = 8 << 20
# the parts of a parallel copy start at multiples of this many bytes (whole pages of both sides when both are)
COPY_GRAIN = 4096


def memmove(dest: int, src: int, size: int) -> None:
    """Copy `size` bytes from address `src` to address `dest` (not overlapping), on `CPU_THREADS` threads when it
    is large."""
    threads = thread_count()
    if size < PARALLEL_COPY_MIN_BYTES or threads == 1:
        ctypes.memmove(dest, src, size)
        return
    # one part per thread, as large as can be: the C library's memcpy bypasses the caches (non-temporal stores) only
    # for copies larger than some threshold, and two 64 MiB parts of a 256 MiB copy ran at half the speed of one
    # 128 MiB part per thread on the machine measured
    grains = -(-size // COPY_GRAIN)
    parts = [(a * COPY_GRAIN, min(b * COPY_GRAIN, size)) for a, b in split(grains, threads)]
    POOL.run(lambda start, end: ctypes.memmove(dest + start, src + start, end - start), parts, threads)
