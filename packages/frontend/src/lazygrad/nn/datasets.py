"""Datasets tinygrad programs load with one call: `mnist()` (and Fashion-MNIST) and `cifar()` (CIFAR-10).

Each file is downloaded once into `<CACHEDIR or the user cache>/lazygrad/datasets/` and checked against its
published MD5 before use, so a truncated or tampered download is never read. Offline, with the files not cached,
the error says which file is missing, where to put it and which variable names a mirror.

The sources can be pointed elsewhere (a mirror, a local server): `LAZYGRAD_MNIST_URL`,
`LAZYGRAD_FASHION_MNIST_URL` and `LAZYGRAD_CIFAR_URL` replace the base URLs; a mirror must serve the same files,
since the checksums stay the published ones.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from lazygrad.errors import InputError
from lazygrad.tensor import Tensor
from lazygrad_uop.config import getenv

__all__ = [
    "CIFAR10",
    "FASHION_MNIST",
    "MNIST",
    "DatasetDownloadError",
    "Source",
    "cache_dir",
    "cifar",
    "fetch",
    "mnist",
]


class DatasetDownloadError(ConnectionError):
    """A dataset file could not be downloaded (offline, server error) or did not match its checksum."""


@dataclass
class Source:
    """Where a dataset's files come from: a base URL (overridden by the environment variable `env`) and the MD5 of
    each file under it."""

    name: str
    url: str
    env: str
    md5: dict[str, str]

    @property
    def base_url(self) -> str:
        """The base URL in use: the environment variable's value if set, else the published one."""
        url = getenv(self.env, "") or self.url
        return url if url.endswith("/") else url + "/"


MNIST = Source(
    "mnist",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "LAZYGRAD_MNIST_URL",
    {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
)
FASHION_MNIST = Source(
    "fashion-mnist",
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "LAZYGRAD_FASHION_MNIST_URL",
    {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
)
CIFAR10 = Source(
    "cifar10",
    "https://www.cs.toronto.edu/~kriz/",
    "LAZYGRAD_CIFAR_URL",
    {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"},
)


def cache_dir() -> Path:
    """The folder datasets are kept in: `$CACHEDIR/lazygrad/datasets`, else the platform's user cache."""
    if cachedir := getenv("CACHEDIR", ""):
        root = Path(cachedir).expanduser()
    elif xdg := os.environ.get("XDG_CACHE_HOME"):
        root = Path(xdg)
    else:
        root = Path.home() / ".cache"
    return root / "lazygrad" / "datasets"


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def fetch(source: Source, file: str, timeout: float = 60.0) -> bytes:
    """The bytes of `file` from `source`: from the cache if present and intact, else downloaded once, checked
    against the file's MD5 and cached."""
    expected = source.md5[file]
    path = cache_dir() / source.name / file
    if path.is_file():
        data = path.read_bytes()
        if _md5(data) == expected:
            return data
        path.unlink()  # a corrupt cached copy (an interrupted write elsewhere): fetch it again
    import urllib.request  # only when downloading: it imports the http and ssl modules

    url = source.base_url + file
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read()
    except OSError as exc:  # urllib's URLError and HTTPError are OSErrors
        raise DatasetDownloadError(
            f"couldn't download {url} ({exc}); without a network connection, put the file at {path}, or set "
            f"{source.env} to a mirror that serves it"
        ) from exc
    if (got := _md5(data)) != expected:
        raise DatasetDownloadError(
            f"{url} has MD5 {got}, but {file} has {expected}: the download was truncated or the server serves another "
            f"file; nothing was cached, so the next call downloads it again ({source.env} names a mirror)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    # write beside the target, then rename: a reader never sees half a file
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, path)
    return data


_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4")}


def parse_idx(data: bytes) -> np.ndarray:
    """An array from the IDX format of MNIST's files (gzip-compressed or not): two zero bytes, a type code, the
    number of dimensions, each dimension as a big-endian uint32, then the values."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in _IDX_DTYPES:
        raise InputError("not an IDX file: it must start with two zero bytes and a known type code")
    ndim = data[3]
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dt = np.dtype(_IDX_DTYPES[data[2]])
    count = int(np.prod(dims))
    if len(data) != 4 + 4 * ndim + count * dt.itemsize:
        raise InputError(
            f"IDX file of shape {dims} has {len(data)} bytes, expected {4 + 4 * ndim + count * dt.itemsize}"
        )
    return np.frombuffer(data, dtype=dt, offset=4 + 4 * ndim).reshape(dims).astype(dt.newbyteorder("="))


def mnist(device: str | None = None, fashion: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """MNIST (or Fashion-MNIST): train images (60000, 1, 28, 28), train labels (60000,), test images (10000, 1, 28,
    28), test labels (10000,), all uint8, as tinygrad's `nn.datasets.mnist`."""
    source = FASHION_MNIST if fashion else MNIST

    def load(file: str) -> np.ndarray:
        return parse_idx(fetch(source, file))

    x_train, x_test = (load(f"{s}-images-idx3-ubyte.gz") for s in ("train", "t10k"))
    y_train, y_test = (load(f"{s}-labels-idx1-ubyte.gz") for s in ("train", "t10k"))
    return (
        Tensor(x_train.reshape(-1, 1, 28, 28), device=device),
        Tensor(y_train, device=device),
        Tensor(x_test.reshape(-1, 1, 28, 28), device=device),
        Tensor(y_test, device=device),
    )


class _ArraysOnly(pickle.Unpickler):
    """Unpickles CIFAR's batches, which hold only dicts, lists, bytes and numpy arrays: any other class is refused,
    so a file that is not a CIFAR batch can't run code while it is read."""

    _ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("_codecs", "encode"),  # how protocol 2 pickles written by Python 3 store an array's bytes
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"a CIFAR batch holds no {module}.{name}; refusing to load it")
        return super().find_class(module, name)


def parse_cifar(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels) from the CIFAR-10 python tarball: five training
    batches and one test batch, each a pickled dict of b"data" (N x 3072 uint8) and b"labels"."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:

        def batch(name: str) -> tuple[np.ndarray, np.ndarray]:
            member = tar.extractfile(f"cifar-10-batches-py/{name}")
            if member is None:
                raise InputError(f"the CIFAR-10 archive has no file cifar-10-batches-py/{name}")
            d = _ArraysOnly(member, encoding="bytes").load()
            return np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32), np.asarray(d[b"labels"], np.int64)

        train = [batch(f"data_batch_{i}") for i in range(1, 6)]
        x_test, y_test = batch("test_batch")
    return np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]), x_test, y_test


def cifar(device: str | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CIFAR-10: train images (50000, 3, 32, 32) uint8, train labels (50000,) int64, test images (10000, 3, 32,
    32) uint8, test labels (10000,) int64."""
    arrays = parse_cifar(fetch(CIFAR10, "cifar-10-python.tar.gz"))
    return tuple(Tensor(a, device=device) for a in arrays)  # type: ignore[return-value]
