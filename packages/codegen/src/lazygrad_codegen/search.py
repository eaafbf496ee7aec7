"""BEAM search: find the opts of a kernel by compiling and timing candidates on the device.

Each round extends every kernel of the beam by each opt of `ACTIONS` that is valid for it (invalid ones raise
`KernelOptError` and are skipped), renders and compiles the candidates in parallel processes (forked, one per core),
runs each on the device on buffers of random data, drops any whose outputs differ from the unoptimised kernel's,
and keeps the `width` fastest. The search starts from the fastest of the unoptimised kernel, the hand-coded
heuristics' choice and, for matmul-like kernels on GPUs, the staged tiles around the default
(`tiling.staged_tiles`: warps per workgroup, register tile, K step, one to four pipeline stages, which no single opt
can vary once STAGE is applied), so the result is never slower than the default, and stops when a round finds
nothing faster than the best so far (confirmed by timing both again) or after `BEAM_TIMEOUT` seconds. The chosen
opts are cached on disk per (kernel, device, renderer), so a kernel is searched once per machine.

`DEBUG>=2` prints each round's best candidate.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import random
import struct
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from lazygrad_codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from lazygrad_uop.config import DEBUG, ContextVar
from lazygrad_uop.device import Buffer, CompiledDevice, CompileError, Program
from lazygrad_uop.diskcache import diskcache_get, diskcache_put
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import pretty_print


def _actions() -> list[Opt]:
    out: list[Opt] = []
    for axis in range(6):
        out += [Opt(OptOps.UPCAST, axis, amt) for amt in (0, 2, 3, 4, 5, 7, 8, 16, 32, 64)]
        out += [Opt(OptOps.LOCAL, axis, amt) for amt in (2, 3, 4, 8, 13, 16, 29, 32)]
        out += [Opt(OptOps.PADTO, axis, amt) for amt in (16, 32)]
    for axis in range(4):
        out += [Opt(OptOps.UNROLL, axis, amt) for amt in (0, 2, 3, 4, 8, 16)]
    for axis in range(3):
        out += [Opt(OptOps.GROUPTOP, axis, amt) for amt in (13, 16, 28, 29, 32, 49, 64, 256)]
        out += [Opt(OptOps.GROUP, axis, amt) for amt in (0, 4, 8, 16)]
    out += [Opt(OptOps.SWAP, a, b) for a in range(4) for b in range(a + 1, 5)]
    out += [Opt(OptOps.NOLOCALS)]
    out += [Opt(OptOps.TC, axis, (-1, pad)) for axis in range(4) for pad in (0, 1)]
    out += [Opt(OptOps.STAGE)]
    return out


ACTIONS: list[Opt] = _actions()
"""The opts one round of search tries to add to each kernel of the beam."""


class SearchError(RuntimeError):
    """BEAM search has no device to time kernels on: the renderer's device can't be opened here."""


# *** buffers ***


def _random_values(dtype: DType, n: int, rng: random.Random) -> bytes:
    """`n` random elements of `dtype` as bytes: floats in [-1, 1), small ints, random bools."""
    scalar = dtype.scalar()
    if dtypes.is_float(scalar):
        vals = [rng.uniform(-1, 1) for _ in range(n)]
        if scalar == dtypes.bfloat16:
            return b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16) for v in vals)
        if scalar.fmt is None:
            return bytes(rng.randrange(0, 0x38) for _ in range(n * scalar.itemsize))  # fp8: small normal numbers
        return struct.pack(f"<{n}{scalar.fmt}", *vals)
    if dtypes.is_bool(scalar):
        return bytes(rng.randrange(2) for _ in range(n))
    return struct.pack(f"<{n}{scalar.fmt}", *(rng.randrange(0, 8) for _ in range(n)))


def _decode(dtype: DType, raw: bytes) -> list[float]:
    scalar = dtype.scalar()
    if scalar == dtypes.bfloat16:
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for (h,) in struct.iter_unpack("<H", raw)]
    if scalar.fmt is None:
        return list(raw)
    return [float(v) for (v,) in struct.iter_unpack(f"<{scalar.fmt}", raw)]


def _close(dtype: DType, got: bytes, want: bytes) -> bool:
    """Equal for ints and bools; for floats, equal up to rounding differences from reordered sums."""
    if not dtypes.is_float(dtype.scalar()):
        return got == want
    a, b = _decode(dtype, got), _decode(dtype, want)
    tol = {dtypes.float64: 1e-9, dtypes.float32: 1e-4}.get(dtype.scalar(), 2e-2)
    scale = max((abs(x) for x in b if math.isfinite(x)), default=1.0)
    for x, y in zip(a, b, strict=True):
        if math.isnan(x) and math.isnan(y):
            continue
        if math.isinf(y) or math.isinf(x):
            if x != y:
                return False
            continue
        if abs(x - y) > tol * (1 + scale):
            return False
    return True


@dataclass
class _Bench:
    """The buffers a kernel runs on during search, with their starting contents, and the variables' values."""

    device: CompiledDevice
    bufs: dict[int, Buffer]
    initial: dict[int, bytes]
    vals: tuple[int, ...]

    def reset(self) -> None:
        for slot, data in self.initial.items():
            self.bufs[slot].copyin(memoryview(data))

    def outputs(self, slots: tuple[int, ...]) -> dict[int, bytes]:
        out = {}
        for slot in slots:
            host = bytearray(self.bufs[slot].nbytes)
            self.bufs[slot].copyout(memoryview(host))
            out[slot] = bytes(host)
        return out


