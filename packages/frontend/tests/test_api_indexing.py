"""Indexing of the Tensor API: reading and writing with ints, slices (negative steps too), None, ..., integer and
bool tensors combined; gather, scatter, scatter_reduce, one_hot, masked_select, nonzero, embedding.

References: torch where it can express the index (it has no negative steps), else numpy applied the way torch
indexes: first the ints, slices and Nones (a view), then the tensor indices on that view."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from torch_reference import compare, rand

from lazygrad import Tensor, dtypes

torch = pytest.importorskip("torch")


def random_index(shape: tuple[int, ...], seed: int, allow_bool: bool = True) -> tuple[Any, ...]:
    """A random index over `shape` mixing every kind of entry."""
    rng = np.random.default_rng(seed)
    tensor_shape = [(2,), (2, 1), (3,), (1, 2)][rng.integers(4)]
    out: list[Any] = []
    dims = list(shape)
    used_bool = False
    for d in dims:
        kind = rng.choice(["int", "slice", "tensor", "bool", "none"], p=[0.2, 0.35, 0.3, 0.1, 0.05])
        if kind == "none":
            out.append(None)
            kind = "slice"
        if kind == "int":
            out.append(int(rng.integers(-d, d)))
        elif kind == "slice":
            step = int(rng.choice([1, 2, 3, -1, -2]))
            start = None if rng.random() < 0.3 else int(rng.integers(-d - 1, d + 1))
            stop = None if rng.random() < 0.3 else int(rng.integers(-d - 1, d + 1))
            out.append(slice(start, stop, step))
        elif kind == "bool" and allow_bool and not used_bool:
            mask = rng.random(d) < 0.5
            mask[rng.integers(d)] = True
            out.append(mask)
            used_bool = True
        else:
            vals = rng.integers(-d, d, size=tensor_shape)
            out.append(vals)
    if rng.random() < 0.3:
        k = int(rng.integers(len(out) + 1))
        out = out[:k] + [Ellipsis] + out[k + 1 :]
    return tuple(out)


def torch_style(x: np.ndarray, index: tuple[Any, ...]) -> tuple[np.ndarray, tuple[Any, ...]]:
    """(the view of x under the basic part of `index`, the array part to apply to it), as torch orders them."""
    basic, adv = [], []
    for i in index:
        if isinstance(i, np.ndarray):
            basic.extend([slice(None)] * (i.ndim if i.dtype == np.bool_ else 1))
            adv.append(i)
        elif i is Ellipsis:
            basic.append(Ellipsis)
            adv.append(Ellipsis)
        else:
            basic.append(i)
            if not isinstance(i, int):
                adv.append(slice(None))
    return x[tuple(basic)], tuple(adv)


def reference_get(x: np.ndarray, index: tuple[Any, ...]) -> np.ndarray:
    view, adv = torch_style(x, index)
    # numpy needs bool masks broadcast against the other arrays as their nonzero positions, as torch does
    return view[adv] if any(isinstance(a, np.ndarray) for a in adv) else view


def as_lazy(index: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(Tensor(i) if isinstance(i, np.ndarray) else i for i in index)


@pytest.mark.parametrize("seed", range(40))
def test_getitem_random(seed: int) -> None:
    shape = [(5,), (4, 5), (3, 4, 5), (2, 3, 4, 5)][seed % 4]
    x = rand(shape, seed, -100, 100, np.int32)
    index = random_index(shape, seed)
    try:
        ref = reference_get(x, index)
    except IndexError:
        return  # arrays numpy can't broadcast together: the index is invalid
    got = Tensor(x)[as_lazy(index)].numpy()
    assert got.shape == ref.shape, f"{index}: shape {got.shape}, reference {ref.shape}"
    np.testing.assert_array_equal(got, ref, err_msg=str(index))


@pytest.mark.parametrize(
    "index",
    [
        (0, slice(None), [0, 1]),
        ([0, 1], slice(None), 0),
        (slice(1, None), [0, 2], [1, 3]),
        ([[0], [1]], slice(None), [1, 3]),
        (None, [1], Ellipsis, None, [2]),
        (Ellipsis, [True, False, True, True]),
        ([True, False], [0, 2]),
        (slice(None, None, 2), Ellipsis, [-1, 0]),
        ([1, -1],),
        (1, 2, 3),
        (Ellipsis,),
        (None, 0, None),
    ],
)
def test_getitem_vs_torch(index: tuple[Any, ...]) -> None:
    x = rand((2, 3, 4), 1)
    torch_index = tuple(torch.tensor(i) if isinstance(i, list) else i for i in index)
    lazy_index = tuple(Tensor(i) if isinstance(i, list) else i for i in index)
    compare(lambda t: t[lazy_index], lambda t: t[torch_index], [x])


def test_getitem_lists_arrays_scalars(device: str) -> None:
    x = rand((4, 3), 2)
    t = Tensor(x, device=device)
    np.testing.assert_array_equal(t[[2, 0, 2]].numpy(), x[[2, 0, 2]])
    np.testing.assert_array_equal(t[np.array([[1], [3]])].numpy(), x[np.array([[1], [3]])])
    np.testing.assert_array_equal(t[Tensor(1, device=device)].numpy(), x[1])
    np.testing.assert_array_equal(t[x > 0].numpy(), x[x > 0])
    np.testing.assert_array_equal(t[::-1, ::-2].numpy(), x[::-1, ::-2])
    assert t[True].shape == (1, 4, 3) and t[False].shape == (0, 4, 3)
    with pytest.raises(IndexError):
        t[4]
    with pytest.raises(IndexError):
        t[0, 0, 0]
    with pytest.raises(IndexError):
        t[Tensor([0.5])]
    with pytest.raises(IndexError):
        t[..., ...]


def test_getitem_other_dtypes_and_grad() -> None:
    for dt in (np.bool_, np.int8, np.float16, np.int64):
        x = rand((4, 5), 3, -9, 9, dt)
        np.testing.assert_array_equal(Tensor(x)[[3, 0], 1:4].numpy(), x[[3, 0], 1:4])
    idx = np.array([[0, 2], [2, 2]])
    compare(lambda t: t[Tensor(idx), ::2], lambda t: t[torch.tensor(idx), ::2], [rand((3, 4), 4)])


# *** writing ***


@pytest.mark.parametrize("seed", range(30))
def test_setitem_random(seed: int) -> None:
    shape = [(5,), (4, 5), (3, 4, 5)][seed % 3]
    x = rand(shape, seed, -100, 100, np.int32)
    index = random_index(shape, seed + 100)
    try:
        target = reference_get(x, index)
    except IndexError:
        return
    value = rand(target.shape, seed + 200, -100, 100, np.int32)
    ref = x.copy()
    view, adv = torch_style(ref, index)
    if any(isinstance(a, np.ndarray) for a in adv):
        view[adv] = value
    else:
        ref[index] = value
    t = Tensor(x).realize()
    t[as_lazy(index)] = Tensor(value)
    np.testing.assert_array_equal(t.numpy(), ref, err_msg=str(index))


def test_setitem_forms(device: str) -> None:
    x = rand((4, 5), 5)
    t = Tensor(x, device=device).realize()
    ref = x.copy()
    t[1] = 7.0
    ref[1] = 7.0
    t[:, ::-2] = Tensor(np.arange(3, dtype=np.float32), device=device)
    ref[:, ::-2] = np.arange(3)
    t[t > 1.5] = 0.0
    ref[ref > 1.5] = 0.0
    t[[0, 0, 2], [1, 1, 3]] = Tensor(np.array([1.0, 2.0, 3.0], np.float32), device=device)
    ref[[0, 0, 2], [1, 1, 3]] = [1.0, 2.0, 3.0]  # a repeated position gets the last value, as in numpy
    t[..., 4] = 9
    ref[..., 4] = 9
    np.testing.assert_array_equal(t.numpy(), ref)
    t[0] += 1
    ref[0] += 1
    t[:, 1:] *= 2
    ref[:, 1:] *= 2
    np.testing.assert_array_equal(t.numpy(), ref)
    lazy = Tensor.zeros(3, 3, device=device)
    lazy[1:, 0] = 1.0  # not realized yet: the graph itself is updated
    np.testing.assert_array_equal(lazy.numpy(), np.array([[0, 0, 0], [1, 0, 0], [1, 0, 0]], np.float32))
    with pytest.raises(ValueError):
        t[0] = Tensor.ones(3, device=device)


# *** gather and scatter ***


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dim: int) -> None:
    x = rand((3, 4, 5), 6)
    rng = np.random.default_rng(7)
    idx_shape = [2, 3, 4]
    n = x.shape[dim]
    idx = rng.integers(0, n, size=idx_shape)
    compare(lambda t, i: t.gather(dim, i), lambda t, i: t.gather(dim, i), [x, idx])
    full = rng.integers(0, n, size=x.shape)
    compare(lambda t, i: t.gather(dim, i), lambda t, i: t.gather(dim, i), [x, full])


def test_gather_python_device(device: str) -> None:
    x, idx = rand((3, 4), 8), np.array([[0, 3, 1], [2, 2, 0]])
    compare(lambda t, i: t.gather(1, i), lambda t, i: t.gather(1, i), [x, idx], device=device, grad=False)


@pytest.mark.parametrize("dim", [0, 1])
def test_scatter(dim: int) -> None:
    x = rand((4, 5), 9)
    # a permutation per row/column, so that no position is written twice (torch leaves that order undefined)
    rng = np.random.default_rng(11)
    n = x.shape[dim]
    idx = np.stack([rng.permutation(n)[:3] for _ in range(4)], axis=1 - dim)[:3, :3]
    src = rand(idx.shape, 10)
    compare(lambda t, i, s: t.scatter(dim, i, s), lambda t, i, s: t.scatter(dim, i, s), [x, idx, src])
    compare(lambda t, i: t.scatter(dim, i, 2.5), lambda t, i: t.scatter(dim, i, 2.5), [x, idx])
    compare(
        lambda t, i, s: t.scatter(dim, i, s, reduce="add"),
        lambda t, i, s: t.scatter(dim, i, s, reduce="add"),
        [x, idx, src],
        grad=False,
    )
    compare(
        lambda t, i, s: t.scatter(dim, i, s, reduce="multiply"),
        lambda t, i, s: t.scatter(dim, i, s, reduce="multiply"),
        [x, idx, src],
        grad=False,
    )


def test_scatter_repeated_index_last_wins() -> None:
    x = np.zeros(4, np.float32)
    got = Tensor(x).scatter(0, Tensor([1, 3, 1]), Tensor([5.0, 6.0, 7.0])).numpy()
    np.testing.assert_array_equal(got, [0.0, 7.0, 0.0, 6.0])


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce: str, include_self: bool) -> None:
    x = rand((5, 3), 12)
    src = rand((6, 3), 13)
    idx = np.random.default_rng(14).integers(0, 4, size=(6, 3))  # repeats, and row 4 never written
    compare(
        lambda t, i, s: t.scatter_reduce(0, i, s, reduce, include_self=include_self),
        lambda t, i, s: t.scatter_reduce(0, i, s, reduce, include_self=include_self),
        [x, idx, src],
        grad=reduce in ("sum", "mean"),
        rtol=1e-5,
    )
    ints, isrc = rand((5, 3), 15, -20, 20, np.int32), rand((6, 3), 16, -20, 20, np.int32)
    compare(
        lambda t, i, s: t.scatter_reduce(0, i, s, reduce, include_self=include_self),
        lambda t, i, s: t.scatter_reduce(0, i, s, reduce, include_self=include_self),
        [ints, idx, isrc],
        grad=False,
    )


def test_one_hot_masked_select_nonzero() -> None:
    y = rand((3, 4), 17, 0, 5, np.int64)
    compare(lambda t: t.one_hot(6), lambda t: torch.nn.functional.one_hot(t, 6), [y], grad=False)
    compare(lambda t: t.one_hot(), lambda t: torch.nn.functional.one_hot(t), [y], grad=False)
    x, m = rand((3, 4), 18), rand((4,), 19, dtype=np.bool_)
    compare(lambda t, k: t.masked_select(k), lambda t, k: t.masked_select(k), [x, m], grad=False)
    compare(lambda t: t.nonzero(), lambda t: t.nonzero(), [rand((3, 4), 20, 0, 1, np.int32)], grad=False)


def test_embedding() -> None:
    w = rand((10, 4), 21)
    idx = rand((2, 3), 22, 0, 9, np.int64)
    compare(lambda i, t: i.embedding(t), lambda i, t: torch.nn.functional.embedding(i, t), [idx, w])
    assert Tensor(idx).embedding(Tensor(w)).dtype == dtypes.float32


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("stored", [False, True])
def test_assign_into_a_view_writes_the_viewed_tensor(seed: int, stored: bool) -> None:
    """`view.assign(v)` on a slice, transpose or int-indexed view changes the tensor it views, whether that tensor is
    stored or still lazy, as torch's in-place copy into a view does. Reference: numpy writing through a view."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 5, size=int(rng.integers(1, 4))))
    ref = rng.standard_normal(shape).astype(np.float32)
    t = (Tensor(ref) * 1).contiguous()  # lazy: a kernel not run yet
    if stored:
        t.realize()
    index = tuple(
        int(rng.integers(0, d)) if rng.random() < 0.3 else slice(int(rng.integers(0, d)), d, int(rng.integers(1, 3)))
        for d in shape
    )
    if all(isinstance(i, int) for i in index):  # a view, not one element (numpy gives a scalar copy for that)
        index = (slice(index[0], index[0] + 1), *index[1:])
    transpose = rng.random() < 0.5 and len(shape) > 1
    ref_view = ref.T[index[::-1]] if transpose else ref[index]
    view = t.T[index[::-1]] if transpose else t[index]
    value = rng.standard_normal(ref_view.shape).astype(np.float32)
    ref_view[...] = value  # numpy writes through its view into ref
    view.assign(Tensor(value))
    np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(view.numpy(), value)
