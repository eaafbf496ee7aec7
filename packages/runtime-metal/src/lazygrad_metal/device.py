"""The METAL device on macOS, through the Objective-C runtime: `MetalDevice` (an MTLDevice and its command queue),
`MetalAllocator` (MTLBuffers in shared storage, which the CPU reads and writes directly), `MetalCompiler` (MSL source
-> MTLLibrary with lazygrad's compile options) and `MetalProgram` (a compute pipeline, launched with
`dispatchThreadgroups:threadsPerThreadgroup:` and timed with the command buffer's GPU timestamps).

Launches are asynchronous: each is a command buffer committed to the device's queue, which runs them in order. The
device waits for them (`synchronize`) before the CPU touches buffer memory, and when a caller asks for a kernel's
run time.

Metal compiles source at run time (there is no public API that turns MSL into a binary the framework loads back
without Apple's command-line tools), so a METAL "binary" is the MSL source: `MetalCompiler.compile` compiles it,
reporting errors as `CompileError`, and hands the MTLLibrary to the program made from it.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from lazygrad_metal import objc
from lazygrad_metal.objc import BOOL, Message, NSUInteger, ObjCError, autorelease_pool, id_t
from lazygrad_metal.renderer import MetalRenderer, gpu_cores
from lazygrad_uop.device import BufferSpec, CompiledDevice, CompileError, Compiler, LRUAllocator, Program
from lazygrad_uop.registry import DeviceName


class MTLSize(ctypes.Structure):
    """Metal's grid and threadgroup size: width, height, depth."""

    _fields_: ClassVar = [("width", NSUInteger), ("height", NSUInteger), ("depth", NSUInteger)]


# Values of Metal's enums (MTLResourceOptions, MTLCommandBufferStatus, MTLGPUFamily, MTLMathMode)
RESOURCE_STORAGE_MODE_SHARED = 0
COMMAND_BUFFER_STATUS_COMPLETED = 4
COMMAND_BUFFER_STATUS_ERROR = 5
GPU_FAMILY_APPLE1 = 1001  # MTLGPUFamilyAppleN is 1000 + N
GPU_FAMILY_APPLE9 = 1009  # M3 and later
MATH_MODE_SAFE = 0
MATH_FLOATING_POINT_FUNCTIONS_PRECISE = 1

# *** the messages this device sends ***

CREATE_SYSTEM_DEFAULT_DEVICE = "MTLCreateSystemDefaultDevice"
COPY_ALL_DEVICES = "MTLCopyAllDevices"
NAME = Message("name", id_t)
NEW_COMMAND_QUEUE = Message("newCommandQueue", id_t)
SUPPORTS_FAMILY = Message("supportsFamily:", BOOL, ctypes.c_long)
NEW_BUFFER = Message("newBufferWithLength:options:", id_t, NSUInteger, NSUInteger)
CONTENTS = Message("contents", ctypes.c_void_p)
SET_FAST_MATH = Message("setFastMathEnabled:", None, BOOL)
SET_MATH_MODE = Message("setMathMode:", None, ctypes.c_long)
SET_MATH_FUNCTIONS = Message("setMathFloatingPointFunctions:", None, ctypes.c_long)
NEW_LIBRARY = Message("newLibraryWithSource:options:error:", id_t, id_t, id_t, ctypes.POINTER(id_t))
NEW_FUNCTION = Message("newFunctionWithName:", id_t, id_t)
NEW_PIPELINE = Message("newComputePipelineStateWithFunction:error:", id_t, id_t, ctypes.POINTER(id_t))
MAX_THREADS = Message("maxTotalThreadsPerThreadgroup", NSUInteger)
COMMAND_BUFFER = Message("commandBuffer", id_t)
COMPUTE_ENCODER = Message("computeCommandEncoder", id_t)
SET_PIPELINE = Message("setComputePipelineState:", None, id_t)
SET_BUFFER = Message("setBuffer:offset:atIndex:", None, id_t, NSUInteger, NSUInteger)
SET_BYTES = Message("setBytes:length:atIndex:", None, ctypes.c_void_p, NSUInteger, NSUInteger)
DISPATCH = Message("dispatchThreadgroups:threadsPerThreadgroup:", None, MTLSize, MTLSize)
END_ENCODING = Message("endEncoding", None)
COMMIT = Message("commit", None)
WAIT = Message("waitUntilCompleted", None)
STATUS = Message("status", NSUInteger)
ERROR = Message("error", id_t)
GPU_START = Message("GPUStartTime", ctypes.c_double)
GPU_END = Message("GPUEndTime", ctypes.c_double)

