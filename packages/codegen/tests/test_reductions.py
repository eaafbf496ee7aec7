"""Split plans for long reductions (`reductions.split_plan`), a workgroup per row for reductions along rows on GPUs
(`reductions.group_rows`, run on the PYTHON device pretending to be a warp GPU against numpy), elementwise
workgroups (`bandwidth`), and launch sizes folded into a renderer's limits (`launch.fitted_indices`, checked against
Python integers and run on the PYTHON device)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from codegen_cases import f32, load, reduce, run_python, sink, st, store
from hypothesis import assume, given, settings
from hypothesis import strategies as hst

from lazygrad_codegen import CRenderer, Kernel, OptOps
from lazygrad_codegen.heuristic import hand_coded_optimizations
from lazygrad_codegen.kernel import AxisType
from lazygrad_codegen.launch import fitted_indices
from lazygrad_codegen.lowerer import hardware_indices, lower
from lazygrad_codegen.reductions import COLUMN_PART_MIN, SEQUENTIAL, accumulator_lanes, axis_split, split_plan
from lazygrad_uop.dtype import dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import eval_uop

py = pytest.importorskip("lazygrad_python")


class Host(CRenderer):
    """A CPU-like renderer: 8-wide vectors, 4 cores."""

    device = "TESTHOST"
    has_local = False
    has_shared = False
    vector_width = 8
    compute_units = 4


class Gpu(CRenderer):
    """A GPU-like renderer: workgroups, shuffles, 132 multiprocessors."""

    device = "TESTGPU"
    has_local = True
    has_shared = True
    warp_size = 32
    compute_units = 132


# *** split plans ***


@settings(deadline=None)
@given(
    renderer=hst.sampled_from([Host(), Gpu(), CRenderer()]),
    outputs=hst.integers(1, 5000),
    length=hst.integers(2, 10**8),
    op=hst.sampled_from([Ops.ADD, Ops.MAX, Ops.MUL]),
)
def test_split_plans_cover_the_reduction_in_bounded_parts(renderer, outputs: int, length: int, op: Ops) -> None:
    lanes = accumulator_lanes(renderer)
    plan = split_plan(renderer, outputs, length, op)
    if plan is None:
        # left whole: short enough for its lanes, or too many outputs to keep the parts fewer than the inputs
        assert length <= lanes * SEQUENTIAL or outputs * lanes * SEQUENTIAL > length
        return
    left = length - plan.parts * plan.length
    assert plan.parts >= 2 and 0 <= left < plan.length
    # each part runs on whole lanes, each lane adding at most SEQUENTIAL elements in sequence
    assert plan.length % lanes == 0 and plan.length // lanes <= SEQUENTIAL
    # the final reduction sees every part and every leftover element, on whole lanes when it has more than one lane's
    assert plan.final >= plan.parts + left
    assert plan.final - (plan.parts + left) < lanes
    assert plan.final <= lanes or plan.final % lanes == 0


def test_split_plans_follow_the_device() -> None:
    # a 2^26 sum on a 132-SM GPU: parts of 256 threads x 64 elements, thousands of workgroups
    plan = split_plan(Gpu(), 1, 2**26, Ops.ADD)
    assert plan is not None and plan.parts >= 132 and plan.parts * plan.length == 2**26
    # a short reduction to few outputs is spread over the cores, a short one to many outputs is left alone
    plan = split_plan(Host(), 1, 1 << 16, Ops.MAX)
    assert plan is not None and plan.parts >= 4
    assert split_plan(Host(), 4096, 4096, Ops.ADD) is None
    assert split_plan(Host(), 1, 1000, Ops.ADD) is None


@settings(deadline=None)
@given(
    renderer=hst.sampled_from([Host(), Gpu(), CRenderer()]),
    shape=hst.lists(hst.sampled_from([1, 2, 3, 7, 12, 49, 64, 100, 128, 512, 4096]), min_size=1, max_size=4),
    data=hst.data(),
    op=hst.sampled_from([Ops.ADD, Ops.MAX, Ops.MUL]),
)
def test_axis_splits_cut_a_reduced_axis_into_whole_parts_on_gpus_only(renderer, shape, data, op: Ops) -> None:
    axes = tuple(sorted(data.draw(hst.sets(hst.integers(0, len(shape) - 1), min_size=1))))
    cut = axis_split(renderer, tuple(shape), axes, op)
    if not (renderer.has_local and renderer.has_shared):
        assert cut is None, "CPUs and devices without workgroups keep their flat split plans"
        return
    if cut is None:
        return
    length = math.prod(shape[a] for a in axes)
    outputs = math.prod(d for a, d in enumerate(shape) if a not in axes)
    # the first reduced axis of more than one element, cut into whole parts
    assert cut.axis == next(a for a in axes if shape[a] > 1)
    assert cut.parts >= 1 and shape[cut.axis] % cut.parts == 0
    kept = [b for b, d in enumerate(shape) if b not in axes and d > 1]
    if kept and kept[-1] > max(a for a in axes if shape[a] > 1):
        # columns: parts of at least COLUMN_PART_MIN rows, more partial results than outputs
        assert cut.parts >= 2 and length // cut.parts >= COLUMN_PART_MIN and outputs * cut.parts > outputs
    else:
        # around a kept axis: parts no longer than a split plan's
        assert any(cut.axis < b for b in kept)
        assert cut.parts == 1 or length // cut.parts <= accumulator_lanes(renderer) * SEQUENTIAL


# *** a workgroup per row ***


def _rows(kind: Ops, rows: int, n: int):
    x = load(1, dtypes.float32, st(rows, n))
    return sink(store(0, reduce(x, kind, (1,)), st(rows, 1)))


@pytest.mark.parametrize(("rows", "n"), [(40, 4096), (33, 1000), (20, 77), (17, 2048 + 5)])
@pytest.mark.parametrize("kind", [Ops.ADD, Ops.MAX])
def test_rows_get_a_workgroup_each_and_reduce_right(rows: int, n: int, kind: Ops) -> None:
    renderer = py.PythonRenderer(py.GPUTarget(name="WARPGPU", warp_size=32))
    k = hand_coded_optimizations(Kernel(_rows(kind, rows, n), renderer))
    assert any(o.op is OptOps.GROUP for o in k.applied_opts), k.applied_opts
    # data of its own (not the shared generator's next draw, which depends on the tests run before in this process)
    # and the exact sum as the reference
    x = np.random.default_rng(rows * n).standard_normal((rows, n)).astype(np.float32)
    out, spec = run_python(k.ast, renderer, k.applied_opts, {1: x})
    assert math.prod(spec.global_size) == rows and math.prod(spec.local_size) >= 32
    ref = x.astype(np.float64).sum(1) if kind is Ops.ADD else x.max(1)
    np.testing.assert_allclose(out[0], ref, rtol=1e-5, atol=1e-5)


def _outer_rows(kind: Ops, n: int, c: int, hw: int, dtype=dtypes.float32):
    # (N, C, HW) reduced over N and HW to C: a BatchNorm statistic of an NCHW tensor
    x = load(1, dtype, st(n, c, hw))
    return sink(store(0, reduce(x, kind, (0, 2)), st(1, c, 1)))


@settings(deadline=None, max_examples=12)
@given(
    n=hst.integers(2, 12),
    c=hst.integers(2, 5),
    hw=hst.sampled_from([16, 25, 49, 64, 100, 196, 256, 784]),
    kind=hst.sampled_from([Ops.ADD, Ops.MAX]),
    dtype=hst.sampled_from([dtypes.float32, dtypes.float16, dtypes.int32]),
)
def test_outer_and_row_axes_share_a_workgroup_and_reduce_right(n: int, c: int, hw: int, kind: Ops, dtype) -> None:
    renderer = py.PythonRenderer(py.GPUTarget(name="WARPGPU", warp_size=32, compute_units=132))
    k = hand_coded_optimizations(Kernel(_outer_rows(kind, n, c, hw, dtype), renderer))
    rng = np.random.default_rng(n * c * hw)
    if dtype == dtypes.int32:
        x = rng.integers(-1000, 1000, (n, c, hw)).astype(np.int32)
    else:
        x = rng.standard_normal((n, c, hw)).astype(to_numpy_dtype(dtype))
    out, spec = run_python(k.ast, renderer, k.applied_opts, {1: x})
    # every channel its own workgroup of whole warps, the row across lidx0 (neighbouring threads, neighbouring
    # addresses) and the outer axis across threads too where a power of two divides it
    groups = [o for o in k.applied_opts if o.op in (OptOps.GROUP, OptOps.GROUPTOP)]
    assert groups and groups[-1].op is OptOps.GROUP, k.applied_opts
    assert math.prod(spec.global_size) == c and math.prod(spec.local_size) % 32 == 0
    assert spec.local_size[0] == groups[-1].arg
    if n % 2 == 0 and n >= 4:
        assert any(o.op is OptOps.GROUPTOP for o in groups), k.applied_opts
    ref = x.astype(np.float64).sum((0, 2)) if kind is Ops.ADD else x.max((0, 2))
    tol = 2e-2 if dtype == dtypes.float16 else 1e-5
    np.testing.assert_allclose(out[0].astype(np.float64), ref, rtol=tol, atol=tol * max(1.0, float(np.abs(ref).max())))


def test_matmuls_keep_their_register_tiles() -> None:
    a = load(1, dtypes.float32, st(64, 1, 256).expand((64, 64, 256)))
    b = load(2, dtypes.float32, st(1, 64, 256).expand((64, 64, 256)))
    ast = sink(store(0, reduce(a * b, Ops.ADD, (2,)), st(64, 64, 1)))
    k = hand_coded_optimizations(Kernel(ast, Gpu()))
    assert not any(o.op is OptOps.GROUP for o in k.applied_opts)


# *** elementwise workgroups ***


@pytest.mark.parametrize("n", [2**20, 10**6 + 3, 3 * 1024 + 4])
def test_elementwise_workgroups_have_128_to_512_threads(n: int) -> None:
    ast = sink(store(0, load(1, dtypes.float32, st(n)) * 2.0, st(n)))
    k = hand_coded_optimizations(Kernel(ast, Gpu()))
    lowered = lower(k, 1)
    assert 128 <= math.prod(lowered.local_size) <= 512
    assert math.prod(lowered.global_size) * math.prod(lowered.local_size) * k.lanes(AxisType.UPCAST) >= n


def test_a_padded_elementwise_tail_runs_right_on_python() -> None:
    renderer = py.PythonRenderer(py.GPUTarget(name="GPU"))
    n = 1000 + 3
    ast = sink(store(0, load(1, dtypes.float32, st(n)) * 2.0, st(n)))
    k = hand_coded_optimizations(Kernel(ast, renderer))
    x = f32(n)
    out, spec = run_python(ast, renderer, k.applied_opts, {1: x})
    assert math.prod(spec.local_size) >= 128
    np.testing.assert_array_equal(out[0], x * 2)


# *** launch limits ***


@settings(deadline=None)
@given(
    sizes=hst.lists(hst.integers(1, 40), min_size=1, max_size=5),
    limits=hst.tuples(hst.integers(1, 5000), hst.integers(1, 50), hst.integers(1, 50)),
)
def test_folded_launches_stay_in_limits_and_number_every_workgroup_once(sizes: list[int], limits) -> None:
    total = math.prod(sizes)
    # every workgroup is evaluated below: keep the launch small enough to enumerate (40**5 took minutes)
    assume(total <= 4096)
    try:
        idxs, dims = fitted_indices(list(sizes), "gidx", limits, hardware_indices)
    except NotImplementedError:
        # only when no x * y * z factorisation of the total fits
        assert not any(
            x <= limits[0] and y <= limits[1] and total // (x * y) <= limits[2]
            for x in range(1, total + 1)
            for y in range(1, total // x + 1)
            if total % (x * y) == 0
        )
        return
    assert all(d <= lim for d, lim in zip(dims, limits, strict=True)) and math.prod(dims) == total
    specials = {u.arg[0]: u for i in idxs for u in i.toposort if u.op is Ops.SPECIAL}
    seen = set()
    for g in np.ndindex(*dims[::-1]):
        env = {specials[f"gidx{d}"]: v for d, v in enumerate(g[::-1]) if f"gidx{d}" in specials}
        coord = tuple(int(eval_uop(i, env)) if i.op is not Ops.CONST else i.arg for i in idxs)
        assert all(0 <= c < s for c, s in zip(coord, sizes, strict=True))
        seen.add(coord)
    assert len(seen) == total


def test_cuda_sized_launches_fold_into_x() -> None:
    limits = (2**31 - 1, 65535, 65535)
    idxs, dims = fitted_indices([100352, 3, 64], "gidx", limits, hardware_indices)
    assert dims == (100352 * 3 * 64, 1, 1) and len(idxs) == 3


def test_a_folded_launch_runs_right_on_python() -> None:
    # three output axes whose outer ones merge into z = 6 workgroups, over the pretend GPU's z limit of 2
    renderer = py.PythonRenderer(py.GPUTarget(name="SMALLGRID", global_max=(64, 2, 2)))
    x = f32(3, 2, 5)
    ast = sink(store(0, load(1, dtypes.float32, st(3, 2, 5)) + 1.0, st(3, 2, 5)))
    out, spec = run_python(ast, renderer, [], {1: x})
    assert all(d <= lim for d, lim in zip(spec.global_size, (64, 2, 2), strict=True))
    np.testing.assert_array_equal(out[0], (x + 1).ravel())
