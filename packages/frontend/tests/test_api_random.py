"""Random numbers: Threefry-2x32 against the published known-answer vectors and a Python-int implementation, the
same values on every device for a seed, reproducibility, ranges, moments, and the initializers' distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lazygrad import Tensor, dtypes
from lazygrad.random import threefry2x32

M32 = 0xFFFFFFFF


def threefry_reference(key: tuple[int, int], ctr: tuple[int, int]) -> tuple[int, int]:
    """Threefry-2x32-20 on Python ints, written from the Random123 specification."""
    rot = [13, 15, 26, 6, 17, 29, 16, 24]
    ks = [key[0], key[1], 0x1BD11BDA ^ key[0] ^ key[1]]
    x = [(ctr[0] + ks[0]) & M32, (ctr[1] + ks[1]) & M32]
    for r in range(20):
        x[0] = (x[0] + x[1]) & M32
        x[1] = ((x[1] << rot[r % 8]) | (x[1] >> (32 - rot[r % 8]))) & M32
        x[1] ^= x[0]
        if r % 4 == 3:
            s = r // 4 + 1
            x[0] = (x[0] + ks[s % 3]) & M32
            x[1] = (x[1] + ks[(s + 1) % 3] + s) & M32
    return x[0], x[1]


# Random123's known-answer vectors for threefry2x32_20: (key, counter, expected)
KAT = [
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((M32, M32), (M32, M32), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize("key,ctr,expected", KAT)
def test_threefry_known_answers(device: str, key: tuple[int, int], ctr: tuple[int, int], expected: tuple) -> None:
    assert threefry_reference(key, ctr) == expected
    c0 = Tensor(np.array([ctr[0]], np.uint32), device=device)
    c1 = Tensor(np.array([ctr[1]], np.uint32), device=device)
    x0, x1 = threefry2x32(key, c0, c1)
    assert (x0.item(), x1.item()) == expected


def test_threefry_random_counters() -> None:
    rng = np.random.default_rng(0)
    c = rng.integers(0, 2**32, size=(2, 64), dtype=np.uint64).astype(np.uint32)
    key = (0xDEADBEEF, 12345)
    x0, x1 = threefry2x32(key, Tensor(c[0]), Tensor(c[1]))
    ref = np.array([threefry_reference(key, (int(a), int(b))) for a, b in zip(c[0], c[1])], np.uint32)
    np.testing.assert_array_equal(x0.numpy(), ref[:, 0])
    np.testing.assert_array_equal(x1.numpy(), ref[:, 1])


def test_rand_is_threefry_of_its_counters() -> None:
    Tensor.manual_seed(2**32 + 7)
    v = Tensor.rand(5).numpy()
    words = [threefry_reference((7, 1), (i, 0))[0] for i in range(5)]
    np.testing.assert_array_equal(v, np.array([(w >> 8) * 2.0**-24 for w in words], np.float32))


def test_lazy_random_tensors_keep_their_own_stream() -> None:
    # realized out of order, and after later calls advanced the generator: each keeps the call index it was made with
    Tensor.manual_seed(11)
    a, b, c = Tensor.rand(4), Tensor.rand(4, contiguous=False), Tensor.rand(4)
    got = [t.numpy() for t in (c, a, b)]
    for k, v in zip((2, 0, 1), got):
        words = [threefry_reference((11, 0), (i, k))[0] for i in range(4)]
        np.testing.assert_array_equal(v, np.array([(w >> 8) * 2.0**-24 for w in words], np.float32))


def test_each_device_counts_its_own_calls(device: str) -> None:
    Tensor.manual_seed(12)
    first = Tensor.rand(6, device="CPU").numpy()
    second = Tensor.rand(6, device="CPU").numpy()
    Tensor.manual_seed(12)
    np.testing.assert_array_equal(Tensor.rand(6, device=device).numpy(), first)
    np.testing.assert_array_equal(Tensor.rand(6, device=device).numpy(), second)


def test_same_values_on_every_device(device: str) -> None:
    makers = [
        lambda d: Tensor.rand(3, 5, device=d),
        lambda d: Tensor.randn(7, device=d),
        lambda d: Tensor.randint(4, 2, low=-5, high=9, device=d),
        lambda d: Tensor.rand(6, dtype=dtypes.float16, device=d),
    ]
    for make in makers:
        Tensor.manual_seed(42)
        ref = make("CPU").numpy()
        Tensor.manual_seed(42)
        got = make(device).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


def test_reproducible_and_fresh() -> None:
    Tensor.manual_seed(1)
    a, b = Tensor.rand(100).numpy(), Tensor.rand(100).numpy()
    Tensor.manual_seed(1)
    a2, b2 = Tensor.rand(100).numpy(), Tensor.rand(100).numpy()
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    assert not np.array_equal(a, b)
    Tensor.manual_seed(2)
    assert not np.array_equal(Tensor.rand(100).numpy(), a)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64])
def test_rand_range_and_uniformity(dt: object) -> None:
    Tensor.manual_seed(3)
    t = Tensor.rand(64, 128, dtype=dt)
    assert t.dtype == dt and t.shape == (64, 128)
    v = t.float().numpy().astype(np.float64)
    assert v.min() >= 0 and v.max() < 1
    assert abs(v.mean() - 0.5) < 0.01 and abs(v.var() - 1 / 12) < 0.005
    hist = np.histogram(v, bins=16, range=(0, 1))[0]
    assert hist.min() > 0.8 * v.size / 16


def test_large_rand_counters() -> None:
    Tensor.manual_seed(4)
    v = Tensor.rand(5000 * 7).numpy()  # longer than one counter chunk
    assert len(np.unique(v)) > 0.99 * v.size and abs(v.mean() - 0.5) < 0.01


def test_randn_moments() -> None:
    Tensor.manual_seed(5)
    v = Tensor.randn(200, 100).numpy().astype(np.float64)
    assert abs(v.mean()) < 0.02 and abs(v.std() - 1) < 0.02
    assert abs(((v - v.mean()) ** 3).mean()) < 0.05 and abs(((v - v.mean()) ** 4).mean() - 3) < 0.15
    assert np.isfinite(v).all()
    n = Tensor.normal(1000, mean=3.0, std=0.5).numpy()
    assert abs(n.mean() - 3) < 0.05 and abs(n.std() - 0.5) < 0.05


def test_randint() -> None:
    Tensor.manual_seed(6)
    v = Tensor.randint(2000, low=-3, high=4).numpy()
    assert v.dtype == np.int32 and v.min() == -3 and v.max() == 3
    counts = np.bincount(v + 3)
    assert counts.min() > 2000 / 7 * 0.8
    big = Tensor.randint(500, low=0, high=2**40, dtype=dtypes.int64).numpy()
    assert big.min() >= 0 and big.max() < 2**40 and big.max() > 2**39
    with pytest.raises(ValueError):
        Tensor.randint(3, low=2, high=2)


def test_uniform_and_initializers() -> None:
    Tensor.manual_seed(7)
    u = Tensor.uniform(1000, low=-2.0, high=5.0).numpy()
    assert u.min() >= -2 and u.max() < 5 and abs(u.mean() - 1.5) < 0.2
    shape = (64, 32, 3, 3)
    fan_in = 32 * 9
    k = Tensor.kaiming_uniform(*shape, a=0.0).numpy()
    bound = math.sqrt(6 / fan_in)
    assert np.abs(k).max() <= bound and abs(k.std() - bound / math.sqrt(3)) < 0.05 * bound
    kn = Tensor.kaiming_normal(*shape, a=0.0).numpy()
    assert abs(kn.std() - math.sqrt(2 / fan_in)) < 0.03 * math.sqrt(2 / fan_in)
    g = Tensor.glorot_uniform(100, 200).numpy()
    assert np.abs(g).max() <= math.sqrt(6 / 300)
    s = Tensor.scaled_uniform(40, 50).numpy()
    assert np.abs(s).max() <= 1 / math.sqrt(2000)


def test_like_requires_grad_and_errors() -> None:
    x = Tensor.ones(3, 4, dtype=dtypes.float16)
    assert x.rand_like().dtype == dtypes.float16 and x.randn_like().shape == (3, 4)
    w = Tensor.rand(2, 2, requires_grad=True)
    assert w.requires_grad
    with pytest.raises(TypeError):
        Tensor.rand(3, dtype=dtypes.int32)
    with pytest.raises(ValueError):
        Tensor.manual_seed(-1)


def test_randperm_multinomial() -> None:
    Tensor.manual_seed(8)
    p = Tensor.randperm(50).numpy()
    assert sorted(p.tolist()) == list(range(50)) and p.dtype == np.int64
    w = Tensor([0.1, 0.0, 0.6, 0.3])
    s = w.multinomial(4000, replacement=True).numpy()
    freq = np.bincount(s, minlength=4) / 4000
    np.testing.assert_allclose(freq, [0.1, 0.0, 0.6, 0.3], atol=0.03)
    rows = Tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0]]).multinomial(2).numpy()
    assert rows.shape == (2, 2) and all(len(set(r)) == 2 for r in rows.tolist())
    assert set(rows[1].tolist()) == {2, 3} and 2 not in rows[0].tolist()
