"""BEAM search at scale: the random buffers and the comparison of candidates' outputs are vectorized (checked here
against numpy and torch encodings of each dtype); BEAM_TIMEOUT holds inside a round and for the staged-tile seeds (a
fake clock counts the compiles and runs started after it), so a search returns within its budget plus one chunk of
compiles, with the best kernel found by then, uncached; and the reference kernel computes what the unoptimised one
does while running side by side on a GPU."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
from codegen_cases import all_cases, check, cpu_device, matmul, run_device, run_python

from lazygrad_codegen import Kernel, Opt, OptOps, heuristic
from lazygrad_codegen import search as search_module
from lazygrad_codegen.kernel import AxisType
from lazygrad_codegen.search import _close, _decode, _random_values, beam_search, reference_kernel, search_key
from lazygrad_uop import symbolic
from lazygrad_uop.diskcache import diskcache_get
from lazygrad_uop.dtype import DType, dtypes, to_numpy_dtype

FLOATS = [dtypes.float16, dtypes.float32, dtypes.float64]
INTS = list(symbolic.INTS)  # every integer dtype


def _torch_bytes(values: np.ndarray, torch_dtype: str) -> bytes:
    """float32 `values` rounded to a torch dtype (bfloat16, fp8), as that dtype's bytes."""
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(np.ascontiguousarray(values, np.float32)).to(getattr(torch, torch_dtype))
    return t.view(torch.uint8).numpy().tobytes()


def _torch_values(raw: bytes, torch_dtype: str) -> np.ndarray:
    """The float64 values of `raw` read as a torch dtype."""
    torch = pytest.importorskip("torch")
    return torch.frombuffer(bytearray(raw), dtype=getattr(torch, torch_dtype)).to(torch.float64).numpy()


TORCH_NAMES = {dtypes.bfloat16: "bfloat16", dtypes.fp8e4m3: "float8_e4m3fn", dtypes.fp8e5m2: "float8_e5m2"}


# *** random buffer contents ***


@pytest.mark.parametrize("dtype", FLOATS + [dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2], ids=str)
def test_random_floats_are_in_range_and_spread(dtype: DType) -> None:
    n = 1 << 20  # enough that float16 would meet values rounding up to 1.0 (about 1 in 8192) if they weren't clipped
    raw = _random_values(dtype, n, np.random.default_rng(3))
    assert len(raw) == n * dtype.itemsize
    if dtype in TORCH_NAMES:
        vals = _torch_values(raw, TORCH_NAMES[dtype])
    else:
        vals = np.frombuffer(raw, to_numpy_dtype(dtype)).astype(np.float64)
    assert np.isfinite(vals).all()
    assert vals.min() >= -1 and vals.max() < 1
    # both signs, many different values, and (where the format is fine enough) uniform over the range
    assert (vals < 0).mean() > 0.4 and (vals > 0).mean() > 0.4
    assert len(np.unique(vals)) >= 100
    if dtype.itemsize > 1:
        assert abs(np.abs(vals).mean() - 0.5) < 0.01


@pytest.mark.parametrize("dtype", INTS + [dtypes.bool], ids=str)
def test_random_ints_and_bools_are_small(dtype: DType) -> None:
    n = 4096
    raw = _random_values(dtype, n, np.random.default_rng(4))
    vals = np.frombuffer(raw, to_numpy_dtype(dtype)).astype(np.int64)
    assert len(vals) == n
    top = 2 if dtype == dtypes.bool else 8
    assert set(np.unique(vals)) == set(range(top))


def test_random_values_repeat_for_a_seed() -> None:
    a = _random_values(dtypes.float32, 1000, np.random.default_rng(5))
    assert a == _random_values(dtypes.float32, 1000, np.random.default_rng(5))
    assert a != _random_values(dtypes.float32, 1000, np.random.default_rng(6))


# *** comparing outputs ***


def _sums() -> tuple[np.ndarray, np.ndarray]:
    """Row sums of random products, added forwards and backwards in float32: the same sums in another order, which
    round differently (as a candidate that reorders a reduction does)."""
    rng = np.random.default_rng(7)
    prods = (rng.uniform(-1, 1, (512, 256)) * rng.uniform(-1, 1, (512, 256))).astype(np.float32)
    fwd, bwd = np.zeros(512, np.float32), np.zeros(512, np.float32)
    for j in range(256):
        fwd += prods[:, j]
        bwd += prods[:, 255 - j]
    return fwd, bwd


