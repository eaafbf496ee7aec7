"""Movement ops of the Tensor API against torch: cat, stack, split, chunk, repeat, tile, roll, squeeze, unsqueeze,
flatten, unflatten, triu/tril, masked_fill, diagonals, padding modes; forward and backward, a subset on PYTHON."""

from __future__ import annotations

import numpy as np
import pytest
from torch_reference import compare, rand

from lazygrad import Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_stack(dim: int) -> None:
    a, b, c = rand((2, 3, 4), 1), rand((2, 3, 4), 2), rand((2, 3, 4), 3)
    compare(lambda x, y, z: x.cat(y, z, dim=dim), lambda x, y, z: torch.cat([x, y, z], dim), [a, b, c])
    compare(lambda x, y, z: Tensor.stack([x, y, z], dim=dim), lambda x, y, z: torch.stack([x, y, z], dim), [a, b, c])
    short = rand((2, 3, 1), 4) if dim == -1 else rand((1, 3, 4), 4) if dim == 0 else rand((2, 1, 4), 4)
    compare(lambda x, y: Tensor.cat(x, y, dim=dim), lambda x, y: torch.cat([x, y], dim), [a, short])


def test_cat_promotion_bool_and_empty() -> None:
    i, f = rand((2, 3), 5, 0, 9, np.int32), rand((1, 3), 6)
    compare(lambda x, y: x.cat(y), lambda x, y: torch.cat([x, y]), [i, f], grad=False)
    b1, b2 = rand((3,), 7, dtype=np.bool_), rand((2,), 8, dtype=np.bool_)
    compare(lambda x, y: x.cat(y), lambda x, y: torch.cat([x, y]), [b1, b2], grad=False)
    compare(lambda x, y: x.cat(y), lambda x, y: torch.cat([x, y]), [rand((0, 3), 9), f])
    with pytest.raises(ValueError):
        Tensor.ones(2, 3).cat(Tensor.ones(2, 4))


def test_cat_python_device(device: str) -> None:
    compare(
        lambda x, y: x.cat(y, dim=1),
        lambda x, y: torch.cat([x, y], 1),
        [rand((2, 2), 10), rand((2, 3), 11)],
        device=device,
        grad=False,
    )
    compare(
        lambda x, y: x.stack(y),
        lambda x, y: torch.stack([x, y]),
        [rand((3,), 12), rand((3,), 13)],
        device=device,
        grad=False,
    )


@pytest.mark.parametrize("sizes", [2, 3, [1, 4], [5, 0]])
def test_split_chunk(sizes: int | list[int]) -> None:
    x = rand((5, 4), 14)
    compare(lambda t: t.split(sizes), lambda t: t.split(sizes), [x])
    compare(lambda t: t.split(2, dim=1), lambda t: t.split(2, dim=1), [x])
    if isinstance(sizes, int):
        compare(lambda t: t.chunk(sizes), lambda t: t.chunk(sizes), [x])
        compare(lambda t: t.chunk(sizes, 1), lambda t: t.chunk(sizes, 1), [x])
    compare(lambda t: t.unbind(1), lambda t: t.unbind(1), [x])
    with pytest.raises(ValueError):
        Tensor(x).split([2, 2])


@pytest.mark.parametrize("reps", [(2, 1), (1, 3), (2, 2, 3), (0, 2)])
def test_repeat_tile(reps: tuple[int, ...]) -> None:
    x = rand((2, 3), 15)
    compare(lambda t: t.repeat(*reps), lambda t: t.repeat(*reps), [x])
    compare(lambda t: t.tile(reps[-1:]), lambda t: t.tile(reps[-1:]), [x])
    compare(lambda t: t.tile(reps), lambda t: t.tile(reps), [x])
    compare(lambda t: t.repeat_interleave(2, 1), lambda t: t.repeat_interleave(2, 1), [x])
    compare(lambda t: t.repeat_interleave(3), lambda t: t.repeat_interleave(3), [x])


@pytest.mark.parametrize("shifts,dims", [(1, 0), (-2, 1), ((1, 3), (0, 1)), (7, None), (0, 1), (5, -1)])
def test_roll(shifts: int | tuple[int, ...], dims: int | tuple[int, ...] | None) -> None:
    x = rand((3, 4), 16)
    compare(lambda t: t.roll(shifts, dims), lambda t: t.roll(shifts, dims), [x])


def test_shape_ops() -> None:
    x = rand((2, 1, 3, 1), 17)
    compare(lambda t: t.squeeze(), lambda t: t.squeeze(), [x])
    compare(lambda t: t.squeeze(1), lambda t: t.squeeze(1), [x])
    compare(lambda t: t.squeeze(0), lambda t: t.squeeze(0), [x])
    compare(lambda t: t.unsqueeze(-1), lambda t: t.unsqueeze(-1), [x])
    compare(lambda t: t.unsqueeze(2), lambda t: t.unsqueeze(2), [x])
    compare(lambda t: t.flatten(), lambda t: t.flatten(), [x])
    compare(lambda t: t.flatten(1, 2), lambda t: t.flatten(1, 2), [x])
    compare(lambda t: t.flatten(-2), lambda t: t.flatten(-2), [x])
    y = rand((2, 12), 18)
    compare(lambda t: t.unflatten(1, (3, 4)), lambda t: t.unflatten(1, (3, 4)), [y])
    compare(lambda t: t.unflatten(-1, (2, -1)), lambda t: t.unflatten(-1, (2, -1)), [y])
    z = rand((2, 3, 4), 19)
    compare(lambda t: t.movedim(0, -1), lambda t: t.movedim(0, -1), [z])
    compare(lambda t: t.movedim((0, 1), (2, 0)), lambda t: t.movedim((0, 1), (2, 0)), [z])
    compare(lambda t: t.swapaxes(0, 2), lambda t: t.swapaxes(0, 2), [z])
    compare(lambda t: t.transpose(-1, 0), lambda t: t.transpose(-1, 0), [z])
    compare(lambda t: t.permute(2, 0, 1), lambda t: t.permute(2, 0, 1), [z])
    compare(lambda t: t.expand(3, 2, 3, 4), lambda t: t.expand(3, 2, 3, 4), [z])
    compare(lambda t: t.flip(0, 2), lambda t: t.flip(0, 2), [z])


