"""The HIP device: AMD GPUs through ROCm's HIP runtime (`libamdhip64`, called with ctypes), running the code objects
that `AMDGPUCompiler` links from `AMDGPURenderer`'s LLVM IR.

Memory is `hipMalloc`ed; copies are synchronous `hipMemcpy`s; a kernel is loaded with `hipModuleLoadData` and
launched with `hipModuleLaunchKernel` on the null stream, with its arguments passed one pointer each (HIP lays
them out from the code object's metadata), and timed with HIP events.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from lazygrad_amd.amdgpu_compiler import AMDGPUCompiler
from lazygrad_amd.amdgpu_renderer import AMDGPURenderer
from lazygrad_uop.device import BufferSpec, CompiledDevice, LRUAllocator, Program, Renderer

_HOST_TO_DEVICE, _DEVICE_TO_HOST = 1, 2
_OUT_OF_MEMORY = 2  # hipErrorOutOfMemory


class HIPError(RuntimeError):
    """A HIP runtime call failed; the message names the call and HIP's error."""


@cache
def libhip() -> ctypes.CDLL:
    """libamdhip64, from the library path or $ROCM_PATH/lib (default /opt/rocm/lib); raises OSError if absent."""
    candidates = [ctypes.util.find_library("amdhip64"), "libamdhip64.so"]
    candidates.append(os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "lib", "libamdhip64.so"))
    errors = []
    for path in filter(None, candidates):
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            errors.append(str(exc))
            continue
        lib.hipGetErrorString.restype = ctypes.c_char_p
        return lib
    raise OSError("libamdhip64 not found (install ROCm's HIP runtime): " + "; ".join(errors))


def check(status: int, what: str) -> None:
    """Raise HIPError (MemoryError for out-of-memory) when `status` is not hipSuccess."""
    if status != 0:
        text = libhip().hipGetErrorString(status).decode(errors="replace")
        raise (MemoryError if status == _OUT_OF_MEMORY else HIPError)(f"{what} failed: {text} (HIP error {status})")


def hip_reason() -> str | None:
    """None when libamdhip64 loads and sees at least one GPU, else why not."""
    try:
        lib = libhip()
    except OSError as exc:
        return str(exc)
    count = ctypes.c_int(0)
    if (status := lib.hipGetDeviceCount(ctypes.byref(count))) != 0:
        return f"hipGetDeviceCount failed: {lib.hipGetErrorString(status).decode(errors='replace')}"
    return None if count.value > 0 else "HIP sees no GPU"


def device_arch(index: int) -> str:
    """The gfx architecture of HIP device `index` (e.g. "gfx1100"), from its properties' gcnArchName. The
    properties struct changes layout between ROCm releases, so its bytes are searched for the name rather than read
    at an offset."""
    lib = libhip()
    raw = ctypes.create_string_buffer(8192)
    get = getattr(lib, "hipGetDevicePropertiesR0600", None) or lib.hipGetDeviceProperties
    check(get(raw, index), "hipGetDeviceProperties")
    if (m := re.search(rb"gfx[0-9a-f]+", raw.raw)) is None:
        raise HIPError(f"HIP device {index} reports no gfx architecture name in its properties")
    return m.group(0).decode()


@dataclass(frozen=True, eq=False)
class HIPBuffer:
    """`size` bytes of device memory at address `addr`; a sub-buffer keeps its `base` alive."""

    addr: int
    size: int
    base: HIPBuffer | None = None


class HIPAllocator(LRUAllocator):
    """Device memory of one HIP device."""

    def __init__(self, device: HIPDevice) -> None:
        super().__init__()
        self.device = device

    def _alloc(self, size: int, options: BufferSpec) -> HIPBuffer:
        self.device.make_current()
        ptr = ctypes.c_void_p()
        check(libhip().hipMalloc(ctypes.byref(ptr), ctypes.c_size_t(size)), f"hipMalloc of {size} bytes")
        return HIPBuffer(int(ptr.value or 0), size)

    def _free(self, handle: HIPBuffer, options: BufferSpec) -> None:
        self.device.make_current()
        check(libhip().hipFree(ctypes.c_void_p(handle.addr)), "hipFree")

    def _copyin(self, dest: HIPBuffer, src: memoryview) -> None:
        if src.nbytes > dest.size:
            raise ValueError(f"copyin of {src.nbytes} bytes into a HIP buffer of {dest.size} bytes")
        self.device.make_current()
        # numpy gives the address of read-only memory too, which ctypes' from_buffer refuses
        host = np.frombuffer(src, dtype=np.uint8)
        status = libhip().hipMemcpy(
            ctypes.c_void_p(dest.addr), ctypes.c_void_p(host.ctypes.data), ctypes.c_size_t(src.nbytes), _HOST_TO_DEVICE
        )
        check(status, "hipMemcpy host to device")

    def _copyout(self, dest: memoryview, src: HIPBuffer) -> None:
        if dest.nbytes > src.size:
            raise ValueError(f"copyout of {dest.nbytes} bytes from a HIP buffer of {src.size} bytes")
        self.device.make_current()
        host = np.frombuffer(dest, dtype=np.uint8)
        status = libhip().hipMemcpy(
            ctypes.c_void_p(host.ctypes.data), ctypes.c_void_p(src.addr), ctypes.c_size_t(dest.nbytes), _DEVICE_TO_HOST
        )
        check(status, "hipMemcpy device to host")

    def _offset(self, handle: HIPBuffer, size: int, offset: int) -> HIPBuffer:
        if offset < 0 or offset + size > handle.size:
            raise ValueError(f"a sub-buffer of {size} bytes at offset {offset} doesn't fit in {handle.size} bytes")
        return HIPBuffer(handle.addr + offset, size, handle.base or handle)


