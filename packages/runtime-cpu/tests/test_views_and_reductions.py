"""Kernels whose loads go through movement ops (broadcast, permute, pad with masks, shrink, flip, stacked views),
reductions over different axes, matmul, kernels with several stores, empty and size-1 dims, and symbolic sizes,
run on the CPU device and checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

RNG = np.random.default_rng(99)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_broadcast_add(run, k) -> None:
    a, b = _f32(5, 1), _f32(1, 7)
    out_st = k.st(5, 7)
    x = k.load(1, dtypes.float32, k.st(5, 1).expand((5, 7)))
    y = k.load(2, dtypes.float32, k.st(1, 7).expand((5, 7)))
    out = run(k.sink(k.store(0, x + y, out_st)), {1: a, 2: b})[0]
    np.testing.assert_allclose(out.reshape(5, 7), a + b, rtol=1e-6)


def test_permute_and_flip(run, k) -> None:
    a = _f32(3, 4, 5)
    st = k.st(3, 4, 5).permute((2, 0, 1)).flip((True, False, True))
    out = run(k.sink(k.store(0, k.load(1, dtypes.float32, st), k.st(5, 3, 4))), {1: a})[0]
    np.testing.assert_array_equal(out.reshape(5, 3, 4), a.transpose(2, 0, 1)[::-1, :, ::-1])


def test_pad_is_masked_and_never_reads_out_of_bounds(run, k) -> None:
    a = _f32(4, 3)
    # a large pad: unmasked, the padded coordinates would index far outside the 12-element buffer
    st = k.st(4, 3).pad(((1000, 2000), (2, 1)))
    x = k.load(1, dtypes.float32, st, size=12)
    out_st = k.st(3004, 6)
    out = run(k.sink(k.store(0, x + k.const(1.0, dtypes.float32, out_st), out_st)), {1: a})[0]
    np.testing.assert_array_equal(out.reshape(3004, 6), np.pad(a, ((1000, 2000), (2, 1))) + 1)


def test_masked_const(run, k) -> None:
    st = k.st(2, 3).pad(((1, 1), (0, 2)))
    out = run(k.sink(k.store(0, k.const(7, dtypes.int32, st), k.st(4, 5))), {})[0]
    np.testing.assert_array_equal(out.reshape(4, 5), np.pad(np.full((2, 3), 7, dtype=np.int32), ((1, 1), (0, 2))))


def test_shrink_of_padded_view(run, k) -> None:
    a = _f32(6, 6)
    st = k.st(6, 6).shrink(((1, 5), (2, 6))).pad(((2, 0), (0, 3))).flip((False, True))
    out = run(k.sink(k.store(0, k.load(1, dtypes.float32, st, size=36), k.st(6, 7))), {1: a})[0]
    np.testing.assert_array_equal(out.reshape(6, 7), np.pad(a[1:5, 2:6], ((2, 0), (0, 3)))[:, ::-1])


def test_reshape_of_transpose_needs_two_views(run, k) -> None:
    a = _f32(4, 6)
    st = k.st(4, 6).permute((1, 0)).reshape((3, 8))
    assert len(st.views) == 2
    out = run(k.sink(k.store(0, k.load(1, dtypes.float32, st, size=24), k.st(3, 8))), {1: a})[0]
    np.testing.assert_array_equal(out.reshape(3, 8), a.T.reshape(3, 8))


@pytest.mark.parametrize("axes", [(0,), (1,), (2,), (0, 2), (0, 1, 2)], ids=str)
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX, Ops.MUL], ids=str)
def test_reduce(run, k, op: Ops, axes: tuple[int, ...]) -> None:
    shape = (3, 5, 4)
    a = _f32(*shape) * 0.5 + 1
    full = k.st(*shape)
    red = k.reduce(k.load(1, dtypes.float32, full), op, axes)
    out_shape = tuple(1 if i in axes else s for i, s in enumerate(shape))
    out = run(k.sink(k.store(0, red, k.st(*out_shape))), {1: a})[0]
    ref = {Ops.ADD: np.sum, Ops.MAX: np.max, Ops.MUL: np.prod}[op](a, axis=axes, keepdims=True)
    np.testing.assert_allclose(out.reshape(out_shape), ref, rtol=1e-5)


@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX, Ops.MUL], ids=str)
def test_integer_reduce(run, k, op: Ops) -> None:
    a = RNG.integers(-5, 6, (6, 8)).astype(np.int32)
    red = k.reduce(k.load(1, dtypes.int32, k.st(6, 8)), op, (1,))
    out = run(k.sink(k.store(0, red, k.st(6, 1))), {1: a})[0]
    ref = {Ops.ADD: np.sum, Ops.MAX: np.max, Ops.MUL: np.prod}[op](a, axis=1).astype(np.int32)
    np.testing.assert_array_equal(out, ref)


def test_bool_reduce_is_any_and_all(run, k) -> None:
    a = RNG.integers(0, 2, (5, 3)).astype(np.bool_)
    a[0] = True
    a[1] = False
    x = k.load(1, dtypes.bool, k.st(5, 3))
    ast = k.sink(k.store(0, k.reduce(x, Ops.MAX, (1,)), k.st(5, 1)), k.store(2, k.reduce(x, Ops.MUL, (1,)), k.st(5, 1)))
    outs = run(ast, {1: a})
    np.testing.assert_array_equal(outs[0], a.any(axis=1))
    np.testing.assert_array_equal(outs[2], a.all(axis=1))


def test_max_reduce_propagates_nan(run, k) -> None:
    a = _f32(4, 9)
    a[1, 3] = np.nan
    a[2, 0] = np.nan
    red = k.reduce(k.load(1, dtypes.float32, k.st(4, 9)), Ops.MAX, (1,))
    out = run(k.sink(k.store(0, red, k.st(4, 1))), {1: a})[0]
    np.testing.assert_array_equal(out, np.max(a, axis=1))


def test_matmul(run, k) -> None:
    m, kk, n = 7, 13, 5
    a, b = _f32(m, kk), _f32(kk, n)
    # (M, N, K): A broadcast over N, B transposed and broadcast over M
    sa = k.st(m, 1, kk).expand((m, n, kk))
    sb = k.st(kk, n).permute((1, 0)).reshape((1, n, kk)).expand((m, n, kk))
    prod = k.load(1, dtypes.float32, sa, size=m * kk) * k.load(2, dtypes.float32, sb, size=kk * n)
    out = run(k.sink(k.store(0, k.reduce(prod, Ops.ADD, (2,)), k.st(m, n, 1))), {1: a, 2: b})[0]
    np.testing.assert_allclose(out.reshape(m, n), a @ b, rtol=1e-5, atol=1e-5)


def test_reduce_then_elementwise_and_several_stores(run, k) -> None:
    a, b = _f32(6, 10), _f32(6, 1)
    x = k.load(1, dtypes.float32, k.st(6, 10))
    out_st = k.st(6, 1)
    y = k.load(2, dtypes.float32, out_st)
    s, mx = k.reduce(x, Ops.ADD, (1,)), k.reduce(x, Ops.MAX, (1,))
    ast = k.sink(k.store(0, s * y + mx, out_st), k.store(3, mx, out_st), k.store(4, y + y, out_st))
    outs = run(ast, {1: a, 2: b})
    np.testing.assert_allclose(outs[0].reshape(6, 1), a.sum(1, keepdims=True) * b + a.max(1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(outs[3].reshape(6, 1), a.max(1, keepdims=True))
    np.testing.assert_array_equal(outs[4].reshape(6, 1), b + b)


def test_softmax_like_kernel_reads_input_above_and_below_the_reduce(run, k) -> None:
    a = _f32(4, 6)
    full = k.st(4, 6)
    out_st = k.st(4, 1)
    x = k.load(1, dtypes.float32, full)
    m = k.reduce(x, Ops.MAX, (1,))
    first = k.load(1, dtypes.float32, k.st(4, 6).shrink(((0, 4), (0, 1))), size=24)
    out = run(k.sink(k.store(0, first - m, out_st)), {1: a})[0]
    np.testing.assert_allclose(out.reshape(4, 1), a[:, :1] - a.max(1, keepdims=True), rtol=1e-6)


def test_sum_of_a_constant(run, k) -> None:
    out = run(k.sink(k.store(0, k.reduce(k.const(1, dtypes.int32, k.st(3, 17)), Ops.ADD, (1,)), k.st(3, 1))), {})[0]
    np.testing.assert_array_equal(out, [17, 17, 17])


def test_size_one_dims(run, k) -> None:
    a = _f32(1, 5, 1)
    full = k.st(1, 5, 1)
    x = k.load(1, dtypes.float32, full)
    ast = k.sink(k.store(0, k.reduce(x * x, Ops.ADD, (0, 2)), k.st(1, 5, 1)))
    out = run(ast, {1: a})[0]
    np.testing.assert_allclose(out, (a * a).reshape(5), rtol=1e-6)


def test_zero_size_output(run, k) -> None:
    st = k.st(0, 4)
    out = run(k.sink(k.store(0, k.load(1, dtypes.float32, st, size=0) + k.const(1.0, dtypes.float32, st), st)), {})
    assert out[0].size == 0


@pytest.mark.parametrize(("op", "identity"), [(Ops.ADD, 0.0), (Ops.MAX, -np.inf), (Ops.MUL, 1.0)], ids=str)
def test_reduce_over_an_empty_axis_gives_the_identity(run, k, op: Ops, identity: float) -> None:
    red = k.reduce(k.load(1, dtypes.float32, k.st(3, 0), size=0), op, (1,))
    out = run(k.sink(k.store(0, red, k.st(3, 1))), {})[0]
    np.testing.assert_array_equal(out, np.full(3, identity, dtype=np.float32))


def test_symbolic_size(run, k) -> None:
    n = UOp.variable("n", 1, 64)
    st = k.st(n, 3)
    a = _f32(64, 3)
    x = k.load(1, dtypes.float32, st, size=64 * 3)
    ast = k.sink(k.store(0, x * k.const(2.0, dtypes.float32, st), st, size=64 * 3))
    out = run(ast, {1: a, 0: np.zeros((64, 3), np.float32)}, vals=(10,))[0]
    np.testing.assert_array_equal(out.reshape(64, 3)[:10], a[:10] * 2)
    np.testing.assert_array_equal(out.reshape(64, 3)[10:], 0)