@pytest.mark.parametrize("diagonal", [-2, 0, 1])
def test_triu_tril(diagonal: int) -> None:
    for shape in ((4, 4), (2, 5, 3)):
        x = rand(shape, 20)
        compare(lambda t: t.triu(diagonal), lambda t: t.triu(diagonal), [x])
        compare(lambda t: t.tril(diagonal), lambda t: t.tril(diagonal), [x])
    ints = rand((3, 3), 21, -5, 5, np.int32)
    compare(lambda t: t.tril(diagonal), lambda t: t.tril(diagonal), [ints], grad=False)


@pytest.mark.parametrize("offset", [-1, 0, 2])
def test_diagonal_diag(offset: int) -> None:
    x = rand((3, 4, 5), 22)
    compare(lambda t: t.diagonal(offset), lambda t: t.diagonal(offset), [x])
    compare(lambda t: t.diagonal(offset, 1, 2), lambda t: t.diagonal(offset, 1, 2), [x])
    compare(lambda t: t.diagonal(offset, -1, 0), lambda t: t.diagonal(offset, -1, 0), [x])
    compare(lambda t: t.diag(offset), lambda t: t.diag(offset), [rand((4,), 23)])
    compare(lambda t: t.diag(offset), lambda t: t.diag(offset), [rand((3, 4), 24)])


def test_masked_fill_meshgrid() -> None:
    x, m = rand((3, 4), 25), rand((3, 4), 26, dtype=np.bool_)
    compare(lambda t, k: t.masked_fill(k, -1.5), lambda t, k: t.masked_fill(k, -1.5), [x, m])
    compare(lambda t, k: t.masked_fill(k, -np.inf), lambda t, k: t.masked_fill(k, -np.inf), [x, m[1:2]])
    ints = rand((3, 4), 27, 0, 9, np.int32)
    compare(lambda t, k: t.masked_fill(k, 7), lambda t, k: t.masked_fill(k, 7), [ints, m], grad=False)
    a, b = rand((3,), 28), rand((4,), 29)
    for indexing in ("ij", "xy"):
        compare(
            lambda p, q, indexing=indexing: p.meshgrid(q, indexing=indexing),
            lambda p, q, indexing=indexing: torch.meshgrid(p, q, indexing=indexing),
            [a, b],
        )


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad", [(1, 2), (2, 0, 1, 1), (0, 3, 2, 2), (-1, 2, 1, -1)])
def test_pad_modes(mode: str, pad: tuple[int, ...]) -> None:
    x = rand((2, 3, 4, 5) if len(pad) == 4 else (2, 3, 5), 30)
    if mode != "constant" and any(p < 0 for p in pad):
        if mode != "circular":
            return  # torch takes negative padding for constant and circular only
    compare(lambda t: t.pad(pad, mode=mode), lambda t: F.pad(t, pad, mode=mode), [x])
    if mode == "constant":
        compare(lambda t: t.pad(pad, value=2.5), lambda t: F.pad(t, pad, value=2.5), [x])


def test_pad_mode_errors_and_python(device: str) -> None:
    compare(
        lambda t: t.pad((1, 2), mode="reflect"),
        lambda t: F.pad(t, (1, 2), mode="reflect"),
        [rand((2, 4), 31)],
        device=device,
        grad=False,
    )
    compare(
        lambda t: t.pad((2, 1), mode="circular"),
        lambda t: F.pad(t, (2, 1), mode="circular"),
        [rand((1, 2, 4), 32)],
        device=device,
        grad=False,
    )
    with pytest.raises(ValueError, match="at most"):
        Tensor.ones(1, 3).pad((3, 0), mode="reflect")
    with pytest.raises(ValueError, match="mode"):
        Tensor.ones(1, 3).pad((1, 0), mode="wrap")


def test_eye_arange_full_linspace_like() -> None:
    np.testing.assert_array_equal(Tensor.eye(3, 4).numpy(), torch.eye(3, 4).numpy())
    np.testing.assert_array_equal(Tensor.arange(2, 11, 3).numpy(), np.arange(2, 11, 3))
    np.testing.assert_allclose(Tensor.arange(0.5, 2.0, 0.25).numpy(), torch.arange(0.5, 2.0, 0.25).numpy())
    np.testing.assert_array_equal(Tensor.arange(5, 0, -2).numpy(), np.arange(5, 0, -2))
    t = Tensor.full((2, 3), 7, dtype=dtypes.int16)
    assert t.dtype == dtypes.int16 and t.numpy().tolist() == [[7] * 3] * 2
    assert t.ones_like().dtype == dtypes.int16 and t.zeros_like(dtype=dtypes.float32).dtype == dtypes.float32
