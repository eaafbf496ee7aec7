"""Autograd against torch: the gradient of every primitive and of composite ops, forward and backward, on random
inputs of several shapes; requires_grad, backward, gradient, detach and the no-grad and training modes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from lazygrad import Tensor, dtypes, no_grad
from lazygrad_uop.ops import Ops

torch = pytest.importorskip("torch")

SHAPES = [(5,), (3, 4), (2, 3, 4)]


def rand(shape: tuple[int, ...], seed: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def check_grad(
    fn: Callable[..., Tensor],
    tfn: Callable[..., torch.Tensor],
    inputs: list[np.ndarray],
    device: str | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> None:
    """fn and its gradient for every input, with a random upstream gradient, equal torch's tfn."""
    xs = [Tensor(a, device=device, requires_grad=True) for a in inputs]
    ts = [torch.tensor(a, requires_grad=True) for a in inputs]
    out, tout = fn(*xs), tfn(*ts)
    seed = rand(tuple(tout.shape), 99)
    # backward before reading `out`: realizing a tensor replaces its graph by the stored result
    (out * Tensor(seed, device=device)).sum().backward()
    (tout * torch.tensor(seed)).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=rtol, atol=atol)
    for i, (x, t) in enumerate(zip(xs, ts)):
        assert x.grad is not None, f"input {i} got no gradient"
        assert x.grad.shape == x.shape
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=rtol, atol=atol, err_msg=f"input {i}")


# *** primitives: each op of the tensor graph with a gradient rule ***

UNARY = {
    "neg": (lambda x: -x, lambda x: -x, None),
    "reciprocal": (lambda x: x.reciprocal(), lambda x: x.reciprocal(), (0.5, 2.0)),
    "exp2": (lambda x: x.exp2(), lambda x: x.exp2(), None),
    "log2": (lambda x: x.log2(), lambda x: x.log2(), (0.1, 3.0)),
    "sin": (lambda x: x.sin(), lambda x: x.sin(), None),
    "sqrt": (lambda x: x.sqrt(), lambda x: x.sqrt(), (0.1, 3.0)),
    "cast_f64": (lambda x: x.cast(dtypes.float64), lambda x: x.double(), None),
    "cast_f16": (lambda x: x.cast(dtypes.float16).cast(dtypes.float32), lambda x: x.half().float(), None),
    "contiguous": (lambda x: x.contiguous() * 2, lambda x: x.contiguous() * 2, None),
    "trunc": (lambda x: x.trunc() + x, lambda x: x.trunc() + x, None),
}


@pytest.mark.parametrize("name", list(UNARY))
@pytest.mark.parametrize("shape", SHAPES)
def test_unary(name: str, shape: tuple[int, ...]) -> None:
    fn, tfn, rng = UNARY[name]
    low, high = rng or (-2.0, 2.0)
    tol = {"rtol": 2e-3, "atol": 2e-3} if "f16" in name else {}
    check_grad(fn, tfn, [rand(shape, len(shape), low, high)], **tol)


BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "maximum": (lambda a, b: a.maximum(b), lambda a, b: torch.maximum(a, b)),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "div": (lambda a, b: a / (b.abs() + 0.5), lambda a, b: a / (b.abs() + 0.5)),
    "where": (lambda a, b: (a < b).where(a * 2, b * 3), lambda a, b: torch.where(a < b, a * 2, b * 3)),
    "minimum": (lambda a, b: a.minimum(b), lambda a, b: torch.minimum(a, b)),
}


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("shape", SHAPES)
def test_binary(name: str, shape: tuple[int, ...]) -> None:
    fn, tfn = BINARY[name]
    check_grad(fn, tfn, [rand(shape, 1), rand(shape, 2)])


def test_maximum_ties_split_the_gradient() -> None:
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = np.array([1.0, 0.0, 3.0], np.float32)
    check_grad(lambda x, y: x.maximum(y), lambda x, y: torch.maximum(x, y), [a, b])


def test_broadcasting_sums_over_expanded_axes() -> None:
    check_grad(lambda a, b: a * b + b, lambda a, b: a * b + b, [rand((3, 4), 1), rand((4,), 2)])
    check_grad(lambda a, b: a - b, lambda a, b: a - b, [rand((2, 1, 4), 1), rand((3, 1), 2)])


