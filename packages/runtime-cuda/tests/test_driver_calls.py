"""The runtime's driver-API calls, run without a GPU against a stand-in driver.

Each call is first handed to the real `cuda.bindings.driver` function, which converts and checks every argument
before it loads the driver library; on a machine without one, a call whose arguments it accepts ends with
"driver library not found". Only then does the stand-in answer, with values of the types the real call returns, and
with "device memory" that is host memory, so copies move real bytes. This checks that every call the allocator,
program, graph and device make exists, takes what it is given, and that the bytes and kernel arguments arrive where
they should. On a machine with a driver these calls would reach real hardware with made-up handles: there the GPU
tests (test_gpu.py) cover the same code instead.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest
from cuda.bindings import driver as real_driver
from cuda.pathfinder import DynamicLibNotFoundError

from lazygrad_cuda import allocator, device, errors, graph, program
from lazygrad_cuda.errors import CUDAError, CUDAOutOfMemoryError
from lazygrad_uop.device import BufferSpec, GraphError, KernelLaunch


def _driver_missing() -> bool:
    try:
        real_driver.cuInit(0)
    except DynamicLibNotFoundError:
        return True
    except Exception:  # noqa: BLE001 - any other failure means a driver library is there
        return False
    return False


pytestmark = pytest.mark.skipif(
    not _driver_missing(), reason="a CUDA driver is installed: the GPU tests exercise these calls for real"
)

OK = real_driver.CUresult.CUDA_SUCCESS


class FakeDriver:
    """`cuda.bindings.driver` with every `cu*` function checked by the real one and answered from `answers`.

    `param_shape` is (buffers, ints) of the kernels launched next: launches and graph nodes record their decoded
    arguments in `kernel_args` while the argument memory is alive.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.memory: dict[int, ctypes.Array] = {}
        self.handles = iter(range(0x1000, 0x100000))
        self.fail: dict[str, Any] = {}  # function name -> CUresult to return once
        self.param_shape = (0, 0)
        self.kernel_args: list[tuple[list[int], list[int]]] = []
        d = real_driver
        nothing: Callable[..., tuple] = lambda *args: ()  # noqa: E731
        self.answers: dict[str, Callable[..., tuple]] = {
            "cuInit": nothing,
            "cuDeviceGetCount": lambda: (2,),
            "cuDeviceGet": lambda ordinal: (d.CUdevice(ordinal),),
            "cuDevicePrimaryCtxRetain": lambda dev: (d.CUcontext(0x100 + int(dev)),),
            "cuDeviceGetAttribute": lambda attrib, dev: (
                8 if attrib == d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR else 6,
            ),
            "cuDeviceCanAccessPeer": lambda a, b: (1,),
            "cuStreamCreate": lambda flags: (d.CUstream(next(self.handles)),),
            "cuEventCreate": lambda flags: (d.CUevent(next(self.handles)),),
            "cuEventElapsedTime": lambda start, end: (1.5,),
            "cuMemAlloc": lambda size: (d.CUdeviceptr(self._alloc(size)),),
            "cuMemHostAlloc": lambda size, flags: (self._alloc(size),),
            "cuMemFree": self._free,
            "cuMemFreeHost": self._free,
            "cuMemcpyHtoDAsync": lambda dst, src, n, stream: self._copy(dst, src, n),
            "cuMemcpyDtoHAsync": lambda dst, src, n, stream: self._copy(dst, src, n),
            "cuMemcpyDtoDAsync": lambda dst, src, n, stream: self._copy(dst, src, n),
            "cuMemcpyPeerAsync": lambda dst, dctx, src, sctx, n, stream: self._copy(dst, src, n),
            "cuModuleLoadData": lambda image: (d.CUmodule(next(self.handles)),),
            "cuModuleGetFunction": lambda module, name: (d.CUfunction(next(self.handles)),),
            "cuLaunchKernel": lambda *args: self._record_args(args[9]),
            "cuGraphCreate": lambda flags: (d.CUgraph(next(self.handles)),),
            "cuGraphAddKernelNode": lambda graph, deps, n, params: (
                *self._record_args(params.kernelParams),
                d.CUgraphNode(next(self.handles)),
            ),
            "cuGraphExecKernelNodeSetParams": lambda exec_, node, params: self._record_args(params.kernelParams),
            "cuGraphInstantiate": lambda graph, flags: (d.CUgraphExec(next(self.handles)),),
            "cuGetErrorString": lambda err: (b"described by the stand-in driver",),
        }
        for name in (
            "cuCtxSetCurrent cuCtxEnablePeerAccess cuEventRecord cuEventSynchronize cuEventDestroy cuStreamSynchronize "
            "cuStreamWaitEvent cuModuleUnload cuGraphLaunch cuGraphExecDestroy cuGraphDestroy"
        ).split():
            self.answers[name] = nothing

    def __getattr__(self, name: str) -> Any:
        real = getattr(real_driver, name)
        if not (name.startswith("cu") and callable(real)):
            return real
        answer = self.answers[name]

        def call(*args: Any) -> tuple:
            try:
                real(*args)
            except DynamicLibNotFoundError:
                pass  # the arguments were accepted; only the library was missing
            self.calls.append((name, args))
            if (err := self.fail.pop(name, None)) is not None:
                return (err, None)
            return (OK, *answer(*args))

        return call

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def _alloc(self, size: int) -> int:
        mem = (ctypes.c_char * size)()
        self.memory[ctypes.addressof(mem)] = mem
        return ctypes.addressof(mem)

    def _free(self, ptr: Any) -> tuple:
        del self.memory[int(ptr)]
        return ()

    def _copy(self, dst: Any, src: Any, n: int) -> tuple:
        ctypes.memmove(int(dst), int(src), n)
        return ()

    def _record_args(self, address: int) -> tuple:
        """Decode a `void**` kernel-parameter array: `param_shape` buffer addresses, then 32-bit ints."""
        nbufs, nvals = self.param_shape
        ptrs = (ctypes.c_void_p * (nbufs + nvals)).from_address(address)
        bufs = [ctypes.c_uint64.from_address(ptrs[i]).value for i in range(nbufs)]
        vals = [ctypes.c_int32.from_address(ptrs[nbufs + i]).value for i in range(nvals)]
        self.kernel_args.append((bufs, vals))
        return ()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    stand_in = FakeDriver()
    for module in (allocator, device, errors, graph, program):
        monkeypatch.setattr(module, "driver", stand_in)
    return stand_in


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


