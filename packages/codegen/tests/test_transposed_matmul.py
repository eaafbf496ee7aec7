"""Matmuls whose inputs are stored transposed or with padded rows (`x @ W.T` of every `nn.Linear`, `x.T @ W`, a
decode GEMV, attention's `q @ k^T`): the default opts and random ones give numpy's results on the CPU device and on
the PYTHON device with vectors, and the dot layout (both inputs contiguous along the reduction) reads only whole
vectors."""

from __future__ import annotations

import random

import numpy as np
import pytest
from codegen_cases import Case, check, cpu_device, random_opts, run_device, run_python

from lazygrad_codegen import Kernel, KernelOptError, LLVMRenderer, Opt, OptOps, get_program
from lazygrad_codegen.heuristic import accumulator_budget, hand_coded_optimizations
from lazygrad_codegen.kernel import AxisType
from lazygrad_codegen.kernel_ast import load, reduce, sink, st, store, strided
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops


def bmm(
    batch: int, m: int, n: int, k: int, a_t: bool, b_t: bool, a_pad: int = 0, b_pad: int = 0, seed: int = 0
) -> Case:
    """`A @ B` over `batch` matrices, A (m, k) and B (k, n), each stored as itself or transposed (`a_t`, `b_t`),
    with `a_pad`/`b_pad` unused elements at the end of each stored row."""
    rng = np.random.default_rng(seed)
    a_rows, a_cols = (k, m) if a_t else (m, k)
    b_rows, b_cols = (n, k) if b_t else (k, n)
    a_data = rng.standard_normal((batch, a_rows, a_cols + a_pad)).astype(np.float32)
    b_data = rng.standard_normal((batch, b_rows, b_cols + b_pad)).astype(np.float32)
    a = a_data[:, :, :a_cols].transpose(0, 2, 1) if a_t else a_data[:, :, :a_cols]
    b = b_data[:, :, :b_cols].transpose(0, 2, 1) if b_t else b_data[:, :, :b_cols]
    a_ld, b_ld = a_cols + a_pad, b_cols + b_pad
    # strides of each input in the full shape (batch, m, n, k)
    a_strides = (a_rows * a_ld, 1, 0, a_ld) if a_t else (a_rows * a_ld, a_ld, 0, 1)
    b_strides = (b_rows * b_ld, 0, b_ld, 1) if b_t else (b_rows * b_ld, 0, 1, b_ld)
    full = (batch, m, n, k)
    x = load(1, dtypes.float32, strided(full, a_strides), size=a_data.size)
    y = load(2, dtypes.float32, strided(full, b_strides), size=b_data.size)
    ast = sink(store(0, reduce(x * y, Ops.ADD, (3,)), st(batch, m, n, 1)))
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    name = f"bmm_{batch}x{m}x{n}x{k}_{'t' if a_t else 'n'}{'t' if b_t else 'n'}_pad{a_pad}{b_pad}"
    return Case(name, ast, {1: a_data, 2: b_data}, {0: ref.reshape(-1)}, tol=1e-4, tags={"matmul"})


# the shapes of the benchmark: a Linear layer of MiniLM, a decode GEMV, attention scores of 12 heads
NAMED = {
    "x@W.T": bmm(1, 1024, 384, 1536, a_t=False, b_t=True),
    "gemv x@W.T": bmm(1, 1, 3072, 768, a_t=False, b_t=True),
    "q@k^T": bmm(12, 128, 128, 64, a_t=False, b_t=True),
    "x.T@W": bmm(1, 1024, 384, 1536, a_t=True, b_t=False),
    "x.T@W.T": bmm(1, 256, 128, 512, a_t=True, b_t=True),
}


@pytest.mark.parametrize("name", list(NAMED))
def test_named_shapes_with_default_opts_match_numpy(name: str) -> None:
    case = NAMED[name]
    out, spec = run_device(case.ast, cpu_device(), None, case.inputs)
    check(case, out, f"{name} {spec.opts}")