def kernel_arguments(bufs: tuple[HIPBuffer, ...], vals: tuple[int, ...]) -> tuple[ctypes.Array, list[Any]]:
    """hipModuleLaunchKernel's `kernelParams`: one pointer to each argument (buffer addresses, then int32 values),
    and the ctypes objects they point to, which must live until the launch returns."""
    values: list[Any] = [ctypes.c_void_p(b.addr) for b in bufs] + [ctypes.c_int32(int(v)) for v in vals]
    return (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values)), values


class HIPProgram(Program):
    """A kernel loaded from a linked code object on the device that `device` names (set by the bound subclass that
    `HIPDevice` makes)."""

    device: HIPDevice

    def __init__(self, name: str, lib: bytes) -> None:
        super().__init__(name, lib)
        self.device.make_current()
        hip = libhip()
        self.module = ctypes.c_void_p()
        check(hip.hipModuleLoadData(ctypes.byref(self.module), lib), f"hipModuleLoadData of {name}")
        self.function = ctypes.c_void_p()
        check(hip.hipModuleGetFunction(ctypes.byref(self.function), self.module, name.encode()), "hipModuleGetFunction")

    def __call__(
        self,
        *bufs: HIPBuffer,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        """Launch `global_size` work-groups of `local_size` work-items; with `wait`, return the kernel's run time."""
        hip = libhip()
        self.device.make_current()
        groups, items = [int(g) for g in global_size], [int(s) for s in local_size]
        if 0 in groups:
            return 0.0 if wait else None
        params, keep = kernel_arguments(bufs, vals)
        start, end = (ctypes.c_void_p(), ctypes.c_void_p()) if wait else (None, None)
        if wait:
            check(hip.hipEventCreate(ctypes.byref(start)), "hipEventCreate")
            check(hip.hipEventCreate(ctypes.byref(end)), "hipEventCreate")
            check(hip.hipEventRecord(start, None), "hipEventRecord")
        status = hip.hipModuleLaunchKernel(self.function, *groups, *items, 0, None, params, None)
        del keep
        check(status, f"hipModuleLaunchKernel of {self.name}")
        if not wait:
            return None
        ms = ctypes.c_float()
        check(hip.hipEventRecord(end, None), "hipEventRecord")
        check(hip.hipEventSynchronize(end), "hipEventSynchronize")
        check(hip.hipEventElapsedTime(ctypes.byref(ms), start, end), "hipEventElapsedTime")
        hip.hipEventDestroy(start)
        hip.hipEventDestroy(end)
        return ms.value * 1e-3

    def __del__(self) -> None:
        module = getattr(self, "module", None)
        if module is not None and module.value:
            libhip().hipModuleUnload(module)


class HIPDevice(CompiledDevice):
    """An opened HIP device ("HIP" or "HIP:n"): memory, the AMDGPU renderer and compiler for its architecture, and
    the program type bound to it."""

    def __init__(self, name: str) -> None:
        self.index = int(name.split(":")[1]) if ":" in name else 0
        count = ctypes.c_int(0)
        check(libhip().hipGetDeviceCount(ctypes.byref(count)), "hipGetDeviceCount")
        if self.index >= count.value:
            raise ValueError(f"{name} does not exist: HIP sees {count.value} GPUs")
        self.arch = device_arch(self.index)
        program_type: Any = type("HIPProgram", (HIPProgram,), {"device": self})
        super().__init__(name, HIPAllocator(self), AMDGPURenderer(self.arch), AMDGPUCompiler(self.arch), program_type)

    def make_current(self) -> None:
        """Make this the calling thread's current HIP device."""
        check(libhip().hipSetDevice(self.index), f"hipSetDevice({self.index})")

    def use_renderer(self, renderer: Renderer) -> None:
        """Render with an AMDGPU renderer for this device's architecture."""
        if not isinstance(renderer, AMDGPURenderer):
            raise TypeError(f"{self.device} runs AMDGPU code objects; it can't use {type(renderer).__name__}")
        self.renderer = type(renderer)(self.arch)

    def synchronize(self) -> None:
        """Wait for all work queued on the device."""
        self.make_current()
        check(libhip().hipDeviceSynchronize(), "hipDeviceSynchronize")