def test_launch_arguments_and_timing(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    prog = gpu.runtime("E_4", b"\x7fELF stand-in cubin")
    bufs = [gpu.allocator.alloc(16), gpu.allocator.alloc(16)]
    fake.param_shape = (2, 2)
    assert prog(*bufs, global_size=(4, 2, 1), local_size=(32, 1, 1), vals=(7, -3)) is None
    name, args = fake.calls[-1]
    assert name == "cuLaunchKernel" and args[1:8] == (4, 2, 1, 32, 1, 1, 0) and args[10] == 0
    assert fake.kernel_args == [([b.ptr for b in bufs], [7, -3])]
    assert prog(*bufs, vals=(0, 0), wait=True) == pytest.approx(1.5e-3)
    assert fake.names()[-4:] == ["cuLaunchKernel", "cuEventRecord", "cuEventSynchronize", "cuEventElapsedTime"]
    with pytest.raises(ValueError, match="positive"):
        prog(*bufs, vals=(0, 0), global_size=(0, 1, 1))


def test_graph_chains_nodes_and_updates_only_what_changed(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    prog = gpu.runtime("E_4", b"\x7fELF stand-in cubin")
    a, b, c = (gpu.allocator.alloc(16) for _ in range(3))
    fake.param_shape = (2, 1)
    launches = [KernelLaunch(prog, (a, b), (4, 1, 1), vals=(0,)), KernelLaunch(prog, (b, c), (4, 1, 1), vals=(1,))]
    g = graph.CUDAGraph(gpu, launches)
    adds = [args for name, args in fake.calls if name == "cuGraphAddKernelNode"]
    assert [len(args[1]) for args in adds] == [0, 1] and adds[1][1][0] == g.nodes[0]
    assert g() is None and fake.names()[-1] == "cuGraphLaunch"
    g.update({1: KernelLaunch(prog, (c, a), (8, 1, 1), vals=(5,))})
    (set_params,) = [args for name, args in fake.calls if name == "cuGraphExecKernelNodeSetParams"]
    assert set_params[1] == g.nodes[1] and set_params[2].gridDimX == 8
    assert fake.kernel_args == [([a.ptr, b.ptr], [0]), ([b.ptr, c.ptr], [1]), ([c.ptr, a.ptr], [5])]
    assert g(wait=True) == pytest.approx(1.5e-3)
    other = gpu.runtime("E_8", b"\x7fELF another")
    with pytest.raises(GraphError, match="build a new graph"):
        g.update({0: KernelLaunch(other, (a, b), vals=(0,))})
    with pytest.raises(GraphError, match="at least one"):
        graph.CUDAGraph(gpu, [])
    with pytest.raises(GraphError, match="not a kernel loaded on CUDA:1"):
        graph.CUDAGraph(device.CUDADevice("CUDA:1"), launches)