def _random_case(seed: int) -> Case:
    rng = random.Random(seed)
    return bmm(
        batch=rng.choice([1, 1, 2, 3]),
        m=rng.choice([1, 3, 8, 17, 32, 48]),
        n=rng.choice([1, 5, 16, 24, 64]),
        k=rng.choice([7, 16, 32, 48, 64, 100, 128, 256]),
        a_t=rng.random() < 0.5,
        b_t=rng.random() < 0.7,
        a_pad=rng.choice([0, 0, 3]),
        b_pad=rng.choice([0, 0, 5]),
        seed=seed,
    )


@pytest.mark.parametrize("seed", range(16))
def test_random_layouts_with_default_opts_match_numpy(seed: int) -> None:
    case = _random_case(seed)
    out, spec = run_device(case.ast, cpu_device(), None, case.inputs)
    check(case, out, f"{case.name} {spec.opts}")


@pytest.mark.parametrize("seed", range(8))
def test_random_opts_on_transposed_matmuls_match_numpy(seed: int) -> None:
    # a reduction unrolled by one or two vectors (or a padded one), then any opts: the dot layout with fewer or more
    # outputs than a vector's lanes, several unrolled axes, or no dot layout at all
    case = _random_case(100 + seed)
    device = cpu_device()
    width = device.renderer.vector_width
    rng = random.Random(seed)
    for _ in range(4):
        k = Kernel(case.ast, device.renderer)
        first = rng.choice(
            [
                [Opt(OptOps.UNROLL, 0, width)],
                [Opt(OptOps.UNROLL, 0, 2 * width)],
                [Opt(OptOps.PADTO, len(k.axes(AxisType.GLOBAL)), width), Opt(OptOps.UNROLL, 0, width)],
            ]
        )
        try:
            k.apply_opts(first)
        except KernelOptError:
            k = Kernel(case.ast, device.renderer)
        opts = random_opts(k, rng, rng.randint(0, 3))
        check(case, run_device(case.ast, device, opts, case.inputs)[0], f"{case.name} {opts}")


def test_dot_layout_on_the_python_device_with_vectors() -> None:
    # the same lowering run by the reference interpreter, independently of LLVM: vectors of 4 lanes
    py = pytest.importorskip("lazygrad_python")
    renderer = py.PythonRenderer(py.GPUTarget(vector_width=4))
    case = bmm(2, 8, 6, 24, a_t=False, b_t=True, b_pad=1)
    for opts in (
        [Opt(OptOps.NOLOCALS, 0, None), Opt(OptOps.UNROLL, 0, 8), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.UPCAST, 2, 3)],
        [Opt(OptOps.NOLOCALS, 0, None), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 2, 6)],
        [Opt(OptOps.NOLOCALS, 0, None), Opt(OptOps.UNROLL, 0, 12)],
    ):
        check(case, run_python(case.ast, renderer, opts, case.inputs)[0], f"{case.name} {opts}")


def test_x_at_w_transposed_gets_dot_products_of_whole_vectors() -> None:
    renderer = LLVMRenderer()
    width = renderer.vector_width
    k = hand_coded_optimizations(Kernel(bmm(1, 64, 48, 128, a_t=False, b_t=True).ast, renderer))
    # the reduction unrolled by one vector, a tile of outputs whose vectors of partial sums fit the budget
    assert k.applied_opts[0] == Opt(OptOps.UNROLL, 0, width)
    assert 1 < k.lanes(AxisType.UPCAST) * width <= accumulator_budget(k)
    spec = get_program(k.ast, renderer, k.applied_opts)
    loads = [u for u in spec.uops if u.op is Ops.LOAD]
    assert loads and all(u.dtype.count == width for u in loads), [u.dtype for u in loads]


def test_contiguous_and_column_major_inputs_keep_outer_products() -> None:
    # an input contiguous along an output axis: vectors along that axis, no dot products
    for case in (bmm(1, 64, 64, 64, a_t=False, b_t=False), bmm(1, 64, 64, 64, a_t=True, b_t=False)):
        opts = hand_coded_optimizations(Kernel(case.ast, LLVMRenderer())).applied_opts
        assert all(o.op is not OptOps.UNROLL for o in opts), opts
