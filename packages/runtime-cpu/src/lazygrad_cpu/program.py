"""Running compiled kernels on the CPU: the object file is loaded into an MCJIT execution engine and the kernel
function is called through ctypes with the buffers' addresses and the symbolic variables' values."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import llvmlite.binding as llvm

from lazygrad_cpu.allocator import CPUBuffer
from lazygrad_cpu.compiler import host_target_machine
from lazygrad_uop.device import Program


class CPUProgram(Program):
    """A kernel loaded from the object code `lib`, in its own execution engine, freed with the program. Runs on the
    calling thread: `global_size` and `local_size` must be all ones (the kernel loops over everything itself)."""

    def __init__(self, name: str, lib: bytes) -> None:
        super().__init__(name, lib)
        # MCJIT wants a module to start from; the kernel comes in as an object file
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), host_target_machine())
        self._engine.add_object_file(llvm.ObjectFileRef.from_data(lib))
        self._engine.finalize_object()
        address = self._engine.get_function_address(name)
        if not address:
            raise RuntimeError(f"the compiled object has no function {name!r}")
        self._address = address
        self._fxn: Any = None
        self._arity = -1

    def __call__(
        self,
        *bufs: CPUBuffer,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        """Run the kernel on the buffers `bufs` with variable values `vals`; with `wait`, return its run time."""
        if tuple(global_size) != (1, 1, 1) or tuple(local_size) != (1, 1, 1):
            raise ValueError(
                f"CPU kernels loop over their whole range themselves; got global_size={global_size}, "
                f"local_size={local_size} (expected all ones)"
            )
        if self._arity != len(bufs) + len(vals):
            argtypes = [ctypes.c_void_p] * len(bufs) + [ctypes.c_int32] * len(vals)
            self._fxn, self._arity = ctypes.CFUNCTYPE(None, *argtypes)(self._address), len(argtypes)
        args = [b.addr for b in bufs] + [int(v) for v in vals]
        start = time.perf_counter()
        self._fxn(*args)
        return time.perf_counter() - start if wait else None