REDUCE = {
    "sum_all": (lambda x: x.sum(), lambda x: x.sum()),
    "sum_0": (lambda x: x.sum(0), lambda x: x.sum(0)),
    "sum_last_keep": (lambda x: x.sum(-1, keepdim=True), lambda x: x.sum(-1, keepdim=True)),
    "max_all": (lambda x: x.max(), lambda x: x.amax()),
    "max_last": (lambda x: x.max(-1), lambda x: x.amax(-1)),
    "min_0": (lambda x: x.min(0), lambda x: x.amin(0)),
    "prod_0": (lambda x: x.prod(0), lambda x: x.prod(0)),
    "mean_last": (lambda x: x.mean(-1), lambda x: x.mean(-1)),
}


@pytest.mark.parametrize("name", list(REDUCE))
@pytest.mark.parametrize("shape", SHAPES)
def test_reduce(name: str, shape: tuple[int, ...]) -> None:
    fn, tfn = REDUCE[name]
    check_grad(fn, tfn, [rand(shape, 3)])


def test_max_ties_split_the_gradient_evenly() -> None:
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], np.float32)
    check_grad(lambda t: t.max(-1), lambda t: t.amax(-1), [x])
    check_grad(lambda t: t.max(), lambda t: t.amax(), [x])


MOVEMENT = {
    "reshape": (lambda x: x.reshape(2, -1), lambda x: x.reshape(2, -1)),
    "expand": (lambda x: x.reshape(1, 2, 12).expand(3, 2, 12), lambda x: x.reshape(1, 2, 12).expand(3, 2, 12)),
    "permute": (lambda x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1)),
    "transpose": (lambda x: x.transpose(0, 2), lambda x: x.transpose(0, 2)),
    "pad": (lambda x: x.pad(((1, 0), (0, 2), (1, 1))), lambda x: torch.nn.functional.pad(x, (1, 1, 0, 2, 1, 0))),
    "shrink": (lambda x: x.shrink(((0, 1), (1, 3), (2, 4))), lambda x: x[0:1, 1:3, 2:4]),
    "flip": (lambda x: x.flip(0, 2), lambda x: x.flip(0, 2)),
    "slice_step": (lambda x: x[:, ::2, 1:], lambda x: x[:, ::2, 1:]),
    "index": (lambda x: x[1, :, -1], lambda x: x[1, :, -1]),
}


@pytest.mark.parametrize("name", list(MOVEMENT))
def test_movement(name: str) -> None:
    fn, tfn = MOVEMENT[name]
    check_grad(fn, tfn, [rand((2, 3, 4), 4)])


def test_pad_with_value_and_negative_pad() -> None:
    check_grad(
        lambda x: x.pad(((1, -1), (2, 0)), value=3.0),
        lambda x: torch.nn.functional.pad(x, (2, 0, 1, -1), value=3.0),
        [rand((3, 4), 5)],
    )


# *** composite ops ***

COMPOSITE = {
    "exp": (lambda x: x.exp(), lambda x: x.exp()),
    "log": (lambda x: (x.abs() + 0.1).log(), lambda x: (x.abs() + 0.1).log()),
    "relu": (lambda x: x.relu(), lambda x: x.relu()),
    "sigmoid": (lambda x: x.sigmoid(), lambda x: x.sigmoid()),
    "tanh": (lambda x: x.tanh(), lambda x: x.tanh()),
    "cos": (lambda x: x.cos(), lambda x: x.cos()),
    "tan": (lambda x: (x * 0.5).tan(), lambda x: (x * 0.5).tan()),
    "rsqrt": (lambda x: (x.square() + 0.5).rsqrt(), lambda x: (x.square() + 0.5).rsqrt()),
    "abs": (lambda x: x.abs(), lambda x: x.abs()),
    "square": (lambda x: x.square(), lambda x: x.square()),
    "softmax": (
        lambda x: (x - x.max(-1, keepdim=True)).exp() / (x - x.max(-1, keepdim=True)).exp().sum(-1, keepdim=True),
        lambda x: x.softmax(-1),
    ),
    "log_softmax": (
        lambda x: x - x.max(-1, keepdim=True) - (x - x.max(-1, keepdim=True)).exp().sum(-1, keepdim=True).log(),
        lambda x: x.log_softmax(-1),
    ),
    "floor_ceil": (lambda x: x.floor() + x.ceil() + x, lambda x: x.floor() + x.ceil() + x),
}


@pytest.mark.parametrize("name", list(COMPOSITE))
@pytest.mark.parametrize("shape", SHAPES)
def test_composite(name: str, shape: tuple[int, ...]) -> None:
    fn, tfn = COMPOSITE[name]
    check_grad(fn, tfn, [rand(shape, 6)])


