"""Host memory for the CPU device: 64-byte-aligned blocks (page-aligned, from anonymous memory maps) that compiled
kernels read and write through raw pointers, and that the frontend can view without a copy."""

from __future__ import annotations

import ctypes
import mmap
from dataclasses import dataclass

import numpy as np

from lazygrad_cpu.threads import memmove
from lazygrad_uop.device import BufferSpec, CompiledDevice, LRUAllocator

_PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS if hasattr(mmap, "MAP_PRIVATE") else None
# the alignment the allocator promises; mmap gives whole pages, which are more aligned than this
ALIGNMENT = 64
# Blocks this large are backed by huge pages where the OS offers them (Linux's transparent huge pages): the first
# touch of fresh memory then takes one page fault per 2 MiB instead of per 4 KiB, several times faster, and kernels
# streaming over big buffers miss the TLB less.
HUGE_PAGE_MIN_BYTES = 2 * 1024 * 1024
_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


@dataclass(frozen=True, eq=False)
class CPUBuffer:
    """A handle to `size` bytes at byte `offset` of the memory map `mem`; `addr` is their address.

    Sub-buffers share their base's map, and a handle keeps the map alive, so memory is unmapped only when no handle
    (and no memoryview from `_as_buffer`) refers to it any more."""

    mem: mmap.mmap
    offset: int
    size: int
    addr: int


def _address_of(view: memoryview) -> int:
    """The address of the first byte of host memory `view` (contiguous bytes, as `Allocator.copyin` and `copyout`
    pass them); 0 for an empty one, which nothing reads."""
    return np.frombuffer(view, np.uint8).ctypes.data if view.nbytes else 0


def _address(mem: mmap.mmap) -> int:
    # the ctypes object that exposes the address pins the map only while it lives: drop it at once
    probe = ctypes.c_char.from_buffer(mem)
    addr = ctypes.addressof(probe)
    del probe
    return addr


class CPUAllocator(LRUAllocator):
    """Allocates page-aligned (so 64-byte-aligned) host memory, zero-filled by the OS, on huge pages when large, and
    recycles freed blocks. Every CPU device's buffers are host memory that kernels take by address, so a kernel on
    one CPU device reads another's in place (`shares_host_memory`)."""

    shares_host_memory = True

    def _alloc(self, size: int, options: BufferSpec) -> CPUBuffer:
        try:
            # private on POSIX so a forked process doesn't share (and race on) its parent's buffers
            mem = mmap.mmap(-1, size, flags=_PRIVATE) if _PRIVATE is not None else mmap.mmap(-1, size)
        except OSError as exc:
            raise MemoryError(f"the CPU device could not allocate {size} bytes: {exc}") from exc
        if _HUGEPAGE is not None and size >= HUGE_PAGE_MIN_BYTES:
            try:
                mem.madvise(_HUGEPAGE)
            except OSError:
                pass  # a kernel without transparent huge pages: plain pages work the same, only slower to fault
        addr = _address(mem)
        assert addr % ALIGNMENT == 0, "mmap returned memory that is not page-aligned"
        return CPUBuffer(mem, 0, size, addr)

    def _free(self, handle: CPUBuffer, options: BufferSpec) -> None:
        # The map is released when the last reference goes: a numpy array made through _as_buffer may still use it,
        # and closing it under that array would leave it pointing at unmapped memory.
        del handle

    # memcpy, on several threads for large copies (`threads.memmove`); numpy gives the address of a read-only source
    # too (bytes), which ctypes would not
    def _copyin(self, dest: CPUBuffer, src: memoryview) -> None:
        if src.nbytes > dest.size:
            raise ValueError(f"copyin of {src.nbytes} bytes into a CPU buffer of {dest.size} bytes")
        memmove(dest.addr, _address_of(src), src.nbytes)

    def _copyout(self, dest: memoryview, src: CPUBuffer) -> None:
        if dest.nbytes > src.size:
            raise ValueError(f"copyout of {dest.nbytes} bytes from a CPU buffer of {src.size} bytes")
        memmove(_address_of(dest), src.addr, dest.nbytes)

    def _transfer(
        self, dest: CPUBuffer, src: CPUBuffer, size: int, src_device: CompiledDevice, dest_device: CompiledDevice
    ) -> None:
        # every CPU device's memory is host memory: a copy between two is one memcpy, with no staging buffer
        if size > min(src.size, dest.size):
            raise ValueError(f"transfer of {size} bytes between CPU buffers of {src.size} and {dest.size} bytes")
        memmove(dest.addr, src.addr, size)

    def _offset(self, handle: CPUBuffer, size: int, offset: int) -> CPUBuffer:
        if offset < 0 or offset + size > handle.size:
            raise ValueError(f"a sub-buffer of {size} bytes at offset {offset} doesn't fit in {handle.size} bytes")
        return CPUBuffer(handle.mem, handle.offset + offset, size, handle.addr + offset)

    def _as_buffer(self, handle: CPUBuffer) -> memoryview:
        """The buffer's bytes as a writable memoryview over the device memory itself (no copy): the CPU device's
        memory is host memory. The view keeps the memory mapped for as long as it lives."""
        return memoryview(handle.mem)[handle.offset : handle.offset + handle.size]