# Committed command buffers kept before the finished ones are let go; a queue hands out 64 at most by default.
_MAX_IN_FLIGHT = 32


class MetalError(RuntimeError):
    """The GPU reported an error running a command buffer; the message is Metal's."""


def _metal() -> ctypes.CDLL:
    lib = objc.framework("Metal")
    # Command-line processes get no GPU from MTLCreateSystemDefaultDevice on some macOS versions unless CoreGraphics
    # is loaded; loading it is harmless everywhere else.
    try:
        objc.framework("CoreGraphics")
    except ObjCError:
        pass
    for fn in (CREATE_SYSTEM_DEFAULT_DEVICE, COPY_ALL_DEVICES):
        getattr(lib, fn).restype, getattr(lib, fn).argtypes = id_t, []
    return lib


def system_default_device() -> int | None:
    """The default MTLDevice (owned), or None where there is no GPU."""
    return _metal().MTLCreateSystemDefaultDevice() or None


def open_mtl_device(index: int) -> int:
    """The MTLDevice number `index` (owned): 0 is the system default, others count through MTLCopyAllDevices."""
    if index == 0:
        if (dev := system_default_device()) is None:
            raise ObjCError("MTLCreateSystemDefaultDevice returned no device: this Mac has no Metal GPU")
        return dev
    array = _metal().MTLCopyAllDevices()
    try:
        devices = objc.nsarray_items(array) if array else []
        if index >= len(devices):
            raise ObjCError(f"METAL:{index} doesn't exist: this Mac has {len(devices)} Metal GPU(s), METAL:0 and up")
        return objc.RETAIN(devices[index])
    finally:
        objc.release(array)


@dataclass(frozen=True)
class MetalBuffer:
    """A handle to device memory: `size` bytes at byte `offset` of the MTLBuffer `buf` (sub-buffers share it)."""

    buf: int
    offset: int
    size: int


class MetalAllocator(LRUAllocator):
    """MTLBuffers in shared storage: unified memory the CPU copies into and out of directly, after the GPU is done
    with it."""

    def __init__(self, device: MetalDevice) -> None:
        super().__init__()
        self.device = device

    def _alloc(self, size: int, options: BufferSpec) -> MetalBuffer:
        buf = NEW_BUFFER(self.device.mtl, size, RESOURCE_STORAGE_MODE_SHARED)
        if not buf:
            raise MemoryError(f"Metal could not allocate {size} bytes on {self.device.device}")
        return MetalBuffer(buf, 0, size)

    def _free(self, handle: MetalBuffer, options: BufferSpec) -> None:
        # a command buffer still using it keeps it alive: Metal's command buffers retain what they reference
        objc.release(handle.buf)

    def host_memory(self, handle: MetalBuffer) -> memoryview:
        """The handle's bytes as seen by the CPU (valid while the buffer lives; synchronize before reading)."""
        address = CONTENTS(handle.buf) + handle.offset
        return memoryview((ctypes.c_char * handle.size).from_address(address)).cast("B")

    def _copyin(self, dest: MetalBuffer, src: memoryview) -> None:
        self.device.synchronize()
        self.host_memory(dest)[: src.nbytes] = src

    def _copyout(self, dest: memoryview, src: MetalBuffer) -> None:
        self.device.synchronize()
        dest[:] = self.host_memory(src)[: dest.nbytes]

    def _offset(self, handle: MetalBuffer, size: int, offset: int) -> MetalBuffer:
        return MetalBuffer(handle.buf, handle.offset + offset, size)


