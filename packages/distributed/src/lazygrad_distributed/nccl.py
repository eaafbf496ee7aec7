"""`NCCLProcessGroup`: the collectives over NCCL for tensors on CUDA devices, GPU memory to GPU memory.

NCCL is loaded with ctypes from the `nvidia-nccl-cu13` wheel (`pip install lazygrad-distributed[nccl]`) or from the
system's libnccl.so.2. Its ranks find each other through a 128-byte id that rank 0 makes and MPI broadcasts, so
NCCL ranks are launched as MPI ranks: `mpirun -n N python train.py`, each rank on GPU `CUDA:<local rank>`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
from dataclasses import dataclass
from functools import cache
from typing import Any

from lazygrad import Tensor
from lazygrad_distributed.process_group import CollectiveError, ProcessGroup, check_op, out_buffer
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.registry import Device

# ncclDataType_t and ncclRedOp_t, as nccl.h numbers them
NCCL_DTYPES: dict[DType, int] = {
    dtypes.int8: 0, dtypes.uint8: 1, dtypes.int32: 2, dtypes.uint32: 3, dtypes.int64: 4, dtypes.uint64: 5,
    dtypes.float16: 6, dtypes.float32: 7, dtypes.float64: 8, dtypes.bfloat16: 9,
}  # fmt: skip
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
UNIQUE_ID_BYTES = 128
NCCL_SYSTEM_ERROR, NCCL_REMOTE_ERROR = 2, 6  # ncclResult_t: the failures of a bootstrap that can't connect


def bootstrap_on_loopback(one_machine: bool) -> None:
    """Have NCCL's ranks find each other over the loopback interface when they all run on this machine and the user
    named no interface (NCCL_SOCKET_IFNAME). NCCL's bootstrap connects its ranks over TCP and prefers any interface to
    `lo`; on a machine whose other interfaces lead nowhere (a VM or container without a network) its connections then
    fail, while loopback always reaches a rank on the same machine. NCCL reads the setting when it first sets up its
    bootstrap, so this runs before the first `ncclGetUniqueId`."""
    if one_machine and "NCCL_SOCKET_IFNAME" not in os.environ:
        os.environ["NCCL_SOCKET_IFNAME"] = "lo"


class NCCLUnavailableError(RuntimeError):
    """The NCCL library can't be found or loaded here."""


class NCCLError(RuntimeError):
    """An NCCL call failed; the message holds NCCL's own description."""


