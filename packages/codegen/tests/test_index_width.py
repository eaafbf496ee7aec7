"""The width of index arithmetic (`lazygrad_codegen.index_width`): int32 where a kernel's bounds stay within int32,
int64 where an offset or a loop bound can pass 2^31 - 1, rendered as such by every renderer; every kind of kernel
computes what numpy computes with int64 index arithmetic forced, on the C renderer, the CPU and the PYTHON device;
and reductions of a value the reduce loop doesn't change are folded to a multiply, exactly."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_c import run_c
from codegen_cases import Case, all_cases, check, cpu_device, run_device, run_python
from hypothesis import given
from hypothesis import strategies as st_

import lazygrad_codegen.lowerer as lowerer_module
from lazygrad_codegen import CRenderer, LLVMRenderer, Opt, OptOps, get_program
from lazygrad_codegen.index_width import INT32_MAX, index_dtype, view_reach
from lazygrad_codegen.kernel_ast import const, load, matmul, reduce, sink, st, store, strided
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import View

CASES = all_cases()


def _exact_reach(v: View) -> int:
    """max |index| over every coordinate of a small view, by enumeration (Python ints)."""
    best = abs(v.offset)
    for coord in np.ndindex(*v.shape):
        best = max(best, abs(v.offset + sum(c * s for c, s in zip(coord, v.strides, strict=True))))
    return best


@given(
    st_.lists(st_.integers(1, 4), min_size=1, max_size=3).flatmap(
        lambda shape: st_.tuples(
            st_.just(tuple(shape)),
            st_.lists(st_.integers(-(2**31), 2**31), min_size=len(shape), max_size=len(shape)),
            st_.integers(-(2**32), 2**32),
        )
    )
)
def test_view_reach_bounds_every_index(args) -> None:
    shape, strides, offset = args
    v = View.create(shape, tuple(strides), offset)
    assert view_reach(v) >= _exact_reach(v)
    # the last view of a tracker takes the kernel's indices: its reach without its element count still bounds them
    assert view_reach(v, unravels=False) >= max(_exact_reach(v), *shape)
    # and the width chosen from it holds every index
    wide = index_dtype([strided(shape, tuple(strides), offset)], shape) == dtypes.int64
    assert wide or _exact_reach(v) <= INT32_MAX


def _range_dtypes(ast: UOp, renderer) -> set:
    return {u.dtype for u in get_program(ast, renderer, []).uops if u.op is Ops.RANGE}


def test_ordinary_kernels_keep_int32() -> None:
    for case in CASES:
        uops = get_program(case.ast, LLVMRenderer(), []).uops
        assert not any(u.dtype == dtypes.int64 for u in uops if u.op in (Ops.RANGE, Ops.INDEX, Ops.ADD, Ops.MUL)), case


def test_a_loop_past_int32_is_int64_in_every_renderer() -> None:
    n = INT32_MAX + 6
    # a strided read of a small buffer (stride 0 but masked by a pad): the loop itself must count past 2^31
    x = load(1, dtypes.float32, st(1).expand((n,)), size=1)
    ast = sink(store(0, reduce(x * x + x, Ops.ADD, (0,)), st(1)))
    for renderer in (LLVMRenderer(), CRenderer()):
        spec = get_program(ast, renderer, [])
        if Ops.RANGE in {u.op for u in spec.uops}:
            assert _range_dtypes(ast, renderer) == {dtypes.int64}
    # a loop that the value does depend on
    y = load(1, dtypes.float32, st(n))
    ast = sink(store(0, reduce(y, Ops.ADD, (0,)), st(1)))
    assert _range_dtypes(ast, LLVMRenderer()) == {dtypes.int64}
    assert "phi i64 [0" in get_program(ast, LLVMRenderer(), []).src
    c = CRenderer()
    assert f"for ({c.render_dtype(dtypes.int64)} ridx" in get_program(ast, c, []).src


def test_big_loop_nests_over_small_buffers_keep_int32() -> None:
    # a 4096^3 matmul: 2^36 iterations, but each loop kind (4096^2 outputs, 4096 reduced) and every buffer within int32
    ast = matmul(4096, 4096, 4096, dtypes.float16)
    assert _range_dtypes(ast, LLVMRenderer()) == {dtypes.int32}
    for u in get_program(ast, LLVMRenderer(), []).uops:
        assert u.dtype != dtypes.int64 or u.op not in (Ops.RANGE, Ops.INDEX, Ops.ADD, Ops.MUL)
    # outputs past int32 together (each axis within it): int64
    assert index_dtype([st(2**16, 2**16)], (2**16, 2**16)) == dtypes.int64
    assert index_dtype([st(1, 1).expand((2**16, 2**14))], (2**16, 2**14)) == dtypes.int32
    # reduce loops past int32 together: int64
    assert index_dtype([st(1, 1).expand((2**16, 2**16))], (2**16, 2**16), (0, 1)) == dtypes.int64
    assert index_dtype([st(1, 1).expand((2**16, 2**16))], (2**16, 2**16), (1,)) == dtypes.int32


@pytest.fixture
def force_int64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lowerer_module, "index_dtype", lambda *args: dtypes.int64)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("where", ["c", "cpu", "python"])
def test_int64_index_arithmetic_computes_the_same(case: Case, where: str, force_int64, tmp_path) -> None:
    opts: list[Opt] = []
    if where == "c":
        out = run_c(tmp_path, case.ast, CRenderer(), case.inputs, opts=opts)[0]
    elif where == "cpu":
        out, spec = run_device(case.ast, cpu_device(), None, case.inputs)
        assert all(u.dtype == dtypes.int64 for u in spec.uops if u.op is Ops.RANGE)
    else:
        py = pytest.importorskip("lazygrad_python")
        out = run_python(case.ast, py.PythonRenderer(), None, case.inputs)[0]
    check(case, out, f"{case.name} with int64 indices on {where}")


def test_int64_indices_with_a_gpu_launch(force_int64) -> None:
    py = pytest.importorskip("lazygrad_python")
    gpu = py.PythonRenderer(py.GPUTarget())
    for case in CASES[:6]:
        check(case, run_python(case.ast, gpu, None, case.inputs)[0], f"{case.name} on an emulated GPU, int64")


@pytest.mark.parametrize("n", [7, 2**31 - 1, 2**31, 10**12])
@pytest.mark.parametrize("upcast", [False, True])
def test_sum_of_an_invariant_value_is_folded_exactly(n: int, upcast: bool) -> None:
    py = pytest.importorskip("lazygrad_python")
    value = const(1.0, dtypes.float32, st(1).expand((n,)))
    ast = sink(store(0, reduce(value * 3.0, Ops.ADD, (0,)), st(1)))
    opts = [Opt(OptOps.UNROLL, 0, 4)] if upcast and n % 4 == 0 else []
    out, spec = run_python(ast, py.PythonRenderer(), opts, {})
    assert not {Ops.RANGE, Ops.DEFINE_ACC} & {u.op for u in spec.uops}
    assert out[0][0] == np.float32(3.0 * n)


def test_max_and_broadcast_loads_fold_and_varying_values_do_not() -> None:
    py = pytest.importorskip("lazygrad_python")
    rows, n = 3, 1000
    a = np.array([1.5, -2.0, 0.25], np.float32)
    x = load(1, dtypes.float32, st(rows, 1).expand((rows, n)), size=rows)
    ast = sink(store(0, reduce(x, Ops.ADD, (1,)), st(rows, 1)), store(2, reduce(x, Ops.MAX, (1,)), st(rows, 1)))
    out, spec = run_python(ast, py.PythonRenderer(), [], {1: a})
    assert Ops.DEFINE_ACC not in {u.op for u in spec.uops}
    np.testing.assert_array_equal(out[0], (a.astype(np.float64) * n).astype(np.float32))
    np.testing.assert_array_equal(out[2], a)
    # padded: the value depends on the loop (zero past the pad), so it stays a loop
    padded = load(1, dtypes.float32, st(rows, 1).expand((rows, n)).pad(((0, 0), (0, 5))), size=rows)
    ast = sink(store(0, reduce(padded, Ops.ADD, (1,)), st(rows, 1)))
    out, spec = run_python(ast, py.PythonRenderer(), [], {1: a})
    assert Ops.DEFINE_ACC in {u.op for u in spec.uops}
    np.testing.assert_allclose(out[0], a * n, rtol=1e-6)
