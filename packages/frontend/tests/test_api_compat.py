"""The rest of the PyTorch/tinygrad surface that ported code reaches for, each against torch (numpy where torch has
no such argument) on random shapes and dtypes: fmod, softmin, normalize, masked_select/nonzero with size=,
prod(dtype=), DType.min/max, reshape with None, list and tuple indices, requires_grad= on creation, exceptions
catchable as torch's, zero gradients through non-differentiable ops, backward to requires_grad=None data, and
edge shapes (empty cummax/cummin, unfold of size 0, reflect/replicate padding with negative pads)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch_reference import compare, rand

from lazygrad import Device, Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)
seeds = st.integers(0, 2**16)


# *** new ops ***


@given(shapes, seeds, st.sampled_from([np.float32, np.int32, np.int64, np.int8]))
def test_fmod(shape, seed, dtype) -> None:
    a = rand(shape, seed, -20, 20, dtype)
    b = rand(shape, seed + 1, 1, 7, dtype) * np.where(rand(shape, seed + 2, dtype=np.bool_), 1, -1).astype(dtype)
    compare(lambda x, y: x.fmod(y), torch.fmod, [a, b], nondiff=[1])


def test_fmod_exact_quotients_and_zero() -> None:
    # a * (1/b) rounds across the integer quotient for these: fmod is still exact
    a = np.array([6.0, -6.0, 0.9, 7.5, 1e7 + 1, 5.0, 3.0], np.float32)
    b = np.array([3.0, 3.0, 0.3, -2.5, 3.0, 0.0, -0.7], np.float32)
    compare(lambda x, y: x.fmod(y), torch.fmod, [a, b], grad=False)


@given(shapes, seeds, st.data())
def test_softmin(shape, seed, data) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    compare(lambda x: x.softmin(axis), lambda x: F.softmin(x, axis), [rand(shape, seed)])


@given(st.lists(st.integers(1, 5), min_size=2, max_size=3).map(tuple), seeds, st.data())
def test_normalize(shape, seed, data) -> None:
    p = data.draw(st.sampled_from([1.0, 2.0, 3.0, math.inf]))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    compare(lambda x: x.normalize(p=p, dim=dim), lambda x: F.normalize(x, p=p, dim=dim), [rand(shape, seed)])


def test_normalize_of_zeros_is_zero() -> None:
    compare(lambda x: x.normalize(), lambda x: F.normalize(x), [np.zeros((2, 3), np.float32)], grad=False)


@given(shapes, seeds, st.integers(0, 12), st.sampled_from([np.float32, np.int32, np.bool_]))
def test_masked_select_with_size(shape, seed, size, dtype) -> None:
    a, m = rand(shape, seed, -9, 9, dtype), rand(shape, seed + 1, dtype=np.bool_)
    got = Tensor(a).masked_select(Tensor(m), size=size, fill_value=1)
    want = np.concatenate([a[m], np.ones(max(0, size - m.sum()), a.dtype)])[:size]
    assert got.shape == (size,) and got.dtype == Tensor(a).dtype
    np.testing.assert_array_equal(got.numpy(), want)


@given(shapes, seeds, st.integers(0, 12))
def test_nonzero_with_size(shape, seed, size) -> None:
    a = rand(shape, seed, -1, 1, np.int32)
    got = Tensor(a).nonzero(size=size, fill_value=-1)
    want = np.concatenate([np.argwhere(a), np.full((max(0, size - np.count_nonzero(a)), a.ndim), -1)])[:size]
    assert got.shape == (size, a.ndim) and got.dtype == dtypes.int64
    np.testing.assert_array_equal(got.numpy(), want)


def test_nonzero_and_masked_select_with_size_stay_lazy_in_a_jit() -> None:
    from lazygrad import TinyJit

    @TinyJit
    def first_positive(x: Tensor) -> tuple[Tensor, Tensor]:
        return x.masked_select(x > 0, size=2).realize(), (x > 0).nonzero(size=2).realize()

    for seed in range(4):
        a = rand((6,), seed)
        vals, idx = first_positive(Tensor(a))
        want = np.concatenate([a[a > 0], np.zeros(2)])[:2]
        np.testing.assert_allclose(vals.numpy(), want)
        np.testing.assert_array_equal(idx.numpy()[:, 0], np.concatenate([np.flatnonzero(a > 0), [0, 0]])[:2])


@given(shapes, seeds, st.sampled_from([np.int32, np.float32, np.bool_]), st.sampled_from(["float32", "int64"]))
def test_prod_with_dtype(shape, seed, dtype, out) -> None:
    compare(
        lambda x: x.prod(-1, dtype=out),
        lambda x: torch.prod(x, -1, dtype=getattr(torch, out)),
        [rand(shape, seed, -3, 3, dtype)],
        grad=False,
    )


@pytest.mark.parametrize("name", [n for n in dtypes.fields() if not n.startswith("fp8")])
def test_dtype_min_max(name: str) -> None:
    dt = getattr(dtypes, name)
    npdt = np.dtype(name if name != "bfloat16" else "float32")
    if dtypes.is_int(dt):
        assert (dt.min, dt.max) == (np.iinfo(npdt).min, np.iinfo(npdt).max)
    elif dt == dtypes.bool:
        assert (dt.min, dt.max) == (False, True)
    else:
        assert (dt.min, dt.max) == (-math.inf, math.inf)  # tinygrad's: a float's range reaches the infinities


@given(st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple), st.data())
def test_reshape_with_none(shape, data) -> None:
    keep = data.draw(st.lists(st.booleans(), min_size=len(shape) - 1, max_size=len(shape) - 1))
    args = [None if k else s for k, s in zip(keep, shape)] + [-1]
    a = rand(shape, 0)
    assert Tensor(a).reshape(*args).shape == tuple(torch.tensor(a).reshape(*shape[:-1], -1).shape)
    np.testing.assert_array_equal(Tensor(a).reshape(args).numpy(), a)
    with pytest.raises(ValueError, match="None"):
        Tensor(a).reshape(*shape, None)


INDICES = {
    "list of 1-tuples": lambda: [(0,), (1,)],
    "list of lists": lambda: [[0, 1], [1, 2]],
    "tuple of tuples": lambda: ((0, 1), (2, 0)),
    "list of tensors": lambda: "tensors",
    "list with a slice": lambda: [slice(None), (0, 2)],
    "plain int list": lambda: [1, 0, 1],
}


@pytest.mark.parametrize("kind", list(INDICES))
def test_sequence_indices_as_torch(kind: str) -> None:
    a = rand((3, 4, 2), 5)
    idx = INDICES[kind]()
    if idx == "tensors":
        mine, theirs = [Tensor([0, 2]), Tensor([1, 3])], [torch.tensor([0, 2]), torch.tensor([1, 3])]
    else:
        mine = theirs = idx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that its list-as-tuple rule will change
        want = torch.tensor(a)[theirs].numpy()
    np.testing.assert_array_equal(Tensor(a)[mine].numpy(), want)


CREATION = {
    "zeros": (lambda **k: Tensor.zeros(2, 3, **k), lambda **k: torch.zeros(2, 3, **k)),
    "ones": (lambda **k: Tensor.ones(2, 3, **k), lambda **k: torch.ones(2, 3, **k)),
    "full": (lambda **k: Tensor.full((2, 3), 1.5, **k), lambda **k: torch.full((2, 3), 1.5, **k)),
    "eye": (lambda **k: Tensor.eye(3, **k), lambda **k: torch.eye(3, **k)),
    "arange": (lambda **k: Tensor.arange(0.0, 3.0, 0.5, **k), lambda **k: torch.arange(0.0, 3.0, 0.5, **k)),
    "linspace": (lambda **k: Tensor.linspace(0, 1, 5, **k), lambda **k: torch.linspace(0, 1, 5, **k)),
    "zeros_like": (lambda **k: Tensor.ones(2, 2).zeros_like(**k), lambda **k: torch.zeros_like(torch.ones(2, 2), **k)),
    "ones_like": (lambda **k: Tensor.zeros(4).ones_like(**k), lambda **k: torch.ones_like(torch.zeros(4), **k)),
    "full_like": (
        lambda **k: Tensor.zeros(3).full_like(2.0, **k),
        lambda **k: torch.full_like(torch.zeros(3), 2.0, **k),
    ),
}


@pytest.mark.parametrize("name", list(CREATION))
def test_creation_takes_requires_grad(name: str) -> None:
    make, tmake = CREATION[name]
    x, tx = make(requires_grad=True), tmake(requires_grad=True)
    assert x.requires_grad is True
    np.testing.assert_allclose(x.numpy(), tx.detach().numpy())
    w = rand(tuple(tx.shape), 3)
    (x * Tensor(w)).sum().backward()
    (tx * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
    assert make(requires_grad=False).requires_grad is False and make().requires_grad is None
    # torch's other common keywords: the PYTHON device (cheap to start) where it is installed, else the default
    dev = "PYTHON" if "PYTHON" in Device.installed() and Device.usable("PYTHON") is None else Device.DEFAULT
    made = make(dtype=dtypes.float64, device=dev)
    assert made.dtype == dtypes.float64 and made.device == dev
    np.testing.assert_allclose(made.numpy(), tx.detach().numpy())


# *** exceptions: what torch raises for the same mistake catches ours, and so does Python's usual class ***

MISTAKES = {
    "matmul shapes": (lambda t: t.reshape(2, 6) @ t.reshape(2, 6), ValueError),
    "matmul 0-d": (lambda t: t.sum() @ t, ValueError),
    "permute": (lambda t: t.permute(0, 0, 1), ValueError),
    "roll": (lambda t: t.roll((1, 2), (0,)), ValueError),
    "reshape": (lambda t: t.reshape(5, 5), ValueError),
    "expand": (lambda t: t.expand(4, 3, 4), ValueError),
    "cat": (lambda t: t.cat(t.reshape(3, 2, 2), dim=0), ValueError),
    "dim out of range": (lambda t: t.sum(5), IndexError),
    "bitwise float": (lambda t: t & t, TypeError),
    "pad mode": (lambda t: t.pad((1, 1), mode="wrap"), ValueError),
}
TORCH_MISTAKES = {
    "matmul shapes": lambda t: t.reshape(2, 6) @ t.reshape(2, 6),
    "matmul 0-d": lambda t: t.sum() @ t,
    "permute": lambda t: t.permute(0, 0, 1),
    "roll": lambda t: t.roll((1, 2), (0,)),
    "reshape": lambda t: t.reshape(5, 5),
    "expand": lambda t: t.expand(4, 3, 4),
    "cat": lambda t: torch.cat([t, t.reshape(3, 2, 2)], dim=0),
    "dim out of range": lambda t: t.sum(5),
    "bitwise float": lambda t: t & t,
    "pad mode": lambda t: F.pad(t, (1, 1), mode="wrap"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_errors_are_caught_as_torch_code_expects(name: str) -> None:
    a = rand((2, 3, 2), 0)
    with pytest.raises(Exception) as theirs:
        TORCH_MISTAKES[name](torch.tensor(a))
    mistake, python_class = MISTAKES[name]
    # the class torch code catches: torch's own, or RuntimeError where torch raises a subclass of it
    # (NotImplementedError for a float bitwise op)
    caught = next(c for c in (IndexError, TypeError, ValueError, RuntimeError) if isinstance(theirs.value, c))
    with pytest.raises(caught) as ours:
        mistake(Tensor(a))
    assert isinstance(ours.value, python_class)
    assert str(ours.value), "the message must say what was wrong"


def test_unknown_pad_mode_is_not_implemented() -> None:
    with pytest.raises(NotImplementedError, match="reflect"):
        Tensor.ones(3, 3).pad((1, 1), mode="symmetric")


# *** autograd ***

FOLDED = {
    "pow 0": (lambda x, y: x**0 * y, lambda x, y: x**0 * y),
    "sign": (lambda x, y: x.sign() * y, lambda x, y: x.sign() * y),
    "copysign": (lambda x, y: x.copysign(y), lambda x, y: torch.copysign(x, y)),
    "comparison": (lambda x, y: (x < y).float() * y, lambda x, y: (x < y).float() * y),
}


@pytest.mark.parametrize("name", list(FOLDED))
def test_gradient_through_non_differentiable_ops_is_zero(name: str) -> None:
    fn, tfn = FOLDED[name]
    a, b = rand((2, 3), 1), rand((2, 3), 2)
    x, y = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    grads = fn(x, y).sum().gradient(x, y)
    tgrads = torch.autograd.grad(tfn(tx, ty).sum(), (tx, ty), allow_unused=True, materialize_grads=True)
    for g, tg in zip(grads, tgrads):
        np.testing.assert_allclose(g.numpy(), tg.numpy())


def test_gradient_of_an_unrelated_target_still_raises() -> None:
    x, unrelated = Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="does not depend"):
        (x * 2).sum().gradient(unrelated)
    with pytest.raises(RuntimeError, match="does not depend"):
        (x.detach() * 2).sum().gradient(x)
    np.testing.assert_array_equal((x * 2).sum().gradient(unrelated, materialize_grads=True)[0].numpy(), [0.0])


@given(shapes, seeds)
def test_backward_reaches_data_left_at_requires_grad_none(shape, seed) -> None:
    a = rand(shape, seed)
    x = Tensor(a)  # requires_grad None: tinygrad code differentiates through such tensors
    (x * (x < 0)).sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    (tx * (tx < 0)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())


def test_backward_prefers_tensors_marked_requires_grad() -> None:
    data, w = Tensor([1.0, 2.0]), Tensor([3.0, 4.0], requires_grad=True)
    (data * w).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0])
    assert data.grad is None  # parameters were marked: data inputs are not differentiated (nor computed)
    frozen = Tensor([1.0], requires_grad=False)
    with pytest.raises(RuntimeError, match="requires_grad"):
        (frozen * 2).sum().backward()


# *** edge shapes ***


@given(st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple), st.data())
def test_cummax_cummin_of_empty_tensors(shape, data) -> None:
    shape = (*shape[:-1], 0)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    for op in ("cummax", "cummin"):
        compare(lambda x, op=op: getattr(x, op)(axis), lambda x, op=op: getattr(torch, op)(x, axis),
                [rand(shape, 0)], grad=False)  # fmt: skip


@given(shapes, st.data())
def test_unfold(shape, data) -> None:
    dim = data.draw(st.integers(0, len(shape) - 1))
    size = data.draw(st.integers(0, shape[dim]))
    step = data.draw(st.integers(1, 3))
    compare(lambda x: x.unfold(dim, size, step), lambda x: x.unfold(dim, size, step), [rand(shape, 1)])


@given(st.integers(1, 6), st.integers(-6, 6), st.integers(-6, 6), st.sampled_from(["reflect", "replicate", "circular"]))
def test_pad_modes_with_negative_pads(n, left, right, mode) -> None:
    a = rand((2, 1, n), n)
    kept = n - max(0, -left) - max(0, -right)
    if mode == "circular" and kept <= 0:
        return  # torch wraps around a crop to nothing by reading the uncropped input; lazygrad refuses
    try:
        F.pad(torch.tensor(a), (left, right), mode=mode)
    except RuntimeError:
        if mode == "circular" and n + left + right > 0:
            # torch refuses to wrap around more than once; lazygrad gives the periodic extension, as numpy's "wrap"
            crop = a[..., max(0, -left) : n - max(0, -right)]
            want = np.pad(crop, ((0, 0), (0, 0), (max(left, 0), max(right, 0))), mode="wrap")
            np.testing.assert_array_equal(Tensor(a).pad((left, right), mode=mode).numpy(), want)
        elif n + left + right > 0:
            with pytest.raises(ValueError, match="too large"):
                Tensor(a).pad((left, right), mode=mode)
        return
    compare(lambda x: x.pad((left, right), mode=mode), lambda x: F.pad(x, (left, right), mode=mode), [a])