class NcclUniqueId(ctypes.Structure):
    """ncclUniqueId: the opaque bytes that let the ranks of one communicator find each other."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]

    def raw(self) -> bytes:
        """All of the id's bytes. (The `internal` field reads as a C string, cut at its first zero byte, and an id
        holds zeros: a socket address follows its magic number.)"""
        return bytes(self)

    @classmethod
    def of(cls, raw: bytes) -> NcclUniqueId:
        """The id whose bytes are `raw` (what `raw()` gave on the rank that made it)."""
        if len(raw) != UNIQUE_ID_BYTES:
            raise NCCLError(f"an ncclUniqueId is {UNIQUE_ID_BYTES} bytes; got {len(raw)}: pass what raw() returned")
        return cls.from_buffer_copy(raw)


def library_path() -> str:
    """Where libnccl.so.2 is: in the nvidia-nccl wheel if it is installed, else where the system keeps it."""
    spec = importlib.util.find_spec("nvidia.nccl") if importlib.util.find_spec("nvidia") is not None else None
    for folder in spec.submodule_search_locations if spec is not None and spec.submodule_search_locations else ():
        path = os.path.join(folder, "lib", "libnccl.so.2")
        if os.path.exists(path):
            return path
    found = ctypes.util.find_library("nccl")
    if found is None:
        raise NCCLUnavailableError(
            "NCCL is not installed: `pip install lazygrad-distributed[nccl]` (the nvidia-nccl-cu13 wheel) or install "
            "the system's libnccl2"
        )
    return found


@dataclass(frozen=True)
class NCCLLibrary:
    """libnccl, loaded, with the argument and result types of the functions lazygrad calls declared."""

    lib: ctypes.CDLL

    def __post_init__(self) -> None:
        c = ctypes
        p, i, sz = c.c_void_p, c.c_int, c.c_size_t
        sigs: dict[str, tuple[Any, list[Any]]] = {
            "ncclGetVersion": (i, [c.POINTER(i)]),
            "ncclGetUniqueId": (i, [c.POINTER(NcclUniqueId)]),
            "ncclCommInitRank": (i, [c.POINTER(p), i, NcclUniqueId, i]),
            "ncclCommDestroy": (i, [p]),
            "ncclGetErrorString": (c.c_char_p, [i]),
            "ncclAllReduce": (i, [p, p, sz, i, i, p, p]),
            "ncclBroadcast": (i, [p, p, sz, i, i, p, p]),
            "ncclAllGather": (i, [p, p, sz, i, p, p]),
            "ncclReduceScatter": (i, [p, p, sz, i, i, p, p]),
        }
        for name, (restype, argtypes) in sigs.items():
            fn = getattr(self.lib, name)
            fn.restype, fn.argtypes = restype, argtypes

    def check(self, result: int, what: str) -> None:
        """Raise NCCLError for a failed call."""
        if result != 0:
            raise NCCLError(f"{what} failed: {self.lib.ncclGetErrorString(result).decode()} (ncclResult {result})")

    def version(self) -> int:
        """NCCL's version as one number (2.23.4 is 22304)."""
        v = ctypes.c_int()
        self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        return v.value

    def unique_id(self) -> NcclUniqueId:
        """A new communicator id (rank 0 makes it; the others receive it)."""
        uid = NcclUniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return uid


@cache
def load_nccl() -> NCCLLibrary:
    """libnccl, loaded once."""
    path = library_path()
    try:
        return NCCLLibrary(ctypes.CDLL(path))
    except OSError as exc:
        raise NCCLUnavailableError(f"NCCL at {path} could not be loaded: {exc}") from exc


def nccl_dtype(dtype: DType) -> int:
    """NCCL's number for `dtype`, or CollectiveError for a dtype NCCL can't reduce."""
    if dtype not in NCCL_DTYPES:
        raise CollectiveError(f"NCCL has no {dtype!r}; cast to one of {', '.join(map(repr, NCCL_DTYPES))}")
    return NCCL_DTYPES[dtype]


