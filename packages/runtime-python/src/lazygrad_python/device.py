"""The parts of the PYTHON device: its renderer (linear UOps -> program text), compiler (program text -> a compact
pickled instruction list), program (runs that list with the interpreter) and allocator (host memory)."""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from lazygrad_python.interpreter import WARP_SIZE, Interpreter
from lazygrad_python.program_text import Instr, ProgramTextError, dtype_text, parse_dtype, parse_program, render_program
from lazygrad_uop.device import (
    BufferSpec,
    CompiledDevice,
    CompileError,
    Compiler,
    LRUAllocator,
    Program,
    Renderer,
    TensorCore,
)
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

# Bumped whenever the pickled instruction format changes, so stale entries of the on-disk compiler cache are not read.
LIB_FORMAT = 1


@dataclass(frozen=True)
class GPUTarget:
    """The limits of a GPU that a `PythonRenderer` can pretend to be, so that codegen lowers kernels as for that GPU
    (workgroups, local memory, barriers, float4 loads, tensor cores) and the interpreter runs them with real warps:
    a way to test a GPU target's code generation, tensor cores included, on any machine."""

    name: str = "GPU"
    tensor_cores: tuple[TensorCore, ...] = ()
    local_max: tuple[int, int, int] = (1024, 1024, 64)
    # workgroups per launch dimension (None: unlimited), e.g. CUDA's (2**31 - 1, 65535, 65535)
    global_max: tuple[int, int, int] | None = None
    shared_max: int = 49152
    max_workgroup_threads: int = 1024
    supports_float4: bool = True
    # 16-byte loads and stores of narrower elements too (8 halves, 16 bytes), as CUDA's
    wide_vectors: bool = True
    vector_width: int = 1
    # threads whose values SHUFFLE_XOR exchanges (a power of two dividing the interpreter's 32-thread warps), so that
    # grouped reductions combine within warps first; 0: no shuffles, grouped reductions go through local memory only
    warp_size: int = 0
    # ASYNC_COPY/ASYNC_WAIT (CUDA's cp.async on sm_80+): staged kernels pipeline their copies
    async_copy: bool = False
    # LDMATRIX (CUDA's ldmatrix on sm_75+): staged tensor-core fragments read local memory as 8x8 matrices
    ldmatrix: bool = False
    # TMA_LOAD and the MBARRIER_* ops (Hopper's tensor memory accelerator): copies of a tensor's boxes into local
    # memory that a barrier counts the bytes of
    tma: bool = False
    # multiprocessors, which size split reductions (`Renderer.compute_units`): a mid-size GPU's by default
    compute_units: int = 32

    def __post_init__(self) -> None:
        if self.warp_size and (self.warp_size < 2 or WARP_SIZE % self.warp_size):
            raise ValueError(
                f"GPUTarget.warp_size must be 0 or a power of two from 2 to {WARP_SIZE} (the interpreter's warps), "
                f"got {self.warp_size}"
            )


class PythonRenderer(Renderer):
    """Writes a linear program as PYTHON program text (see `lazygrad_python.program_text`).

    By default codegen gives it loops rather than thread indices: one thread walks every output element, which is
    the fastest way to run a kernel in Python. `PythonRenderer(GPUTarget(...))` instead takes a GPU's limits and
    tensor cores, so kernels get workgroups, local memory and WMMA as on that GPU."""

    device: ClassVar[str] = "PYTHON"
    suffix: ClassVar[str] = "PYTHON"
    has_local: bool = False
    has_shared: bool = False
    supports_float4: bool = False
    # the interpreter runs one thread at a time
    compute_units: int = 1

    def __init__(self, target: GPUTarget | None = None) -> None:
        self.target = target
        if target is not None:
            # the GPU's limits, for this renderer only
            self.has_local = self.has_shared = True
            self.local_max, self.shared_max = target.local_max, target.shared_max
            self.global_max = target.global_max
            self.max_workgroup_threads, self.warp_size = target.max_workgroup_threads, target.warp_size
            self.supports_float4, self.vector_width = target.supports_float4, target.vector_width
            self.wide_vectors = target.wide_vectors
            self.tensor_cores, self.has_async_copy = target.tensor_cores, target.async_copy
            self.has_ldmatrix, self.has_tma = target.ldmatrix, target.tma
            self.compute_units = target.compute_units

    def __reduce__(self) -> tuple[Any, ...]:
        return (PythonRenderer, (self.target,))

    def tensor_core_targets(self) -> tuple[str, ...]:
        """The name of the GPU this renderer pretends to be: the registry hands it the tensor cores registered for
        `TensorCoreSpec("PYTHON", <that name>, ...)`. None without a GPU target (kernels get no workgroups, so no
        tensor cores)."""
        return (self.target.name,) if self.target is not None else ()

    def tensor_core_problem(self, tc: TensorCore, target: str) -> str | None:
        """None for any description with a layout that a group of the interpreter's warp runs: the interpreter
        emulates every layout, which is how it checks other devices' descriptions without their hardware."""
        if not tc.swizzle:
            return "the interpreter emulates tensor cores from their layout (TensorCore.swizzle), and this one has none"
        if tc.shared_operands and tc.threads % WARP_SIZE == 0:
            return None  # the interpreter widens its warps to the instruction's group of threads
        if WARP_SIZE % tc.threads:
            return f"it takes {tc.threads} threads, which don't divide the interpreter's {WARP_SIZE}-thread warps"
        return None

    def render(self, uops: list[UOp]) -> str:
        """The program text of `uops`."""
        return render_program(uops)


