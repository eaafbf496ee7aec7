"""Values at the edges of their types and functions, against torch (the test-only reference): creation dtypes that
hold their values, min/argmin at the type's minimum, logcumsumexp across far-apart values, powers of infinities and
zeros, and the gradients torch gives at the kinks of relu/clip, at logaddexp's tie, prod with zeros, powers at 0 and
infinity, and exp ratios at +-300. Property tests draw values that include the edges; a subset runs on PYTHON."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lazygrad import Tensor, dtypes

torch = pytest.importorskip("torch")

DEVICES = ["CPU", "PYTHON"]
EDGES = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, math.inf, -math.inf]


def _grad(fn, values, dtype=dtypes.float32, device: str = "CPU") -> tuple[np.ndarray, np.ndarray]:
    x = Tensor(values, dtype=dtype, device=device, requires_grad=True)
    y = fn(x)
    y.sum().backward()
    return y.numpy(), x.grad.numpy()


def _torch_grad(fn, values, dtype=torch.float32) -> tuple[np.ndarray, np.ndarray]:
    x = torch.tensor(values, dtype=dtype, requires_grad=True)
    y = fn(x)
    y.sum().backward()
    return y.detach().numpy(), x.grad.numpy()


def _same(ours: tuple[np.ndarray, np.ndarray], ref: tuple[np.ndarray, np.ndarray], rtol: float = 1e-5) -> None:
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6, equal_nan=True)


# *** creation dtypes ***


@pytest.mark.parametrize(
    "args", [(2**31, 2**31 + 3), (-(2**31) - 2, -(2**31) + 1), (0, 2**33, 2**31), (5,), (2**31 - 2, 2**31 + 1)]
)
def test_arange_holds_its_values(args: tuple[int, ...]) -> None:
    got = Tensor.arange(*args)
    want = torch.arange(*args).numpy()
    np.testing.assert_array_equal(got.numpy(), want)
    # int32 (our default integer) while the values fit it, int64 (torch's) beyond
    fits = want.size == 0 or (want.min() >= -(2**31) and want.max() < 2**31)
    assert got.dtype == (dtypes.int32 if fits else dtypes.int64)


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**62])
def test_creation_from_big_ints_keeps_values(value: int) -> None:
    assert Tensor(value).item() == value
    assert Tensor([1, value]).tolist() == [1, value]
    assert Tensor.full((2,), value).tolist() == [value, value]
    with pytest.raises(OverflowError, match="int64"):
        Tensor([2**64])


# *** min / argmin at the type's minimum ***


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"])
def test_min_at_type_minimum(dt: str, device: str) -> None:
    info = np.iinfo(dt)
    values = np.array([0, info.min, info.max, 1], dtype=dt)
    t = Tensor(values, device=device)
    assert t.min().item() == values.min()
    assert t.argmin().item() == values.argmin()
    assert t.max().item() == values.max()
    np.testing.assert_array_equal(
        t.minimum(Tensor(values[::-1].copy(), device=device)).numpy(), np.minimum(values, values[::-1])
    )


@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=9))
def test_int32_min_argmin_property(values: list[int]) -> None:
    ref = torch.tensor(values, dtype=torch.int32)
    t = Tensor(values, dtype=dtypes.int32)
    assert t.min().item() == ref.min().item()
    assert t.argmin().item() == ref.argmin().item()


# *** numerics ***


def test_logcumsumexp_far_apart_values() -> None:
    values = [0.0, 100.0, -50.0, 100.0, -math.inf]
    _same(_grad(lambda x: x.logcumsumexp(), values), _torch_grad(lambda x: x.logcumsumexp(0), values))


@pytest.mark.parametrize("n", [3, 300])  # the direct and the blocked scan
def test_logcumsumexp_long(n: int) -> None:
    values = (np.random.default_rng(n).standard_normal(n) * 40).astype(np.float32).tolist()
    _same(_grad(lambda x: x.logcumsumexp(), values), _torch_grad(lambda x: x.logcumsumexp(0), values), rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("e", [0.3, -0.3, 2.5, 3.0, -1.0, 0.0])
def test_pow_of_infinities_and_zeros(e: float, device: str) -> None:
    values = [-math.inf, math.inf, 0.0, -0.0, -2.0, 2.0, math.nan]
    got = (Tensor(values, device=device) ** e).numpy()
    np.testing.assert_allclose(got, (torch.tensor(values) ** e).numpy(), rtol=1e-6, equal_nan=True)


# *** gradients at edges ***

CASES = {
    "relu": (lambda x: x.relu(), lambda x: x.relu(), [0.0, -1.0, 2.0, math.nan]),
    "clip": (lambda x: x.clip(-1, 1), lambda x: x.clip(-1, 1), [-1.0, 1.0, 0.0, -3.0, 3.0]),
    "logaddexp": (lambda x: x.logaddexp(Tensor(1.0)), lambda x: x.logaddexp(torch.tensor(1.0)), [1.0, 0.0, 5.0]),
    "prod one zero": (lambda x: x.prod(), lambda x: x.prod(), [0.0, 2.0, 3.0]),
    "prod two zeros": (lambda x: x.prod(), lambda x: x.prod(), [0.0, 2.0, 0.0]),
    "prod no zero": (lambda x: x.prod(), lambda x: x.prod(), [1.5, 2.0, -3.0]),
    "pow 0.3": (lambda x: x**0.3, lambda x: x**0.3, [0.0, 2.0, -2.0]),
    "pow -0.3": (lambda x: x**-0.3, lambda x: x**-0.3, [0.0, 2.0]),
    "pow 2.5": (lambda x: x**2.5, lambda x: x**2.5, [0.0, 2.0, -1.0]),
    "pow 0": (lambda x: x**0, lambda x: x**0, [0.0, math.inf, -math.inf, 2.0, math.nan]),
    "pow tensor 0": (lambda x: x ** Tensor(0.0), lambda x: x ** torch.tensor(0.0), [0.0, math.inf, -math.inf, 2.0]),
    "sqrt": (lambda x: x.sqrt(), lambda x: x.sqrt(), [0.0, 4.0]),
    "exp ratio": (lambda x: x.exp() / (1 + x.exp()), lambda x: x.exp() / (1 + x.exp()), [-300.0, 300.0, 0.0, 30.0]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradient_matches_torch_at_edges(name: str) -> None:
    fn, tfn, values = CASES[name]
    _same(_grad(fn, values), _torch_grad(tfn, values))


def test_exp_ratio_float64_finite_where_torch_is() -> None:
    fn, tfn, values = CASES["exp ratio"]
    ours = _grad(fn, values, dtypes.float64)
    ref = _torch_grad(tfn, values, torch.float64)
    assert np.isfinite(ours[1]).all() and np.isfinite(ref[1]).all()
    _same(ours, ref)


@pytest.mark.parametrize("name", ["relu", "clip", "prod one zero", "pow 0.3"])
def test_gradient_edges_on_python(name: str) -> None:
    fn, tfn, values = CASES[name]
    _same(_grad(fn, values, device="PYTHON"), _torch_grad(tfn, values))


edge_floats = st.one_of(st.sampled_from(EDGES), st.floats(-5, 5, width=32))


@given(st.lists(edge_floats, min_size=1, max_size=6), st.sampled_from(["relu", "clip", "logaddexp", "prod"]))
def test_gradients_property(values: list[float], which: str) -> None:
    fns = {
        "relu": (lambda x: x.relu(), lambda x: x.relu()),
        "clip": (lambda x: x.clip(-1, 2.5), lambda x: x.clip(-1, 2.5)),
        "logaddexp": (lambda x: x.logaddexp(Tensor(1.0)), lambda x: x.logaddexp(torch.tensor(1.0))),
        "prod": (lambda x: x.prod(), lambda x: x.prod()),
    }
    fn, tfn = fns[which]
    if which == "prod":
        values = [v for v in values if math.isfinite(v)] or [0.0]  # inf * 0 in the others' product is nan both ways
    _same(_grad(fn, values), _torch_grad(tfn, values), rtol=1e-4)


@given(
    st.lists(st.one_of(st.sampled_from([0.0, -0.0, 1.0, -2.0]), st.floats(-4, 4, width=32)), min_size=1, max_size=5),
    st.sampled_from([0.3, -0.3, 0.5, 1.7, 2.5, 0.0, -1.5]),
)
def test_pow_gradient_property(values: list[float], e: float) -> None:
    _same(_grad(lambda x: x**e, values), _torch_grad(lambda x: x**e, values), rtol=1e-4)


signed_floats = st.one_of(st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan]), st.floats(-8, 8, width=32))


@given(
    st.lists(st.lists(signed_floats, min_size=0, max_size=4), min_size=1, max_size=4),
    st.sampled_from(["cat", "stack"]),
    st.sampled_from(DEVICES),
)
def test_cat_and_stack_keep_every_bit(parts: list[list[float]], how: str, device: str) -> None:
    """cat and stack move values, so each result is bit for bit numpy's, signed zeros and infinities included."""
    if how == "stack":
        parts = [p[: min(map(len, parts))] for p in parts]
    arrays = [np.array(p, np.float32).reshape(-1, 1) for p in parts]
    ts = [Tensor(a, device=device) for a in arrays]
    ours = (Tensor.cat(ts, dim=0) if how == "cat" else Tensor.stack(ts, dim=1)).numpy()
    ref = np.concatenate(arrays, 0) if how == "cat" else np.stack(arrays, 1)
    assert ours.shape == ref.shape
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(ref))
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_pad_with_negative_zero(device: str) -> None:
    x = np.array([1.5, -0.0, 0.0], np.float32)
    ours = Tensor(x, device=device).pad(((2, 1),), value=-0.0).numpy()
    ref = torch.nn.functional.pad(torch.tensor(x), (2, 1), value=-0.0).numpy()
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(ref))
    np.testing.assert_array_equal(ours, ref)