@pytest.mark.parametrize(
    "shapes", [((4, 3), (3, 5)), ((3,), (3, 2)), ((2, 4, 3), (3, 2)), ((2, 4, 3), (2, 3, 5)), ((2, 1, 3, 4), (5, 4, 2))]
)
def test_matmul(shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    check_grad(lambda a, b: a @ b, lambda a, b: a @ b, [rand(shapes[0], 7), rand(shapes[1], 8)])


def test_mlp_and_cross_entropy() -> None:
    labels = np.array([0, 2, 1, 2])
    onehot = Tensor(np.eye(3, dtype=np.float32)[labels])

    def fn(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
        z = (x @ w1).relu() @ w2
        return -((z - z.exp().sum(-1, keepdim=True).log()) * onehot).sum(-1).mean()

    def tfn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy((x @ w1).relu() @ w2, torch.tensor(labels))

    check_grad(fn, tfn, [rand((4, 5), 1), rand((5, 6), 2), rand((6, 3), 3)])


def test_used_twice_and_through_several_paths() -> None:
    check_grad(lambda a: a * a + a.exp() * a, lambda a: a * a + a.exp() * a, [rand((3, 3), 9)])
    check_grad(lambda a, b: (a @ b) * a.sum(), lambda a, b: (a @ b) * a.sum(), [rand((3, 3), 1), rand((3, 3), 2)])


def test_float16_gradients() -> None:
    x = rand((4, 4), 11)
    a = Tensor(x, dtype=dtypes.float16, requires_grad=True)
    (a * a).sum().backward()
    assert a.grad is not None and a.grad.dtype == dtypes.float16
    np.testing.assert_allclose(a.grad.numpy().astype(np.float32), 2 * x.astype(np.float16), rtol=2e-3)


# *** the PYTHON device (and every other op-suite device) ***


def test_gradients_on_each_device(device: str) -> None:
    check_grad(
        lambda a, b: (a @ b).relu().sum(0),
        lambda a, b: (a @ b).relu().sum(0),
        [rand((3, 4), 1), rand((4, 2), 2)],
        device,
    )
    check_grad(
        lambda a: a.max(-1) + a.sigmoid().sum(-1), lambda a: a.amax(-1) + a.sigmoid().sum(-1), [rand((2, 5), 3)], device
    )
    check_grad(
        lambda a: a.pad(((1, 0), (0, 1))).flip(1)[:, 1:].permute(1, 0).sqrt(),
        lambda a: torch.nn.functional.pad(a, (0, 1, 1, 0)).flip(1)[:, 1:].permute(1, 0).sqrt(),
        [rand((2, 3), 4, 0.5, 2.0)],
        device,
    )


# *** semantics of requires_grad, backward, gradient, detach, no_grad, train ***


def test_backward_fills_grad_of_requires_grad_tensors_only() -> None:
    a = Tensor([1.0, 2.0], requires_grad=True)
    b = Tensor([3.0, 4.0])  # None: undecided, not differentiated by backward
    c = Tensor([5.0, 6.0], requires_grad=False)
    (a * b * c).sum().backward()
    assert a.grad is not None and b.grad is None and c.grad is None
    np.testing.assert_allclose(a.grad.numpy(), [15.0, 24.0])


def test_backward_accumulates() -> None:
    a = Tensor([1.0, 2.0], requires_grad=True)
    (a * 3).sum().backward()
    a.grad.realize()
    (a * a).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [5.0, 7.0])


def test_gradient_returns_lazy_tensors_for_targets() -> None:
    x, w = Tensor(rand((3, 4), 1)), Tensor(rand((4, 2), 2))
    loss = (x @ w).square().mean()
    gx, gw = loss.gradient(x, w)
    tx, tw = torch.tensor(x.numpy(), requires_grad=True), torch.tensor(w.numpy(), requires_grad=True)
    (tx @ tw).square().mean().backward()
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert x.grad is None, "gradient() must not touch .grad"


def test_gradient_with_seed_and_missing_targets() -> None:
    x, other = Tensor([1.0, 2.0, 3.0]), Tensor([1.0])
    y = x * x
    (g,) = y.gradient(x, gradient=Tensor([1.0, 0.0, 2.0]))
    np.testing.assert_allclose(g.numpy(), [2.0, 0.0, 12.0])
    with pytest.raises(RuntimeError, match="does not depend"):
        y.sum().gradient(other)
    (z,) = y.sum().gradient(other, materialize_grads=True)
    np.testing.assert_allclose(z.numpy(), [0.0])
    with pytest.raises(ValueError, match="one-element"):
        y.gradient(x)
    with pytest.raises(ValueError, match="shape"):
        y.gradient(x, gradient=Tensor([1.0]))


def test_detach_cuts_the_graph() -> None:
    a = Tensor([2.0, 3.0], requires_grad=True)
    (a * a.detach()).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 3.0])
    with pytest.raises(RuntimeError, match="does not depend"):
        a.detach().sum().gradient(a)


