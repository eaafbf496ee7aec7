"""Lookups by integer tensors — `w[idx]`, `gather`, `nn.Embedding` and the embedding's backward — against numpy, on
the CPU and PYTHON devices; and one-hot lookups whose arange the kernel computes (one written here from constants, and
the frontend's own), which codegen turns into one load per output (`lazygrad_codegen.selection`): their programs must
have no loop over the table and do work in proportion to the outputs, not to outputs x table rows."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from lazygrad import Context, Tensor, nn
from lazygrad.indexing import kernel_iota
from lazygrad_codegen import get_program
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device

RNG = np.random.default_rng(17)
DEVICES = ["CPU", "PYTHON"]


@pytest.fixture(params=DEVICES)
def dev(request: pytest.FixtureRequest) -> str:
    name = request.param
    why = Device.usable(name) if name in Device.installed() else "not installed"
    if why is not None:
        pytest.skip(f"{name} device unavailable: {why}")
    return name


def _table(v: int, h: int, dtype: type) -> np.ndarray:
    return (RNG.standard_normal((v, h)) * 10).astype(dtype)


def _wrap(idx: np.ndarray, n: int) -> np.ndarray:
    """The frontend's indexing rule: a negative index counts from the end once; what is still out of range selects
    nothing (0)."""
    return np.where(idx < 0, idx.astype(np.int64) + n, idx)


def _rows(w: np.ndarray, e: np.ndarray) -> np.ndarray:
    ok = (e >= 0) & (e < w.shape[0])
    return np.where(ok[..., None], w[np.where(ok, e, 0)], 0).astype(w.dtype)


def _ids(shape: tuple[int, ...], v: int) -> np.ndarray:
    """Random ids with repeats, negatives, and ids past either end."""
    return RNG.integers(-2 * v, 2 * v, shape).astype(np.int32)


@pytest.fixture
def unchecked_indices() -> Iterator[None]:
    """Index checks off (INDEX_CHECKS=0): these tests read what the lowered lookups give for ids past either end
    (nothing: 0), which the checks would otherwise report as errors (tested in test_index_checks.py)."""
    with Context(INDEX_CHECKS=0):
        yield


# *** the frontend's lookups ***


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16], ids=lambda d: d.__name__)
def test_tensor_index_matches_numpy(dev: str, dtype: type, unchecked_indices: None) -> None:
    for v, h, shape in [(13, 5, (7,)), (40, 3, (4, 6)), (1, 2, (3,))]:
        w = _table(v, h, dtype)
        idx = _ids(shape, v)
        out = Tensor(w, device=dev)[Tensor(idx, device=dev)].numpy()
        np.testing.assert_array_equal(out, _rows(w, _wrap(idx, v)))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16], ids=lambda d: d.__name__)
def test_gather_matches_numpy(dev: str, dtype: type, unchecked_indices: None) -> None:
    v, h = 11, 6
    w = _table(v, h, dtype)
    idx = _ids((9, h), v)
    out = Tensor(w, device=dev).gather(0, Tensor(idx, device=dev)).numpy()
    e = _wrap(idx, v)
    ok = (e >= 0) & (e < v)
    np.testing.assert_array_equal(out, np.where(ok, w[np.where(ok, e, 0), np.arange(h)], 0).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: d.__name__)
def test_embedding_matches_numpy_and_its_backward_scatter_adds(dev: str, dtype: type) -> None:
    v, h = 23, 4
    w = _table(v, h, dtype)
    idx = RNG.integers(0, v, (5, 7)).astype(np.int32)
    idx[0, :3] = 2  # repeated ids: their gradients add up
    emb = nn.Embedding(v, h)
    emb.weight = Tensor(w, device=dev, requires_grad=True)
    out = emb(Tensor(idx, device=dev))
    np.testing.assert_array_equal(out.numpy(), w[idx])
    g = RNG.standard_normal((5, 7, h)).astype(dtype)
    (out * Tensor(g, device=dev)).sum().backward()
    want = np.zeros((v, h), np.float64)
    np.add.at(want, idx, g.astype(np.float64))
    tol = 1e-5 if dtype is np.float32 else 2e-2
    np.testing.assert_allclose(emb.weight.grad.numpy().astype(np.float64), want, rtol=tol, atol=tol)


# *** a lookup whose arange is computed in the kernel: one load, no loop ***


def kernel_arange(n: int, device: str) -> Tensor:
    """0..n-1 (int32) built from constants and movement ops only, so that it is index math inside the kernel that
    uses it (not a buffer): bit b of each position is a constant 2**b, padded to be there only where the bit is."""
    p = 1 << max(1, (n - 1).bit_length())
    out = None
    for b in range(p.bit_length() - 1):
        bit = Tensor.ones(p >> (b + 1), 1, 1 << b, dtype=dtypes.int32, device=device)
        bit = bit.pad(((0, 0), (1, 0), (0, 0))).reshape(p)[:n] * (1 << b)
        out = bit if out is None else out + bit
    assert out is not None
    return out


def onehot_lookup(w: Tensor, idx: Tensor) -> Tensor:
    """w[idx] as the frontend spells it (negative ids wrapped once, a one-hot WHERE summed over the rows), with the
    arange from `kernel_arange`. The wrapped ids are stored first: recomputing their three ops for every column
    looks too costly to the scheduler, which would then store the whole (ids x rows) mask instead and leave codegen
    a loop over it."""
    v = w.shape[0]
    e = (idx < 0).where(idx + v, idx).contiguous()
    hit = e.reshape(*idx.shape, 1).eq(kernel_arange(v, w.device)).reshape(*idx.shape, v, 1)
    return hit.where(w.reshape(*(1,) * idx.ndim, *w.shape), 0).sum(idx.ndim)


def _programs(t: Tensor) -> list:
    return [get_program(si.ast, Device[si.bufs[0].device].renderer) for si in t.schedule()]


def _assert_one_load_per_output(out: Tensor, v: int, sizes: tuple[int, ...]) -> None:
    """The kernels of `out` (a lookup into `v` rows) have no loop over the rows (unless some other axis, of
    `sizes`, has that length too) and no accumulator, and do a small constant of work per output element."""
    specs = _programs(out)
    for spec in specs:
        loops = [u.src[0].arg for u in spec.uops if u.op is Ops.RANGE]
        assert v not in loops or v in sizes, f"loop over the {v} rows left in {spec.name}: {loops}"
        assert not any(u.op is Ops.DEFINE_ACC for u in spec.uops), spec.name
    # the work is per output element, a small constant each, not per output x rows
    assert sum(int(s.estimates.ops) for s in specs) <= 40 * out.numel()


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16], ids=lambda d: d.__name__)
def test_kernel_arange_lookup_is_one_load_per_output(dev: str, dtype: type) -> None:
    for v, h, shape in [(37, 8, (5, 3)), (300, 4, (11,)), (2, 1, (4,)), (3001, 384, (3, 4))]:
        w = _table(v, h, dtype)
        idx = _ids(shape, v)
        idx.flat[:2] = [2**31 - 1, -(2**31)]
        w_t, idx_t = Tensor(w, device=dev).realize(), Tensor(idx, device=dev).realize()
        out = onehot_lookup(w_t, idx_t)
        _assert_one_load_per_output(out, v, (*shape, h))
        np.testing.assert_array_equal(out.numpy(), _rows(w, _wrap(idx, v)))


# *** the frontend's lookups compile to the same: one load per output ***


@pytest.mark.parametrize("n", [0, 1, 2, 3, 8, 37, 1024, 30522])
def test_kernel_iota_is_an_arange_with_no_buffer(n: int) -> None:
    for dt, np_dt in [(dtypes.int32, np.int32), (dtypes.int64, np.int64)]:
        iota = kernel_iota(Tensor, n, dt, "CPU")
        assert not [u for u in iota.uop.toposort if u.op is Ops.BUFFER], "an in-kernel arange must read no buffer"
        got = iota.numpy()
        assert got.dtype == np_dt
        np.testing.assert_array_equal(got, np.arange(n, dtype=np_dt))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16], ids=lambda d: d.__name__)
def test_tensor_index_is_one_load_per_output(dev: str, dtype: type, unchecked_indices: None) -> None:
    for v, h, shape in [(37, 8, (5, 3)), (300, 4, (11,)), (3001, 384, (3, 4))]:
        w = _table(v, h, dtype)
        idx = _ids(shape, v)
        out = Tensor(w, device=dev).realize()[Tensor(idx, device=dev).realize()]
        _assert_one_load_per_output(out, v, (*shape, h))
        np.testing.assert_array_equal(out.numpy(), _rows(w, _wrap(idx, v)))


def test_tensor_index_on_two_dims_is_one_load_per_output(dev: str) -> None:
    w = _table(7 * 11, 5, np.float32).reshape(7, 11, 5)
    # in range, negatives included (past the ends, ids on several dimensions combine into one flat position)
    i, j = RNG.integers(-7, 7, (4, 3)), RNG.integers(-11, 11, (4, 3))
    out = Tensor(w, device=dev).realize()[Tensor(i, device=dev), Tensor(j, device=dev)]
    _assert_one_load_per_output(out, 7 * 11, (4, 3, 5))
    np.testing.assert_array_equal(out.numpy(), w[i, j])


def test_gather_is_one_load_per_output(dev: str, unchecked_indices: None) -> None:
    v, h = 301, 6
    w = _table(v, h, np.float32)
    idx = _ids((9, h), v)
    out = Tensor(w, device=dev).realize().gather(0, Tensor(idx, device=dev).realize())
    _assert_one_load_per_output(out, v, (9, h))
    e = _wrap(idx, v)
    ok = (e >= 0) & (e < v)
    np.testing.assert_array_equal(out.numpy(), np.where(ok, w[np.where(ok, e, 0), np.arange(h)], 0))


def test_embedding_is_one_load_per_output_with_stored_or_computed_ids(dev: str) -> None:
    v, h = 3001, 16
    w = _table(v, h, np.float32)
    idx = RNG.integers(0, v, (4, 6)).astype(np.int32)
    emb = nn.Embedding(v, h)
    emb.weight = Tensor(w, device=dev).realize()
    ids = Tensor(idx, device=dev).realize()
    # ids straight from a buffer, and ids computed lazily (which the lookup stores before comparing)
    for ids_in, want in [(ids, idx), ((ids + 5) % v, (idx + 5) % v)]:
        out = emb(ids_in)
        _assert_one_load_per_output(out, v, (4, 6, h))
        np.testing.assert_array_equal(out.numpy(), w[want])


def test_kernel_arange_lookup_backward_scatter_adds(dev: str) -> None:
    v, h = 19, 3
    w = _table(v, h, np.float32)
    idx = RNG.integers(-v, v, (4, 5)).astype(np.int32)
    idx[1, :] = 7  # one row read five times
    w_t = Tensor(w, device=dev, requires_grad=True)
    out = onehot_lookup(w_t, Tensor(idx, device=dev))
    g = RNG.standard_normal((4, 5, h)).astype(np.float32)
    (out * Tensor(g, device=dev)).sum().backward()
    want = np.zeros((v, h), np.float64)
    np.add.at(want, _wrap(idx, v), g.astype(np.float64))
    np.testing.assert_allclose(w_t.grad.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out.numpy(), _rows(w, _wrap(idx, v)))
