"""The C renderer's output, compiled with the system C compiler and called through ctypes, against numpy; and the
GPU-shaped path (output axes on hardware indices), run over its grid from the host."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad_codegen import CRenderer, get_program
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops

RNG = np.random.default_rng(7)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_elementwise_broadcast(run_cc, k) -> None:
    a, b = _f32(4, 1), _f32(1, 6)
    x = k.load(1, dtypes.float32, k.st(4, 1).expand((4, 6)))
    y = k.load(2, dtypes.float32, k.st(1, 6).expand((4, 6)))
    out = run_cc(k.sink(k.store(0, x * y + k.const(0.5, dtypes.float32, k.st(4, 6)), k.st(4, 6))), {1: a, 2: b})[0]
    np.testing.assert_allclose(out.reshape(4, 6), a * b + 0.5, rtol=1e-6)


def test_padded_flipped_permuted(run_cc, k) -> None:
    a = _f32(3, 5)
    st = k.st(3, 5).permute((1, 0)).flip((True, False)).pad(((100, 200), (1, 0)))
    out = run_cc(k.sink(k.store(0, k.load(1, dtypes.float32, st, size=15), k.st(305, 4))), {1: a})[0]
    np.testing.assert_array_equal(out.reshape(305, 4), np.pad(a.T[::-1], ((100, 200), (1, 0))))


@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX, Ops.MUL], ids=str)
def test_reduce(run_cc, k, op: Ops) -> None:
    a = _f32(5, 7) * 0.5 + 1
    a[2, 3] = np.nan if op is Ops.MAX else a[2, 3]
    red = k.reduce(k.load(1, dtypes.float32, k.st(5, 7)), op, (0,))
    out = run_cc(k.sink(k.store(0, red, k.st(1, 7))), {1: a})[0]
    ref = {Ops.ADD: np.sum, Ops.MAX: np.max, Ops.MUL: np.prod}[op](a, axis=0)
    np.testing.assert_allclose(out, ref, rtol=1e-5)


def test_matmul_and_second_store(run_cc, k) -> None:
    m, kk, n = 4, 9, 3
    a, b = _f32(m, kk), _f32(kk, n)
    sa = k.st(m, 1, kk).expand((m, n, kk))
    sb = k.st(kk, n).permute((1, 0)).reshape((1, n, kk)).expand((m, n, kk))
    prod = k.load(1, dtypes.float32, sa, size=m * kk) * k.load(2, dtypes.float32, sb, size=kk * n)
    acc = k.reduce(prod, Ops.ADD, (2,))
    outs = run_cc(k.sink(k.store(0, acc, k.st(m, n, 1)), k.store(3, acc.maximum(0.0), k.st(m, n, 1))), {1: a, 2: b})
    np.testing.assert_allclose(outs[0].reshape(m, n), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[3].reshape(m, n), np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)


def test_integer_semantics(run_cc, k) -> None:
    a = RNG.integers(-100, 100, 20).astype(np.int32)
    b = RNG.integers(1, 9, 20).astype(np.int32) * np.where(RNG.integers(0, 2, 20) == 1, 1, -1).astype(np.int32)
    st = k.st(20)
    x, y = k.load(1, dtypes.int32, st), k.load(2, dtypes.int32, st)
    small = x.cast(dtypes.uint8)
    ast = k.sink(
        k.store(0, x.alu(Ops.IDIV, y), st),
        k.store(3, x.alu(Ops.MOD, y), st),
        k.store(4, (small + small).cast(dtypes.int32) // 2, st),  # uint8 arithmetic wraps before the division
    )
    outs = run_cc(ast, {1: a, 2: b})
    np.testing.assert_array_equal(outs[0], (np.abs(a) // np.abs(b)) * np.sign(a * b))
    np.testing.assert_array_equal(outs[3], np.fmod(a, b))
    au8 = a.astype(np.uint8)
    np.testing.assert_array_equal(outs[4], (au8 + au8).astype(np.int32) // 2)


def test_casts_and_bitcast(run_cc, k) -> None:
    a = _f32(16) * 50
    a[:3] = [np.nan, 0.0, -0.0]
    st = k.st(16)
    x = k.load(1, dtypes.float32, st)
    ast = k.sink(
        k.store(0, x.cast(dtypes.bool), st),
        k.store(2, x.bitcast(dtypes.int32), st),
        k.store(3, x.cast(dtypes.float64), st),
        k.store(4, k.load(5, dtypes.float32, k.st(16)).cast(dtypes.int8), st),
        k.store(6, x.cast(dtypes.float16), st),
    )
    small = (_f32(16) * 40).astype(np.float32)
    outs = run_cc(ast, {1: a, 5: small})
    np.testing.assert_array_equal(outs[0], a.astype(np.bool_))
    np.testing.assert_array_equal(outs[2], a.view(np.int32))
    np.testing.assert_array_equal(outs[3], a.astype(np.float64))
    np.testing.assert_array_equal(outs[4], small.astype(np.int8))
    np.testing.assert_array_equal(outs[6], a.astype(np.float16))


def test_unary_math(run_cc, k) -> None:
    a = np.abs(_f32(12)) + 0.25
    st = k.st(12)
    x = k.load(1, dtypes.float32, st)
    ops = [Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC]
    outs = run_cc(k.sink(*(k.store(i + 2, x.alu(op), st) for i, op in enumerate(ops))), {1: a})
    for i, ref in enumerate([np.exp2(a), np.log2(a), np.sin(a), np.sqrt(a), 1 / a, np.trunc(a)]):
        np.testing.assert_allclose(outs[i + 2], ref, rtol=1e-6, err_msg=str(ops[i]))


def test_symbolic_variable_parameter(run_cc, k) -> None:
    from lazygrad_uop.uop import UOp

    n = UOp.variable("n", 1, 32)
    st = k.st(n)
    a = _f32(32)
    out = run_cc(k.sink(k.store(0, k.load(1, dtypes.float32, st, size=32) + 1.0, st, size=32)), {1: a}, vals=(7,))[0]
    np.testing.assert_array_equal(out[:7], a[:7] + 1)
    np.testing.assert_array_equal(out[7:], 0)


def test_c_renderer_signature(k) -> None:
    st = k.st(8)
    spec = get_program(k.sink(k.store(0, k.load(1, dtypes.int64, st) * 3, st)), CRenderer())
    assert f"void {spec.name}(long long* data0, long long* data1)" in spec.src
    assert "for (int ridx0 = 0; ridx0 < 8; ridx0++)" in spec.src


# *** GPU-shaped: output axes on hardware indices ***


def test_grid_kernel_uses_hardware_indices(run_cc, k) -> None:
    a = _f32(3, 4, 5)
    st = k.st(3, 4, 5)
    out = run_cc(
        k.sink(k.store(0, k.load(1, dtypes.float32, st.permute((2, 1, 0)), size=60), k.st(5, 4, 3))), {1: a}, grid=True
    )
    np.testing.assert_array_equal(out[0].reshape(5, 4, 3), a.transpose(2, 1, 0))


def test_grid_kernel_collapses_extra_dims_into_the_last(run_cc, k) -> None:
    shape = (2, 3, 4, 5, 6)
    a = _f32(*shape)
    st = k.st(*shape)
    x = k.load(1, dtypes.float32, st.flip((True, False, True, False, True)), size=a.size)
    out = run_cc(k.sink(k.store(0, x, st)), {1: a}, grid=True)[0]
    np.testing.assert_array_equal(out.reshape(shape), a[::-1, :, ::-1, :, ::-1])


def test_grid_kernel_with_reduce_loop(run_cc, k) -> None:
    a = _f32(6, 5, 7)
    red = k.reduce(k.load(1, dtypes.float32, k.st(6, 5, 7)), Ops.ADD, (1,))
    out = run_cc(k.sink(k.store(0, red, k.st(6, 1, 7))), {1: a}, grid=True)[0]
    np.testing.assert_allclose(out.reshape(6, 7), a.sum(axis=1), rtol=1e-5)
