"""Running a compiled kernel on a GPU: the module is loaded into the GPU's context, and each call launches the kernel
on the GPU's stream with its buffers and variable values; with `wait`, events around the launch time it.

A kernel with more shared memory than a block may declare statically (the renderer's `extern __shared__` form) says
how much in its binary (`compiler.dynamic_shared`): the program reads it when it loads the module, opts the kernel in
to that much (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`) and launches it with it (`dynamic_shared`).

A kernel that copies with TMA takes a tensor map (`CUtensorMap`) per tensor it copies, after its buffers and ints; its
binary describes them (`compiler.tensor_maps`), and each launch's arguments encode them over the launch's buffers
(`cuTensorMapEncodeTiled`)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cuda.bindings import driver

from lazygrad_cuda.allocator import CUDABuffer
from lazygrad_cuda.compiler import TensorMapArg, dynamic_shared, tensor_maps
from lazygrad_cuda.errors import CUDAError, check
from lazygrad_uop.device import Program

if TYPE_CHECKING:
    from lazygrad_cuda.device import CUDADevice


TENSOR_MAP_BYTES = 128  # sizeof(CUtensorMap)
TENSOR_MAP_ALIGN = 64  # the driver encodes, and the kernel takes, tensor maps 64-byte aligned


class KernelArgs:
    """The parameters of one launch of kernel `name` as the driver reads them: an array of pointers, one to each value
    (buffer addresses as 64-bit values, then the variables as 32-bit ints, then the 128-byte `CUtensorMap` of each of
    `maps` over `bufs`, encoded here). `address` is what `kernelParams` takes; the object owns the memory, so it must
    live until the launch (or the graph node) has been created. Encoding a map raises CUDAError naming it when the
    driver refuses it."""

    def __init__(
        self, bufs: Sequence[CUDABuffer], vals: Sequence[int], maps: Sequence[TensorMapArg] = (), name: str = "kernel"
    ) -> None:
        self.ptrs = (ctypes.c_uint64 * len(bufs))(*(b.ptr for b in bufs))
        self.ints = (ctypes.c_int32 * len(vals))(*(int(v) for v in vals))
        addrs = [ctypes.addressof(self.ptrs) + 8 * i for i in range(len(bufs))]
        addrs += [ctypes.addressof(self.ints) + 4 * i for i in range(len(vals))]
        # ctypes aligns an array to at most 16 bytes: the maps start at the first 64-byte boundary in it
        self.maps = (ctypes.c_char * (len(maps) * TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN if maps else 0))()
        first = ctypes.addressof(self.maps) + -ctypes.addressof(self.maps) % TENSOR_MAP_ALIGN
        for i, m in enumerate(maps):
            encoded = encode_tensor_map(m, bufs, f"tensor map {i} of {name}")
            ctypes.memmove(first + TENSOR_MAP_BYTES * i, encoded.getPtr(), TENSOR_MAP_BYTES)
            addrs.append(first + TENSOR_MAP_BYTES * i)
        self.array = (ctypes.c_void_p * max(len(addrs), 1))(*addrs)

    @property
    def address(self) -> int:
        """The address of the pointer array (the C `void**`)."""
        return ctypes.addressof(self.array)


# the driver's swizzle modes by bytes (`compiler.TENSOR_MAP_SWIZZLES`)
_SWIZZLES = {
    0: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
    32: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
    64: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
    128: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
}


def encode_tensor_map(m: TensorMapArg, bufs: Sequence[CUDABuffer], what: str = "tensor map") -> driver.CUtensorMap:
    """The `CUtensorMap` of `m` over its buffer in `bufs` (`what` names it in errors): elements not strided, not
    interleaved, promoted to L2 in 256-byte lines, zeros where a box reaches past the tensor. ValueError when `bufs`
    lacks its buffer or its data type is none of the driver's; CUDAError when the driver refuses the map."""
    if m.buffer >= len(bufs):
        raise ValueError(f"{what} views buffer {m.buffer}, but the launch passes {len(bufs)} buffers")
    try:
        dtype = driver.CUtensorMapDataType(m.dtype)
    except ValueError:
        raise ValueError(f"{what} has data type {m.dtype}, which is no CUtensorMapDataType") from None
    address = bufs[m.buffer].ptr + m.offset
    result = driver.cuTensorMapEncodeTiled(
        dtype,
        m.rank,
        address,
        [driver.cuuint64_t(d) for d in m.dims],
        [driver.cuuint64_t(s) for s in m.strides],
        [driver.cuuint32_t(b) for b in m.box],
        [driver.cuuint32_t(1)] * m.rank,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        _SWIZZLES[m.swizzle],
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if result[0] != driver.CUresult.CUDA_SUCCESS:  # the message is built only for a failure
        misaligned = ", not 16-byte aligned" if address % 16 else ""
        check(
            result,
            f"cuTensorMapEncodeTiled({what}: {dtype.name}, dims {m.dims}, byte strides {m.strides}, box {m.box}, "
            f"swizzle {m.swizzle} bytes, address {address:#x} (buffer {m.buffer} + {m.offset} bytes{misaligned}))",
        )
    return result[1]


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
        self.tensor_maps = tensor_maps(lib)
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
        # with the same sizes every call, and building them (encoding tensor maps most of all) is a good part of a
        # launch's host time
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
            self._args = (ptrs, tuple(vals), KernelArgs(bufs, vals, self.tensor_maps, self.name))
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
