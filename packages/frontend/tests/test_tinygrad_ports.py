"""tinygrad programs with only their imports changed: examples/beautiful_mnist.py trained for a few steps on a
generated MNIST served from 127.0.0.1, and the snippets of tinygrad's quickstart, each checked against numpy."""

from __future__ import annotations

import math
import runpy
from pathlib import Path

import numpy as np
import pytest
from dataset_files import md5s, serve, write_mnist

from lazygrad.nn import datasets

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "beautiful_mnist.py"


@pytest.fixture
def local_mnist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A generated MNIST (every image of a class a noisy copy of that class's pattern, so it can be learned) served
    from 127.0.0.1, with lazygrad.nn.datasets pointed at it; yields the arrays by file name."""
    arrays = write_mnist(tmp_path / "srv", n_train=256, n_test=64)
    rng = np.random.default_rng(7)
    patterns = rng.integers(0, 256, (10, 28, 28))
    for images, labels in (("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
                           ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")):  # fmt: skip
        noise = rng.integers(-40, 40, arrays[images].shape)
        arrays[images] = np.clip(patterns[arrays[labels]] + noise, 0, 255).astype(np.uint8)
    import gzip

    from dataset_files import idx_bytes

    for name, a in arrays.items():
        (tmp_path / "srv" / name).write_bytes(gzip.compress(idx_bytes(a)))
    monkeypatch.setattr(datasets, "cache_dir", lambda: tmp_path / "cache")  # CACHEDIR would move the compile cache
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    with serve(tmp_path / "srv") as (url, _):
        monkeypatch.setenv(datasets.MNIST.env, url)
        monkeypatch.setattr(datasets.MNIST, "md5", md5s(tmp_path / "srv"))
        yield arrays


def test_beautiful_mnist_trains(local_mnist, monkeypatch) -> None:
    if not EXAMPLE.exists():
        pytest.skip(f"{EXAMPLE} is not in this checkout")
    pytest.importorskip("tqdm")
    monkeypatch.setenv("STEPS", "10")
    monkeypatch.setenv("BS", "32")
    out = runpy.run_path(str(EXAMPLE), run_name="__main__")
    # ten steps of Adam on classes that are noisy copies of ten patterns: well above chance (10%)
    assert math.isfinite(out["loss"].item())
    assert out["test_acc"] >= 50.0
    labels = local_mnist["t10k-labels-idx1-ubyte.gz"]
    predicted = out["model"](out["X_test"]).argmax(axis=1).numpy()
    assert out["test_acc"] == pytest.approx(100 * (predicted == labels).mean(), abs=1e-3)


def test_quickstart_creation_and_ops() -> None:
    from lazygrad import Tensor, dtypes

    t1 = Tensor([1, 2, 3, 4, 5])
    na = np.array([1, 2, 3, 4, 5])
    t2 = Tensor(na)
    np.testing.assert_array_equal(t1.numpy(), t2.numpy())
    full = Tensor.full(shape=(2, 3), fill_value=5)
    np.testing.assert_array_equal(full.numpy(), np.full((2, 3), 5))
    np.testing.assert_array_equal(Tensor.zeros(2, 3).numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(Tensor.ones(2, 3).numpy(), np.ones((2, 3)))
    np.testing.assert_array_equal(Tensor.full_like(full, fill_value=2).numpy(), np.full((2, 3), 2))
    np.testing.assert_array_equal(Tensor.zeros_like(full).numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(Tensor.ones_like(full).numpy(), np.ones((2, 3)))
    np.testing.assert_array_equal(Tensor.eye(3).numpy(), np.eye(3))
    np.testing.assert_array_equal(Tensor.arange(start=0, stop=10, step=1).numpy(), np.arange(10))
    rand, randn = Tensor.rand(2, 3).numpy(), Tensor.randn(2, 3)
    assert rand.shape == (2, 3) and ((rand >= 0) & (rand < 1)).all() and randn.shape == (2, 3)
    uniform = Tensor.uniform(2, 3, low=0, high=10).numpy()
    assert ((uniform >= 0) & (uniform < 10)).all()
    assert Tensor([1, 2, 3, 4, 5], dtype=dtypes.int32).dtype == dtypes.int32

    t4 = Tensor([1, 2, 3, 4, 5])
    t5 = (t4 + 1) * 2
    t6 = (t5 * t4).relu().log_softmax()
    x = (na + 1) * 2 * na
    np.testing.assert_allclose(t6.numpy(), x - np.log(np.exp(x - x.max()).sum()) - x.max(), rtol=1e-5, atol=1e-5)


def test_quickstart_training_loop(local_mnist) -> None:
    from lazygrad import Tensor, TinyJit, nn
    from lazygrad.helpers import Context, GlobalCounters, Timing
    from lazygrad.nn.datasets import mnist
    from lazygrad.nn.state import get_parameters

    class Linear:
        def __init__(self, in_features: int, out_features: int, bias: bool = True, initialization: str = "uniform"):
            self.weight = getattr(Tensor, initialization)(out_features, in_features)
            self.bias = Tensor.zeros(out_features) if bias else None

        def __call__(self, x: Tensor) -> Tensor:
            return x.linear(self.weight.transpose(), self.bias)

    class TinyNet:
        def __init__(self):
            self.l1 = Linear(784, 128, bias=False)
            self.l2 = Linear(128, 10, bias=False)

        def __call__(self, x: Tensor) -> Tensor:
            x = self.l1(x)
            x = x.leaky_relu()
            x = self.l2(x)
            return x

    net = TinyNet()
    opt = nn.optim.SGD(get_parameters(net), lr=3e-4)
    X_train, Y_train, X_test, Y_test = mnist()  # noqa: N806 - the quickstart's names

    @TinyJit
    def step() -> Tensor:
        with Tensor.train():
            samples = Tensor.randint(64, high=X_train.shape[0])
            X, Y = X_train[samples].flatten(1).float() / 255, Y_train[samples]  # noqa: N806
            out = net(X)
            loss = out.sparse_categorical_crossentropy(Y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

    with Timing("Time: "):
        losses = [step().item() for _ in range(5)]
    assert all(math.isfinite(v) for v in losses)
    GlobalCounters.reset()
    with Context(TRAINING=0):
        pred = net(X_test.flatten(1).float() / 255).argmax(axis=-1)
        acc = (pred == Y_test).mean().item()
    w1, w2 = net.l1.weight.numpy(), net.l2.weight.numpy()
    x = local_mnist["t10k-images-idx3-ubyte.gz"].reshape(-1, 784) / 255
    h = x @ w1.T
    want = ((np.where(h > 0, h, 0.01 * h) @ w2.T).argmax(-1) == local_mnist["t10k-labels-idx1-ubyte.gz"]).mean()
    assert acc == pytest.approx(want, abs=1e-6) and GlobalCounters.kernel_count > 0