def _bench(k: Kernel, device: CompiledDevice, name: str) -> _Bench:
    rng = random.Random(0)
    bufs, initial = {}, {}
    for u in sorted((u for u in k.ast.toposort if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg):
        size = max(u.dtype.size, 1)
        b = Buffer(name, size, u.dtype.base).allocate()
        data = _random_values(u.dtype.base, size, rng)
        b.copyin(memoryview(data))
        bufs[u.arg], initial[u.arg] = b, data
    variables = sorted({v for st in k.views.values() for v in st.vars()}, key=lambda v: v.arg[0])
    vals = tuple(int(v.arg[2]) for v in variables)
    return _Bench(device, bufs, initial, vals)


# *** compiling in worker processes ***

# what forked workers compile with: set in the parent just before the pool starts, inherited by fork
_WORKER: dict[str, Any] = {}


@dataclass(frozen=True)
class _Compiled:
    opts: tuple[Opt, ...]
    name: str
    src: str
    lib: bytes
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int]
    globals: tuple[int, ...]
    outs: tuple[int, ...]


def _compile(opts: tuple[Opt, ...]) -> _Compiled | None:
    """Render and compile the kernel with `opts` (in a worker); None when that fails."""
    from lazygrad_codegen.program import program_of

    k: Kernel = _WORKER["kernel"].copy()
    try:
        k.apply_opts(list(opts[len(k.applied_opts) :]))
        spec = program_of(k)
        lib = _WORKER["compiler"].compile(spec.src)
    except (KernelOptError, CompileError, NotImplementedError):
        return None
    sizes = tuple(int(s) for s in spec.global_size), tuple(int(s) for s in spec.local_size)
    return _Compiled(opts, spec.name, spec.src, lib, sizes[0], sizes[1], spec.globals, spec.outs)  # type: ignore[arg-type]