class MetalCompiler(Compiler):
    """Compiles MSL with the device's Metal compiler: IEEE-safe math and precise math functions (no fast math, so
    NaN, infinity and transcendental functions behave as on every other device) and the newest language version the
    OS has (bfloat needs MSL 3.1: macOS 14). The lib it returns is the source itself;
    the compiled MTLLibrary is handed to the program made from it."""

    def __init__(self, device: MetalDevice) -> None:
        # No on-disk cache: the lib is the source, and Metal keeps its own cache of compiled shaders.
        super().__init__(None)
        self.device = device
        self._libraries: dict[bytes, int] = {}

    def compile(self, src: str) -> bytes:
        """Compile `src`; raise CompileError with Metal's diagnostics if it fails."""
        lib = src.encode()
        if lib not in self._libraries:
            self._libraries[lib] = self.new_library(src)
        return lib

    def take_library(self, lib: bytes) -> int:
        """The owned MTLLibrary compiled from `lib`: the one `compile` made, or a new one."""
        library = self._libraries.pop(lib, None)
        return library if library is not None else self.new_library(lib.decode())

    def new_library(self, src: str) -> int:
        """An owned MTLLibrary compiled from MSL `src`."""
        with autorelease_pool():
            options = objc.new_object("MTLCompileOptions")
            # macOS 15 replaced fastMathEnabled (whose NO also meant precise math functions) with these two
            if objc.responds_to(options, "setMathMode:"):
                SET_MATH_MODE(options, MATH_MODE_SAFE)
                SET_MATH_FUNCTIONS(options, MATH_FLOATING_POINT_FUNCTIONS_PRECISE)
            else:
                SET_FAST_MATH(options, False)
            source, error = objc.nsstring(src), id_t()
            try:
                library = NEW_LIBRARY(self.device.mtl, source, options, ctypes.byref(error))
            finally:
                objc.release(source)
                objc.release(options)
            if not library:
                raise CompileError(f"Metal could not compile the kernel: {objc.error_text(error.value)}\n{src}")
            return library


