"""Running a compiled kernel on a GPU: the module is loaded into the GPU's context, and each call launches the kernel
on the GPU's stream with its buffers and variable values; with `wait`, events around the launch time it.

A kernel with more shared memory than a block may declare statically (the renderer's `extern __shared__` form) says
how much in its binary (`compiler.dynamic_shared`): the program reads it when it loads the module, opts the kernel in
to that much (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`) and launches it with it (`dynamic_shared`)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cuda.bindings import driver

from lazygrad_cuda.allocator import CUDABuffer
from lazygrad_cuda.compiler import dynamic_shared
from lazygrad_cuda.errors import CUDAError, check
from lazygrad_uop.device import Program

if TYPE_CHECKING:
    from lazygrad_cuda.device import CUDADevice


class KernelArgs:
    """The parameters of one launch as the driver reads them: an array of pointers, one to each value (buffer
    addresses as 64-bit values, then the variables as 32-bit ints). `address` is what `kernelParams` takes; the
    object owns the memory, so it must live until the launch (or the graph node) has been created."""

    def __init__(self, bufs: Sequence[CUDABuffer], vals: Sequence[int]) -> None:
        self.ptrs = (ctypes.c_uint64 * len(bufs))(*(b.ptr for b in bufs))
        self.ints = (ctypes.c_int32 * len(vals))(*(int(v) for v in vals))
        addrs = [ctypes.addressof(self.ptrs) + 8 * i for i in range(len(bufs))]
        addrs += [ctypes.addressof(self.ints) + 4 * i for i in range(len(vals))]
        self.array = (ctypes.c_void_p * max(len(addrs), 1))(*addrs)

    @property
    def address(self) -> int:
        """The address of the pointer array (the C `void**`)."""
        return ctypes.addressof(self.array)


class CUDAProgram(Program):
    """Kernel `name` of the cubin or PTX `lib`, loaded on `device`."""

    def __init__(self, device: CUDADevice, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        device.activate()
        try:
            self.module = check(driver.cuModuleLoadData(lib), f"cuModuleLoadData({name})")
        except CUDAError as exc:
            kind = "cubin" if lib[:4] == b"\x7fELF" else "PTX"
            raise CUDAError(
                f"loading the {kind} of {name} on {device.device} ({device.arch}) — a driver older than NVRTC "
                "rejects its output; update the NVIDIA driver or install an nvidia-cuda-nvrtc matching it",
                exc.code,
            ) from exc
        self.function = check(driver.cuModuleGetFunction(self.module, name.encode()), f"cuModuleGetFunction({name})")
        self.dynamic_shared = dynamic_shared(lib)
        if self.dynamic_shared:
            attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(
                driver.cuFuncSetAttribute(self.function, attribute, self.dynamic_shared),
                f"cuFuncSetAttribute({name}, max dynamic shared memory {self.dynamic_shared} bytes) — more than "
                f"{device.device} ({device.arch}) gives a block",
            )
            # as much of the multiprocessor's L1/shared memory as shared memory as it can: the driver's default split
            # may hold fewer of these blocks than the registers allow, and their copies (cp.async.cg) bypass L1
            carveout = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
            most = driver.CUshared_carveout.CU_SHAREDMEM_CARVEOUT_MAX_SHARED
            check(
                driver.cuFuncSetAttribute(self.function, carveout, int(most)), f"cuFuncSetAttribute({name}, carveout)"
            )
        self._events: tuple[driver.CUevent, driver.CUevent] | None = None
        # the last launch's arguments and sizes as the driver takes them: a jitted replay launches the same buffers
        # with the same sizes every call, and building them is a good part of a launch's host time
        self._args: tuple[tuple[int, ...], tuple[int, ...], KernelArgs] | None = None
        self._dims: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None

    def __call__(
        self,
        *bufs: CUDABuffer,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        """Launch `global_size` blocks of `local_size` threads on `bufs` and `vals`. Without `wait` the launch is
        queued and None returned; with it, the call blocks until the kernel is done and returns its GPU time in
        seconds, measured with events recorded before and after it on the stream."""
        self.device.activate()
        stream = self.device.stream
        ptrs = tuple(b.ptr for b in bufs)
        if self._args is None or self._args[0] != ptrs or self._args[1] != vals:
            self._args = (ptrs, tuple(vals), KernelArgs(bufs, vals))
        args = self._args[2]
        if self._dims is None or self._dims[0] != global_size or self._dims[1] != local_size:
            self._dims = (global_size, local_size, (*launch_dims(global_size), *launch_dims(local_size)))
        if wait:
            start, end = self._timing_events()
            check(driver.cuEventRecord(start, stream), "cuEventRecord")
        result = driver.cuLaunchKernel(self.function, *self._dims[2], self.dynamic_shared, stream, args.address, 0)
        if result[0] != driver.CUresult.CUDA_SUCCESS:  # the message is built only for a failure
            check(result, f"cuLaunchKernel({self.name}, grid {tuple(global_size)}, block {tuple(local_size)})")
        if not wait:
            return None
        check(driver.cuEventRecord(end, stream), "cuEventRecord")
        check(driver.cuEventSynchronize(end), "cuEventSynchronize")
        return float(check(driver.cuEventElapsedTime(start, end), "cuEventElapsedTime")) * 1e-3

    def _timing_events(self) -> tuple[driver.CUevent, driver.CUevent]:
        if self._events is None:
            flags = driver.CUevent_flags.CU_EVENT_DEFAULT
            self._events = (
                check(driver.cuEventCreate(flags), "cuEventCreate"),
                check(driver.cuEventCreate(flags), "cuEventCreate"),
            )
        return self._events

    def __del__(self) -> None:
        # unloading needs the module's context current; at interpreter exit the driver may already be torn down,
        # and there is nothing left to free then
        if (module := getattr(self, "module", None)) is not None:
            try:
                self.device.synchronize()
                driver.cuModuleUnload(module)
            except Exception:  # noqa: BLE001
                pass


def launch_dims(size: Sequence[int]) -> tuple[int, int, int]:
    """Launch sizes as the three positive ints the driver takes."""
    dims = tuple(int(s) for s in size)
    if len(dims) != 3 or any(d < 1 for d in dims):
        raise ValueError(f"launch sizes are three positive ints, got {tuple(size)}")
    return dims[0], dims[1], dims[2]