def _compile_all(candidates: list[tuple[Opt, ...]], pool: ProcessPoolExecutor | None) -> list[_Compiled]:
    if pool is None:
        results = [_compile(c) for c in candidates]
    else:
        results = list(pool.map(_compile, candidates, chunksize=max(1, len(candidates) // (4 * (os.cpu_count() or 1)))))
    return [r for r in results if r is not None]


def _fork_pool() -> ProcessPoolExecutor | None:
    """A pool of forked workers, one per core; None where fork is not available (compile in this process)."""
    workers = os.cpu_count() or 1
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))


def _time(prg: Program, c: _Compiled, bench: _Bench, runs: int = 3, give_up: float = math.inf) -> float:
    """The fastest of `runs` runs, or the first when it is already slower than `give_up` seconds (a slow candidate
    is not worth timing again)."""
    handles = [bench.bufs[slot].handle for slot in c.globals]
    best = math.inf
    for _ in range(runs):
        t = prg(*handles, global_size=c.global_size, local_size=c.local_size, vals=bench.vals, wait=True)
        best = min(best, t if t is not None else math.inf)
        if best > give_up:
            break
    return best


# *** the search ***


def search_key(k: Kernel, width: int) -> tuple[str, str, str, int]:
    """What a search result is cached under: the kernel AST's text, the device, the renderer and the beam width."""
    r = k.renderer
    renderer = f"{type(r).__module__}.{type(r).__qualname__} {getattr(r, 'target', '')} {r.vector_width}"
    return (pretty_print(k.ast), r.device, renderer, width)


BEAM_TIMEOUT = ContextVar("BEAM_TIMEOUT", 600.0)
"""Seconds after which a search stops starting new rounds and keeps the best kernel found so far."""


def beam_search(k: Kernel, width: int, timeout_s: float | None = None) -> Kernel:
    """The kernel `k` with the opts a BEAM search of beam `width` finds fastest on its renderer's device (see the
    module docstring), from the disk cache when this kernel was searched before."""
    key = search_key(k, width)
    if (cached := diskcache_get("beam_search", key)) is not None:
        try:
            return k.copy().apply_opts(list(cached))
        except KernelOptError:
            pass  # opts found by an older codegen that no longer apply: search again
    from lazygrad_uop.registry import Device

    try:
        device: CompiledDevice = Device[k.renderer.device]
    except Exception as exc:  # any failure to open the device means it can't time candidates
        raise SearchError(f"BEAM needs the device {k.renderer.device!r} to time kernels on: {exc}") from exc
    best, converged = _search(k, width, device, BEAM_TIMEOUT.value if timeout_s is None else timeout_s)
    # a search cut short by its time limit is used now but not remembered: caching it would pin this kernel to
    # whatever the first rounds found (often only the heuristics' choice) on every later run
    if converged:
        diskcache_put("beam_search", key, tuple(best.applied_opts))
    return best


def _search(k: Kernel, width: int, device: CompiledDevice, timeout_s: float) -> tuple[Kernel, bool]:
    """The fastest kernel found, and whether the search ran to its end (False: the time limit stopped it)."""
    from lazygrad_codegen.heuristic import hand_coded_optimizations
    from lazygrad_codegen.tiling import staged_tiles

    start = time.perf_counter()
    bench = _bench(k, device, device.device)
    _WORKER.update(kernel=k, compiler=device.compiler)
    pool = _fork_pool()
    try:
        (base,) = _compile_all([tuple(k.applied_opts)], None)
        # the unoptimised kernel, run once, gives the outputs every candidate must reproduce
        reference, base_time = _run_outputs(device.load_program(base.name, base.lib), base, bench)
        assert reference is not None
        seen: set[str] = {base.src}
        # the search starts from the faster of the unoptimised kernel and the hand-coded choice, so it only ever
        # improves on the default (and does not spend its time extending a kernel that is far from fast)
        hand = hand_coded_optimizations(k.copy())
        seeds = {tuple(hand.applied_opts): hand}
        # staged tiles around the default (warps, register tile, K step, pipeline stages): STAGE fixes the tiles, so
        # the actions below can't reach them from the default; each is a whole tile that has passed every opt's checks
        for tile in staged_tiles(k):
            seeds.setdefault(tuple(tile.applied_opts), tile)
        tried = _evaluate(seeds, device, bench, reference, seen, pool, base_time)
        beam = sorted([(k, base_time), *tried], key=lambda kt: kt[1])[:1]
        best, best_time = beam[0]
        while time.perf_counter() - start < timeout_s:
            candidates: dict[tuple[Opt, ...], Kernel] = {}
            for kernel, _ in beam:
                for action in ACTIONS:
                    new = kernel.copy()
                    try:
                        new.apply_opt(action)
                    except KernelOptError:
                        continue
                    candidates.setdefault(tuple(new.applied_opts), new)
            timed = _evaluate(candidates, device, bench, reference, seen, pool, best_time)
            if not timed:
                return best, True
            if DEBUG >= 2:
                print(f"BEAM: {len(timed)} candidates, best {timed[0][1] * 1e6:.1f} us {timed[0][0].applied_opts}")
            if timed[0][1] >= best_time or not _confirm(timed[0][0], best, device, bench):
                return best, True
            best, best_time = timed[0]
            beam = timed[:width]
        return best, False
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        _WORKER.clear()


def _evaluate(
    candidates: dict[tuple[Opt, ...], Kernel],
    device: CompiledDevice,
    bench: _Bench,
    reference: dict[int, bytes],
    seen: set[str],
    pool: ProcessPoolExecutor | None,
    best_time: float,
) -> list[tuple[Kernel, float]]:
    """The candidates that compile to new source and reproduce `reference`, with their run times, fastest first.
    One much slower than `best_time` is timed by its checking run alone."""
    timed: list[tuple[Kernel, float]] = []
    for c in _compile_all(list(candidates), pool):
        if c.src in seen:
            continue
        seen.add(c.src)
        try:
            prg = device.load_program(c.name, c.lib)
            outputs, first = _run_outputs(prg, c, bench, reference)
        except Exception as exc:  # noqa: BLE001 - a candidate that fails to run is skipped like a wrong one
            if DEBUG >= 2:
                print(f"BEAM: {c.opts} failed to run ({type(exc).__name__}: {exc}), skipped")
            continue
        if outputs is None:
            if DEBUG >= 2:
                print(f"BEAM: {c.opts} gives wrong results, skipped")
            continue
        elapsed = first if first > 3 * best_time else min(first, _time(prg, c, bench, give_up=3 * best_time))
        timed.append((candidates[c.opts], elapsed))
    return sorted(timed, key=lambda kt: kt[1])


def _confirm(candidate: Kernel, best: Kernel, device: CompiledDevice, bench: _Bench, rounds: int = 3) -> bool:
    """Whether `candidate` is really faster than `best`: both timed again, alternately, and the candidate must win by
    3% (a busy machine makes single timings noisy enough to pick a slower kernel otherwise)."""
    compiled = _compile_all([tuple(candidate.applied_opts), tuple(best.applied_opts)], None)
    if len(compiled) != 2:
        return False
    programs = [(device.load_program(c.name, c.lib), c) for c in compiled]
    times = [math.inf, math.inf]
    for _ in range(rounds):
        for i, (prg, c) in enumerate(programs):
            times[i] = min(times[i], _time(prg, c, bench, runs=1))
    return times[0] < 0.97 * times[1]


def _run_outputs(
    prg: Callable[..., Any], c: _Compiled, bench: _Bench, reference: dict[int, bytes] | None = None
) -> tuple[dict[int, bytes] | None, float]:
    """Run once from the starting contents: the outputs (None when they differ from `reference`) and the run time."""
    bench.reset()
    handles = [bench.bufs[slot].handle for slot in c.globals]
    t = prg(*handles, global_size=c.global_size, local_size=c.local_size, vals=bench.vals, wait=True)
    elapsed = t if t is not None else math.inf
    out = bench.outputs(c.outs)
    if reference is not None:
        for slot, want in reference.items():
            if not _close(bench.bufs[slot].dtype, out[slot], want):
                return None, elapsed
    return out, elapsed
