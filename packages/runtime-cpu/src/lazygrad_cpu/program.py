"""Running compiled kernels on the CPU: the object file is loaded into an MCJIT execution engine and the kernel
function is called through ctypes with the buffers' addresses, the symbolic variables' values and the range of its
`core0` axis to run, once per thread with the threads' ranges covering the whole axis."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import llvmlite.binding as llvm

from lazygrad_cpu.allocator import CPUBuffer
from lazygrad_cpu.compiler import host_target_machine
from lazygrad_cpu.renderer import arity_symbol
from lazygrad_cpu.threads import POOL, split, thread_count
from lazygrad_uop.device import CompiledDevice, Program

# A part of a launch shorter than this isn't worth a worker: waking one and waiting for it costs tens of
# microseconds, so a kernel is split only into parts at least this long.
MIN_PART_SECONDS = 50e-6
# Parts per thread: more than one, so that a thread slowed down by other processes takes fewer of them instead of
# holding up the launch; few, since every part is a call into the kernel.
PARTS_PER_THREAD = 4


def engine_of(lib: bytes) -> llvm.ExecutionEngine:
    """An MCJIT execution engine holding the object file `lib`, its code ready to run."""
    # MCJIT wants a module to start from, and finalizing would run the code generator over it (most of a
    # millisecond, empty as it is: most of the cost of loading a kernel); the kernel comes in as an object file, so
    # the module goes before that
    module = llvm.parse_assembly("")
    engine = llvm.create_mcjit_compiler(module, host_target_machine())
    engine.remove_module(module)
    engine.add_object_file(llvm.ObjectFileRef.from_data(lib))
    engine.finalize_object()
    return engine


class CPUProgram(Program):
    """A kernel loaded from the object code `lib`, in its own execution engine, freed with the program.

    `global_size[0]` is the size of the kernel's `core0` axis (1 when it has none); `local_size` and the other
    global dimensions must be 1. A launch runs the axis on `CPU_THREADS` threads in contiguous parts (a few per
    thread, each thread taking the next), fewer when the kernel is small: the program remembers how long one value
    of core0 took in its last launch, and runs on the calling thread alone while the whole kernel takes less than a
    worker's wake-up is worth."""

    def __init__(self, device: CompiledDevice, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        self._engine = engine_of(lib)
        address = self._engine.get_function_address(name)
        if not address:
            raise RuntimeError(f"the compiled object has no function {name!r}")
        self._address = address
        arity = self._engine.get_global_value_address(arity_symbol(name))
        if not arity:
            raise RuntimeError(f"the compiled object has no {arity_symbol(name)!r}: it was not rendered by CPURenderer")
        # buffers and variables the kernel takes, before the core range
        self.arity = ctypes.c_int32.from_address(arity).value
        self._fxn: Any = None
        # CPU seconds one value of core0 took on one thread, measured by the last launch; None before the first
        self.item_seconds: float | None = None

    def threads_for(self, size: int) -> int:
        """How many threads a launch over `size` values of core0 uses now."""
        return min(thread_count(), self._parts_worth(size))

    def parts_for(self, size: int) -> list[tuple[int, int]]:
        """The contiguous parts a launch over `size` values of core0 cuts it into now."""
        threads = self.threads_for(size)
        return split(size, 1 if threads == 1 else min(threads * PARTS_PER_THREAD, self._parts_worth(size)))

    def _parts_worth(self, size: int) -> int:
        """Into how many parts `size` values of core0 can be cut that are each worth a thread's wake-up."""
        if self.item_seconds is None:  # not measured yet: a split that turns out too fine costs microseconds once
            return size
        return max(min(int(self.item_seconds * size / MIN_PART_SECONDS), size), 1)

    def __call__(
        self,
        *bufs: CPUBuffer,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        """Run the kernel on the buffers `bufs` with variable values `vals` over `global_size[0]` values of core0;
        with `wait`, return the run time of the whole launch. The kernel has finished when this returns."""
        size = int(global_size[0])
        if global_size[1] != 1 or global_size[2] != 1 or tuple(local_size) != (1, 1, 1) or size < 0:
            raise ValueError(
                f"a CPU kernel is split over cores along one axis: expected global_size=(n, 1, 1) with n >= 0 and "
                f"local_size=(1, 1, 1), got global_size={global_size}, local_size={local_size}"
            )
        if len(bufs) + len(vals) != self.arity:
            raise ValueError(
                f"kernel {self.name} takes {self.arity} buffers and variables, got {len(bufs)} buffers and "
                f"{len(vals)} variable values"
            )
        if self._fxn is None:
            argtypes = [ctypes.c_void_p] * len(bufs) + [ctypes.c_int32] * (len(vals) + 2)
            self._fxn = ctypes.CFUNCTYPE(None, *argtypes)(self._address)
        if size == 0:
            return 0.0 if wait else None  # an empty core axis: no output element to compute
        fxn, args = self._fxn, [b.addr for b in bufs]
        args.extend(int(v) for v in vals)
        threads = self.threads_for(size)
        start = time.perf_counter() if wait else 0.0
        if threads == 1:
            # the calling thread alone, without the pool's bookkeeping: a small kernel's launch is mostly overhead
            cpu = time.thread_time()
            fxn(*args, 0, size)
            self.item_seconds = (time.thread_time() - cpu) / size
        else:
            own = POOL.run(lambda lo, hi: fxn(*args, lo, hi), self.parts_for(size), threads)
            if own is not None:
                self.item_seconds = own[0] / own[1]
        return time.perf_counter() - start if wait else None
