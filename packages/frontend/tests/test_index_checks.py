"""Out-of-range integer indices are found on the device and raise IndexError at the next read, naming the op, the
index and the range (torch raises for the same calls, checked here too); in-range indices give numpy's values; a
jitted function checks on every replay; INDEX_CHECKS=0 turns the checks off. On CPU and PYTHON."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lazygrad import Context, Tensor, TinyJit, nn
from lazygrad.index_checks import _pending

torch = pytest.importorskip("torch")

DEVICES = ["CPU", "PYTHON"]
DATA = np.arange(12, dtype=np.float32).reshape(3, 4)

# (name, lazygrad op on (data, index), torch op on (data, index), bad index, message)
OPS = [
    ("getitem", lambda t, i: t[i], lambda t, i: t[i], [0, 3], r"indexing dimension 0 .* index 3 .*\[-3, 3\)"),
    ("getitem negative", lambda t, i: t[:, i], lambda t, i: t[:, i], [-5], r"index -5 .*\[-4, 4\)"),
    ("gather", lambda t, i: t.gather(1, i), lambda t, i: t.gather(1, i), [[1], [4], [0]], r"gather .* index 4"),
    (
        "scatter",
        lambda t, i: t.scatter(1, i, 1.0),
        lambda t, i: t.scatter(1, i, 1.0),
        [[7], [0], [1]],
        r"scatter along dimension 1 .* index 7",
    ),
    (
        "one_hot",
        lambda t, i: i.one_hot(3),
        lambda t, i: torch.nn.functional.one_hot(i, 3),
        [0, 3],
        r"one_hot .* index 3",
    ),
    (
        "embedding",
        lambda t, i: _embedding(t)(i),
        lambda t, i: torch.nn.functional.embedding(i, t),
        [[0, 2], [3, 1]],
        r"Embedding with 3 rows: index 3",
    ),
    (
        "sparse_categorical_crossentropy",
        lambda t, i: t.sparse_categorical_crossentropy(i),
        lambda t, i: torch.nn.functional.cross_entropy(t, i),
        [0, 1, 9],
        r"sparse_categorical_crossentropy labels with 4 classes: index 9",
    ),
    (
        "cross_entropy",
        lambda t, i: t.cross_entropy(i),
        lambda t, i: torch.nn.functional.cross_entropy(t, i),
        [0, 4, 1],
        r"cross_entropy target .* index 4",
    ),
]


def _embedding(weight: Tensor) -> nn.Embedding:
    emb = nn.Embedding(*weight.shape)
    emb.weight = weight
    return emb


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", OPS, ids=[c[0] for c in OPS])
def test_out_of_range_index_raises_at_the_read(case, device: str) -> None:
    _, op, top, bad, message = case
    with pytest.raises((IndexError, RuntimeError)):
        top(torch.tensor(DATA), torch.tensor(bad))  # torch refuses the same call
    out = op(Tensor(DATA, device=device), Tensor(np.array(bad, np.int32), device=device))  # lazy: nothing raised yet
    with pytest.raises(IndexError, match=message):
        out.numpy()
    assert not _pending


@pytest.mark.parametrize("case", OPS, ids=[c[0] for c in OPS])
def test_in_range_indices_give_torch_values(case) -> None:
    _, op, top, bad, _ = case
    good = np.clip(np.array(bad), 0, 2)
    got = op(Tensor(DATA), Tensor(good.astype(np.int32))).numpy()
    want = top(torch.tensor(DATA), torch.tensor(good, dtype=torch.int64)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_ignored_labels_are_not_out_of_range() -> None:
    logits = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    labels = np.array([1, -1, 3])
    got = Tensor(logits).sparse_categorical_crossentropy(Tensor(labels.astype(np.int32))).item()
    want = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels), ignore_index=-1).item()
    assert got == pytest.approx(want, rel=1e-5)


def test_item_and_a_later_read_raise() -> None:
    t = Tensor(DATA)
    t[Tensor([5])]  # never read itself: the next read of anything reports it
    with pytest.raises(IndexError, match="index 5"):
        Tensor([1.0]).sum().item()
    assert Tensor([1.0]).sum().item() == 1.0  # reported once


def test_checks_off_select_nothing() -> None:
    with Context(INDEX_CHECKS=0):
        np.testing.assert_array_equal(Tensor(DATA)[Tensor([0, 3])].numpy(), np.stack([DATA[0], np.zeros(4)]))


def test_jitted_function_checks_every_replay() -> None:
    emb_weight = Tensor(DATA).realize()

    @TinyJit
    def f(i: Tensor) -> Tensor:
        return (_embedding(emb_weight)(i) * 2).sum(-1)

    for _ in range(3):
        np.testing.assert_allclose(f(Tensor([[0, 2]])).numpy(), (DATA[[0, 2]] * 2).sum(-1)[None])
    with pytest.raises(IndexError, match="Embedding with 3 rows: index 7"):
        f(Tensor([[7, 1]]))
    np.testing.assert_allclose(f(Tensor([[1, 1]])).numpy(), (DATA[[1, 1]] * 2).sum(-1)[None])


@given(st.lists(st.integers(-6, 6), min_size=1, max_size=8))
def test_getitem_property(indices: list[int]) -> None:
    n = DATA.shape[0]
    out = Tensor(DATA)[Tensor(np.array(indices, np.int32))]
    if all(-n <= i < n for i in indices):
        np.testing.assert_array_equal(out.numpy(), DATA[indices])
    else:
        worst = max(i for i in indices if not -n <= i < n)
        with pytest.raises(IndexError, match=f"index {worst} "):
            out.numpy()
