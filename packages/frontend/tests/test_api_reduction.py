"""Reductions of the Tensor API against torch: scans (cumsum, cumprod, cummax, cummin, logcumsumexp), argmax/argmin,
sort/argsort/topk, var/std, logsumexp/softmax/log_softmax, any/all/isclose, einsum; forward and backward."""

from __future__ import annotations

import numpy as np
import pytest
from torch_reference import compare, rand

from lazygrad import Tensor, dtypes

torch = pytest.importorskip("torch")

SHAPES_AXES = [((6,), 0), ((3, 5), 1), ((3, 5), 0), ((2, 3, 4), -1), ((2, 3, 4), 1)]


@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
def test_cumsum_cumprod(shape: tuple[int, ...], axis: int) -> None:
    x = rand(shape, 1)
    compare(lambda t: t.cumsum(axis), lambda t: t.cumsum(axis), [x])
    compare(lambda t: t.cumprod(axis), lambda t: t.cumprod(axis), [rand(shape, 2, 0.5, 1.5)])
    compare(lambda t: t.logcumsumexp(axis), lambda t: t.logcumsumexp(axis), [x], rtol=1e-5)
    ints = rand(shape, 3, -5, 5, np.int32)
    compare(lambda t: t.cumsum(axis), lambda t: t.cumsum(axis), [ints], grad=False)
    compare(lambda t: t.cumprod(axis), lambda t: t.cumprod(axis), [ints], grad=False)
    compare(lambda t: t.cumsum(axis), lambda t: t.cumsum(axis), [rand(shape, 4, dtype=np.bool_)], grad=False)


@pytest.mark.parametrize("n", [300, 1000])
def test_long_scans(n: int) -> None:
    x = rand((2, n), 5, 0, 1)
    compare(lambda t: t.cumsum(1), lambda t: t.cumsum(1), [x], rtol=1e-5, atol=1e-4)
    ints = rand((n,), 6, -3, 3, np.int64)
    compare(lambda t: t.cumsum(0), lambda t: t.cumsum(0), [ints], grad=False)
    compare(lambda t: t.cummax(0), lambda t: t.cummax(0), [ints], grad=False)


@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
def test_cummax_cummin(shape: tuple[int, ...], axis: int) -> None:
    x = rand(shape, 7)
    compare(lambda t: t.cummax(axis), lambda t: t.cummax(axis), [x])
    compare(lambda t: t.cummin(axis), lambda t: t.cummin(axis), [x])
    ties = rand(shape, 8, 0, 3, np.int32)  # many repeats: the index is the last one reaching the extreme
    compare(lambda t: t.cummax(axis), lambda t: t.cummax(axis), [ties], grad=False)
    compare(lambda t: t.cummin(axis), lambda t: t.cummin(axis), [ties], grad=False)


def test_scan_python_device(device: str) -> None:
    compare(lambda t: t.cumsum(1), lambda t: t.cumsum(1), [rand((2, 5), 9)], device=device, grad=False)
    compare(lambda t: t.cummax(0), lambda t: t.cummax(0), [rand((6,), 10)], device=device, grad=False)


@pytest.mark.parametrize("shape,axis", [*SHAPES_AXES, ((3, 5), None)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_argmin(shape: tuple[int, ...], axis: int | None, keepdim: bool) -> None:
    for x in (rand(shape, 11), rand(shape, 12, 0, 2, np.int32), rand(shape, 13, dtype=np.bool_)):
        if axis is None and keepdim:
            continue
        compare(
            lambda t: t.argmax(axis, keepdim),
            lambda t: (t.byte() if t.dtype == torch.bool else t).argmax(axis, keepdim),
            [x],
            grad=False,
        )
        if x.dtype != np.bool_:
            compare(lambda t: t.argmin(axis, keepdim), lambda t: t.argmin(axis, keepdim), [x], grad=False)


def test_argmax_nan_and_errors() -> None:
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, 5.0, -1.0]], np.float32)
    compare(lambda t: t.argmax(1), lambda t: t.argmax(1), [x], grad=False)
    compare(lambda t: t.argmin(1), lambda t: t.argmin(1), [x], grad=False)
    with pytest.raises(ValueError):
        Tensor.ones(2, 0).argmax(1)


@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
@pytest.mark.parametrize("descending", [False, True])
def test_sort(shape: tuple[int, ...], axis: int, descending: bool) -> None:
    x = rand(shape, 14)
    compare(lambda t: t.sort(axis, descending), lambda t: t.sort(dim=axis, descending=descending, stable=True), [x])
    ties = rand(shape, 15, 0, 3, np.int32)
    compare(
        lambda t: t.sort(axis, descending),
        lambda t: t.sort(dim=axis, descending=descending, stable=True),
        [ties],
        grad=False,
    )
    compare(
        lambda t: t.argsort(axis, descending),
        lambda t: t.argsort(dim=axis, descending=descending, stable=True),
        [ties],
        grad=False,
    )


