"""Kernel counts and fusion: what the issue promises about how a graph is cut, checked through Tensor."""

from __future__ import annotations

import numpy as np

from lazygrad import Tensor
from lazygrad_uop.ops import Ops


def stores(items: list) -> int:
    return sum(1 for si in items for s in si.ast.toposort if s.op is Ops.STORE)


def rnd(*shape: int) -> Tensor:
    return Tensor(np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32))


def test_elementwise_chain_is_one_kernel() -> None:
    a, b, c = rnd(8, 8), rnd(8, 8), rnd(8, 8)
    out = a * b + c
    assert len(out.schedule()) == 1
    np.testing.assert_allclose(out.numpy(), a.numpy() * b.numpy() + c.numpy(), rtol=1e-6)


def test_fused_reduce_is_one_kernel() -> None:
    x = rnd(64, 32)
    out = (x * 2 + 1).sum()
    assert len(out.schedule()) == 1
    np.testing.assert_allclose(out.numpy(), (x.numpy() * 2 + 1).sum(), rtol=1e-5)


def test_matmul_is_one_kernel() -> None:
    a, b = rnd(16, 8), rnd(8, 12)
    out = a @ b
    assert len(out.schedule()) == 1
    np.testing.assert_allclose(out.numpy(), a.numpy() @ b.numpy(), rtol=1e-5, atol=1e-5)


def test_epilogue_fuses_into_reduce() -> None:
    x, y = rnd(16, 8), rnd(16)
    out = (x.sum(1) + y).relu()
    assert len(out.schedule()) == 1
    np.testing.assert_allclose(out.numpy(), np.maximum(x.numpy().sum(1) + y.numpy(), 0), rtol=1e-5)


def test_softmax_at_most_three_kernels() -> None:
    x = rnd(8, 16)
    e = (x - x.max(-1, keepdim=True)).exp()
    out = e / e.sum(-1, keepdim=True)
    assert len(out.schedule()) <= 3
    ref = np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), ref / ref.sum(-1, keepdims=True), rtol=1e-5)


def test_shared_elementwise_is_recomputed_not_stored() -> None:
    a, b, c, d = rnd(32), rnd(32), rnd(32), rnd(32)
    ab = a + b
    out1, out2 = ab + c, ab + d
    items = out1.schedule(out2)
    # a+b is never stored: only the two outputs are
    assert stores(items) == 2
    Tensor.realize(out1, out2)
    np.testing.assert_allclose(out1.numpy(), a.numpy() + b.numpy() + c.numpy(), rtol=1e-6)
    np.testing.assert_allclose(out2.numpy(), a.numpy() + b.numpy() + d.numpy(), rtol=1e-6)


def test_same_shape_outputs_share_a_kernel() -> None:
    a, b = rnd(16), rnd(16)
    assert len((a + b).schedule(a * b)) == 1


def test_movement_ops_do_not_copy() -> None:
    x = rnd(4, 6).realize()
    out = x.T.flip(0).pad(((1, 1), (0, 2)))[1:4] * 3
    assert len(out.schedule()) == 1
    ref = np.pad(np.flip(x.numpy().T, 0), ((1, 1), (0, 2)))[1:4] * 3
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)


def test_kernelize_gives_assign_of_buffer_and_kernel() -> None:
    a, b = rnd(4, 4), rnd(4, 4)
    out = (a + b).kernelize()
    assert out.uop.op is Ops.ASSIGN and out.uop.src[1].op is Ops.KERNEL
    assert out.uop.src[0].src[0].op is Ops.BUFFER
    child = out * 2
    child.kernelize()
    ast = child.uop.src[1].arg.ast
    loads = [u for u in ast.toposort if u.op is Ops.LOAD]
    assert len(loads) == 1, "the child reads the kernelized buffer, it doesn't recompute a+b"
    out.kernelize()  # again: nothing changes
    assert out.uop.op is Ops.ASSIGN
    np.testing.assert_allclose(child.numpy(), (a.numpy() + b.numpy()) * 2, rtol=1e-6)


def test_realize_reuses_results() -> None:
    a = rnd(8)
    b = a + 1
    c = b * 2
    b.realize()
    assert len(c.schedule()) == 1
    np.testing.assert_allclose(c.numpy(), (a.numpy() + 1) * 2, rtol=1e-6)


def test_assign_orders_reads_of_the_old_value_first() -> None:
    a = rnd(16).realize()
    old = a.numpy().copy()
    doubled = a * 2  # reads the old value
    a.assign(a + 1)
    Tensor.realize(a, doubled)
    np.testing.assert_allclose(doubled.numpy(), old * 2, rtol=1e-6)
    np.testing.assert_allclose(a.numpy(), old + 1, rtol=1e-6)
    after = a * 3  # built after the assign: reads the new value
    np.testing.assert_allclose(after.numpy(), (old + 1) * 3, rtol=1e-6)


