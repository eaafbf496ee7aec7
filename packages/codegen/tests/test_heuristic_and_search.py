"""The default opts (hand-coded heuristics), NOOPT, DEBUG=3 output, and BEAM search: it keeps only candidates whose
results match the unoptimised kernel, compiles in forked processes, and caches its choice per (kernel, device,
renderer) on disk."""

from __future__ import annotations

import re

import numpy as np
import pytest
from codegen_cases import (
    Case,
    all_cases,
    check,
    column_sum,
    conv2d,
    cpu_device,
    elementwise,
    matmul,
    row_reduce,
    run_device,
    run_python,
)
from hypothesis import given, settings
from hypothesis import strategies as hs

from lazygrad_codegen import CRenderer, Kernel, LLVMRenderer, Opt, OptOps, get_program
from lazygrad_codegen import kernel_ast as ka
from lazygrad_codegen import search as search_module
from lazygrad_codegen.heuristic import hand_coded_optimizations
from lazygrad_codegen.search import _close, _compile_all, _fork_pool, beam_search, search_key
from lazygrad_uop.config import Context
from lazygrad_uop.diskcache import diskcache_get
from lazygrad_uop.dtype import dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops

CASES = all_cases()
RNG_T = np.random.default_rng(31)


class GPU(CRenderer):
    device = "TESTGPU"
    has_local = True
    has_shared = True
    supports_float4 = True


def _opts(case: Case, renderer) -> list[Opt]:
    return hand_coded_optimizations(Kernel(case.ast, renderer)).applied_opts


# *** heuristics ***


def test_matmul_gets_register_tiles_vectors_and_loop_order_on_llvm() -> None:
    # the output's contiguous axis in vectors (2 x 8 lanes), the other axis 8 rows, that loop outermost
    assert _opts(matmul(64, 64, 64), LLVMRenderer()) == [
        Opt(OptOps.UPCAST, 1, 16),
        Opt(OptOps.UPCAST, 0, 8),
        Opt(OptOps.SWAP, 0, 1),
    ]


def test_scalar_renderers_get_small_tiles() -> None:
    assert _opts(matmul(64, 64, 64), CRenderer()) == [
        Opt(OptOps.UPCAST, 1, 8),
        Opt(OptOps.UPCAST, 0, 2),
        Opt(OptOps.SWAP, 0, 1),
    ]
    assert _opts(elementwise(), CRenderer()) == []  # no vectors to fill


def test_reductions_read_vectors_along_the_contiguous_axis() -> None:
    assert _opts(row_reduce(Ops.ADD, 4, 1024), LLVMRenderer()) == [Opt(OptOps.UNROLL, 0, 32)]
    assert _opts(column_sum(64, 256), LLVMRenderer()) == [Opt(OptOps.UPCAST, 0, 128)]  # the accumulator budget
    assert _opts(elementwise(4096), LLVMRenderer()) == [Opt(OptOps.UPCAST, 0, 16)]


def test_short_reductions_are_unrolled() -> None:
    k = hand_coded_optimizations(Kernel(conv2d().ast, LLVMRenderer()))
    assert k.colored_shape().endswith("3ur 3ur 3ur")  # the 3x3x3 window is straight-line code


def test_gpus_get_workgroups_and_grouped_reductions() -> None:
    opts = _opts(row_reduce(Ops.ADD, 4, 4096), GPU())
    assert opts[0] == Opt(OptOps.GROUPTOP, 0, 256)
    assert any(o.op is OptOps.LOCAL for o in _opts(elementwise(4096), GPU()))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_heuristic_kernels_are_correct(case: Case) -> None:
    py = pytest.importorskip("lazygrad_python")
    gpu = py.PythonRenderer(py.GPUTarget())
    check(case, run_python(case.ast, gpu, None, case.inputs)[0], f"{case.name} on an emulated GPU")
    check(case, run_device(case.ast, cpu_device(), None, case.inputs)[0], f"{case.name} on the CPU")


def test_noopt_and_debug_output(capsys) -> None:
    case = matmul(16, 16, 16)
    with Context(NOOPT=1):
        assert get_program(case.ast, LLVMRenderer()).opts == ()
    with Context(DEBUG=3):
        spec = get_program(case.ast, LLVMRenderer())
    printed = capsys.readouterr().out
    assert spec.name in printed and "UPCAST" in printed and "8u" in printed