def _encode(values: np.ndarray, dtype: DType) -> bytes:
    if dtype in TORCH_NAMES:
        return _torch_bytes(values, TORCH_NAMES[dtype])
    return np.asarray(values).astype(to_numpy_dtype(dtype)).tobytes()


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3], ids=str)
def test_reordered_sums_match_and_wrong_outputs_do_not(dtype: DType) -> None:
    fwd, bwd = _sums()
    want = _encode(fwd, dtype)
    assert fwd.tobytes() != bwd.tobytes(), "the two orders must round differently for this test to mean anything"
    assert _close(dtype, _encode(bwd, dtype), want)
    assert _close(dtype, want, want)
    # a wrong element (as far off as a real bug puts it: an addend dropped or doubled), a sign flipped, a NaN or an
    # inf where the reference is finite, an output shifted by one element, and one of another length
    scale = np.abs(fwd).max()
    for wrong in (
        np.where(np.arange(512) == 100, fwd + scale / 2, fwd),
        np.where(np.arange(512) == 3, -fwd - scale / 4, fwd),
        np.where(np.arange(512) == 511, np.nan, fwd),
        np.where(np.arange(512) == 0, np.inf, fwd),
        np.roll(fwd, 1),
    ):
        assert not _close(dtype, _encode(wrong, dtype), want)
    assert not _close(dtype, _encode(fwd[:-1], dtype), want)


def test_nan_and_inf_rules() -> None:
    f32 = lambda xs: np.array(xs, np.float32).tobytes()  # noqa: E731
    assert _close(dtypes.float32, f32([np.nan, np.inf, -np.inf, 1.0]), f32([np.nan, np.inf, -np.inf, 1.0]))
    assert not _close(dtypes.float32, f32([np.inf, 1.0]), f32([-np.inf, 1.0]))
    assert not _close(dtypes.float32, f32([1.0, 1.0]), f32([np.nan, 1.0]))  # NaN where the reference has none, and
    assert not _close(dtypes.float32, f32([np.nan, 1.0]), f32([1.0, 1.0]))  # a number where it has NaN
    assert not _close(dtypes.float32, f32([3e38, 1.0]), f32([np.inf, 1.0]))
    # the tolerance grows with the largest finite value (an inf in the reference does not make everything match)
    assert _close(dtypes.float32, f32([1000.05, np.inf]), f32([1000.0, np.inf]))
    assert not _close(dtypes.float32, f32([1.2, np.inf]), f32([1.0, np.inf]))


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint8, dtypes.int64, dtypes.bool], ids=str)
def test_ints_and_bools_must_be_equal(dtype: DType) -> None:
    rng = np.random.default_rng(8)
    want = rng.integers(0, 2 if dtype == dtypes.bool else 100, 1000).astype(to_numpy_dtype(dtype))
    assert _close(dtype, want.tobytes(), want.copy().tobytes())
    wrong = want.copy()
    wrong[500] = not wrong[500] if dtype == dtypes.bool else wrong[500] + 1
    assert not _close(dtype, wrong.tobytes(), want.tobytes())


@pytest.mark.parametrize("dtype", [dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2], ids=str)
def test_decoding_matches_torch(dtype: DType) -> None:
    every = bytes(range(256)) if dtype.itemsize == 1 else np.arange(65536, dtype=np.uint16).tobytes()
    with np.errstate(invalid="ignore"):  # signalling NaNs become quiet ones
        ours, theirs = _decode(dtype, every).astype(np.float64), _torch_values(every, TORCH_NAMES[dtype])
    np.testing.assert_array_equal(ours, theirs)  # NaN at the same places too


# *** the time limit ***


class _Clock:
    """A fake `time` module for the search, and what happened when: each compile takes one second of it, each
    checking run a quarter. Installed by `_fake_time`."""

    def __init__(self) -> None:
        self.now = 0.0
        self.compiles: list[float] = []
        self.runs: list[float] = []
        self.offered: list[int] = []
        # (compiles, runs) so far when each `_evaluate` began: the first evaluates the default, which is timed
        # whatever the limit; all later ones are bound by it
        self.marks: list[tuple[int, int]] = []

    def perf_counter(self) -> float:
        return self.now


