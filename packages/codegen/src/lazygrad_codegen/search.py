"""BEAM search: find the opts of a kernel by compiling and timing candidates on the device.

Each round extends every kernel of the beam by each opt of `ACTIONS` that is valid for it (invalid ones raise
`KernelOptError` and are skipped), renders and compiles the candidates in parallel processes (forked, one per core),
runs each on the device on buffers of random data, drops any whose outputs differ from the reference kernel's, and
keeps the `width` fastest. The reference is the unoptimised kernel spread over threads and vector lanes without
changing any output's arithmetic (`reference_kernel`; checked against the plain unoptimised kernel where that is
cheap), because one thread per output is far too slow to run on big kernels. The search starts from the fastest of
the reference, the hand-coded heuristics' choice and, for matmul-like kernels on GPUs, the staged tiles around the
default (`tiling.staged_tiles`: warps per workgroup, register tile, K step, one to four pipeline stages, which no
single opt can vary once STAGE is applied), so the result is never slower than the default, and stops when a round
finds nothing faster than the best so far (confirmed by timing both again) or at `BEAM_TIMEOUT`. The time limit holds
inside a round: candidates are compiled a chunk at a time (two per worker), and no chunk or timing starts after it,
so a search ends within about BEAM_TIMEOUT plus one chunk's compile time, with the best kernel found by then. The
chosen opts are cached on disk per (kernel, device, renderer), so a kernel is searched once per machine; a search cut
short by the time limit is not cached. Buffers are filled and outputs compared with numpy: a 4096^2 output is
compared in tens of milliseconds.

`DEBUG>=1` prints a summary of each search (`SearchSummary`: time, candidates compiled and timed, rounds, whether it
converged) to stderr; `DEBUG>=2` also each round's best candidate.
"""

from __future__ import annotations

import collections
import functools
import math
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lazygrad_codegen.kernel import AxisType, Kernel, KernelOptError, Opt, OptOps
from lazygrad_uop.config import DEBUG, TF32, WGMMA, ContextVar
from lazygrad_uop.device import Buffer, CompiledDevice, CompileError, Program
from lazygrad_uop.diskcache import diskcache_get, diskcache_put
from lazygrad_uop.dtype import DType, dtypes, to_numpy_dtype
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