class PythonCompiler(Compiler):
    """Parses program text into the instruction list a `PythonProgram` runs, pickled."""

    def __init__(self) -> None:
        super().__init__(f"compile_python_v{LIB_FORMAT}")

    def compile(self, src: str) -> bytes:
        """The pickled instructions of program text `src`; malformed text raises CompileError naming the line."""
        try:
            instrs = parse_program(src)
        except ProgramTextError as exc:
            raise CompileError(f"PYTHON program text: {exc}") from None
        # plain tuples of names and literals: the lib never depends on lazygrad's classes pickling the same way
        compact = tuple((x.op.name, dtype_text(x.dtype), x.src, x.arg) for x in instrs)
        return pickle.dumps((LIB_FORMAT, compact), protocol=pickle.HIGHEST_PROTOCOL)


def load_lib(lib: bytes) -> list[Instr]:
    """The instructions a `PythonCompiler` pickled into `lib`."""
    version, compact = pickle.loads(lib)  # libs come from PythonCompiler, like any device's binaries
    if version != LIB_FORMAT:
        raise ValueError(f"PYTHON lib of format {version}, this interpreter reads format {LIB_FORMAT}; recompile it")
    return [Instr(Ops[op], parse_dtype(dt), tuple(src), arg) for op, dt, src, arg in compact]


class PythonProgram(Program):
    """A compiled PYTHON kernel: the interpreter, ready to run on buffer handles (memoryviews)."""

    def __init__(self, device: CompiledDevice, name: str, lib: bytes) -> None:
        super().__init__(device, name, lib)
        self.interpreter = Interpreter(load_lib(lib))

    def __call__(
        self,
        *bufs: Any,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        """Run the kernel to completion (the device is synchronous); with `wait`, return how long it took."""
        start = time.perf_counter()
        self.interpreter(bufs, global_size, local_size, vals)
        return time.perf_counter() - start if wait else None


class PythonAllocator(LRUAllocator):
    """Host memory: each allocation is a memoryview of a bytearray, which is also what kernels receive."""

    def _alloc(self, size: int, options: BufferSpec) -> memoryview:
        return memoryview(bytearray(size))

    def _free(self, handle: memoryview, options: BufferSpec) -> None:
        # Nothing to give back: the bytearray goes when the last view of it (sub-buffers included) is dropped.
        return None

    def _copyin(self, dest: memoryview, src: memoryview) -> None:
        dest[: src.nbytes] = src

    def _copyout(self, dest: memoryview, src: memoryview) -> None:
        dest[:] = src[: dest.nbytes]

    def _offset(self, handle: memoryview, size: int, offset: int) -> memoryview:
        return handle[offset : offset + size]

    def _transfer(
        self, dest: memoryview, src: memoryview, size: int, src_device: CompiledDevice, dest_device: CompiledDevice
    ) -> None:
        dest[:size] = src[:size]

    def _as_buffer(self, handle: memoryview) -> memoryview:
        """The handle's bytes, shared rather than copied: PYTHON memory is host memory already."""
        return handle


def open_python(name: str) -> CompiledDevice:
    """Open the PYTHON device `name` ("PYTHON", "PYTHON:1"); every index is an independent interpreter."""
    return CompiledDevice(name, PythonAllocator(), PythonRenderer(), PythonCompiler(), PythonProgram)
