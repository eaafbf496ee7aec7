"""Small dataset files in the real formats (MNIST's gzip'd IDX, CIFAR-10's python tarball), written by the tests
themselves, and an HTTP server on 127.0.0.1 that serves a folder of them and counts the requests."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import pickle
import struct
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np


def idx_bytes(a: np.ndarray) -> bytes:
    """`a` (uint8) in the IDX format, written from its description: 0, 0, type 0x08, ndim, big-endian dims."""
    assert a.dtype == np.uint8
    return bytes([0, 0, 0x08, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.tobytes()


def write_mnist(folder: Path, n_train: int, n_test: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random MNIST-shaped images and labels 0-9 as the four gzip'd IDX files; returns the arrays by file name."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte.gz": rng.integers(0, 10, (n_train,), dtype=np.uint8),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, (n_test,), dtype=np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        (folder / name).write_bytes(gzip.compress(idx_bytes(a)))
    return arrays


def write_cifar(folder: Path, per_batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A cifar-10-python.tar.gz with five training batches and a test batch of `per_batch` images each, pickled as
    CIFAR's are (dicts of bytes keys, data as an (N, 3072) uint8 array, labels as a list)."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    xs, ys = [], []
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
            labels = rng.integers(0, 10, per_batch).tolist()
            xs.append(data)
            ys.append(labels)
            blob = pickle.dumps({b"batch_label": name.encode(), b"labels": labels, b"data": data}, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cifar-10-python.tar.gz").write_bytes(buf.getvalue())
    return {
        "x_train": np.concatenate(xs[:5]).reshape(-1, 3, 32, 32),
        "y_train": np.concatenate(ys[:5]),
        "x_test": xs[5].reshape(-1, 3, 32, 32),
        "y_test": np.array(ys[5]),
    }


def md5s(folder: Path) -> dict[str, str]:
    """The MD5 of every file in `folder`."""
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()}


@contextmanager
def serve(folder: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve `folder` over HTTP on 127.0.0.1 (loopback only) on a free port: yields the base URL and the list of
    paths requested so far."""
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, directory=str(folder), **kwargs)

        def do_GET(self) -> None:
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", requests
    finally:
        server.shutdown()
        server.server_close()
