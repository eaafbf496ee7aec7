"""The HIP device: AMD GPUs through ROCm's HIP runtime (`libamdhip64`, called with ctypes), running the code objects
that `AMDGPUCompiler` links from `AMDGPURenderer`'s LLVM IR.

Memory is `hipMalloc`ed; copies are synchronous `hipMemcpy`s (they also wait for the kernels queued before them on the
null stream, and the host memory they read may be freed as soon as they return). A kernel is loaded with
`hipModuleLoadData` and launched with `hipModuleLaunchKernel` on the null stream; its arguments go as one kernarg
buffer (`extra`: HIP_LAUNCH_PARAM_BUFFER_POINTER, _SIZE, _END) packed at the offsets the code object's metadata gives
each explicit argument (`code_object_kernels`), which also says how big a work-group the kernel may run. HIP fills the
hidden arguments itself. With `wait`, a launch is timed between two HIP events.

Every function is called through the C signature `HIP_PROTOTYPES` declares for it, so ctypes converts each argument to
the type HIP's header gives it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from lazygrad_amd.amdgpu_compiler import AMDGPUCompiler, KernelInfo, code_object_kernels
from lazygrad_amd.amdgpu_renderer import AMDGPURenderer
from lazygrad_uop.device import BufferSpec, CompiledDevice, Compiler, LRUAllocator, Program, Renderer

_HOST_TO_DEVICE, _DEVICE_TO_HOST = 1, 2  # hipMemcpyKind
_OUT_OF_MEMORY = 2  # hipErrorOutOfMemory
# the markers of hipModuleLaunchKernel's `extra` array (HIP_LAUNCH_PARAM_BUFFER_POINTER, _BUFFER_SIZE, _END)
LAUNCH_PARAM_BUFFER_POINTER, LAUNCH_PARAM_BUFFER_SIZE, LAUNCH_PARAM_END = 1, 2, 3

_err, _int, _uint, _size, _ptr = ctypes.c_int, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p
_out_ptr = ctypes.POINTER(ctypes.c_void_p)  # void** (hipMalloc, handles returned through a pointer, arrays)
# name -> (return type, argument types), as hip_runtime_api.h declares them (hipError_t and the enums are C ints)
HIP_PROTOTYPES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "hipGetErrorString": (ctypes.c_char_p, (_err,)),
    "hipGetDeviceCount": (_err, (ctypes.POINTER(ctypes.c_int),)),
    "hipGetDeviceProperties": (_err, (_ptr, _int)),
    "hipSetDevice": (_err, (_int,)),
    "hipDeviceSynchronize": (_err, ()),
    "hipMalloc": (_err, (_out_ptr, _size)),
    "hipFree": (_err, (_ptr,)),
    "hipMemcpy": (_err, (_ptr, _ptr, _size, _int)),
    "hipModuleLoadData": (_err, (_out_ptr, _ptr)),
    "hipModuleGetFunction": (_err, (_out_ptr, _ptr, ctypes.c_char_p)),
    "hipModuleUnload": (_err, (_ptr,)),
    # f, grid x y z (work-groups), block x y z (work-items), dynamic LDS bytes, stream, kernelParams, extra
    "hipModuleLaunchKernel": (_err, (_ptr, _uint, _uint, _uint, _uint, _uint, _uint, _uint, _ptr, _out_ptr, _out_ptr)),
    "hipEventCreate": (_err, (_out_ptr,)),
    "hipEventRecord": (_err, (_ptr, _ptr)),
    "hipEventSynchronize": (_err, (_ptr,)),
    "hipEventElapsedTime": (_err, (ctypes.POINTER(ctypes.c_float), _ptr, _ptr)),
    "hipEventDestroy": (_err, (_ptr,)),
}
# ROCm 6 renamed the properties call for its new struct layout (the old name stays, for the old layout)
_OPTIONAL_PROTOTYPES = {
    "hipGetDevicePropertiesR0600": (_err, (_ptr, _int)),
    "hipDeviceGetAttribute": (_err, (ctypes.POINTER(ctypes.c_int), _int, _int)),
}
# hipDeviceAttributeMultiprocessorCount in the numbering of ROCm 5 and newer (hipDeviceAttribute_t)
_MULTIPROCESSOR_COUNT = 63


class HIPError(RuntimeError):
    """A HIP runtime call failed; the message names the call and HIP's error."""