def test_sort_nan_inf_and_python(device: str) -> None:
    x = np.array([3.0, np.nan, -np.inf, 1.0, np.inf, -0.0, 0.0, np.nan, -2.0], np.float32)
    for descending in (False, True):
        compare(
            lambda t, descending=descending: t.sort(0, descending),
            lambda t, descending=descending: t.sort(dim=0, descending=descending, stable=True),
            [x],
            device=device,
            grad=False,
        )


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("largest", [True, False])
def test_topk(k: int, largest: bool) -> None:
    for shape, axis in [((7,), 0), ((3, 6), 1), ((5, 4), 0), ((2, 3, 4), -1)]:
        x = rand(shape, 16)
        compare(lambda t, axis=axis: t.topk(k, axis, largest), lambda t, axis=axis: t.topk(k, axis, largest), [x])
    with pytest.raises(ValueError):
        Tensor.ones(3).topk(4)


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)])
@pytest.mark.parametrize("correction", [0, 1])
def test_var_std(axis: int | tuple[int, ...] | None, correction: int) -> None:
    x = rand((3, 4, 5), 17)
    compare(lambda t: t.var(axis, correction=correction), lambda t: t.var(axis, correction=correction), [x])
    compare(
        lambda t: t.std(axis, keepdim=True, correction=correction),
        lambda t: t.std(axis, keepdim=True, correction=correction),
        [x],
    )
    compare(
        lambda t: t.var_mean(axis, correction=correction), lambda t: torch.var_mean(t, axis, correction=correction), [x]
    )
    compare(
        lambda t: t.std_mean(axis, correction=correction), lambda t: torch.std_mean(t, axis, correction=correction), [x]
    )


@pytest.mark.parametrize("shape,axis", [((5,), 0), ((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1)])
def test_softmax_family(shape: tuple[int, ...], axis: int) -> None:
    x = rand(shape, 18, -5, 5)
    compare(lambda t: t.softmax(axis), lambda t: t.softmax(axis), [x])
    compare(lambda t: t.log_softmax(axis), lambda t: t.log_softmax(axis), [x])
    compare(lambda t: t.logsumexp(axis), lambda t: t.logsumexp(axis), [x])
    compare(lambda t: t.logsumexp(axis, keepdim=True), lambda t: t.logsumexp(axis, keepdim=True), [x])
    compare(lambda t: t.softmax(axis, dtype=dtypes.float64), lambda t: t.softmax(axis, dtype=torch.float64), [x])


def test_softmax_extremes() -> None:
    x = np.array([[1000.0, 0.0, -1000.0], [-np.inf, 0.0, 1.0], [-np.inf, -np.inf, 2.0]], np.float32)
    compare(lambda t: t.softmax(-1), lambda t: t.softmax(-1), [x], grad=False)
    compare(lambda t: t.log_softmax(-1), lambda t: t.log_softmax(-1), [x], grad=False)
    compare(lambda t: t.logsumexp(-1), lambda t: t.logsumexp(-1), [x], grad=False)
    compare(lambda t: t.logsumexp(-1), lambda t: t.logsumexp(-1), [np.full((2, 3), -np.inf, np.float32)], grad=False)


def test_any_all_isclose() -> None:
    b = rand((3, 4), 19, dtype=np.bool_)
    for axis in (None, 0, 1):
        compare(
            lambda t, axis=axis: t.any(axis),
            lambda t, axis=axis: t.any() if axis is None else t.any(axis),
            [b],
            grad=False,
        )
        compare(
            lambda t, axis=axis: t.all(axis),
            lambda t, axis=axis: t.all() if axis is None else t.all(axis),
            [b],
            grad=False,
        )
    a = np.array([1.0, np.nan, np.inf, 1e-9, 1.0, -np.inf], np.float32)
    c = np.array([1.0 + 1e-6, np.nan, np.inf, 0.0, 1.1, np.inf], np.float32)
    for equal_nan in (False, True):
        compare(
            lambda x, y, equal_nan=equal_nan: x.isclose(y, equal_nan=equal_nan),
            lambda x, y, equal_nan=equal_nan: x.isclose(y, equal_nan=equal_nan),
            [a, c],
            grad=False,
        )
    assert Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0 + 1e-7]))
    assert not Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.1]))


EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 2)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij->ji", [(3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("b...,b->b...", [(2, 3, 4), (2,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("iij->j", [(3, 3, 2)]),
    ("a b, b c -> a c", [(2, 3), (3, 2)]),
]


@pytest.mark.parametrize("formula,shapes", EINSUMS)
def test_einsum(formula: str, shapes: list[tuple[int, ...]]) -> None:
    xs = [rand(s, 20 + i) for i, s in enumerate(shapes)]
    compare(lambda *t: Tensor.einsum(formula, *t), lambda *t: torch.einsum(formula, *t), xs, rtol=2e-5, atol=2e-6)


def test_einsum_list_ints_errors() -> None:
    a, b = rand((2, 3), 30, -5, 5, np.int32), rand((3, 2), 31, -5, 5, np.int32)
    compare(
        lambda x, y: Tensor.einsum("ij,jk->ik", [x, y]),
        lambda x, y: torch.einsum("ij,jk->ik", [x, y]),
        [a, b],
        grad=False,
    )
    with pytest.raises(ValueError):
        Tensor.einsum("ij,jk->ik", Tensor(a))
    with pytest.raises(ValueError):
        Tensor.einsum("ij,jk->ik", Tensor(a), Tensor(a))
