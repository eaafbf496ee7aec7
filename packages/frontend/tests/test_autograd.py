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
    with pytest.raises(RuntimeError, match="no tensor with requires_grad"):
        (Tensor([1.0, 2.0]) * 2).sum().backward()
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


# *** reading a value never changes the gradients: autograd goes through realized tensors ***

MLP_POINTS = ["matmul", "activation", "logits", "loss", "twice", "all"]


def _mlp(lib: object, x: object, w1: object, b1: object, w2: object, labels: np.ndarray, read: Callable) -> object:
    """A 2-layer MLP with cross-entropy, calling `read(name, value)` at each intermediate."""
    h = read("matmul", x @ w1 + b1)
    a = read("activation", h.relu() if lib is Tensor else torch.relu(h))
    twice = read("twice", a * a.sum(-1, keepdim=True))  # a value read by two later ops
    z = read("logits", twice @ w2 + a[:, :3])
    if lib is Tensor:
        loss = z.sparse_categorical_crossentropy(Tensor(labels))
    else:
        loss = torch.nn.functional.cross_entropy(z, torch.tensor(labels))
    return read("loss", loss)


def _mlp_inputs() -> list[np.ndarray]:
    return [rand((8, 6), 1), rand((6, 5), 2), rand((5,), 3), rand((5, 3), 4, -0.5, 0.5)]


@pytest.mark.parametrize("how", ["realize", "numpy"])
@pytest.mark.parametrize("point", MLP_POINTS)
def test_backward_through_realized_intermediates(point: str, how: str) -> None:
    labels = np.array([0, 2, 1, 2, 0, 1, 1, 0])
    arrays = _mlp_inputs()
    seen: dict[str, np.ndarray] = {}

    def read(name: str, t: Tensor) -> Tensor:
        if point in (name, "all"):
            seen[name] = t.realize().numpy().copy() if how == "realize" else t.numpy().copy()
        return t

    xs = [Tensor(a, requires_grad=True) for a in arrays]
    loss = _mlp(Tensor, *xs, labels, read)
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    tvals: dict[str, np.ndarray] = {}
    tloss = _mlp(torch, *ts, labels, lambda n, v: tvals.setdefault(n, v.detach().numpy()) is None or v)
    loss.backward()
    tloss.backward()
    for name, v in seen.items():
        np.testing.assert_allclose(v, tvals[name], rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(loss.numpy(), tloss.detach().numpy(), rtol=1e-5, atol=1e-6)
    for i, (x, t) in enumerate(zip(xs, ts)):
        assert x.grad is not None, f"input {i} lost its gradient when {point} was read"
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"input {i}")


def test_gradient_through_a_chain_of_realizes() -> None:
    x = Tensor(rand((4, 4), 5), requires_grad=True)
    tx = torch.tensor(x.numpy(), requires_grad=True)
    h, th = x, tx
    for _ in range(3):  # each step realized on its own: the graph of the last is three realizes deep
        h, th = (h @ h.T).tanh().realize(), (th @ th.T).tanh()
    (gx,) = h.sum().realize().gradient(x)
    th.sum().backward()
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_realized_value_reused_in_a_second_loss() -> None:
    x, w = rand((6, 4), 1), rand((4, 3), 2)
    lx, lw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    h = (lx @ lw).exp().realize()
    th = (tx @ tw).exp()
    (h * h).mean().backward()
    (th * th).mean().backward(retain_graph=True)
    np.testing.assert_allclose(lw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-5)
    # the second loss accumulates into the same .grad, through the same realized h
    h.max().backward()
    th.max().backward()
    np.testing.assert_allclose(lx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_realized_values_that_must_stay_constants() -> None:
    a = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    h = (a * a).realize()
    (h.detach() * a).sum().backward()  # detach of a realized value: a constant
    np.testing.assert_allclose(a.grad.numpy(), [1.0, 4.0, 9.0])
    with no_grad():
        frozen = (a * 10).realize()
    a.grad = None
    (frozen * a).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [10.0, 20.0, 30.0])
    b = Tensor([1.0, 2.0])  # no requires_grad: nothing to keep, gradient() says why it can't reach it
    with pytest.raises(RuntimeError, match="realized tensor"):
        (b * b).realize().sum().gradient(b)


def test_backward_through_a_value_overwritten_in_place_raises() -> None:
    w = Tensor([1.0, 2.0], requires_grad=True)
    h = (w * 3).realize()
    w.assign(Tensor([5.0, 5.0])).realize()  # h's graph reads w's old values, which are gone
    with pytest.raises(RuntimeError, match="overwritten in place"):
        h.sum().backward()
    h2 = (w * 3).realize()  # computed from the new values: fine
    h2.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [3.0, 3.0])