@cache
def libhip() -> Any:
    """libamdhip64, from the library path or $ROCM_PATH/lib (default /opt/rocm/lib), with the `HIP_PROTOTYPES`
    signatures; raises OSError if absent or missing one of those functions."""
    candidates = [ctypes.util.find_library("amdhip64"), "libamdhip64.so"]
    candidates.append(os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "lib", "libamdhip64.so"))
    errors = []
    for path in filter(None, candidates):
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            errors.append(str(exc))
            continue
        declare(lib, HIP_PROTOTYPES, required=True)
        declare(lib, _OPTIONAL_PROTOTYPES, required=False)
        return lib
    raise OSError("libamdhip64 not found (install ROCm's HIP runtime): " + "; ".join(errors))


def declare(lib: Any, prototypes: dict[str, tuple[Any, tuple[Any, ...]]], required: bool) -> None:
    """Give `lib`'s functions their C signatures; a missing function is an OSError when `required`."""
    for name, (restype, argtypes) in prototypes.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            if required:
                raise OSError(f"{lib} has no {name}: lazygrad needs the HIP runtime of ROCm 5 or newer") from None
            continue
        fn.restype, fn.argtypes = restype, argtypes


def check(status: int, what: str) -> None:
    """Raise HIPError (MemoryError for out-of-memory) when `status` is not hipSuccess."""
    if status != 0:
        text = (libhip().hipGetErrorString(status) or b"unknown error").decode(errors="replace")
        raise (MemoryError if status == _OUT_OF_MEMORY else HIPError)(f"{what} failed: {text} (HIP error {status})")


def hip_reason() -> str | None:
    """None when libamdhip64 loads and sees at least one GPU, else why not."""
    try:
        lib = libhip()
    except OSError as exc:
        return str(exc)
    count = ctypes.c_int(0)
    if (status := lib.hipGetDeviceCount(ctypes.byref(count))) != 0:
        text = (lib.hipGetErrorString(status) or b"unknown error").decode(errors="replace")
        return f"hipGetDeviceCount failed: {text} (HIP error {status})"
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


def device_compute_units(index: int) -> int | None:
    """The compute units of HIP device `index`, or None when the runtime can't tell (the renderer's default stays)."""
    get = getattr(libhip(), "hipDeviceGetAttribute", None)
    if get is None:
        return None
    value = ctypes.c_int(0)
    if get(ctypes.byref(value), _MULTIPROCESSOR_COUNT, index) != 0 or value.value <= 0:
        return None
    return value.value


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


def pack_kernargs(info: KernelInfo, bufs: tuple[HIPBuffer, ...], vals: tuple[int, ...]) -> bytes:
    """The explicit part of kernel `info`'s kernarg segment: each buffer's address and each variable's value at the
    offset and in the size the code object's metadata gives its argument (buffers and numbers each in parameter
    order), little-endian, the gaps zero. Raises ValueError when the arguments don't match the kernel's."""
    kinds = [a.kind for a in info.args]
    if (
        kinds.count("global_buffer") != len(bufs)
        or kinds.count("by_value") != len(vals)
        or len(kinds) != len(bufs) + len(vals)
    ):
        raise ValueError(
            f"kernel {info.name} takes {kinds.count('global_buffer')} buffers and {kinds.count('by_value')} values "
            f"({', '.join(kinds) or 'no arguments'}), got {len(bufs)} buffers and {len(vals)} values"
        )
    out = bytearray(max((a.offset + a.size for a in info.args), default=0))
    next_buf, next_val = iter(bufs), iter(vals)
    for a in info.args:
        if a.kind == "global_buffer":
            if a.size != 8:
                raise ValueError(f"argument {a.name} of {info.name} is a {a.size}-byte pointer, expected 8 bytes")
            value = next(next_buf).addr
        else:
            value = int(next(next_val))
        try:
            out[a.offset : a.offset + a.size] = value.to_bytes(a.size, "little", signed=value < 0)
        except OverflowError:
            raise ValueError(f"argument {a.name} of {info.name} is {a.size} bytes, too few for {value}") from None
    return bytes(out)