def _random_values(dtype: DType, n: int, rng: np.random.Generator) -> bytes:
    """`n` random elements of `dtype` as bytes: floats in [-1, 1) (fp8: small magnitudes of either sign), ints in
    [0, 8), random bools. Made by numpy in one pass: a 4096^2 buffer is tens of milliseconds, not seconds."""
    scalar = dtype.scalar()
    if scalar in _FP8:
        # magnitudes below 0x38 (e4m3: < 1; e5m2: < 0.5), so sums of products stay far from the small maximum
        return (rng.integers(0, 0x38, n, dtype=np.uint8) | (rng.integers(0, 2, n, dtype=np.uint8) << 7)).tobytes()
    if dtypes.is_float(scalar):
        # 2r - 1 is exact in the format r was drawn in, so the values are in [-1, 1) there
        if scalar == dtypes.float64:
            return (rng.random(n) * 2 - 1).tobytes()
        vals = rng.random(n, dtype=np.float32) * 2 - 1
        if scalar == dtypes.bfloat16:
            return (vals.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # truncated toward 0: still in [-1, 1)
        if scalar == dtypes.float16:
            # rounding to nearest would take the top values to 1.0: clip them to the largest float16 below it first
            return np.minimum(vals, np.float32(1 - 2**-11)).astype(np.float16).tobytes()
        return vals.tobytes()
    if dtypes.is_bool(scalar):
        return rng.integers(0, 2, n, dtype=np.uint8).tobytes()
    return rng.integers(0, 8, n).astype(to_numpy_dtype(scalar)).tobytes()


_FP8 = (dtypes.fp8e4m3, dtypes.fp8e5m2)


@functools.cache
def _fp8_values(dtype: DType) -> np.ndarray:
    """The value of each of the 256 bytes of an fp8 format (e4m3 has no infinities: only S.1111.111 is NaN; e5m2
    follows IEEE: an all-ones exponent is inf with a zero mantissa, else NaN)."""
    exp_bits, mant_bits = dtypes.finfo(dtype)
    has_inf = dtype == dtypes.fp8e5m2
    byte = np.arange(256)
    e, m = (byte >> mant_bits) & ((1 << exp_bits) - 1), byte & ((1 << mant_bits) - 1)
    bias = (1 << (exp_bits - 1)) - 1
    mag = np.where(e == 0, np.ldexp(m, 1 - bias - mant_bits), np.ldexp(m + (1 << mant_bits), e - bias - mant_bits))
    top = e == (1 << exp_bits) - 1
    if has_inf:
        mag = np.where(top, np.where(m == 0, np.inf, np.nan), mag)
    else:
        mag = np.where(top & (m == (1 << mant_bits) - 1), np.nan, mag)
    return np.where(byte & 0x80, -mag, mag).astype(np.float32)


def _decode(dtype: DType, raw: bytes | memoryview) -> np.ndarray:
    """The values of a float buffer's bytes, as float32 (float64 for float64: both hold the narrower types exactly)."""
    scalar = dtype.scalar()
    if scalar == dtypes.bfloat16:
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    if scalar in _FP8:
        return _fp8_values(scalar)[np.frombuffer(raw, np.uint8)]
    vals = np.frombuffer(raw, to_numpy_dtype(scalar))
    return vals if scalar in (dtypes.float32, dtypes.float64) else vals.astype(np.float32)


class _Expected:
    """A reference output, decoded once, that candidates' outputs are compared with (`matches`): equal for ints and
    bools; for floats, NaN where it has NaN, the same infinities, and elsewhere within `tol * (1 + scale)` of it,
    `scale` being its largest finite magnitude, so sums in another order (rounding differently) still match."""

    # elements compared at a time: the temporaries stay in the CPU's caches
    CHUNK = 1 << 18

    def __init__(self, dtype: DType, raw: bytes | bytearray) -> None:
        self.dtype, self.raw = dtype, raw
        scalar = dtype.scalar()
        if not dtypes.is_float(scalar):
            return
        self.want = _decode(dtype, raw)
        tol = {dtypes.float64: 1e-9, dtypes.float32: 1e-4}.get(scalar, 2e-2)
        if scalar in _FP8:
            tol = 2.0 ** -dtypes.finfo(scalar)[1]  # one step of the format at 1: rounding the sum once differently
        finite = np.abs(self.want[np.isfinite(self.want)])
        scale = float(finite.max()) if finite.size else 1.0
        self.limit = self.want.dtype.type(tol * (1 + scale))

    def matches(self, got: bytes | bytearray) -> bool:
        """Whether `got` (a candidate's output bytes) is this output up to reordering (see the class docstring)."""
        if got == self.raw:
            return True
        if not dtypes.is_float(self.dtype.scalar()):
            return False
        if len(got) != len(self.raw):
            return False
        size = self.dtype.scalar().itemsize
        view = memoryview(got)
        for lo in range(0, len(self.want), self.CHUNK):
            a = _decode(self.dtype, view[lo * size : (lo + self.CHUNK) * size])
            b = self.want[lo : lo + self.CHUNK]
            # a NaN difference (a NaN on either side, or inf - inf) fails `<=`: those elements are checked apart
            with np.errstate(invalid="ignore"):
                ok = np.abs(a - b) <= self.limit
            if not ok.all():
                a, b = a[~ok], b[~ok]
                if not (np.isnan(a) & np.isnan(b) | (a == b)).all():
                    return False
        return True


def _close(dtype: DType, got: bytes, want: bytes) -> bool:
    """Whether output `got` matches the reference output `want` of `dtype` (see `_Expected`)."""
    return _Expected(dtype, want).matches(got)


@dataclass
class _Bench:
    """The buffers a kernel runs on during search, with their starting contents, and the variables' values."""

    device: CompiledDevice
    bufs: dict[int, Buffer]
    initial: dict[int, bytes]
    vals: tuple[int, ...]

    def reset(self, slots: tuple[int, ...]) -> None:
        """Put back the starting contents of `slots`: a kernel's outputs, the only buffers it writes, so that its
        outputs are its own and not those of the kernel that ran before (which its starting random data rule out)."""
        for slot in slots:
            self.bufs[slot].copyin(memoryview(self.initial[slot]))

    def outputs(self, slots: tuple[int, ...]) -> dict[int, bytearray]:
        out = {}
        for slot in slots:
            host = bytearray(self.bufs[slot].nbytes)
            self.bufs[slot].copyout(memoryview(host))
            out[slot] = host
        return out


def _bench(k: Kernel, device: CompiledDevice, name: str) -> _Bench:
    rng = np.random.default_rng(0)
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
        results = list(pool.map(_compile, candidates, chunksize=max(1, len(candidates) // (4 * _workers(pool)))))
    return [r for r in results if r is not None]


def _workers(pool: ProcessPoolExecutor | None) -> int:
    return 1 if pool is None else os.cpu_count() or 1  # what `_fork_pool` starts


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


def search_key(k: Kernel, width: int) -> tuple[str, str, str, int, int] | tuple[str, str, str, int, int, int]:
    """What a search result is cached under: the kernel AST's text, the device, the renderer, the beam width and the
    TF32 setting (which decides whether fp32 kernels may take a tensor core, so whether the best opts can), and
    `WGMMA` where it is on (the candidates then include wgmma tiles)."""
    r = k.renderer
    renderer = f"{type(r).__module__}.{type(r).__qualname__} {getattr(r, 'target', '')} {r.vector_width}"
    key = (pretty_print(k.ast), r.device, renderer, width, int(TF32.value))
    return (*key, int(WGMMA.value)) if WGMMA.value else key


BEAM_TIMEOUT = ContextVar("BEAM_TIMEOUT", 600.0)
"""Seconds after which a search stops starting compiles and timings and keeps the best kernel found so far."""


@dataclass(frozen=True)
class SearchSummary:
    """What one BEAM search did: the kernel's name, its wall time in `seconds`, the candidates it `compiled` and
    `timed` (ran and found correct), its `rounds`, whether it `converged` (False: BEAM_TIMEOUT stopped it), and the
    run times of the kernel it chose (`best_s`), of the default opts' kernel (`default_s`, None when it was not
    timed) and of the kernel that gave the reference outputs (`reference_s`)."""

    kernel: str
    seconds: float
    compiled: int
    timed: int
    rounds: int
    converged: bool
    best_s: float
    default_s: float | None
    reference_s: float

    def __str__(self) -> str:
        end = "converged" if self.converged else "stopped by BEAM_TIMEOUT"
        default = "not timed" if self.default_s is None else f"{self.default_s * 1e6:.1f} us"
        return (
            f"BEAM search of {self.kernel}: {self.seconds:.1f} s, {self.compiled} compiled, {self.timed} timed, "
            f"{self.rounds} rounds, {end}; best {self.best_s * 1e6:.1f} us (default {default}, "
            f"reference {self.reference_s * 1e6:.1f} us)"
        )


SEARCHES: collections.deque[SearchSummary] = collections.deque(maxlen=32)
"""The summaries of this process's most recent searches (newest last), for benchmarks and tools to report;
`DEBUG>=1` also prints each to stderr."""


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


# opts that only choose which thread, loop step or vector lane computes which output: each output is still the same
# sequence of operations, in the same order, as in the unoptimised kernel
_OUTPUT_ONLY = (OptOps.UPCAST, OptOps.LOCAL, OptOps.SWAP)


def reference_kernel(k: Kernel, default: Kernel) -> Kernel:
    """The kernel whose outputs a search checks candidates against: the unoptimised kernel `k`, spread over threads
    and vector lanes by the leading UPCAST, LOCAL and SWAP opts of the `default` opts' kernel or, on a renderer with
    local dimensions where those give it none, by a LOCAL of up to 32 threads (the largest divisor) along its last
    output axis that has one. Those opts only pick the GLOBAL (output) axes that threads and lanes run over, so each
    output is the same sum in the same order as in `k`, as trustworthy a reference; but the kernel is no longer one
    thread per workgroup on a GPU or a strided scalar loop on a CPU, which for big matmuls takes seconds (it runs
    once per search)."""
    ref = k.copy()
    if k.applied_opts:
        return ref
    for opt in default.applied_opts:
        if opt.op not in _OUTPUT_ONLY:
            break
        ref.apply_opt(opt)  # the default applied it to the same kernel, after the same opts: it is valid here too
    if not k.renderer.has_local or any(o.op is OptOps.LOCAL for o in ref.applied_opts):
        return ref
    for axis, size in reversed(list(enumerate(ref.sizes(AxisType.GLOBAL)))):
        for amount in (a for a in range(32, 1, -1) if isinstance(size, int) and size % a == 0):
            try:
                ref.apply_opt(Opt(OptOps.LOCAL, axis, amount))
                return ref
            except KernelOptError:
                continue
    return ref


@dataclass
class _Progress:
    """A search's deadline (`time.perf_counter()` seconds), its counts so far, and the programs of the candidates it
    timed by their opts (so that confirming a winner times them again without compiling them again)."""

    deadline: float
    compiled: int = 0
    timed: int = 0
    rounds: int = 0
    programs: dict[tuple[Opt, ...], tuple[Program, _Compiled]] = field(default_factory=dict)

    def expired(self) -> bool:
        return time.perf_counter() >= self.deadline


def _search(k: Kernel, width: int, device: CompiledDevice, timeout_s: float) -> tuple[Kernel, bool]:
    """The fastest kernel found, and whether the search ran to its end (False: the time limit stopped it).
    Compiles and timings start only before the deadline (the default opts' kernel excepted), so the search returns
    within about `timeout_s` plus one chunk of compiles (two per worker) and the timings of the round's winner."""
    from lazygrad_codegen.heuristic import hand_coded_optimizations
    from lazygrad_codegen.tiling import staged_tiles

    start = time.perf_counter()
    progress = _Progress(start + timeout_s)
    bench = _bench(k, device, device.device)
    _WORKER.update(kernel=k, compiler=device.compiler)
    pool = _fork_pool()
    try:
        hand = hand_coded_optimizations(k.copy())
        # the reference kernel, run once, gives the outputs every candidate must reproduce
        ref, base, base_prg, reference, base_time = _reference(k, reference_kernel(k, hand), device, bench)
        progress.programs[base.opts] = (base_prg, base)
        seen: set[str] = {base.src}
        # the search starts from the fastest of the reference kernel and the hand-coded choice, so it only ever
        # improves on the default (and does not spend its time extending a kernel that is far from fast); the
        # default is timed even past the deadline, so that a cut-short search still knows whether to prefer it
        deadline, progress.deadline = progress.deadline, math.inf
        tried = _evaluate({tuple(hand.applied_opts): hand}, device, bench, reference, seen, pool, base_time, progress)
        progress.deadline = deadline
        default_time = base_time if tuple(hand.applied_opts) == base.opts else next((t for _, t in tried), None)
        # staged tiles around the default (warps, register tile, K step, pipeline stages): STAGE fixes the tiles, so
        # the actions below can't reach them from the default; each is a whole tile that has passed every opt's checks
        tiles = {tuple(t.applied_opts): t for t in staged_tiles(k) if tuple(t.applied_opts) != tuple(hand.applied_opts)}
        tried += _evaluate(tiles, device, bench, reference, seen, pool, base_time, progress)
        beam = sorted([(ref, base_time), *tried], key=lambda kt: kt[1])[:1]
        best, best_time = beam[0]
        converged = False
        while not progress.expired():
            progress.rounds += 1
            candidates: dict[tuple[Opt, ...], Kernel] = {}
            for kernel, _ in beam:
                for action in ACTIONS:
                    new = kernel.copy()
                    try:
                        new.apply_opt(action)
                    except KernelOptError:
                        continue
                    candidates.setdefault(tuple(new.applied_opts), new)
            timed = _evaluate(candidates, device, bench, reference, seen, pool, best_time, progress)
            # a round cut short by the deadline still offers its fastest candidate, but ends the search unconverged
            complete = not progress.expired()
            if DEBUG >= 2 and timed:
                print(f"BEAM: {len(timed)} candidates, best {timed[0][1] * 1e6:.1f} us {timed[0][0].applied_opts}")
            if not timed or timed[0][1] >= best_time or not _confirm(timed[0][0], best, device, bench, progress, pool):
                converged = complete
                break
            best, best_time = timed[0]
            beam = timed[:width]
        summary = SearchSummary(
            kernel=base.name,
            seconds=time.perf_counter() - start,
            compiled=progress.compiled,
            timed=progress.timed,
            rounds=progress.rounds,
            converged=converged,
            best_s=best_time,
            default_s=default_time,
            reference_s=base_time,
        )
        SEARCHES.append(summary)
        if DEBUG >= 1:
            print(summary, file=sys.stderr, flush=True)
        return best, converged
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        _WORKER.clear()


VERIFY_ITERATIONS = 1 << 22
"""Kernels of at most this many loop iterations (outputs times reduction steps) also run the unoptimised kernel, to
check that the reference kernel computes the same (`reference_kernel`); bigger ones trust it."""


def _reference(
    k: Kernel, ref: Kernel, device: CompiledDevice, bench: _Bench
) -> tuple[Kernel, _Compiled, Program, dict[int, _Expected], float]:
    """The reference kernel (`ref`, or `k` when `ref` differs from it), compiled, loaded, its outputs and run time.
    On small kernels, the outputs of `ref` are checked against the unoptimised kernel's: they only differ when the
    opts of `ref` are lowered wrongly, and then the unoptimised kernel is the reference, with a warning."""
    kernels = [ref]
    size = math.prod(s if isinstance(s, int) else int(s.vmax) for s in k.full_shape)
    if ref.applied_opts != k.applied_opts and size <= VERIFY_ITERATIONS:
        kernels.append(k)
    runs = []
    for kernel in kernels:
        (c,) = _compile_all([tuple(kernel.applied_opts)], None)
        prg = device.load_program(c.name, c.lib)
        outputs, elapsed = _run_outputs(prg, c, bench)
        assert outputs is not None
        expected = {slot: _Expected(bench.bufs[slot].dtype, raw) for slot, raw in outputs.items()}
        runs.append((kernel, c, prg, expected, elapsed))
    if len(runs) == 2:
        (_, c, _, got, _), (_, _, _, want, _) = runs
        if not all(want[slot].matches(got[slot].raw) for slot in want):
            warnings.warn(
                f"BEAM: the kernel {c.name} with opts {ref.applied_opts} computes other values than without them (a "
                "codegen bug: please report it); candidates are checked against the unoptimised kernel instead",
                RuntimeWarning,
                stacklevel=4,
            )
            return runs[1]
    return runs[0]


def _compiled_chunks(
    todo: list[tuple[Opt, ...]], pool: ProcessPoolExecutor | None, progress: _Progress, overlap: bool
) -> Iterator[list[_Compiled]]:
    """The candidates `todo` compiled, a chunk (two per worker) at a time; no chunk starts after `progress`'s deadline.
    With `overlap` (and a pool), the next chunk compiles while the caller times this one."""
    size = 2 * _workers(pool)
    chunks = [todo[lo : lo + size] for lo in range(0, len(todo), size)]
    if pool is None or not overlap:
        for chunk in chunks:
            if progress.expired():
                return
            yield _compile_all(chunk, pool)
        return
    ahead: list[Future] = []
    try:
        for i, chunk in enumerate(chunks):
            if not ahead:
                if progress.expired():
                    return
                ahead = [pool.submit(_compile, opts) for opts in chunk]
            current, ahead = ahead, []
            if i + 1 < len(chunks) and not progress.expired():
                ahead = [pool.submit(_compile, opts) for opts in chunks[i + 1]]
            yield [c for f in current if (c := f.result()) is not None]
    finally:
        for f in ahead:  # a chunk submitted ahead of a caller that stopped: those not started yet never will
            f.cancel()


def _evaluate(
    candidates: dict[tuple[Opt, ...], Kernel],
    device: CompiledDevice,
    bench: _Bench,
    reference: dict[int, _Expected],
    seen: set[str],
    pool: ProcessPoolExecutor | None,
    best_time: float,
    progress: _Progress,
) -> list[tuple[Kernel, float]]:
    """The candidates that compile to new source and reproduce `reference`, with their run times, fastest first.
    One much slower than `best_time` is timed by its checking run alone. They are compiled a chunk at a time (two per
    worker) and none is compiled or timed once `progress`'s deadline has passed: what was timed by then is returned."""
    timed: list[tuple[Kernel, float]] = []
    # kernels that run on the device's own processors (local dimensions: GPUs) are timed while the next chunk
    # compiles; a CPU's kernels would share its cores with the compilers, and their timings with them
    chunks = _compiled_chunks(list(candidates), pool, progress, overlap=device.renderer.has_local)
    try:
        for compiled in chunks:
            progress.compiled += len(compiled)
            for c in compiled:
                if progress.expired():
                    break
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
                progress.timed += 1
                progress.programs[c.opts] = (prg, c)
                timed.append((candidates[c.opts], elapsed))
            if progress.expired():
                break
    finally:
        chunks.close()  # cancels a chunk submitted ahead that has not started
    return sorted(timed, key=lambda kt: kt[1])


def _confirm(
    candidate: Kernel,
    best: Kernel,
    device: CompiledDevice,
    bench: _Bench,
    progress: _Progress,
    pool: ProcessPoolExecutor | None,
    rounds: int = 3,
) -> bool:
    """Whether `candidate` is really faster than `best`: both timed again, alternately, and the candidate must win by
    3% (a busy machine makes single timings noisy enough to pick a slower kernel otherwise)."""
    programs = []
    for kernel in (candidate, best):
        opts = tuple(kernel.applied_opts)
        if opts not in progress.programs:
            compiled = _compile_all([opts], pool)
            if not compiled:
                return False
            progress.programs[opts] = (device.load_program(compiled[0].name, compiled[0].lib), compiled[0])
        programs.append(progress.programs[opts])
    times = [math.inf, math.inf]
    for _ in range(rounds):
        for i, (prg, c) in enumerate(programs):
            times[i] = min(times[i], _time(prg, c, bench, runs=1))
    return times[0] < 0.97 * times[1]


def _run_outputs(
    prg: Callable[..., Any], c: _Compiled, bench: _Bench, reference: dict[int, _Expected] | None = None
) -> tuple[dict[int, bytearray] | None, float]:
    """Run once from the starting contents: the outputs (None when they differ from `reference`) and the run time."""
    bench.reset(c.outs)
    handles = [bench.bufs[slot].handle for slot in c.globals]
    t = prg(*handles, global_size=c.global_size, local_size=c.local_size, vals=bench.vals, wait=True)
    elapsed = t if t is not None else math.inf
    out = bench.outputs(c.outs)
    if reference is not None:
        for slot, want in reference.items():
            if not want.matches(out[slot]):
                return None, elapsed
    return out, elapsed
