"""The runtime's driver-API calls (device, allocator, launches), run without a GPU against a stand-in driver
(`fake_cuda`): every call the runtime makes exists, takes what it is given, and the bytes and kernel arguments arrive
where they should. On a machine with a driver these calls would reach real hardware with made-up handles: there the
GPU tests (test_gpu.py) cover the same code instead. The graph's calls are in test_graph.py.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from cuda.bindings import driver as real_driver
from fake_cuda import FakeDriver, driver_missing, install

from lazygrad_cuda import device
from lazygrad_cuda.errors import CUDAError, CUDAOutOfMemoryError
from lazygrad_uop.config import Context
from lazygrad_uop.device import BufferSpec

pytestmark = pytest.mark.skipif(
    not driver_missing(), reason="a CUDA driver is installed: the GPU tests exercise these calls for real"
)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDriver]:
    yield install(monkeypatch)
    # objects of this test (a graph kept alive by a traceback) go while this stand-in still answers for the driver
    gc.collect()


def test_opening_two_gpus(fake: FakeDriver) -> None:
    gpu0, gpu1 = device.CUDADevice("CUDA"), device.CUDADevice("CUDA:1")
    assert (gpu0.arch, gpu1.index, gpu0.compiler.target.nvrtc_arch) == ("sm_86", 1, "sm_86")
    assert gpu0.renderer.arch == "sm_86"
    with pytest.raises(ValueError, match="2 NVIDIA GPU"):
        device.CUDADevice("CUDA:2")
    gpu0.synchronize()
    assert fake.names()[-2:] == ["cuCtxSetCurrent", "cuStreamSynchronize"]


def test_copies_through_pinned_staging_chunks(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    alloc = gpu.allocator
    alloc.STAGING_CHUNK, alloc.STAGING_SLOTS = 64, 2
    data = bytes(range(200))
    buf = alloc.alloc(200)
    alloc.copyin(buf, memoryview(data))
    assert fake.names().count("cuMemcpyHtoDAsync") == 4  # 200 bytes in chunks of 64
    assert fake.names().count("cuMemHostAlloc") == 2  # two staging chunks, reused in turn
    out = bytearray(200)
    alloc.copyout(memoryview(out), buf)
    assert bytes(out) == data
    part = alloc._offset(buf, 50, 100)
    half = bytearray(50)
    alloc.copyout(memoryview(half), part)
    assert bytes(half) == data[100:150]
    pinned = alloc.alloc(16, BufferSpec(host=True))
    assert pinned.host
    alloc.copyin(pinned, memoryview(b"x" * 16))
    back = bytearray(16)
    alloc.copyout(memoryview(back), pinned)
    assert bytes(back) == b"x" * 16
    alloc.free(buf, 200, BufferSpec(nolru=True))
    assert "cuMemFree" in fake.names()


def test_out_of_memory_frees_the_cache_and_retries(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    kept = gpu.allocator.alloc(32)
    gpu.allocator.free(kept, 32)
    fake.fail["cuMemAlloc"] = real_driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    gpu.allocator.alloc(64)
    assert fake.names().count("cuMemAlloc") == 3 and "cuMemFree" in fake.names()
    fake.fail["cuMemAlloc"] = real_driver.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CUDAError, match=r"cuMemAlloc.*CUDA_ERROR_INVALID_VALUE: described by the stand-in driver"):
        gpu.allocator._alloc(8, BufferSpec())
    assert issubclass(CUDAOutOfMemoryError, MemoryError)


def test_transfers_on_one_gpu_and_between_two(fake: FakeDriver) -> None:
    gpu0, gpu1 = device.CUDADevice("CUDA"), device.CUDADevice("CUDA:1")
    a, b, c = gpu0.allocator.alloc(8), gpu0.allocator.alloc(8), gpu1.allocator.alloc(8)
    gpu0.allocator.copyin(a, memoryview(b"01234567"))
    gpu0.allocator._transfer(b, a, 8, gpu0, gpu0)
    gpu1.allocator._transfer(c, b, 8, gpu0, gpu1)
    out = bytearray(8)
    gpu1.allocator.copyout(memoryview(out), c)
    assert bytes(out) == b"01234567"
    assert "cuMemcpyDtoDAsync" in fake.names() and "cuMemcpyPeerAsync" in fake.names()
    assert fake.names().count("cuCtxEnablePeerAccess") == 2 and gpu0.peers == {1} and gpu1.peers == {0}


def test_several_devices_on_one_gpu(fake: FakeDriver) -> None:
    """CUDA_GPUS=0,0: CUDA and CUDA:1 are two devices (own streams, own memory) on GPU 0; a copy between them is a
    device-to-device copy ordered after the source's stream, with no peer access (a GPU is no peer of itself)."""
    with Context(CUDA_GPUS="0,0"):
        gpu0, gpu1 = device.CUDADevice("CUDA"), device.CUDADevice("CUDA:1")
        with pytest.raises(ValueError, match=r"CUDA:2 is not in CUDA_GPUS='0,0'"):
            device.CUDADevice("CUDA:2")
    assert (gpu0.gpu, gpu1.gpu) == (0, 0) and [args[0] for args in fake.args_of("cuDeviceGet")][-2:] == [0, 0]
    a, b = gpu0.allocator.alloc(8), gpu1.allocator.alloc(8)
    gpu0.allocator.copyin(a, memoryview(b"twiceGPU"))
    before = len(fake.names())
    gpu1.allocator._transfer(b, a, 8, gpu0, gpu1)
    calls = fake.names()[before:]
    assert "cuMemcpyDtoDAsync" in calls and "cuStreamWaitEvent" in calls
    assert "cuMemcpyPeerAsync" not in calls and "cuCtxEnablePeerAccess" not in calls
    out = bytearray(8)
    gpu1.allocator.copyout(memoryview(out), b)
    assert bytes(out) == b"twiceGPU"