def test_no_grad_context_and_decorator() -> None:
    a = Tensor([2.0, 3.0], requires_grad=True)
    with no_grad():
        assert Tensor.no_grad
        frozen = a * 10
    assert not Tensor.no_grad
    (a * frozen).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [20.0, 30.0])  # frozen acted as a constant
    np.testing.assert_allclose(frozen.numpy(), [20.0, 30.0])

    @no_grad()
    def infer(t: Tensor) -> Tensor:
        return t * t

    with pytest.raises(RuntimeError, match="no tensor with requires_grad"):
        infer(a).sum().backward()


def test_no_grad_keeps_slices_of_realized_tensors_assignable() -> None:
    buf = Tensor.zeros(4).contiguous().realize()
    with no_grad():
        buf[1:3].assign(Tensor([5.0, 6.0])).realize()
    np.testing.assert_allclose(buf.numpy(), [0.0, 5.0, 6.0, 0.0])


def test_train_context_and_decorator() -> None:
    assert not Tensor.training
    with Tensor.train():
        assert Tensor.training
        with Tensor.train(False):
            assert not Tensor.training
        assert Tensor.training
    assert not Tensor.training

    @Tensor.train()
    def step() -> bool:
        return Tensor.training

    assert step() and not Tensor.training


def test_constant_that_requires_grad_is_its_own_node() -> None:
    # CONST nodes are shared; a scalar leaf must not also collect the gradient of an equal constant
    x = Tensor(2.0, requires_grad=True)
    (x * 2.0).backward()
    np.testing.assert_allclose(x.grad.numpy(), 2.0)
    y = Tensor(3.0).requires_grad_()
    (y * 3.0 + 3.0).backward()
    np.testing.assert_allclose(y.grad.numpy(), 3.0)


def test_backward_errors_say_what_to_do() -> None:
    a = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(ValueError, match="one-element"):
        (a * 2).backward()
    loss = (a * 2).sum()
    loss.realize()
    with pytest.raises(RuntimeError, match="before the loss is realized"):
        loss.backward()
    with pytest.raises(TypeError, match="floating-point"):
        Tensor([1, 2]).sum().backward()


def test_grads_through_int_casts_and_comparisons_are_cut() -> None:
    a = Tensor([1.5, -2.5], requires_grad=True)
    (a.cast(dtypes.int32).cast(dtypes.float32) + (a > 0).cast(dtypes.float32) * a).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [1.0, 0.0])


# *** the backward pass is lazy graph work that fuses like the forward pass ***


def test_backward_is_lazy_and_fuses() -> None:
    x = Tensor(rand((16, 8), 1))
    w = Tensor(rand((16, 8), 2), requires_grad=True)
    (x * w).exp().sin().sum().backward()
    assert w.grad is not None and w.grad.uop.op is not Ops.VIEW, "the gradient must stay lazy until realized"
    # the backward of an elementwise chain is one elementwise kernel, like its forward
    assert len(w.grad.schedule()) == 1
    ref = np.cos(np.exp(x.numpy() * w.numpy())) * np.exp(x.numpy() * w.numpy()) * x.numpy()
    np.testing.assert_allclose(w.grad.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_linear_layer_gradient_and_update_kernels() -> None:
    x = Tensor(rand((16, 8), 1))
    w = Tensor(rand((4, 8), 2), requires_grad=True)
    (x @ w.T).sum().backward()
    # the gradient is one reduction over the batch and the update reads it: two kernels
    new_w = w - 0.1 * w.grad
    assert len(new_w.schedule()) <= 2
    np.testing.assert_allclose(new_w.numpy(), w.numpy() - 0.1 * np.broadcast_to(x.numpy().sum(0), (4, 8)), rtol=1e-5)


def test_loss_and_gradients_realize_in_one_schedule() -> None:
    x = Tensor(rand((8, 6), 1))
    w1, w2 = Tensor(rand((6, 5), 2), requires_grad=True), Tensor(rand((5, 3), 3), requires_grad=True)
    loss = ((x @ w1).tanh() @ w2).square().mean()
    loss.backward()
    # forward: two matmuls and the mean; backward: the two weight gradients and the gradient through w2; and a
    # layout copy for each gradient realized on its own (an optimizer's update reads it in place instead)
    items = loss.schedule(w1.grad, w2.grad)
    assert len(items) <= 8, f"forward and backward of a 2-layer MLP took {len(items)} kernels"