def launch_extra(kernargs: bytes) -> tuple[ctypes.Array, list[Any]]:
    """hipModuleLaunchKernel's `extra` array for the kernarg buffer `kernargs`, and the ctypes objects it points to,
    which must live until the launch returns (HIP copies the buffer when it queues the kernel)."""
    buffer = ctypes.create_string_buffer(kernargs, len(kernargs))
    size = ctypes.c_size_t(len(kernargs))
    markers = (LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buffer), LAUNCH_PARAM_BUFFER_SIZE)
    extra = (ctypes.c_void_p * 5)(*markers, ctypes.addressof(size), LAUNCH_PARAM_END)
    return extra, [buffer, size]


class HIPProgram(Program):
    """Kernel `name` loaded from the linked code object `lib` on `device`."""

    device: HIPDevice

    def __init__(self, device: HIPDevice, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        try:
            self.info = code_object_kernels(lib)[name]
        except (ValueError, KeyError) as exc:
            raise HIPError(f"can't launch {name}: its code object has no metadata for it ({exc})") from None
        self.device.make_current()
        # the library the module was loaded with unloads it, even from a finaliser
        self.hip = hip = libhip()
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
        groups, items = [int(g) for g in global_size], [int(s) for s in local_size]
        if math.prod(items) > self.info.max_workgroup_size:
            raise ValueError(
                f"{self.name} launched with work-groups of {items} work-items, but it was compiled for at most "
                f"{self.info.max_workgroup_size}: launch it with the local size its program states"
            )
        if any(g * s >= 2**32 for g, s in zip(groups, items, strict=True)):
            raise ValueError(
                f"{self.name}: HIP launches fewer than 2**32 work-items per dimension, got {groups} x {items}"
            )
        if 0 in groups:
            return 0.0 if wait else None
        # `_kept` holds the buffer and size that `extra` points to, alive until this call returns
        extra, _kept = launch_extra(pack_kernargs(self.info, bufs, vals))
        hip = self.hip
        self.device.make_current()
        events: list[ctypes.c_void_p] = []
        try:
            if wait:
                for _ in range(2):
                    events.append(ctypes.c_void_p())
                    check(hip.hipEventCreate(ctypes.byref(events[-1])), "hipEventCreate")
                check(hip.hipEventRecord(events[0], None), "hipEventRecord")
            status = hip.hipModuleLaunchKernel(self.function, *groups, *items, 0, None, None, extra)
            check(status, f"hipModuleLaunchKernel of {self.name}")
            if not wait:
                return None
            ms = ctypes.c_float()
            check(hip.hipEventRecord(events[1], None), "hipEventRecord")
            check(hip.hipEventSynchronize(events[1]), "hipEventSynchronize")
            check(hip.hipEventElapsedTime(ctypes.byref(ms), events[0], events[1]), "hipEventElapsedTime")
            return ms.value * 1e-3
        finally:
            # events go even when a call failed; their status is ignored so that it can't hide that failure
            for event in events:
                if event.value:
                    hip.hipEventDestroy(event)

    def __del__(self) -> None:
        module = getattr(self, "module", None)
        if module is not None and module.value:
            self.hip.hipModuleUnload(module)


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
        self.compute_units = device_compute_units(self.index)
        renderer = AMDGPURenderer(self.arch, compute_units=self.compute_units)
        super().__init__(name, HIPAllocator(self), renderer, AMDGPUCompiler(self.arch), HIPProgram)

    def make_current(self) -> None:
        """Make this the calling thread's current HIP device."""
        check(libhip().hipSetDevice(self.index), f"hipSetDevice({self.index})")

    def use_renderer(self, renderer: Renderer, compiler: Compiler | None = None) -> None:
        """Render with an AMDGPU renderer for this device's architecture (built by this device's AMDGPU compiler:
        `compiler` must be None)."""
        if compiler is not None:
            raise TypeError(
                f"{self.device} loads AMDGPU code objects from its own compiler; a renderer can't bring one"
            )
        if not isinstance(renderer, AMDGPURenderer):
            raise TypeError(f"{self.device} runs AMDGPU code objects; it can't use {type(renderer).__name__}")
        self.renderer = type(renderer)(self.arch, compute_units=self.compute_units)

    def synchronize(self) -> None:
        """Wait for all work queued on the device."""
        self.make_current()
        check(libhip().hipDeviceSynchronize(), "hipDeviceSynchronize")
