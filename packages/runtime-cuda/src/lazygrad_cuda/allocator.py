"""GPU memory through the CUDA driver API: device allocations, pinned host memory, and copies.

Copies between host and device go through pinned ("page-locked") staging memory, which the GPU's copy engines read
and write directly: a copy in returns once the bytes are staged, and its transfer to the GPU overlaps whatever the host
does next. Copies between GPUs are device-to-device (same GPU) or peer copies (another GPU), queued in order with the
work of both GPUs.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cuda.bindings import driver

from lazygrad_cuda.errors import CUDAOutOfMemoryError, check
from lazygrad_uop.device import BufferSpec, CompiledDevice, LRUAllocator

if TYPE_CHECKING:
    from lazygrad_cuda.device import CUDADevice


@dataclass(frozen=True, eq=False)
class CUDABuffer:
    """`size` bytes at address `ptr`: GPU memory, or pinned host memory the GPU can reach when `host` is set.
    A sub-buffer keeps the allocation it lies in as `base`."""

    ptr: int
    size: int
    host: bool = False
    base: CUDABuffer | None = None


def _host_view(ptr: int, size: int) -> memoryview:
    """The `size` bytes of host memory at `ptr`, as a writable byte view (no copy)."""
    return memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


class _StagingSlot:
    """A chunk of pinned host memory and an event recorded after the last copy that used it."""

    def __init__(self, size: int) -> None:
        flags = driver.CU_MEMHOSTALLOC_PORTABLE | driver.CU_MEMHOSTALLOC_DEVICEMAP
        self.ptr = int(check(driver.cuMemHostAlloc(size, flags), "cuMemHostAlloc (staging)"))
        self.event = check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        self.in_use = False

    def wait(self) -> None:
        """Block until the copy that last used this chunk has finished reading or writing it."""
        if self.in_use:
            check(driver.cuEventSynchronize(self.event), "cuEventSynchronize")
            self.in_use = False


class CUDAAllocator(LRUAllocator):
    """Memory of one GPU. Freed allocations are kept for reuse (LRU cache); an allocation that finds the GPU full
    frees that cache and tries again."""

    oom_errors = (CUDAOutOfMemoryError,)
    # bytes per staging chunk, and how many chunks copies rotate through so that staging one overlaps sending another
    STAGING_CHUNK = 16 << 20
    STAGING_SLOTS = 2

    def __init__(self, device: CUDADevice) -> None:
        super().__init__()
        self.device = device
        self._slots: list[_StagingSlot] = []
        self._next_slot = 0

    def _slot(self) -> _StagingSlot:
        """The next staging chunk, free to use (allocated on first need)."""
        if len(self._slots) < self.STAGING_SLOTS:
            self._slots.append(_StagingSlot(self.STAGING_CHUNK))
            return self._slots[-1]
        slot = self._slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % self.STAGING_SLOTS
        slot.wait()
        return slot

    def _alloc(self, size: int, options: BufferSpec) -> CUDABuffer:
        self.device.activate()
        if options.host or options.cpu_access:
            flags = driver.CU_MEMHOSTALLOC_PORTABLE | driver.CU_MEMHOSTALLOC_DEVICEMAP
            return CUDABuffer(int(check(driver.cuMemHostAlloc(size, flags), "cuMemHostAlloc")), size, host=True)
        return CUDABuffer(int(check(driver.cuMemAlloc(size), f"cuMemAlloc({size} bytes)")), size)

    def _free(self, handle: CUDABuffer, options: BufferSpec) -> None:
        # kernels queued before the free may still read or write the memory
        self.device.synchronize()
        if handle.host:
            check(driver.cuMemFreeHost(handle.ptr), "cuMemFreeHost")
        else:
            check(driver.cuMemFree(handle.ptr), "cuMemFree")

    def _copyin(self, dest: CUDABuffer, src: memoryview) -> None:
        if src.nbytes > dest.size:
            raise ValueError(f"copyin of {src.nbytes} bytes into a CUDA buffer of {dest.size} bytes")
        if dest.host:
            self.device.synchronize()
            _host_view(dest.ptr, src.nbytes)[:] = src
            return
        self.device.activate()
        for off in range(0, src.nbytes, self.STAGING_CHUNK):
            n = min(self.STAGING_CHUNK, src.nbytes - off)
            slot = self._slot()
            _host_view(slot.ptr, n)[:] = src[off : off + n]
            check(driver.cuMemcpyHtoDAsync(dest.ptr + off, slot.ptr, n, self.device.stream), "cuMemcpyHtoDAsync")
            check(driver.cuEventRecord(slot.event, self.device.stream), "cuEventRecord")
            slot.in_use = True

    def _copyout(self, dest: memoryview, src: CUDABuffer) -> None:
        if dest.nbytes > src.size:
            raise ValueError(f"copyout of {dest.nbytes} bytes from a CUDA buffer of {src.size} bytes")
        if src.host:
            self.device.synchronize()
            dest[:] = _host_view(src.ptr, dest.nbytes)
            return
        self.device.activate()
        for off in range(0, dest.nbytes, self.STAGING_CHUNK):
            n = min(self.STAGING_CHUNK, dest.nbytes - off)
            slot = self._slot()
            check(driver.cuMemcpyDtoHAsync(slot.ptr, src.ptr + off, n, self.device.stream), "cuMemcpyDtoHAsync")
            check(driver.cuStreamSynchronize(self.device.stream), "cuStreamSynchronize")
            dest[off : off + n] = _host_view(slot.ptr, n)

    def _transfer(
        self, dest: CUDABuffer, src: CUDABuffer, size: int, src_device: CompiledDevice, dest_device: CompiledDevice
    ) -> None:
        """Copy `size` bytes from `src` on `src_device` to `dest` on `dest_device` (this allocator's GPU) without
        passing through the host: device to device on one GPU, a peer copy between two."""
        from lazygrad_cuda.device import CUDADevice

        if not isinstance(src_device, CUDADevice) or not isinstance(dest_device, CUDADevice):
            raise TypeError(f"a CUDA transfer is between two CUDA devices, got {src_device!r} and {dest_device!r}")
        if size > min(src.size, dest.size):
            raise ValueError(f"transfer of {size} bytes between CUDA buffers of {src.size} and {dest.size} bytes")
        if src_device is dest_device:
            dest_device.activate()
            stream = dest_device.stream
            check(driver.cuMemcpyDtoDAsync(dest.ptr, src.ptr, size, stream), "cuMemcpyDtoDAsync")
            return
        # two lazygrad devices on one GPU (CUDA_GPUS) share its context: a device-to-device copy between their streams
        one_gpu = src_device.gpu == dest_device.gpu
        if not one_gpu:
            dest_device.enable_peer_access(src_device)
        # the copy starts after the source device's queued work (which may still be writing src) ...
        _stream_waits_for(dest_device, src_device)
        dest_device.activate()
        if one_gpu:
            check(driver.cuMemcpyDtoDAsync(dest.ptr, src.ptr, size, dest_device.stream), "cuMemcpyDtoDAsync")
        else:
            check(
                driver.cuMemcpyPeerAsync(
                    dest.ptr, dest_device.context, src.ptr, src_device.context, size, dest_device.stream
                ),
                "cuMemcpyPeerAsync",
            )
        # ... and the source device's later work (which may overwrite src) waits for the copy
        _stream_waits_for(src_device, dest_device)

    def _offset(self, handle: CUDABuffer, size: int, offset: int) -> CUDABuffer:
        if offset < 0 or offset + size > handle.size:
            raise ValueError(f"a sub-buffer of {size} bytes at offset {offset} doesn't fit in {handle.size} bytes")
        return CUDABuffer(handle.ptr + offset, size, handle.host, handle.base or handle)


def _stream_waits_for(waiter: CUDADevice, other: CUDADevice) -> None:
    """Make work queued on `waiter`'s stream from now on start only after everything queued on `other`'s so far."""
    other.activate()
    event = check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    check(driver.cuEventRecord(event, other.stream), "cuEventRecord")
    waiter.activate()
    check(driver.cuStreamWaitEvent(waiter.stream, event, 0), "cuStreamWaitEvent")
    # the driver keeps the event until the wait is done; this handle is no longer needed
    check(driver.cuEventDestroy(event), "cuEventDestroy")
