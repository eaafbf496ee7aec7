"""Invalid arguments raise a clear exception naming the problem, as torch rejects them (checked against torch where it
has the same call): negative sizes in creation functions, a dimension given twice, an axis out of range for a
scalar, a non-int dimension, bool ranges, and loss targets of the wrong shape or type."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad import Tensor, dtypes

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    "make",
    [
        lambda: Tensor.full((-3,), 2),
        lambda: Tensor.zeros(-3, 2),
        lambda: Tensor.ones(2, -1),
        lambda: Tensor.empty(-1),
        lambda: Tensor.rand(-2, 3),
        lambda: Tensor.randn(-2),
    ],
)
def test_negative_sizes_rejected(make) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        make()


def test_torch_rejects_negative_sizes_too() -> None:
    with pytest.raises(RuntimeError):
        torch.full((-3,), 2)
    with pytest.raises(RuntimeError):
        torch.zeros(-3, 2)


@pytest.mark.parametrize("make", [lambda: Tensor.full((2.5,), 1), lambda: Tensor.zeros(2.0, 3)])
def test_float_sizes_rejected(make) -> None:
    with pytest.raises(TypeError, match="must be ints"):
        make()


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.flip((0, 0)),
        lambda t: t.flip((1, -1)),
        lambda t: t.sum(axis=(0, 0)),
        lambda t: t.max(axis=(1, -1)),
    ],
)
def test_dimension_given_twice(call) -> None:
    with pytest.raises(ValueError, match="more than once"):
        call(Tensor(np.ones((2, 3), np.float32)))


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"])
def test_scan_axis_of_a_scalar(op: str) -> None:
    t, ref = Tensor(3.0), torch.tensor(3.0)
    for axis in (0, -1):
        got = getattr(t, op)(axis=axis)
        want = getattr(ref, op)(axis)
        got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
        assert got.item() == pytest.approx(want.item())
    with pytest.raises(IndexError, match="out of range"):
        getattr(t, op)(axis=1)
    with pytest.raises(IndexError):
        getattr(ref, op)(1)


def test_stack_and_cat_with_a_tensor_as_dim() -> None:
    a, b = Tensor([1, 2]), Tensor([3, 4])
    with pytest.raises(TypeError, match="int dim"):
        Tensor.stack((a, b), Tensor(0))
    with pytest.raises(TypeError, match="int dim"):
        Tensor.cat([a, b], Tensor(0))
    with pytest.raises(TypeError, match="dimension must be an int"):
        a.stack(b, dim=Tensor(0))
    with pytest.raises(TypeError, match="dimension must be an int"):
        a.sum(axis=0.5)
    # torch's positional dim after the sequence works
    np.testing.assert_array_equal(
        Tensor.stack((a, b), 1).numpy(), torch.stack((torch.tensor([1, 2]), torch.tensor([3, 4])), 1).numpy()
    )
    np.testing.assert_array_equal(Tensor.cat([a, b], 0).numpy(), [1, 2, 3, 4])


def test_bool_ranges_rejected() -> None:
    with pytest.raises(TypeError, match="bool"):
        Tensor.linspace(0, 1, 3, dtype=dtypes.bool)
    with pytest.raises(TypeError, match="bool"):
        Tensor.arange(3, dtype=dtypes.bool)
    with pytest.raises(RuntimeError):
        torch.linspace(0, 1, 3, dtype=torch.bool)


def test_loss_targets_checked() -> None:
    logits = Tensor(np.zeros((32, 10), np.float32))
    with pytest.raises(ValueError, match="class probabilities"):
        logits.cross_entropy(Tensor(np.zeros((32, 1), np.float32)))
    with pytest.raises(ValueError, match="class indices"):
        logits.cross_entropy(Tensor(np.zeros((32, 1), np.int32)))
    with pytest.raises(ValueError, match="nll_loss"):
        logits.nll_loss(Tensor(np.zeros((32, 1), np.int32)))
    with pytest.raises(ValueError, match="labels"):
        logits.sparse_categorical_crossentropy(Tensor(np.zeros((32,), np.float32)))
    with pytest.raises((RuntimeError, ValueError)):
        torch.nn.functional.cross_entropy(torch.zeros(32, 10), torch.zeros(32, 1))
    # the valid forms still agree with torch
    y = np.arange(32) % 10
    got = Tensor(np.eye(10, dtype=np.float32)[y] * 3).cross_entropy(Tensor(y.astype(np.int32))).item()
    want = torch.nn.functional.cross_entropy(torch.tensor(np.eye(10, dtype=np.float32)[y] * 3), torch.tensor(y)).item()
    assert got == pytest.approx(want, rel=1e-5)
