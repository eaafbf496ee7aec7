"""lazygrad.nn.datasets against files the test writes in the real formats and serves from 127.0.0.1: values as
written, one download per file (then the cache), checksums enforced, and a clear error when the server is gone."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
from dataset_files import md5s, serve, write_cifar, write_mnist

from lazygrad.nn import datasets
from lazygrad.nn.datasets import DatasetDownloadError, parse_idx


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty dataset cache, and no proxy between the test and its loopback server."""
    monkeypatch.setenv("CACHEDIR", str(tmp_path / "cache"))
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    return tmp_path / "cache" / "lazygrad" / "datasets"


def point_at(monkeypatch: pytest.MonkeyPatch, source: datasets.Source, url: str, folder: Path) -> None:
    """Make `source` download from `url` and expect the MD5s of the files in `folder`."""
    monkeypatch.setenv(source.env, url)
    monkeypatch.setattr(source, "md5", md5s(folder))


def test_mnist_downloads_once_and_reads_the_idx_files(tmp_path, cache, monkeypatch) -> None:
    arrays = write_mnist(tmp_path / "srv", n_train=50, n_test=20)
    with serve(tmp_path / "srv") as (url, requests):
        point_at(monkeypatch, datasets.MNIST, url, tmp_path / "srv")
        x_train, y_train, x_test, y_test = datasets.mnist()
        assert sorted(requests) == sorted(f"/{name}" for name in arrays)
        again = datasets.mnist()
        assert len(requests) == 4, "the second call must read the cache, not the server"
    assert x_train.shape == (50, 1, 28, 28) and x_test.shape == (20, 1, 28, 28)
    assert x_train.dtype.name == y_train.dtype.name == "unsigned char"
    np.testing.assert_array_equal(x_train.numpy()[:, 0], arrays["train-images-idx3-ubyte.gz"])
    np.testing.assert_array_equal(y_train.numpy(), arrays["train-labels-idx1-ubyte.gz"])
    np.testing.assert_array_equal(x_test.numpy()[:, 0], arrays["t10k-images-idx3-ubyte.gz"])
    np.testing.assert_array_equal(y_test.numpy(), arrays["t10k-labels-idx1-ubyte.gz"])
    np.testing.assert_array_equal(again[3].numpy(), y_test.numpy())
    assert sorted(p.name for p in (cache / "mnist").iterdir()) == sorted(arrays)


def test_fashion_mnist_has_its_own_source_and_cache(tmp_path, cache, monkeypatch) -> None:
    arrays = write_mnist(tmp_path / "srv", n_train=8, n_test=4, seed=3)
    with serve(tmp_path / "srv") as (url, _):
        point_at(monkeypatch, datasets.FASHION_MNIST, url, tmp_path / "srv")
        _, y_train, _, _ = datasets.mnist(fashion=True)
    np.testing.assert_array_equal(y_train.numpy(), arrays["train-labels-idx1-ubyte.gz"])
    assert (cache / "fashion-mnist").is_dir() and not (cache / "mnist").exists()


def test_cifar_reads_the_python_tarball(tmp_path, cache, monkeypatch) -> None:
    want = write_cifar(tmp_path / "srv", per_batch=6)
    with serve(tmp_path / "srv") as (url, requests):
        point_at(monkeypatch, datasets.CIFAR10, url, tmp_path / "srv")
        got = datasets.cifar()
        datasets.cifar()
        assert requests == ["/cifar-10-python.tar.gz"]
    for t, key in zip(got, ("x_train", "y_train", "x_test", "y_test")):
        np.testing.assert_array_equal(t.numpy(), want[key])
    assert got[0].shape == (30, 3, 32, 32) and got[2].shape == (6, 3, 32, 32)


def test_a_wrong_checksum_is_refused_and_not_cached(tmp_path, cache, monkeypatch) -> None:
    write_mnist(tmp_path / "srv", n_train=4, n_test=2)
    with serve(tmp_path / "srv") as (url, _):
        monkeypatch.setenv(datasets.MNIST.env, url)
        # the published checksums: the generated files don't have them
        with pytest.raises(DatasetDownloadError, match="MD5") as info:
            datasets.mnist()
    assert "train-images-idx3-ubyte.gz" in str(info.value)
    assert not (cache / "mnist" / "train-images-idx3-ubyte.gz").exists()


def test_a_corrupt_cached_file_is_downloaded_again(tmp_path, cache, monkeypatch) -> None:
    arrays = write_mnist(tmp_path / "srv", n_train=4, n_test=2)
    with serve(tmp_path / "srv") as (url, requests):
        point_at(monkeypatch, datasets.MNIST, url, tmp_path / "srv")
        datasets.mnist()
        (cache / "mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"truncated")
        _, _, _, y_test = datasets.mnist()
        assert requests.count("/t10k-labels-idx1-ubyte.gz") == 2 and len(requests) == 5
    np.testing.assert_array_equal(y_test.numpy(), arrays["t10k-labels-idx1-ubyte.gz"])


def test_offline_says_where_to_put_the_file(tmp_path, cache, monkeypatch) -> None:
    with socket.socket() as s:  # a loopback port with nothing listening on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(datasets.MNIST.env, f"http://127.0.0.1:{port}/")
    with pytest.raises(DatasetDownloadError) as info:
        datasets.mnist()
    msg = str(info.value)
    assert f"127.0.0.1:{port}/train-images-idx3-ubyte.gz" in msg
    assert str(cache / "mnist" / "train-images-idx3-ubyte.gz") in msg and datasets.MNIST.env in msg
    assert isinstance(info.value, ConnectionError)


def test_parse_idx_rejects_what_is_not_idx() -> None:
    with pytest.raises(ValueError, match="IDX"):
        parse_idx(b"PK\x03\x04 a zip file")
    with pytest.raises(ValueError, match="bytes"):
        parse_idx(bytes([0, 0, 8, 1, 0, 0, 0, 5, 1, 2]))  # says 5 values, has 2
