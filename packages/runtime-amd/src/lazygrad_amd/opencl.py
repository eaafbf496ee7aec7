"""Running kernels through OpenCL with pyopencl, on any OpenCL 1.2+ platform: AMD's driver, Intel's, NVIDIA's, or
PoCL on a CPU.

`CLDevice` opens one OpenCL device with its own context and in-order queue, so kernels and copies run in the order
they were issued. The compiler builds OpenCL C to the device's program binary (cached on disk per device and
driver) and shows the build log when the build fails; programs are loaded from that binary and timed with profiling
events.
"""

from __future__ import annotations

import re
from functools import cache

import numpy as np
import pyopencl as cl

from lazygrad_amd.opencl_renderer import OpenCLRenderer
from lazygrad_uop.config import DEBUG
from lazygrad_uop.device import BufferSpec, CompiledDevice, CompileError, Compiler, LRUAllocator, Program, Renderer

AMD_VENDORS = ("Advanced Micro Devices", "AMD")


@cache
def cl_devices() -> tuple[cl.Device, ...]:
    """Every OpenCL device of every platform: GPUs and other accelerators first, then CPUs, each group in platform
    order, so that `CL` (index 0) is a GPU wherever there is one. Empty when no platform is installed."""
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        return ()
    found: list[cl.Device] = []
    for platform in platforms:
        try:
            found.extend(platform.get_devices())
        except cl.Error:
            continue  # a platform with no devices reports DEVICE_NOT_FOUND
    return tuple(sorted(found, key=lambda d: bool(d.type & cl.device_type.CPU)))


def is_amd_gpu(device: cl.Device) -> bool:
    """Whether `device` is an AMD GPU driven by AMD's OpenCL platform."""
    vendor = f"{device.platform.vendor} {device.vendor}"
    return bool(device.type & cl.device_type.GPU) and any(v in vendor for v in AMD_VENDORS)


def describe(device: cl.Device) -> str:
    """One line naming the device and its platform."""
    return f"{device.name.strip()} ({device.platform.name.strip()}, {device.version.strip()})"


