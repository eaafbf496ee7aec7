"""lazygrad across processes and machines: process groups with the usual collectives (`all_reduce`, `broadcast`,
`all_gather`, `reduce_scatter`, `barrier`) over MPI (`MPIProcessGroup`, through mpi4py) and NCCL
(`NCCLProcessGroup`, for CUDA tensors), and `DataParallel`, which averages gradients across ranks. Launch the
ranks with `mpirun -n N python train.py`."""

from __future__ import annotations

from lazygrad_distributed.data_parallel import DataParallel
from lazygrad_distributed.mpi import MPIProcessGroup
from lazygrad_distributed.process_group import CollectiveError, ProcessGroup

__version__ = "0.3.0"

__all__ = ["CollectiveError", "DataParallel", "MPIProcessGroup", "ProcessGroup", "init_process_group"]


def init_process_group(backend: str = "mpi") -> ProcessGroup:
    """The group of every rank `mpirun` started, talking over `backend`: "mpi" (host tensors) or "nccl" (CUDA)."""
    if backend == "mpi":
        return MPIProcessGroup()
    if backend == "nccl":
        from lazygrad_distributed.nccl import NCCLProcessGroup

        return NCCLProcessGroup()
    raise ValueError(f"unknown backend {backend!r}; use 'mpi' or 'nccl'")
