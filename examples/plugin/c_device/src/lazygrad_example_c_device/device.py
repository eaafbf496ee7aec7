"""The parts of the CDEV device: allocator (host memory), renderer (C), compiler (a shared library) and program."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from lazygrad_codegen import CRenderer
from lazygrad_uop.device import BufferSpec, CompiledDevice, CompileError, Compiler, LRUAllocator, Program

CC = os.environ.get("CC", "cc")


class CDevAllocator(LRUAllocator):
    """Host memory as ctypes byte arrays; a handle is the array (or a view of one), whose address kernels get."""

    def _alloc(self, size: int, options: BufferSpec) -> ctypes.Array:
        return (ctypes.c_uint8 * size)()

    def _free(self, handle: ctypes.Array, options: BufferSpec) -> None:
        # the array goes when its last reference does (a sub-buffer may still hold it)
        return None

    def _copyin(self, dest: ctypes.Array, src: memoryview) -> None:
        memoryview(dest).cast("B")[: src.nbytes] = src

    def _copyout(self, dest: memoryview, src: ctypes.Array) -> None:
        dest[:] = memoryview(src).cast("B")[: dest.nbytes]

    def _offset(self, handle: ctypes.Array, size: int, offset: int) -> ctypes.Array:
        return (ctypes.c_uint8 * size).from_buffer(handle, offset)

    def _transfer(
        self, dest: ctypes.Array, src: ctypes.Array, size: int, src_device: CompiledDevice, dest_device: CompiledDevice
    ) -> None:
        ctypes.memmove(dest, src, size)


class CDevRenderer(CRenderer):
    """Codegen's plain C: each kernel one function that runs all its loops, taking buffer pointers and `int`
    variables."""

    device = "CDEV"


class CDevCompiler(Compiler):
    """The system C compiler, building a shared library of one kernel."""

    def __init__(self) -> None:
        super().__init__(f"compile_cdev_{Path(CC).name}")

    def compile(self, src: str) -> bytes:
        """The shared library of `src`; CompileError with the compiler's messages when it fails."""
        with tempfile.TemporaryDirectory() as tmp:
            lib = Path(tmp) / "kernel.so"
            cmd = [CC, "-shared", "-O2", "-fPIC", "-x", "c", "-", "-o", str(lib), "-lm"]
            proc = subprocess.run(cmd, input=src, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise CompileError(f"{CC} rejected the kernel:\n{proc.stderr}\n{src}")
            return lib.read_bytes()


class CDevProgram(Program):
    """A kernel loaded from its shared library (written to a temporary file, which dlopen needs)."""

    def __init__(self, device: CompiledDevice, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        with tempfile.NamedTemporaryFile(suffix=".so", delete=False) as f:
            f.write(lib)
        try:
            self._dll = ctypes.CDLL(f.name)
        finally:
            os.unlink(f.name)  # the loaded library stays mapped
        self._fxn = getattr(self._dll, name)

    def __call__(
        self,
        *bufs: Any,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        """Run the kernel once (it loops over everything itself); with `wait`, return how long it took."""
        start = time.perf_counter()
        self._fxn(*(ctypes.c_void_p(ctypes.addressof(b)) for b in bufs), *(ctypes.c_int(v) for v in vals))
        return time.perf_counter() - start if wait else None


def cdev_usable() -> str | None:
    """None where the C compiler is on PATH."""
    return None if shutil.which(CC) else f"no C compiler {CC!r} on PATH (install gcc or clang, or set CC)"


def open_cdev(name: str) -> CompiledDevice:
    """Open `CDEV` (`CDEV:1`... are independent devices of the same kind)."""
    return CompiledDevice(name, CDevAllocator(), CDevRenderer(), CDevCompiler(), CDevProgram)