class MetalProgram(Program):
    """Kernel `name` of the compiled library `lib`, as a compute pipeline of `device`."""

    device: MetalDevice

    def __init__(self, device: MetalDevice, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        self.library = self.device.compiler.take_library(lib)
        with autorelease_pool():
            fname = objc.nsstring(name)
            try:
                self.function = NEW_FUNCTION(self.library, fname)
            finally:
                objc.release(fname)
            if not self.function:
                raise CompileError(f"the compiled Metal library has no kernel named {name!r}")
            error = id_t()
            self.pipeline = NEW_PIPELINE(self.device.mtl, self.function, ctypes.byref(error))
            if not self.pipeline:
                raise CompileError(f"Metal could not make a pipeline for {name}: {objc.error_text(error.value)}")
        self.max_threads = MAX_THREADS(self.pipeline)
        self._icb_pipeline: int | None = None

    def check_launch(self, nbufs: int, local_size: tuple[int, int, int]) -> None:
        """Raise ValueError for a launch this pipeline can't run."""
        if math.prod(local_size) > self.max_threads:
            raise ValueError(
                f"{self.name}: a threadgroup of {local_size} threads is more than the {self.max_threads} this "
                "kernel's pipeline allows on this GPU; use a smaller local size"
            )
        if nbufs > 31:
            raise ValueError(f"{self.name}: {nbufs} buffers, Metal binds at most 31 per kernel")

    def __call__(
        self,
        *bufs: MetalBuffer,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        """Encode and commit one launch of `global_size` threadgroups of `local_size` threads; with `wait`, block
        until it finishes and return its GPU time in seconds."""
        self.check_launch(len(bufs) + len(vals), local_size)
        with autorelease_pool():
            cbuf = objc.RETAIN(COMMAND_BUFFER(self.device.queue))
            encoder = COMPUTE_ENCODER(cbuf)
            SET_PIPELINE(encoder, self.pipeline)
            for i, b in enumerate(bufs):
                SET_BUFFER(encoder, b.buf, b.offset, i)
            for i, v in enumerate(vals, start=len(bufs)):
                value = ctypes.c_int32(v)
                SET_BYTES(encoder, ctypes.byref(value), ctypes.sizeof(value), i)
            DISPATCH(encoder, MTLSize(*global_size), MTLSize(*local_size))
            END_ENCODING(encoder)
            COMMIT(cbuf)
        return self.device.track(cbuf, wait)

    def icb_pipeline(self) -> int:
        """This kernel's pipeline made usable in indirect command buffers (made on first use); GraphError where Metal
        can't make one."""
        if self._icb_pipeline is None:
            from lazygrad_metal.graph import new_icb_pipeline

            self._icb_pipeline = new_icb_pipeline(self.device, self.function, self.name)
        return self._icb_pipeline

    def __del__(self) -> None:
        for attr in ("_icb_pipeline", "pipeline", "function", "library"):
            objc.release(getattr(self, attr, None))


class MetalDevice(CompiledDevice):
    """An opened Apple GPU: its MTLDevice, a command queue, and the command buffers committed and not yet known to
    be finished. Its graph type is `MetalGraph` (indirect command buffers), which the JIT replays kernels with.
    Renders with the tensor cores of the newest GPU family it supports that has descriptions (`target`, e.g. "apple7"
    for M1; None, and no tensor cores, on GPUs without simdgroup matrices)."""

    def __init__(self, name: str) -> None:
        from lazygrad_metal.graph import MetalGraph
        from lazygrad_uop.registry import Device

        index = DeviceName.parse(name).index
        with autorelease_pool():
            self.mtl = open_mtl_device(index)
            self.queue = NEW_COMMAND_QUEUE(self.mtl)
            self.gpu_name = objc.to_str(NAME(self.mtl))
        if not self.queue:
            raise ObjCError(f"{self.gpu_name} gave no command queue")
        self.in_flight: list[int] = []
        self.target = gpu_family_target(self.mtl, Device.tensor_core_targets("METAL"))
        # whether MetalGraph must make its pipelines used before running an indirect command buffer (see there)
        self.icb_pipelines_need_use = not SUPPORTS_FAMILY(self.mtl, GPU_FAMILY_APPLE9)
        # the registry hands the renderer the tensor cores registered for its target when it opens the device
        renderer = MetalRenderer(target=self.target, compute_units=gpu_cores(self.gpu_name))
        super().__init__(name, MetalAllocator(self), renderer, MetalCompiler(self), MetalProgram, MetalGraph)

    def track(self, cbuf: int, wait: bool) -> float | None:
        """Take ownership of the committed command buffer `cbuf`; with `wait`, wait for it and return its GPU time.
        Without, it is checked when the device synchronizes or lets finished work go, so a failed launch raises
        MetalError at one of the next calls."""
        if wait:
            try:
                WAIT(cbuf)
                check_command_buffer(cbuf)
                return GPU_END(cbuf) - GPU_START(cbuf)
            finally:
                objc.release(cbuf)
        self.in_flight.append(cbuf)
        if len(self.in_flight) > _MAX_IN_FLIGHT:
            self._drop_finished()
        return None

    def _drop_finished(self) -> None:
        # The queue runs command buffers in order, so the finished ones are a prefix.
        done = 0
        for cbuf in self.in_flight:
            if STATUS(cbuf) < COMMAND_BUFFER_STATUS_COMPLETED:
                break
            done += 1
        finished, self.in_flight = self.in_flight[:done], self.in_flight[done:]
        for cbuf in finished:
            try:
                check_command_buffer(cbuf)
            finally:
                objc.release(cbuf)

    def synchronize(self) -> None:
        """Wait for every committed launch; raise MetalError if one of them failed."""
        pending, self.in_flight = self.in_flight, []
        failure: MetalError | None = None
        for cbuf in pending:
            WAIT(cbuf)
            try:
                check_command_buffer(cbuf)
            except MetalError as exc:
                failure = failure or exc
            finally:
                objc.release(cbuf)
        if failure is not None:
            raise failure

    def __repr__(self) -> str:
        return f"<MetalDevice {self.device} ({self.gpu_name})>"


def gpu_family_target(mtl: int, targets: Iterable[str]) -> str | None:
    """The newest of `targets` ("apple7", "apple8", ...) whose Apple GPU family the device `mtl` supports."""
    families = sorted((int(t[5:]), t) for t in targets if t.startswith("apple") and t[5:].isdigit())
    for number, target in reversed(families):
        if SUPPORTS_FAMILY(mtl, GPU_FAMILY_APPLE1 - 1 + number):
            return target
    return None


def check_command_buffer(cbuf: int) -> None:
    """Raise MetalError if the finished command buffer `cbuf` failed."""
    if STATUS(cbuf) == COMMAND_BUFFER_STATUS_ERROR:
        with autorelease_pool():
            raise MetalError(f"a Metal command buffer failed: {objc.error_text(ERROR(cbuf))}")


def metal_device_usable() -> str | None:
    """None if this Mac has a Metal GPU, else why not."""
    try:
        device = system_default_device()
    except ObjCError as exc:
        return str(exc)
    if device is None:
        return "MTLCreateSystemDefaultDevice returned no device: this Mac has no Metal GPU"
    objc.release(device)
    return None
