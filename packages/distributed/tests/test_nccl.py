"""The NCCL path: the library loads through ctypes with every function lazygrad calls declared, its ids and dtype
table are right, and without a GPU a process group says why it can't start. On a machine with an NVIDIA GPU, a
single-rank all-reduce runs GPU to GPU."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from lazygrad import Tensor
from lazygrad_distributed import nccl
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.registry import Device, DeviceUnavailableError


@pytest.fixture(scope="module")
def lib() -> nccl.NCCLLibrary:
    try:
        return nccl.load_nccl()
    except nccl.NCCLUnavailableError as exc:
        pytest.skip(f"NCCL not installed here (`pip install nvidia-nccl-cu13`): {exc}")


def test_library_loads_and_reports_its_version(lib: nccl.NCCLLibrary) -> None:
    version = lib.version()
    # 2.x.y is 2xxyy (20000 + 100 * minor + patch) since NCCL 2.9
    assert 20900 <= version < 30000
    for name in ("ncclAllReduce", "ncclBroadcast", "ncclAllGather", "ncclReduceScatter", "ncclCommInitRank"):
        assert getattr(lib.lib, name).argtypes, f"{name} has no declared argument types"
    assert ctypes.sizeof(nccl.NcclUniqueId) == 128


def test_unique_ids_differ_and_errors_have_nccl_text(lib: nccl.NCCLLibrary) -> None:
    a, b = lib.unique_id(), lib.unique_id()
    assert a.raw() != b.raw()
    with pytest.raises(nccl.NCCLError, match=r"invalid argument|ncclResult 4"):
        lib.check(4, "ncclAllReduce")


def test_unique_id_travels_between_ranks_whole(lib: nccl.NCCLLibrary) -> None:
    # an id holds zero bytes (its socket address follows the magic number), so the bytes rank 0 sends must be all 128,
    # not the C string the `internal` field reads as, or the other ranks connect to 0.0.0.0
    uid = lib.unique_id()
    raw = uid.raw()
    assert len(raw) == 128 and 0 in raw
    assert ctypes.string_at(ctypes.addressof(uid), 128) == raw
    got = nccl.NcclUniqueId.of(raw)
    assert ctypes.string_at(ctypes.addressof(got), 128) == raw
    with pytest.raises(nccl.NCCLError, match="128 bytes; got 10"):
        nccl.NcclUniqueId.of(raw[:10])


def test_dtype_numbers_follow_nccl_h() -> None:
    # nccl.h: ncclInt8=0 ... ncclFloat32=7, ncclFloat64=8, ncclBfloat16=9
    assert nccl.nccl_dtype(dtypes.float32) == 7 and nccl.nccl_dtype(dtypes.bfloat16) == 9
    assert nccl.nccl_dtype(dtypes.int64) == 4 and nccl.nccl_dtype(dtypes.uint8) == 1
    with pytest.raises(nccl.CollectiveError, match="NCCL has no"):
        nccl.nccl_dtype(dtypes.bool)


def test_group_without_a_gpu_says_why(lib: nccl.NCCLLibrary) -> None:
    if "CUDA" in Device.installed() and Device.usable("CUDA") is None:
        pytest.skip("this machine has a GPU: see the single-rank all-reduce test")
    with pytest.raises((DeviceUnavailableError, KeyError), match="CUDA"):
        nccl.NCCLProcessGroup()


def test_single_rank_all_reduce_on_a_gpu(lib: nccl.NCCLLibrary) -> None:
    if "CUDA" not in Device.installed() or (why := Device.usable("CUDA")) is not None:
        pytest.skip(f"needs an NVIDIA GPU: {why if 'CUDA' in Device.installed() else 'runtime-cuda not installed'}")
    group = nccl.NCCLProcessGroup()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(a, device=group.device)
    np.testing.assert_array_equal(group.all_reduce(t).numpy(), a)
    out = Tensor.empty(3, 4, device=group.device)
    assert group.all_reduce(t, "max", out=out) is out  # into a reused output; one rank: the input itself
    np.testing.assert_array_equal(out.numpy(), a)
    with pytest.raises(nccl.CollectiveError, match=r"Tensor\.empty"):
        group.all_reduce(t, out=Tensor.empty(4, 3, device=group.device))
    np.testing.assert_array_equal(group.all_gather(t, 1).numpy(), a)
    np.testing.assert_array_equal(group.broadcast(t).numpy(), a)
    group.barrier()
    group.close()


@pytest.mark.parametrize(
    ("one_machine", "before", "after"),
    [(True, None, "lo"), (False, None, None), (True, "eth1", "eth1"), (False, "ib0", "ib0")],
)
def test_bootstrap_uses_loopback_only_on_one_machine_and_only_unset(
    monkeypatch: pytest.MonkeyPatch, one_machine: bool, before: str | None, after: str | None
) -> None:
    if before is None:
        monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    else:
        monkeypatch.setenv("NCCL_SOCKET_IFNAME", before)
    nccl.bootstrap_on_loopback(one_machine)
    assert os.environ.get("NCCL_SOCKET_IFNAME") == after