@pytest.mark.parametrize(
    ("mapping", "index", "want"),
    [("", 3, 3), ("0,0", 1, 0), ("1,0", 0, 1), (" 2, 0 ", 0, 2), ("0,x", 0, "GPU numbers"), ("0,-1", 1, "negative")],
)
def test_gpu_ordinals_from_cuda_gpus(mapping: str, index: int, want: int | str) -> None:
    if isinstance(want, int):
        assert device.gpu_ordinal(index, mapping) == want
    else:
        with pytest.raises(ValueError, match=want):
            device.gpu_ordinal(index, mapping)


def test_launch_arguments_and_timing(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    prog = gpu.load_program("E_4", b"\x7fELF stand-in cubin")
    bufs = [gpu.allocator.alloc(16), gpu.allocator.alloc(16)]
    fake.param_shape = (2, 2)
    assert prog(*bufs, global_size=(4, 2, 1), local_size=(32, 1, 1), vals=(7, -3)) is None
    name, args = fake.calls[-1]
    assert name == "cuLaunchKernel" and args[1:8] == (4, 2, 1, 32, 1, 1, 0) and args[10] == 0
    assert fake.kernel_args == [([b.ptr for b in bufs], [7, -3])]
    assert prog(*bufs, vals=(0, 0), wait=True) == pytest.approx(1.5e-3)
    assert fake.names()[-4:] == ["cuLaunchKernel", "cuEventRecord", "cuEventSynchronize", "cuEventElapsedTime"]
    # the last launch's arguments and sizes are reused only while they are the same: other buffers, values or sizes
    # reach the driver
    other = [gpu.allocator.alloc(16), gpu.allocator.alloc(16)]
    for _ in range(2):
        prog(*other, global_size=(4, 2, 1), local_size=(32, 1, 1), vals=(5, 6))
    prog(*bufs, global_size=(1, 1, 1), local_size=(64, 1, 1), vals=(5, 6))
    want = [([b.ptr for b in other], [5, 6])] * 2 + [([b.ptr for b in bufs], [5, 6])]
    assert fake.kernel_args[-3:] == want
    assert fake.calls[-1][1][1:7] == (1, 1, 1, 64, 1, 1)
    with pytest.raises(ValueError, match="positive"):
        prog(*bufs, vals=(0, 0), global_size=(0, 1, 1))


def _ptx_with_dynamic_shared(nbytes: int) -> bytes:
    """A stand-in module as the driver reads PTX, with the constant the renderer writes for dynamic shared memory."""
    from lazygrad_cuda.renderer import DYNAMIC_SHARED_SYMBOL

    return f".version 8.0\n.const .align 4 .u32 {DYNAMIC_SHARED_SYMBOL} = {nbytes};\n".encode() + b"\0"


def test_a_kernel_with_dynamic_shared_memory_is_opted_in_and_launched_with_it(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    nbytes = 96 * 1024
    prog = gpu.load_program("r_4", _ptx_with_dynamic_shared(nbytes))
    attribute = real_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    carveout = real_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    assert fake.args_of("cuFuncSetAttribute") == [(prog.function, attribute, nbytes), (prog.function, carveout, 100)]
    fake.param_shape = (1, 0)
    prog(gpu.allocator.alloc(16), global_size=(2, 1, 1), local_size=(128, 1, 1))
    assert fake.args_of("cuLaunchKernel")[-1][7] == nbytes
    # a module without the constant: no attribute, no dynamic shared memory
    plain = gpu.load_program("E_4", b"\x7fELF stand-in cubin")
    assert len(fake.args_of("cuFuncSetAttribute")) == 2 and plain.dynamic_shared == 0
    plain(gpu.allocator.alloc(16))
    assert fake.args_of("cuLaunchKernel")[-1][7] == 0
    # the stand-in refuses what the driver refuses: more than the static limit without opting in
    fake.max_dynamic_shared.clear()
    with pytest.raises(CUDAError, match="cuLaunchKernel"):
        prog(gpu.allocator.alloc(16))


def test_a_gpu_refusing_the_shared_memory_attribute_is_an_error_naming_it(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    fake.fail["cuFuncSetAttribute"] = real_driver.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CUDAError, match="max dynamic shared memory 307200 bytes"):
        gpu.load_program("r_4", _ptx_with_dynamic_shared(300 * 1024))


def test_engine_copies_between_two_gpus_peer_to_peer(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    import lazygrad.engine as engine
    from lazygrad_uop.device import Buffer
    from lazygrad_uop.dtype import dtypes

    gpus = {"CUDA": device.CUDADevice("CUDA"), "CUDA:1": device.CUDADevice("CUDA:1")}
    monkeypatch.setattr(engine, "Device", gpus)
    src, dest = Buffer("CUDA", 8, dtypes.uint8), Buffer("CUDA:1", 8, dtypes.uint8)
    for b in (src, dest):  # memory from the stand-in GPUs directly: the registry would look for a real driver
        b.allocator = gpus[b.device].allocator
        b._handle = b.allocator.alloc(8)
    src.copyin(memoryview(b"peer2pee"))
    before = len(fake.names())
    engine.BufferCopy("CUDA:1")([dest, src])
    copy_calls = fake.names()[before:]
    assert "cuMemcpyPeerAsync" in copy_calls
    assert "cuMemcpyDtoHAsync" not in copy_calls and "cuMemcpyHtoDAsync" not in copy_calls
    out = bytearray(8)
    dest.copyout(memoryview(out))
    assert bytes(out) == b"peer2pee"