def _fake_time(monkeypatch) -> _Clock:
    clock = _Clock()
    compile_one, run_one, evaluate = search_module._compile, search_module._run_outputs, search_module._evaluate

    def slow_compile(opts):
        clock.compiles.append(clock.now)
        clock.now += 1.0
        return compile_one(opts)

    def slow_run(*args, **kwargs):
        clock.runs.append(clock.now)
        clock.now += 0.25
        return run_one(*args, **kwargs)

    def counting(candidates, *args, **kwargs):
        clock.offered.append(len(candidates))
        clock.marks.append((len(clock.compiles), len(clock.runs)))
        return evaluate(candidates, *args, **kwargs)

    monkeypatch.setattr(search_module, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(search_module, "_compile", slow_compile)
    monkeypatch.setattr(search_module, "_run_outputs", slow_run)
    monkeypatch.setattr(search_module, "_evaluate", counting)
    monkeypatch.setattr(search_module, "_fork_pool", lambda: None)  # the fake clock lives in this process
    return clock


def _bound_by_the_limit(clock: _Clock, deadline: float) -> tuple[list[float], list[float]]:
    """The start times of the compiles and checking runs after the default's, checked against the time limit: the
    reference kernel and the default are compiled and run whatever the limit; after them, no chunk of compiles (two,
    without a pool) starts past the deadline, nor any candidate's checking run."""
    compiles, runs = clock.compiles[clock.marks[1][0] :], clock.runs[clock.marks[1][1] :]
    assert all(t < deadline + 2 for t in compiles), clock.compiles
    assert all(t < deadline for t in runs), clock.runs
    assert clock.now < deadline + 2
    return compiles, runs


def test_the_time_limit_holds_inside_a_round(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    device = cpu_device()
    case = matmul(32, 32, 32)
    k = Kernel(case.ast, device.renderer)
    clock = _fake_time(monkeypatch)
    # the default is the unoptimised kernel here, so that the first round extends it by every action that applies
    monkeypatch.setattr(heuristic, "hand_coded_optimizations", lambda k: k)
    deadline = 6.0
    best = beam_search(k, 2, timeout_s=deadline)
    assert not search_module.SEARCHES[-1].converged
    assert diskcache_get("beam_search", search_key(k, 2)) is None, "a cut-short search must not be cached"
    compiles, _ = _bound_by_the_limit(clock, deadline)
    # the round had far more candidates than it got to compile
    assert max(clock.offered) > 2 * len(compiles) > 0
    out, _ = run_device(case.ast, device, list(best.applied_opts), case.inputs)
    check(case, out, f"opts of the cut-short search {best.applied_opts}")


def test_the_staged_tile_seeds_are_timed_under_the_limit_too(tmp_path, monkeypatch) -> None:
    from test_staging import FMA_GPU, bmm

    from lazygrad_codegen import tiling

    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    case = bmm(1, 64, 64, 16, dtypes.float32)
    k = Kernel(case.ast, FMA_GPU)
    tiles = tiling.staged_tiles(k)
    clock = _fake_time(monkeypatch)
    deadline = 5.0
    best = beam_search(k, 2, timeout_s=deadline)
    assert not search_module.SEARCHES[-1].converged and search_module.SEARCHES[-1].rounds == 0
    assert clock.offered[0] == 1 and clock.offered[1] >= len(tiles) - 1 > 4
    compiles, _ = _bound_by_the_limit(clock, deadline)
    assert clock.offered[1] > len(compiles) > 0
    out, _ = run_python(case.ast, FMA_GPU, list(best.applied_opts), case.inputs)
    check(case, out, f"opts of the cut-short search {best.applied_opts}")


def test_a_search_reports_what_it_did(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    from lazygrad_uop.config import Context

    device = cpu_device()
    case = matmul(8, 8, 8)
    with Context(DEBUG=1):
        best = beam_search(Kernel(case.ast, device.renderer), 1, timeout_s=60)
    summary = search_module.SEARCHES[-1]
    assert summary.converged and summary.rounds >= 1 and summary.timed >= 1 and summary.compiled >= summary.timed
    assert summary.best_s <= summary.reference_s and summary.default_s is not None
    assert diskcache_get("beam_search", search_key(Kernel(case.ast, device.renderer), 1)) == tuple(best.applied_opts)
    assert str(summary) in capsys.readouterr().err
    beam_search(Kernel(case.ast, device.renderer), 1, timeout_s=60)  # from the cache: no search, nothing printed
    assert capsys.readouterr().err == ""


# *** the reference kernel ***


def _gpu():
    py = pytest.importorskip("lazygrad_python")
    return py.PythonRenderer(py.GPUTarget(name="REFGPU", warp_size=32))


@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.name)
def test_the_reference_kernel_computes_what_the_unoptimised_one_does(case) -> None:
    py = pytest.importorskip("lazygrad_python")
    for renderer in (_gpu(), py.PythonRenderer()):
        k = Kernel(case.ast, renderer)
        ref = reference_kernel(k, heuristic.hand_coded_optimizations(k.copy()))
        assert all(o.op in (OptOps.UPCAST, OptOps.LOCAL, OptOps.SWAP) for o in ref.applied_opts)
        if renderer.has_local and not any(o.op is OptOps.LOCAL for o in ref.applied_opts):
            # a GPU reference runs threads side by side, where an output axis can be split into 2 to 32 threads
            assert not any(s % a == 0 for s in ref.sizes(AxisType.GLOBAL) for a in range(2, 33)), ref.applied_opts
        got, _ = run_python(case.ast, renderer, list(ref.applied_opts), case.inputs)
        plain, _ = run_python(case.ast, renderer, [], case.inputs)
        check(case, got, f"reference opts {ref.applied_opts}")
        # the same operations in the same order for every output: the same bits
        for slot, want in plain.items():
            np.testing.assert_array_equal(got[slot], want, err_msg=f"reference opts {ref.applied_opts}")


def test_a_gpu_matmul_reference_runs_a_warp_per_workgroup_not_one_thread() -> None:
    cuda = pytest.importorskip("lazygrad_cuda.renderer")
    cores = pytest.importorskip("lazygrad_cuda.tensor_cores")
    from test_staging import bmm_ast

    from lazygrad_codegen.program import program_of

    k = Kernel(bmm_ast(1, 4096, 4096, 4096, dtypes.float16), cuda.CUDARenderer("sm_90", cores.TENSOR_CORES["sm_90"]))
    default = heuristic.hand_coded_optimizations(k.copy())
    assert default.applied_opts[0].op is OptOps.TC  # no leading opts to borrow: the LOCAL is the reference's own
    plain, ref = program_of(k.copy()), program_of(reference_kernel(k, default))
    assert math.prod(plain.local_size) == 1 and math.prod(ref.local_size) == 32
    assert math.prod(ref.global_size) * 32 == math.prod(plain.global_size) == 4096 * 4096


def test_only_small_kernels_also_run_the_unoptimised_kernel(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    device = cpu_device()
    case = matmul(16, 16, 16)
    compiled: list[tuple] = []
    compile_one = search_module._compile

    def recording(opts):
        compiled.append(opts)
        return compile_one(opts)

    monkeypatch.setattr(search_module, "_compile", recording)
    monkeypatch.setattr(search_module, "_fork_pool", lambda: None)  # record in this process
    k = Kernel(case.ast, device.renderer)
    ref = reference_kernel(k, heuristic.hand_coded_optimizations(k.copy()))
    assert ref.applied_opts, "the CPU default starts with UPCASTs of the outputs"
    beam_search(k, 1, timeout_s=0)
    assert compiled[:2] == [tuple(ref.applied_opts), ()]
    compiled.clear()
    monkeypatch.setattr(search_module, "VERIFY_ITERATIONS", 16**3 - 1)
    beam_search(k.copy(), 1, timeout_s=0)
    assert () not in compiled and compiled[0] == tuple(ref.applied_opts)


def test_chunks_compiled_ahead_match_serial_compiles_and_stop_at_the_deadline() -> None:
    device = cpu_device()
    k = Kernel(matmul(16, 16, 16).ast, device.renderer)
    candidates = [(Opt(OptOps.UPCAST, axis, amt),) for axis in (0, 1) for amt in (2, 4, 8, 16)]
    candidates += [(Opt(OptOps.UNROLL, 0, amt),) for amt in (2, 4, 8, 16)]
    search_module._WORKER.update(kernel=k, compiler=device.compiler)
    pool = search_module._fork_pool()
    try:
        serial = [c.src for c in search_module._compile_all(candidates, None)]
        progress = search_module._Progress(math.inf)
        chunks = list(search_module._compiled_chunks(candidates, pool, progress, overlap=True))
        assert [c.src for chunk in chunks for c in chunk] == serial and len(serial) == len(candidates)
        assert len(chunks) == -(-len(candidates) // (2 * search_module._workers(pool)))
        # past the deadline, the chunk already compiling ahead is still handed over, and nothing after it
        gen = search_module._compiled_chunks(candidates, pool, progress, overlap=True)
        first = next(gen)
        progress.deadline = -math.inf
        rest = list(gen)
        assert first and len(rest) <= (1 if pool is not None else 0)
    finally:
        if pool is not None:
            pool.shutdown()
        search_module._WORKER.clear()


def test_a_candidate_that_writes_nothing_does_not_pass_for_the_kernel_before_it() -> None:
    device = cpu_device()
    k = Kernel(matmul(16, 16, 16).ast, device.renderer)
    bench = search_module._bench(k, device, device.device)
    search_module._WORKER.update(kernel=k, compiler=device.compiler)
    try:
        c = search_module._compile(())
    finally:
        search_module._WORKER.clear()
    outputs, _ = search_module._run_outputs(device.load_program(c.name, c.lib), c, bench)
    reference = {slot: search_module._Expected(bench.bufs[slot].dtype, raw) for slot, raw in outputs.items()}
    # the output buffers now hold the right values; a kernel that leaves them alone must still be caught
    assert search_module._run_outputs(lambda *args, **kwargs: 0.0, c, bench, reference)[0] is None
    assert search_module._run_outputs(device.load_program(c.name, c.lib), c, bench, reference)[0] is not None