# *** BEAM ***


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    return tmp_path


def test_beam_search_on_the_cpu_is_correct_and_cached(cache_dir, monkeypatch) -> None:
    device = cpu_device()
    case = matmul(64, 64, 64)
    with Context(BEAM=1):
        out, spec = run_device(case.ast, device, None, case.inputs)
    check(case, out, f"BEAM opts {spec.opts}")
    # which opts win depends on timings (and on the machine's load), so only what is certain is checked: the
    # choice is a valid opt sequence for the kernel, its program is correct (above), and it is what the cache holds
    Kernel(case.ast, device.renderer).apply_opts(list(spec.opts))
    assert diskcache_get("beam_search", search_key(Kernel(case.ast, device.renderer), 1)) == tuple(spec.opts)

    def no_search(*args, **kwargs):
        raise AssertionError("the second search of the same kernel must come from the cache")

    monkeypatch.setattr(search_module, "_search", no_search)
    with Context(BEAM=1):
        assert get_program(case.ast, device.renderer).opts == spec.opts
    with Context(BEAM=2), pytest.raises(AssertionError, match="from the cache"):
        get_program(case.ast, device.renderer)  # another beam width is another search


def test_a_search_stopped_by_its_time_limit_is_not_cached(cache_dir) -> None:
    device = cpu_device()
    case = matmul(32, 32, 32)
    k = Kernel(case.ast, device.renderer)
    best = beam_search(k, 2, timeout_s=0)  # the limit is reached before the first round
    out, _ = run_device(case.ast, device, list(best.applied_opts), case.inputs)
    check(case, out, f"opts of the cut-short search {best.applied_opts}")
    assert diskcache_get("beam_search", search_key(k, 2)) is None, "a cut-short search must be searched again"
    full = beam_search(k.copy(), 2, timeout_s=60)
    assert diskcache_get("beam_search", search_key(k, 2)) == tuple(full.applied_opts)


def test_candidates_with_wrong_results_are_dropped(cache_dir, monkeypatch) -> None:
    py = pytest.importorskip("lazygrad_python")
    case = matmul(8, 8, 8)
    compile_one = search_module._compile

    def corrupt_upcasts(opts):
        # an UPCAST candidate that computes a + b instead of a * b: fast, but wrong
        got = compile_one(opts)
        if got is None or not any(o.op is OptOps.UPCAST for o in opts):
            return got
        src = re.sub(r" MUL(\s+)float32 ", r" ADD\1float32 ", got.src)
        assert src != got.src
        return search_module._Compiled(
            got.opts, got.name, src, py.PythonCompiler().compile(src), *tuple(vars(got).values())[4:]
        )

    monkeypatch.setattr(search_module, "_compile", corrupt_upcasts)
    monkeypatch.setattr(search_module, "_fork_pool", lambda: None)  # a local function can't go to a worker
    # the reference kernel has the default's UPCASTs, so it is wrong too: checked against the unoptimised kernel on
    # this small kernel, it is replaced by it, with a warning
    with pytest.warns(RuntimeWarning, match="computes other values than without them"):
        best = beam_search(Kernel(case.ast, py.PythonRenderer()), 2, timeout_s=20)
    assert all(o.op is not OptOps.UPCAST for o in best.applied_opts)


def test_parallel_compiles_match_serial_ones() -> None:
    device = cpu_device()
    k = Kernel(elementwise(256).ast, device.renderer)
    search_module._WORKER.update(kernel=k, compiler=device.compiler)
    try:
        candidates = [(Opt(OptOps.UPCAST, 0, amt),) for amt in (2, 4, 8, 16)]
        pool = _fork_pool()
        try:
            parallel = _compile_all(candidates, pool)
        finally:
            if pool is not None:
                pool.shutdown()
        serial = _compile_all(candidates, None)
    finally:
        search_module._WORKER.clear()
    assert [c.src for c in parallel] == [c.src for c in serial] and len(serial) == 4