def test_training_loop_reading_accuracy_each_step_matches_torch() -> None:
    from lazygrad.nn.optim import SGD

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 0.5).astype(np.int32)
    arrays = [rand((8, 16), 1, -0.5, 0.5), rand((16,), 2, -0.1, 0.1), rand((16, 3), 3, -0.5, 0.5)]
    params = [Tensor(a) for a in arrays]
    tparams = [torch.tensor(a, requires_grad=True) for a in arrays]
    opt, topt = SGD(params, lr=0.5, momentum=0.9), torch.optim.SGD(tparams, lr=0.5, momentum=0.9)
    lx, tx = Tensor(x), torch.tensor(x)
    for step in range(5):
        logits = (lx @ params[0] + params[1]).relu() @ params[2]
        tlogits = (tx @ tparams[0] + tparams[1]).relu() @ tparams[2]
        # the accuracy reads the logits before backward, and the loss is printed too
        acc = (logits.numpy().argmax(-1) == y).mean()
        loss = logits.sparse_categorical_crossentropy(Tensor(y))
        loss_value = loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(tlogits, torch.tensor(y, dtype=torch.long))
        tloss.backward()
        topt.step()
        assert acc == (tlogits.detach().numpy().argmax(-1) == y).mean()
        np.testing.assert_allclose(loss_value, tloss.item(), rtol=1e-5, err_msg=f"step {step}")
        for p, tp in zip(params, tparams):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=f"step {step}")
        # the realized loss read parameters the step overwrote: backward through it again can't be right
        with pytest.raises(RuntimeError, match="overwritten in place"):
            loss.backward()


def test_parameters_after_a_step_carry_no_graph_and_nothing_is_retained() -> None:
    import gc

    from lazygrad.gradient import realized_graphs
    from lazygrad.nn.optim import SGD

    gc.collect()
    before = len(realized_graphs)
    w = Tensor(rand((4, 4), 1))
    opt = SGD([w], lr=0.1)
    x = Tensor(rand((3, 4), 2))
    for _ in range(3):
        h = (x @ w).relu().realize()
        loss = h.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    # the update of w is not part of the next step's autograd: the gradient of w is x's column sums, not more
    x2 = Tensor(rand((3, 4), 3))
    opt.zero_grad()
    (x2 @ w).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.broadcast_to(x2.numpy().sum(0)[:, None], (4, 4)), rtol=1e-5)
    # with the tensors gone, so are the graphs kept for them
    del h, loss, opt
    w.grad = None
    gc.collect()
    assert len(realized_graphs) == before


# *** equal lazy graphs built apart are one node; the tensors must still be separate ***

TWINS = {
    "zeros": lambda: Tensor.zeros(2, 3),
    "full": lambda: Tensor.full((2, 3), 7.0),
    "contiguous": lambda: Tensor.ones(2, 3).contiguous(),
    "eye": lambda: Tensor.eye(2, 3),
    "computed": lambda: _TWIN_INPUT * 2 + 1,
}
_TWIN_INPUT = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize("name", list(TWINS))
def test_equal_lazy_tensors_get_buffers_of_their_own(name: str) -> None:
    make = TWINS[name]
    ref = make().numpy().copy()
    new = np.full((2, 3), -1.0, np.float32)
    a, b = make(), make()
    a.realize()
    a.assign(Tensor(new)).realize()
    np.testing.assert_array_equal(a.numpy(), new)
    np.testing.assert_array_equal(b.numpy(), ref)
    b.assign(Tensor(new * 2)).realize()
    np.testing.assert_array_equal(a.numpy(), new)
    # realized together, then written apart
    c, d = make(), make()
    Tensor.realize(c, d)
    d[0] = 5.0
    d.realize()
    np.testing.assert_array_equal(c.numpy(), ref)
    np.testing.assert_array_equal(d.numpy(), np.concatenate([np.full((1, 3), 5.0, np.float32), ref[1:]]))


def test_parameters_made_alike_get_their_own_gradients() -> None:
    from lazygrad.nn.optim import SGD

    x = rand((4, 3), 1)
    wa, wb = rand((3, 3), 2), rand((3, 2), 3)
    # two zero-initialized biases, and a zero constant elsewhere in the loss: three equal lazy graphs
    w1, w2 = Tensor(wa), Tensor(wb)
    b1, b2 = Tensor.zeros(3), Tensor.zeros(3)
    opt = SGD([w1, b1, w2, b2], lr=0.1)
    tw1, tw2 = torch.tensor(wa, requires_grad=True), torch.tensor(wb, requires_grad=True)
    tb1, tb2 = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    topt = torch.optim.SGD([tw1, tb1, tw2, tb2], lr=0.1)
    for _ in range(3):
        h = (Tensor(x) @ w1 + b1).tanh() + b2 * 3
        loss = (h @ w2).square().mean() + (h * Tensor.zeros(3)).sum()
        th = (torch.tensor(x) @ tw1 + tb1).tanh() + tb2 * 3
        tloss = (th @ tw2).square().mean() + (th * torch.zeros(3)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        topt.zero_grad()
        tloss.backward()
        topt.step()
        for p, tp in zip((w1, b1, w2, b2), (tw1, tb1, tw2, tb2)):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)