def test_assign_in_place_reuses_the_buffer() -> None:
    a = rnd(8).realize()
    before = a._buffer_view()[0]
    for _ in range(3):
        a.assign(a * 2).realize()
    assert a._buffer_view()[0] is before


def test_assign_that_reads_other_elements_of_its_target_is_not_done_in_place() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    sq = np.arange(16, dtype=np.float32).reshape(4, 4)
    cases = [
        (sq, lambda t: t.T, lambda r: r.T),
        (x, lambda t: t.flip(0) * 2, lambda r: np.flip(r, 0) * 2),
        (x, lambda t: t + t.sum(1, keepdim=True), lambda r: r + r.sum(1, keepdims=True)),
        (x, lambda t: t.pad(((1, 0), (0, 0)))[:3], lambda r: np.pad(r, ((1, 0), (0, 0)))[:3]),
    ]
    for data, f, ref in cases:
        t = Tensor(data).realize()
        t.assign(f(t)).realize()
        np.testing.assert_array_equal(t.numpy(), ref(data))


def test_elementwise_assign_stays_one_kernel() -> None:
    t = rnd(8, 8).realize()
    t.assign(t * 2 + 1)
    assert len(t.schedule()) == 1


def test_pad_of_a_value_that_is_not_zero_at_zero() -> None:
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_allclose(Tensor(x).exp().pad(((1, 1),)).numpy(), np.pad(np.exp(x), 1), rtol=1e-6)
    np.testing.assert_allclose(Tensor(x).reciprocal().pad(((1, 0),)).numpy(), np.pad(1 / x, (1, 0)), rtol=1e-6)
    np.testing.assert_allclose(Tensor(x).log2().pad(((0, 2),)).numpy(), np.pad(np.log2(x), (0, 2)), rtol=1e-6)
    # ops that keep 0 at 0 still fuse the pad into one kernel
    assert len((Tensor(x) * 2 + 1).pad(((1, 1),)).schedule()) == 1


def _kernels_computing(items: list, op: Ops) -> list:
    """The schedule items whose kernel computes `op`."""
    return [si for si in items if any(u.op is op for u in si.ast.toposort)]


def test_gelu_before_a_matmul_is_computed_once_per_element() -> None:
    x, w = rnd(1, 64), rnd(64, 32)
    out = x.gelu(approximate="tanh") @ w
    items = out.schedule()
    # the gelu in an elementwise kernel of its own, the matmul reading it: not recomputed for each of its 32 columns
    assert len(items) == 2
    (gelu,) = _kernels_computing(items, Ops.EXP2)
    assert not _kernels_computing([gelu], Ops.REDUCE_AXIS)
    xn = x.numpy()
    ref = 0.5 * xn * (1 + np.tanh(np.sqrt(2 / np.pi) * (xn + 0.044715 * xn**3))) @ w.numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_exp_before_a_matmul_is_computed_once_per_element() -> None:
    x, w = rnd(4, 32), rnd(32, 48)
    out = (x.exp() * 2) @ w
    items = out.schedule()
    assert len(items) == 2
    (exp,) = _kernels_computing(items, Ops.EXP2)
    assert not _kernels_computing([exp], Ops.REDUCE_AXIS)
    np.testing.assert_allclose(out.numpy(), (np.exp(x.numpy()) * 2) @ w.numpy(), rtol=1e-5, atol=1e-5)


def test_cheap_producers_still_fuse() -> None:
    x, w = rnd(4, 16), rnd(16, 24)
    scaled = (x * 2) @ w
    assert len(scaled.schedule()) == 1
    np.testing.assert_allclose(scaled.numpy(), (x.numpy() * 2) @ w.numpy(), rtol=1e-5, atol=1e-5)
    total = x.exp().sum()  # not broadcast: each exp is computed once either way
    assert len(total.schedule()) == 1
    np.testing.assert_allclose(total.numpy(), np.exp(x.numpy()).sum(), rtol=1e-5)


def test_attention_weights_are_computed_once_per_element() -> None:
    q, k = rnd(2, 8, 16), rnd(2, 12, 16)
    v = Tensor(np.random.default_rng(7).standard_normal((2, 12, 16)).astype(np.float32))
    out = (q @ k.transpose(1, 2) * 0.25).softmax(-1) @ v
    items = out.schedule()
    # scores, max and sum (one kernel, one loop over the row after the other), weights, weights @ v: the same
    # kernels as with .contiguous() after the softmax
    assert len(items) == 4
    assert not _kernels_computing(items[-1:], Ops.EXP2)
    s = q.numpy() @ k.numpy().transpose(0, 2, 1) * 0.25
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True) @ v.numpy(), rtol=1e-5, atol=1e-5)
