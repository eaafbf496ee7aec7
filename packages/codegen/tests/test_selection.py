"""One-hot selections (`lazygrad_codegen.selection`): a reduction of `WHERE(arange == e, x, 0)` over an arange the
kernel computes is read with one gated load and no loop. Kernels built by hand, run on the PYTHON device (plain and
as an emulated GPU) and the CPU device, checked against numpy indexing; the loop over the indexed axis must be gone
from the linear program, except where the kernel is not a selection (then the loop must stay, and still be right)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from codegen_cases import Case, check, cpu_device, random_opts, run_device, run_python

from lazygrad_codegen import Kernel, OptOps
from lazygrad_codegen.heuristic import hand_coded_optimizations
from lazygrad_codegen.kernel_ast import const, load, reduce, sink, st, store, strided
from lazygrad_codegen.program import optimized_kernel
from lazygrad_codegen.selection import affine_fit, find_selection
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker

RNG = np.random.default_rng(5)
NP = {dtypes.float32: np.float32, dtypes.int32: np.int32, dtypes.float16: np.float16}


def arange_in_kernel(n: int, shape: tuple[int, ...], axis: int) -> UOp:
    """0..n-1 along `axis` of `shape` (int32), computed in the kernel from masked constants: bit b of the position
    is a constant 2**b padded so that it is only valid where that bit is set."""
    p = 1 << max(1, (n - 1).bit_length())
    where = tuple(n if a == axis else 1 for a in range(len(shape)))
    out = None
    for b in range(p.bit_length() - 1):
        bit = ShapeTracker.from_shape((p >> (b + 1), 1, 1 << b)).pad(((0, 0), (1, 0), (0, 0)))
        view = bit.reshape((p,)).shrink(((0, n),)).reshape(where).expand(shape)
        term = const(1 << b, dtypes.int32, view)
        out = term if out is None else out + term
    assert out is not None
    return out


def _wrapped(idx: np.ndarray, n: int) -> np.ndarray:
    """The frontend's rule: a negative index counts from the end (once); anything still out of range selects
    nothing."""
    return np.where(idx < 0, idx.astype(np.int64) + n, idx)


def _take_rows(w: np.ndarray, e: np.ndarray) -> np.ndarray:
    ok = (e >= 0) & (e < w.shape[0])
    return np.where(ok[..., None], w[np.where(ok, e, 0)], 0).astype(w.dtype)


def _indices(t: int, v: int) -> np.ndarray:
    """In range, negative, repeated, just out of range on both sides, and the int32 extremes."""
    base = RNG.integers(-v, v, t)
    extra = np.array([v, -v - 1, 2**31 - 1, -(2**31), 0, 0, v - 1, -1])
    return np.concatenate([base, extra])[:t].astype(np.int32) if t >= len(extra) else base.astype(np.int32)


def gather_rows(t: int, v: int, h: int, dtype: DType = dtypes.float32, form: str = "where") -> Case:
    """out[t, :] = w[idx[t], :]: a reduction over v of the one-hot row selection, as the frontend builds it."""
    w = (RNG.standard_normal((v, h)) * 8).astype(NP[dtype])
    idx = _indices(t, v)
    full = (t, v, h)
    e = load(1, dtypes.int32, strided(full, (1, 0, 0)))
    e = (e < const(0, dtypes.int32, st(*full))).where(e + const(v, dtypes.int32, st(*full)), e)
    hit = arange_in_kernel(v, full, 1).eq(e)
    x = load(2, dtype, strided(full, (0, h, 1)))
    value = hit.where(x, const(0, dtype, st(*full))) if form == "where" else hit.cast(dtype) * x
    ast = sink(store(0, reduce(value, Ops.ADD, (1,)), st(t, 1, h)))
    ref = _take_rows(w, _wrapped(idx, v))
    return Case(f"gather_rows_{t}_{v}_{h}_{dtype}_{form}", ast, {1: idx, 2: w}, {0: ref.reshape(-1)}, tol=0)


def _ranges(spec) -> list:
    return [u.src[0].arg for u in spec.uops if u.op is Ops.RANGE]


def _loopless(spec, v: int) -> None:
    assert v not in _ranges(spec), f"a loop over the indexed axis ({v}) is left: {_ranges(spec)}"
    assert not any(u.op is Ops.DEFINE_ACC for u in spec.uops), "a selection needs no accumulator"


def _python():
    py = pytest.importorskip("lazygrad_python")
    return py.PythonRenderer()


def _gpu():
    py = pytest.importorskip("lazygrad_python")
    return py.PythonRenderer(py.GPUTarget(local_max=(16, 16, 16), max_workgroup_threads=64, shared_max=4096))


# *** recognising the index math ***


def test_affine_fit_accepts_aranges_with_any_start_and_step_and_nothing_else() -> None:
    r = UOp.range(50, 0)
    assert affine_fit(r, r, 50) == (1, 0)
    assert affine_fit(r * 3 + 7, r, 50) == (3, 7)
    assert affine_fit(49 - r, r, 50) == (-1, 49)
    assert affine_fit(r // 2, r, 50) is None  # two positions give each value
    assert affine_fit(r * r, r, 50) is None
    assert affine_fit(r + UOp.range(4, 1), r, 50) is None  # another loop: not index math of r alone
    assert affine_fit(r * 100_000_000, r, 50) is None  # overflows int32 on the way
    big = UOp.range(200_000, 0)
    assert affine_fit(big * 2 - 3, big, 200_000) == (2, -3)
    # off the line only far past the first chunk that is checked
    assert affine_fit((big < 150_000).where(big, big + 1), big, 200_000) is None


def test_masked_constant_arange_is_recognised_and_a_loaded_one_is_not() -> None:
    case = gather_rows(8, 37, 5)
    k = Kernel(case.ast, _python())
    assert find_selection(k.reduceops[0], k) is not None
    full = (8, 37, 5)
    loaded = load(3, dtypes.int32, strided(full, (0, 1, 0)))  # an arange read from a buffer: contents unknown
    value = loaded.eq(load(1, dtypes.int32, strided(full, (1, 0, 0)))).where(
        load(2, dtypes.float32, strided(full, (0, 5, 1))), const(0, dtypes.float32, st(*full))
    )
    k2 = Kernel(sink(store(0, reduce(value, Ops.ADD, (1,)), st(8, 1, 5))), _python())
    assert find_selection(k2.reduceops[0], k2) is None


# *** values, and the loop gone ***


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32, dtypes.float16], ids=str)
@pytest.mark.parametrize("form", ["where", "cast_mul"])
def test_row_gather_on_the_python_device(dtype: DType, form: str) -> None:
    for t, v, h in [(19, 37, 5), (8, 1, 3), (16, 64, 16), (3, 300, 7)]:
        case = gather_rows(t, v, h, dtype, form)
        out, spec = run_python(case.ast, _python(), None, case.inputs)
        check(case, out, case.name)
        _loopless(spec, v)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32, dtypes.float16], ids=str)
@pytest.mark.parametrize("form", ["where", "cast_mul"])
def test_row_gather_on_the_cpu(dtype: DType, form: str) -> None:
    device = cpu_device()
    for t, v, h in [(21, 41, 16), (64, 1000, 24), (5, 3, 1)]:
        case = gather_rows(t, v, h, dtype, form)
        out, spec = run_device(case.ast, device, None, case.inputs)
        check(case, out, case.name)
        _loopless(spec, v)


def test_index_per_output_element_like_torch_gather() -> None:
    """out[t, j] = w[idx[t, j], j]: e depends on both output axes, so every lane reads its own row."""
    t, v, h = 12, 29, 9
    w = RNG.standard_normal((v, h)).astype(np.float32)
    idx = RNG.integers(-v - 3, v + 3, (t, h)).astype(np.int32)
    full = (t, v, h)
    e = load(1, dtypes.int32, strided(full, (h, 0, 1)))
    e = (e < const(0, dtypes.int32, st(*full))).where(e + const(v, dtypes.int32, st(*full)), e)
    x = load(2, dtypes.float32, strided(full, (0, h, 1)))
    value = arange_in_kernel(v, full, 1).eq(e).where(x, const(0, dtypes.float32, st(*full)))
    ast = sink(store(0, reduce(value, Ops.ADD, (1,)), st(t, 1, h)))
    ew = _wrapped(idx, v)
    ok = (ew >= 0) & (ew < v)
    ref = np.where(ok, w[np.where(ok, ew, 0), np.arange(h)[None, :]], 0).astype(np.float32)
    case = Case("gather_elements", ast, {1: idx, 2: w}, {0: ref.reshape(-1)}, tol=0)
    for runner in (lambda a, i: run_python(a, _python(), None, i), lambda a, i: run_device(a, cpu_device(), None, i)):
        out, spec = runner(ast, case.inputs)
        check(case, out, case.name)
        _loopless(spec, v)


def test_two_indices_joined_by_and_with_an_independent_gate() -> None:
    """w[i, j] over two reduce axes, each fixed by its own comparison, and a mask of the output that must also
    hold: out[t] = w[i[t], j[t]] where keep[t], else 0."""
    t, v1, v2, h = 10, 7, 6, 4
    w = RNG.standard_normal((v1, v2, h)).astype(np.float32)
    i = RNG.integers(-2, v1 + 2, t).astype(np.int32)
    j = RNG.integers(-2, v2 + 2, t).astype(np.int32)
    keep = RNG.integers(0, 2, t).astype(np.bool_)
    full = (t, v1, v2, h)
    hit = arange_in_kernel(v1, full, 1).eq(load(1, dtypes.int32, strided(full, (1, 0, 0, 0))))
    hit = hit & arange_in_kernel(v2, full, 2).eq(load(2, dtypes.int32, strided(full, (1, 0, 0, 0))))
    hit = hit & load(3, dtypes.bool, strided(full, (1, 0, 0, 0)))
    x = load(4, dtypes.float32, strided(full, (0, v2 * h, h, 1)))
    ast = sink(store(0, reduce(hit.where(x, const(0, dtypes.float32, st(*full))), Ops.ADD, (1, 2)), st(t, 1, 1, h)))
    ok = (i >= 0) & (i < v1) & (j >= 0) & (j < v2) & keep
    ref = np.where(ok[:, None], w[np.where(ok, i, 0), np.where(ok, j, 0)], 0).astype(np.float32)
    case = Case("two_indices", ast, {1: i, 2: j, 3: keep, 4: w}, {0: ref.reshape(-1)}, tol=0)
    for runner in (lambda a, x: run_python(a, _python(), None, x), lambda a, x: run_device(a, cpu_device(), None, x)):
        out, spec = runner(ast, case.inputs)
        check(case, out, case.name)
        _loopless(spec, v1)
        _loopless(spec, v2)


@pytest.mark.parametrize("start,step", [(5, 1), (40, -1), (3, 4), (-9, -3)])
def test_arange_with_start_and_step(start: int, step: int) -> None:
    """Compared with start + step*r: e hits only values of that progression (with step 4, most values hit
    nothing)."""
    t, v, h = 40, 23, 3
    w = RNG.standard_normal((v, h)).astype(np.float32)
    lo, hi = min(start, start + step * (v - 1)), max(start, start + step * (v - 1))
    idx = RNG.integers(lo - 5, hi + 6, t).astype(np.int32)
    full = (t, v, h)
    ar = arange_in_kernel(v, full, 1) * const(step, dtypes.int32, st(*full)) + const(start, dtypes.int32, st(*full))
    x = load(2, dtypes.float32, strided(full, (0, h, 1)))
    value = ar.eq(load(1, dtypes.int32, strided(full, (1, 0, 0)))).where(x, const(0, dtypes.float32, st(*full)))
    ast = sink(store(0, reduce(value, Ops.ADD, (1,)), st(t, 1, h)))
    pos = (idx.astype(np.int64) - start) // step
    ok = ((idx.astype(np.int64) - start) % abs(step) == 0) & (pos >= 0) & (pos < v)
    ref = np.where(ok[:, None], w[np.where(ok, pos, 0)], 0).astype(np.float32)
    case = Case(f"arange_{start}_{step}", ast, {1: idx, 2: w}, {0: ref.reshape(-1)}, tol=0)
    for runner in (lambda a, x: run_python(a, _python(), None, x), lambda a, x: run_device(a, cpu_device(), None, x)):
        out, spec = runner(ast, case.inputs)
        check(case, out, case.name)
        _loopless(spec, v)


def test_max_selection_with_its_identity_and_bool_any() -> None:
    t, v, h = 9, 13, 4
    w = RNG.standard_normal((v, h)).astype(np.float32)
    idx = RNG.integers(-3, v + 3, t).astype(np.int32)
    full = (t, v, h)
    hit = arange_in_kernel(v, full, 1).eq(load(1, dtypes.int32, strided(full, (1, 0, 0))))
    x = load(2, dtypes.float32, strided(full, (0, h, 1)))
    value = hit.where(x, const(-np.inf, dtypes.float32, st(*full)))
    ast = sink(store(0, reduce(value, Ops.MAX, (1,)), st(t, 1, h)))
    ok = (idx >= 0) & (idx < v)
    ref = np.where(ok[:, None], w[np.where(ok, idx, 0)], -np.inf).astype(np.float32)
    case = Case("max_pick", ast, {1: idx, 2: w}, {0: ref.reshape(-1)}, tol=0)
    out, spec = run_device(ast, cpu_device(), None, case.inputs)
    check(case, out, case.name)
    _loopless(spec, v)
    # bools (the frontend picks them with a max): any of (hit and b) is b at the hit
    b = RNG.integers(0, 2, (v, h)).astype(np.bool_)
    xb = load(2, dtypes.bool, strided(full, (0, h, 1)))
    ast_b = sink(store(0, reduce(hit.where(xb, const(False, dtypes.bool, st(*full))), Ops.MAX, (1,)), st(t, 1, h)))
    ref_b = np.where(ok[:, None], b[np.where(ok, idx, 0)], False)
    case_b = Case("bool_pick", ast_b, {1: idx, 2: b}, {0: ref_b.reshape(-1)}, tol=0)
    out, spec = run_python(ast_b, _python(), None, case_b.inputs)
    check(case_b, out, case_b.name)
    _loopless(spec, v)


# *** not selections: the loop stays and the values are right ***


def test_other_branch_nonzero_or_max_over_zeros_or_repeating_index_math_keep_the_loop() -> None:
    t, v, h = 11, 17, 3
    w = RNG.standard_normal((v, h)).astype(np.float32)
    idx = RNG.integers(-2, v + 2, t).astype(np.int32)
    full = (t, v, h)
    e = load(1, dtypes.int32, strided(full, (1, 0, 0)))
    x = load(2, dtypes.float32, strided(full, (0, h, 1)))
    ar = arange_in_kernel(v, full, 1)
    ok = ((idx >= 0) & (idx < v))[:, None]
    picked = np.where(ok, w[np.where(ok[:, 0], idx, 0)], 0)
    halves = ar // const(2, dtypes.int32, st(*full))  # r // 2 == e holds for two r
    two = np.stack([np.where((idx >= 0) & (2 * idx + k < v), 1, 0) for k in (0, 1)])
    two_rows = sum(two[k][:, None] * w[np.clip(2 * idx + k, 0, v - 1)] for k in (0, 1))
    kernels = [
        ("alt_one", ar.eq(e).where(x, const(1.0, dtypes.float32, st(*full))), Ops.ADD, picked + (v - ok)),
        ("max_zero", ar.eq(e).where(x, const(0.0, dtypes.float32, st(*full))), Ops.MAX, np.maximum(picked, 0)),
        ("halves", halves.eq(e).where(x, const(0.0, dtypes.float32, st(*full))), Ops.ADD, two_rows),
    ]
    for name, value, op, ref in kernels:
        ast = sink(store(0, reduce(value, op, (1,)), st(t, 1, h)))
        case = Case(name, ast, {1: idx, 2: w}, {0: np.asarray(ref, np.float32).reshape(-1)}, tol=1e-5)
        out, spec = run_python(ast, _python(), None, case.inputs)
        check(case, out, name)
        assert v in _ranges(spec) or any(u.op is Ops.DEFINE_ACC for u in spec.uops), name


# *** opts ***


def test_the_heuristic_keeps_the_indexed_axis_whole() -> None:
    """A gather from a 1-d table and a row gather, whose indexed axis the emulated GPU's heuristic groups over
    threads (GROUPTOP): codegen drops those opts, keeps the others, and reads one element per output."""
    t, v = 33, 256
    w = RNG.standard_normal(v).astype(np.float32)
    idx = RNG.integers(-v, v + 4, t).astype(np.int32)
    full = (t, v)
    hit = arange_in_kernel(v, full, 1).eq(load(1, dtypes.int32, strided(full, (1, 0))))
    x = load(2, dtypes.float32, strided(full, (0, 1)))
    ast = sink(store(0, reduce(hit.where(x, const(0.0, dtypes.float32, st(*full))), Ops.ADD, (1,)), st(t, 1)))
    ok = (idx >= 0) & (idx < v)
    ref = np.where(ok, w[np.where(ok, idx, 0)], 0).astype(np.float32)
    cases = [(Case("gather_1d", ast, {1: idx, 2: w}, {0: ref}, tol=0), v), (gather_rows(4, 512, 2), 512)]
    reduce_opts = {OptOps.GROUP, OptOps.GROUPTOP, OptOps.UNROLL, OptOps.TC}
    for case, rows in cases:
        for renderer in (_gpu(), cpu_device().renderer):
            chosen = hand_coded_optimizations(Kernel(case.ast, renderer)).applied_opts
            kept = optimized_kernel(case.ast, renderer).applied_opts
            assert not any(o.op in reduce_opts for o in kept), kept
            assert [o for o in chosen if o.op not in reduce_opts] == kept
        assert any(o.op in reduce_opts for o in hand_coded_optimizations(Kernel(case.ast, _gpu())).applied_opts)
        for out, spec in (
            run_python(case.ast, _gpu(), None, case.inputs),
            run_device(case.ast, cpu_device(), None, case.inputs),
        ):
            check(case, out, case.name)
            _loopless(spec, rows)


def test_random_opts_split_or_not_give_numpy_values() -> None:
    """Opts given explicitly (UNROLL, GROUP, PADTO of the indexed axis included) keep the loop where they split
    it; every sequence must give numpy's values, on an emulated GPU and on the CPU."""
    case = gather_rows(16, 24, 8)
    rng = random.Random(3)
    gpu = _gpu()
    for _ in range(12):
        opts = random_opts(Kernel(case.ast, gpu), rng, rng.randint(1, 4))
        check(case, run_python(case.ast, gpu, opts, case.inputs)[0], f"gpu {opts}")
    device = cpu_device()
    for _ in range(6):
        opts = random_opts(Kernel(case.ast, device.renderer), rng, rng.randint(1, 3))
        check(case, run_device(case.ast, device, opts, case.inputs)[0], f"cpu {opts}")