class NCCLProcessGroup(ProcessGroup):
    """The ranks of an MPI communicator, talking over NCCL on one CUDA device each (`device`, by default
    CUDA:<rank on this machine>)."""

    def __init__(self, comm: Any = None, device: str | None = None) -> None:
        from lazygrad_distributed.mpi import MPIProcessGroup

        self.mpi = MPIProcessGroup(comm)
        self.rank, self.world_size = self.mpi.rank, self.mpi.world_size
        self.nccl = load_nccl()
        here = self.mpi.comm.Split_type(self.mpi.MPI.COMM_TYPE_SHARED)
        self.device = Device.canonicalize(device or f"CUDA:{here.Get_rank()}")
        self.cuda = Device[self.device]  # raises DeviceUnavailableError without a GPU, before NCCL is touched
        bootstrap_on_loopback(here.Get_size() == self.world_size)
        uid = NcclUniqueId.of(self.mpi.comm.bcast(self.nccl.unique_id().raw() if self.rank == 0 else None, root=0))
        self.cuda.activate()
        self.comm = ctypes.c_void_p()
        result = self.nccl.lib.ncclCommInitRank(ctypes.byref(self.comm), self.world_size, uid, self.rank)
        what = "ncclCommInitRank"
        if result in (NCCL_SYSTEM_ERROR, NCCL_REMOTE_ERROR):
            iface = os.environ.get("NCCL_SOCKET_IFNAME", "the one NCCL picked")
            what += (
                f" (its ranks connect over TCP on {iface}: name an interface that reaches every rank in "
                "NCCL_SOCKET_IFNAME; NCCL_DEBUG=INFO shows what it tried)"
            )
        self.nccl.check(result, what)

    def _stream(self) -> int:
        return int(self.cuda.stream)

    def _ptr(self, t: Tensor) -> int:
        if t.device != self.device:
            raise CollectiveError(f"this NCCL group runs on {self.device}; the tensor is on {t.device}: move it")
        buf, st = t._buffer_view()
        if not (st.contiguous and st.size == buf.size):
            buf, _ = t.contiguous()._buffer_view()
        return buf.handle.ptr

    def _out(self, shape: tuple[int, ...], like: Tensor) -> tuple[Tensor, int]:
        out = Tensor.empty(*shape, dtype=like.dtype, device=self.device)
        buf, _ = out._buffer_view()
        return out, buf.handle.ptr

    def all_reduce(self, t: Tensor, op: str = "sum", out: Tensor | None = None) -> Tensor:
        """The reduction of every rank's `t` on every rank, GPU to GPU: a new tensor, or written into `out` (a whole
        buffer of `t`'s shape and dtype on this group's device; `t` itself reduces in place) and `out` returned."""
        check_op(op, "float32" if dtypes.is_float(t.dtype) else "int32")
        if out is None:
            out, dest = self._out(t.shape, t)
        else:
            dest = out_buffer(out, t).handle.ptr
        self.nccl.check(
            self.nccl.lib.ncclAllReduce(
                self._ptr(t), dest, t.numel(), nccl_dtype(t.dtype), NCCL_OPS[op], self.comm, self._stream()
            ),
            "ncclAllReduce",
        )
        return out

    def broadcast(self, t: Tensor, root: int = 0) -> Tensor:
        """Rank `root`'s `t` on every rank."""
        self._check_root(root)
        out, dest = self._out(t.shape, t)
        self.nccl.check(
            self.nccl.lib.ncclBroadcast(
                self._ptr(t), dest, t.numel(), nccl_dtype(t.dtype), root, self.comm, self._stream()
            ),
            "ncclBroadcast",
        )
        return out

    def all_gather(self, t: Tensor, axis: int = 0) -> Tensor:
        """Every rank's `t` concatenated along `axis` (NCCL gathers along the first axis; others are moved there
        and back)."""
        if t.ndim == 0:
            raise CollectiveError("all_gather concatenates along an axis; reshape a 0-d tensor to (1,) first")
        axis %= t.ndim
        front = t.transpose(0, axis).contiguous() if axis else t
        out, dest = self._out((self.world_size * front.shape[0], *front.shape[1:]), t)
        self.nccl.check(
            self.nccl.lib.ncclAllGather(
                self._ptr(front), dest, front.numel(), nccl_dtype(t.dtype), self.comm, self._stream()
            ),
            "ncclAllGather",
        )
        return out.transpose(0, axis).contiguous().realize() if axis else out

    def reduce_scatter(self, t: Tensor, op: str = "sum", axis: int = 0) -> Tensor:
        """Rank r's part along `axis` of the reduction of every rank's `t`."""
        axis = self._scatter_axis(t, axis)
        front = t.transpose(0, axis).contiguous() if axis else t
        part = (front.shape[0] // self.world_size, *front.shape[1:])
        out, dest = self._out(part, t)
        self.nccl.check(
            self.nccl.lib.ncclReduceScatter(
                self._ptr(front), dest, out.numel(), nccl_dtype(t.dtype), NCCL_OPS[op], self.comm, self._stream()
            ),
            "ncclReduceScatter",
        )
        return out.transpose(0, axis).contiguous().realize() if axis else out

    def barrier(self) -> None:
        """Return once every rank's queued NCCL work is done and every rank has called it."""
        self.cuda.synchronize()
        self.mpi.barrier()

    def close(self) -> None:
        """Free the NCCL communicator."""
        if self.comm:
            self.nccl.check(self.nccl.lib.ncclCommDestroy(self.comm), "ncclCommDestroy")
            self.comm = ctypes.c_void_p()