class CLAllocator(LRUAllocator):
    """OpenCL buffers in the device's context. Copies block, so host memory may be reused as soon as they return."""

    oom_errors = (MemoryError, cl.MemoryError)

    def __init__(self, device: CLDevice) -> None:
        super().__init__()
        self.device = device

    def _alloc(self, size: int, options: BufferSpec) -> cl.Buffer:
        flags = cl.mem_flags.READ_WRITE | (cl.mem_flags.ALLOC_HOST_PTR if options.host or options.cpu_access else 0)
        return cl.Buffer(self.device.context, flags, size)

    def _free(self, handle: cl.Buffer, options: BufferSpec) -> None:
        handle.release()

    def _copyin(self, dest: cl.Buffer, src: memoryview) -> None:
        if src.nbytes > dest.size:
            raise ValueError(f"copyin of {src.nbytes} bytes into an OpenCL buffer of {dest.size} bytes")
        cl.enqueue_copy(self.device.queue, dest, src, is_blocking=True)

    def _copyout(self, dest: memoryview, src: cl.Buffer) -> None:
        if dest.nbytes > src.size:
            raise ValueError(f"copyout of {dest.nbytes} bytes from an OpenCL buffer of {src.size} bytes")
        cl.enqueue_copy(self.device.queue, dest, src, is_blocking=True)

    @property
    def offset_alignment(self) -> int:  # type: ignore[override]
        """A sub-buffer's offset must be a multiple of the device's base address alignment (bits, in bytes)."""
        return max(1, self.device.cl_device.mem_base_addr_align // 8)

    def _offset(self, handle: cl.Buffer, size: int, offset: int) -> cl.Buffer:
        align = self.offset_alignment
        if offset % align:
            raise ValueError(
                f"an OpenCL sub-buffer must start at a multiple of {align} bytes on {describe(self.device.cl_device)}"
                f"; offset {offset} is not (copy the view into its own buffer instead)"
            )
        return handle.get_sub_region(offset, size)


class CLCompiler(Compiler):
    """OpenCL C to the device's program binary. Single-precision division and square root are built correctly
    rounded where the device can, so that results match numpy's."""

    def __init__(self, device: CLDevice) -> None:
        self.device = device
        dev = device.cl_device
        self.options: list[str] = []
        if dev.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
            self.options.append("-cl-fp32-correctly-rounded-divide-sqrt")
        tag = re.sub(r"\W+", "_", f"{dev.platform.name}_{dev.name}_{dev.driver_version}").strip("_")
        super().__init__(f"compile_cl_{tag}")

    def compile(self, src: str) -> bytes:
        """The program binary of `src`; raises CompileError with the build log when the build fails."""
        program = cl.Program(self.device.context, src)
        try:
            program.build(options=self.options, devices=[self.device.cl_device])
        except cl.RuntimeError as exc:
            log = _build_log(program, self.device.cl_device) or str(exc)
            raise CompileError(f"OpenCL build failed on {describe(self.device.cl_device)}:\n{log}\n{src}") from exc
        if DEBUG >= 7 and (log := _build_log(program, self.device.cl_device)):
            print(log)
        (binary,) = program.binaries
        return bytes(binary)


def _build_log(program: cl.Program, device: cl.Device) -> str:
    try:
        return str(program.get_build_info(device, cl.program_build_info.LOG)).strip()
    except cl.Error:
        return ""


class CLProgram(Program):
    """Kernel `name` loaded from its program binary `lib` on `device`."""

    device: CLDevice

    def __init__(self, device: CLDevice, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        dev = self.device.cl_device
        self.program = cl.Program(self.device.context, [dev], [lib])
        try:
            self.program.build(devices=[dev])
        except cl.RuntimeError as exc:
            raise CompileError(f"loading the binary of {name} failed: {_build_log(self.program, dev) or exc}") from exc
        self.kernel = cl.Kernel(self.program, name)
        required = self.kernel.get_work_group_info(cl.kernel_work_group_info.COMPILE_WORK_GROUP_SIZE, dev)
        # a kernel with work-group dimensions declares their size; without, the driver picks it
        self.work_group: tuple[int, int, int] | None = tuple(int(s) for s in required) if any(required) else None

    def __call__(
        self,
        *bufs: cl.Buffer,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        """Run the kernel on `global_size` work-groups of `local_size` items; with `wait`, return its run time."""
        groups, items = tuple(int(g) for g in global_size), tuple(int(s) for s in local_size)
        if self.work_group is None and items != (1, 1, 1):
            raise ValueError(f"{self.name} has no work-group dimensions but was launched with local_size={items}")
        if self.work_group is not None and items != self.work_group:
            raise ValueError(f"{self.name} was built for work-groups of {self.work_group}, launched with {items}")
        if 0 in groups:
            return 0.0 if wait else None
        self.kernel.set_args(*bufs, *(np.int32(v) for v in vals))
        total = tuple(g * s for g, s in zip(groups, items, strict=True))
        event = cl.enqueue_nd_range_kernel(self.device.queue, self.kernel, total, self.work_group)
        if not wait:
            return None
        event.wait()
        return (event.profile.end - event.profile.start) * 1e-9


class CLDevice(CompiledDevice):
    """An opened OpenCL device: its context, a profiling in-order queue, and the allocator, renderer, compiler and
    program type bound to them."""

    def __init__(self, name: str, cl_device: cl.Device) -> None:
        self.cl_device = cl_device
        self.context = cl.Context([cl_device])
        self.queue = cl.CommandQueue(self.context, properties=cl.command_queue_properties.PROFILING_ENABLE)
        extensions = cl_device.extensions.split()
        sizes = tuple(int(s) for s in cl_device.max_work_item_sizes[:3])
        renderer = OpenCLRenderer(
            half_native="cl_khr_fp16" in extensions,
            fp64="cl_khr_fp64" in extensions,
            local_max=(sizes[0], sizes[1], sizes[2]),
            shared_max=int(cl_device.local_mem_size),
            max_workgroup_threads=int(cl_device.max_work_group_size),
            compute_units=int(cl_device.max_compute_units),
        )
        super().__init__(name, CLAllocator(self), renderer, CLCompiler(self), CLProgram)
        if DEBUG >= 1:
            print(f"{name}: {describe(cl_device)}")

    def use_renderer(self, renderer: Renderer, compiler: Compiler | None = None) -> None:
        """Render with `renderer`'s class, set up for this device's limits and extensions (OpenCL C always compiles
        with the device's OpenCL compiler: `compiler` must be None)."""
        if compiler is not None:
            raise TypeError(
                f"{self.device} compiles OpenCL C with its OpenCL driver; a renderer can't bring a compiler"
            )
        if not isinstance(renderer, OpenCLRenderer):
            raise TypeError(f"{self.device} runs OpenCL C; it can't use {type(renderer).__name__}")
        current = self.renderer
        assert isinstance(current, OpenCLRenderer)
        self.renderer = type(renderer)(
            current.half_native,
            current.fp64,
            current.local_max,
            current.shared_max,
            current.max_workgroup_threads,
            current.compute_units,
        )

    def synchronize(self) -> None:
        """Wait for every kernel and copy queued on the device."""
        self.queue.finish()