def test_search_keys_and_result_comparison() -> None:
    case = elementwise()
    k_llvm, k_c = Kernel(case.ast, LLVMRenderer()), Kernel(case.ast, CRenderer())
    assert search_key(k_llvm, 2) != search_key(k_c, 2) != search_key(k_c, 3)
    # TF32 decides whether an fp32 kernel may take a tensor core: a search under one setting is not the other's
    off = search_key(k_c, 2)
    with Context(TF32=1):
        assert search_key(k_c, 2) != off
    f32 = lambda xs: np.array(xs, np.float32).tobytes()  # noqa: E731
    assert _close(dtypes.float32, f32([1.0, 2.0, np.nan]), f32([1.0 + 1e-6, 2.0, np.nan]))
    assert not _close(dtypes.float32, f32([1.0, 2.0]), f32([1.0, 2.1]))
    assert not _close(dtypes.float32, f32([np.inf]), f32([-np.inf]))
    assert not _close(dtypes.int32, np.int32([1]).tobytes(), np.int32([2]).tobytes())


@settings(max_examples=25, deadline=None)
@given(
    shape=hs.tuples(hs.integers(1, 3), hs.sampled_from([1, 5, 16, 32, 48, 96]), hs.sampled_from([3, 16, 64, 80])),
    order=hs.sampled_from([(0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1)]),
    dtype=hs.sampled_from([dtypes.float32, dtypes.float16, dtypes.int8]),
)
def test_cpu_transposes_read_and_write_vectors(shape, order, dtype) -> None:
    """A permute that moves the input's contiguous axis: the CPU's default opts upcast the output's contiguous axis
    and the input's, so that the kernel reads vectors of the input (and turns the tile in registers) instead of one
    element per row it crosses, wherever both axes take a vector; the result is numpy's transpose."""
    device = cpu_device()
    a = (RNG_T.standard_normal(shape) * 50).astype(to_numpy_dtype(dtype))
    out_shape = tuple(shape[i] for i in order)
    ast = ka.sink(ka.store(0, ka.load(1, dtype, ka.st(*shape).permute(order), size=a.size), ka.st(*out_shape)))
    outs, spec = run_device(ast, device, None, {1: a})
    np.testing.assert_array_equal(outs[0].reshape(out_shape), np.transpose(a, order))
    width = device.renderer.vector_width
    inner_in, inner_out = shape[-1], out_shape[-1]
    if inner_in % width == 0 and inner_out % width == 0 and inner_in > 1 and inner_out > 1:
        loads = [u for u in spec.uops if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
        assert loads and all(u.dtype.count > 1 for u in loads), [u.dtype for u in loads]


@pytest.mark.parametrize("width", [147, 45, 49])
def test_cpu_matmul_whose_output_axis_takes_no_vector(width: int) -> None:
    """C = A^T B with both operands stored with the reduction outermost (a weight gradient over a window matrix of
    147 columns): the vector goes on the other output axis (contiguous in A), the odd one gets a register tile, and the
    result is numpy's."""
    device = cpu_device()
    rows, cout = 96, 32
    a = RNG_T.standard_normal((rows, cout)).astype(np.float32)
    b = RNG_T.standard_normal((rows, width)).astype(np.float32)
    av = ka.st(rows, cout).permute((1, 0)).reshape((cout, 1, rows)).expand((cout, width, rows))
    bv = ka.st(rows, width).permute((1, 0)).reshape((1, width, rows)).expand((cout, width, rows))
    prod = ka.load(1, dtypes.float32, av, size=a.size) * ka.load(2, dtypes.float32, bv, size=b.size)
    ast = ka.sink(ka.store(0, ka.reduce(prod, Ops.ADD, (2,)), ka.st(cout, width, 1)))
    outs, spec = run_device(ast, device, None, {1: a, 2: b})
    np.testing.assert_allclose(outs[0].reshape(cout, width), a.T @ b, rtol=1e-4, atol=1e-4)
    upcasts = [o.arg for o in spec.opts if o.op is OptOps.UPCAST]
    lanes = device.renderer.vector_width
    if lanes > 1 and cout % lanes == 0:
        # a vector along the output channels first, then an odd tile of the taps
        assert upcasts[0] % lanes == 0 and upcasts[1:] and upcasts[1] in (7, 5, 3), spec.opts
