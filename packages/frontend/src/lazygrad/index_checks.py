"""Out-of-range integer indices found on the device, reported at the next synchronisation.

An op that selects by integer indices (`t[idx]`, `gather`, `scatter`, `scatter_reduce`, `nn.Embedding`, `one_hot`,
the class labels of the cross-entropy losses) would otherwise give 0 for an index outside its dimension: the one-hot
comparison it is built from matches nothing. Such an op calls `record`, which builds a lazy int64 scalar on the
device: the largest offending index, or the int64 minimum when every index is in range (one small reduction kernel
over the indices). Nothing waits for it: it is computed with the next `realize()`, values the host reads
(`.numpy()`, `.item()`, `.tolist()`) or jitted function's results, and read at the next read or jitted return (the
synchronisations), raising `IndexError` that names the operation, the offending index and the valid range, as CUDA's
device-side asserts do for torch.

`INDEX_CHECKS=0` (environment, or `Context(INDEX_CHECKS=0)`) turns the checks off: out-of-range indices then select
nothing (0), as before. The checks are on by default; their cost is one reduction over each index tensor and, on a
read, one small read-back (see benchmarks/index_checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lazygrad.errors import RangeError
from lazygrad_uop.config import ContextVar
from lazygrad_uop.dtype import dtypes

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

INDEX_CHECKS = ContextVar("INDEX_CHECKS", 1)
_IN_RANGE = -(2**63)  # the check's value when no index is out of range
_MAX_PENDING = 64  # unread checks beyond this are realized and read, so a loop that never reads keeps no graphs


@dataclass
class IndexCheck:
    """A device-side check of one op's indices: `worst` is the largest index outside [low, high), or `_IN_RANGE`."""

    what: str
    low: int
    high: int
    worst: Tensor
    computed: bool = False

    def raise_if_failed(self) -> None:
        """Read the (realized) check and raise IndexError if an index was out of range."""
        value = int(np.asarray(self.worst.numpy()).reshape(()))
        if value != _IN_RANGE:
            raise RangeError(
                f"{self.what}: index {value} is out of range [{self.low}, {self.high}) (found on the device; every "
                f"index must be at least {self.low} and below {self.high})"
            )


_pending: list[IndexCheck] = []


def record(what: str, index: Tensor, low: int, high: int) -> None:
    """Check on the device that every value of the integer tensor `index` lies in [low, high); the result is read
    at the next synchronisation (see the module docstring)."""
    if not INDEX_CHECKS or index.numel() == 0:
        return
    i = index.cast(dtypes.int64)
    bad = (i < low).logical_or(i >= high)
    _pending.append(IndexCheck(what, low, high, bad.where(i, _IN_RANGE).max()))
    if len(_pending) > _MAX_PENDING:
        verify()


def uncomputed() -> list[Tensor]:
    """The pending checks' tensors not realized yet: a realize computes them with its tensors (they share the
    indices), and marks them computed; they stay pending until read."""
    out = [c.worst for c in _pending if not c.computed]
    for c in _pending:
        c.computed = True
    return out


def take_pending() -> list[IndexCheck]:
    """The checks not yet read, handed over to the caller (a jitted function realizes them with its results)."""
    out = _pending[:]
    _pending.clear()
    return out


def verify(*also: Tensor) -> None:
    """Realize the pending checks (with the tensors `also`, in one schedule) and raise IndexError for the first that
    found an out-of-range index."""
    if not _pending:
        return
    from lazygrad.tensor import Tensor

    checks = take_pending()
    # the values about to be read are realized in the same schedule: what they share with the checks (the indices)
    # is computed once; a tensor of symbolic shape is read its own way
    also = tuple(t for t in also if all(isinstance(d, int) for d in t.shape))
    Tensor.realize(*also, *(c.worst for c in checks))
    for c in checks:
        c.raise_if_failed()
