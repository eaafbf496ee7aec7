"""`DataParallel`: every rank trains the same model on its part of the global batch, and the gradients are averaged
across ranks before each optimizer step, so every rank applies the same update as one process on the whole batch.

    group = MPIProcessGroup()
    dp = DataParallel(get_parameters(model), group)       # rank 0's initial weights on every rank
    ...
    loss = model(x_part).sparse_categorical_crossentropy(y_part)   # this rank's part of the batch
    loss.backward()
    dp.sync_gradients()                                    # p.grad: the average over the ranks
    opt.step()

The gradients travel in buckets, last parameters first (the order backward finishes them in an eager framework):
each bucket is computed (realized), packed into one host array and sent with a non-blocking all-reduce, and the next
bucket is computed while it travels. In lazygrad a bucket's realize runs the whole backward graph it needs, so
several buckets cost some recomputation of what they share; the default (one bucket up to 32 MiB) sends small
models in one message after one realize.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lazygrad import Tensor
from lazygrad_distributed.mpi import MPIProcessGroup
from lazygrad_distributed.process_group import host_array, output_tensor

BUCKET_BYTES = 32 * 1024 * 1024


class DataParallel:
    """Averages the gradients of `params` across the ranks of `group` (an `MPIProcessGroup`)."""

    def __init__(
        self, params: Sequence[Tensor], group: MPIProcessGroup | None = None, bucket_bytes: int = BUCKET_BYTES
    ) -> None:
        self.params = list(params)
        self.group = group if group is not None else MPIProcessGroup()
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = bucket_bytes
        self.broadcast_parameters()

    def broadcast_parameters(self, root: int = 0) -> None:
        """Give every rank rank `root`'s parameter values (so that all ranks start from the same weights)."""
        if self.group.world_size == 1:
            return
        Tensor.realize(*self.params)
        for p in self.params:
            p.assign(self.group.broadcast(p.detach(), root)).realize()

    def buckets(self) -> list[list[Tensor]]:
        """The parameters in the order their gradients travel: last first, in groups of up to bucket_bytes."""
        out: list[list[Tensor]] = []
        size = 0
        for p in reversed(self.params):
            if not out or size + p.nbytes > self.bucket_bytes:
                out.append([])
                size = 0
            out[-1].append(p)
            size += p.nbytes
        return out

    def sync_gradients(self) -> None:
        """Replace each parameter's `.grad` by its average over the ranks (after `backward()`, before `step()`)."""
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:
            raise RuntimeError(f"parameters {missing} have no .grad: call loss.backward() before sync_gradients()")
        if self.group.world_size == 1:
            return
        pending: list[tuple[list[Tensor], np.ndarray, object]] = []
        for bucket in self.buckets():
            grads = [p.grad for p in bucket]
            Tensor.realize(*grads)  # type: ignore[arg-type]
            arrays = [host_array(g).reshape(-1) for g in grads]  # type: ignore[arg-type]
            packed = np.concatenate(arrays).astype(np.result_type(*arrays), copy=False)
            pending.append((bucket, packed, self.group.iall_reduce(packed)))
            # let the messages already sent move on while the next bucket is computed
            self.group.MPI.Request.Testall([r for _, _, r in pending])
        self.group.MPI.Request.Waitall([r for _, _, r in pending])
        for bucket, packed, _ in pending:
            packed /= self.group.world_size
            start = 0
            for p in bucket:
                g = p.grad
                assert g is not None
                out, dest, done = output_tensor(g.shape, g)
                dest[...] = packed[start : start + g.numel()].reshape(g.shape)
                done()
                p.grad = out
                start += g.numel()
