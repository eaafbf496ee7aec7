"""Compiling LLVM IR for the host CPU with llvmlite: parse, verify, optimise at O3 for the host's CPU and vector
features, and emit an object file, whose bytes are the cacheable binary."""

from __future__ import annotations

import functools
import hashlib
import threading

import llvmlite.binding as llvm

from lazygrad_uop.config import DEBUG
from lazygrad_uop.device import CompileError, Compiler

_init_lock = threading.Lock()
_initialized = False


def _init_llvm() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _initialized = True


@functools.cache
def _host() -> tuple[str, str, str]:
    # the process triple, CPU name and feature string: asking LLVM for them took ~5 ms per loaded kernel
    _init_llvm()
    return llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def host_target_machine(opt: int = 3) -> llvm.TargetMachine:
    """A new target machine for this CPU, with every feature it has (AVX, AVX-512, NEON ...), for position
    independent code (new each call: an execution engine takes ownership of the one it is given)."""
    triple, cpu, features = _host()
    return llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=opt, reloc="pic")


def host_vector_bits() -> int:
    """The width of the host's widest vector registers for arithmetic, in bits: 512 with AVX-512, 256 with AVX,
    else 128 (SSE2 on x86-64, NEON on ARM)."""
    features = llvm.get_host_cpu_features()
    if features.get("avx512f"):
        return 512
    if features.get("avx"):
        return 256
    return 128


_local = threading.local()


def _thread_context() -> llvm.ContextRef:
    # an LLVM context must not be shared by threads; this thread's lives as long as the thread
    if (ctx := getattr(_local, "context", None)) is None:
        ctx = _local.context = llvm.create_context()
    return ctx


class LLVMCompiler(Compiler):
    """LLVM IR text to an object file for the host CPU. Binaries are cached per CPU and feature set, since code
    using AVX-512 must not be loaded on a machine without it.

    Thread-safe: each thread parses into its own LLVM context (llvmlite serialises the calls into LLVM, and releases
    the GIL during them), so kernels compile on a worker thread while Python generates the next ones."""

    threadsafe = True

    def __init__(self, opt: int = 3) -> None:
        self.opt = opt
        self.target_machine = host_target_machine(opt)
        features = llvm.get_host_cpu_features().flatten()
        tag = hashlib.sha256(f"{llvm.llvm_version_info} {features}".encode()).hexdigest()[:16]
        super().__init__(f"compile_cpu_llvm_{llvm.get_host_cpu_name()}_{tag}_O{opt}")

    def optimized_module(self, src: str) -> llvm.ModuleRef:
        """`src` parsed, verified and optimised for the host; raises CompileError with LLVM's message when the IR is
        invalid."""
        try:
            mod = llvm.parse_assembly(src, context=_thread_context())
            mod.verify()
        except RuntimeError as exc:
            raise CompileError(f"LLVM rejected the IR: {exc}\n{src}") from exc
        tm = self.target_machine
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        tuning = llvm.create_pipeline_tuning_options(speed_level=self.opt)
        tuning.loop_vectorization = tuning.slp_vectorization = tuning.loop_unrolling = self.opt >= 2
        builder = llvm.create_pass_builder(tm, tuning)
        builder.getModulePassManager().run(mod, builder)
        return mod

    def compile(self, src: str) -> bytes:
        """Object code for `src`. `DEBUG>=7` prints its assembly."""
        mod = self.optimized_module(src)
        if DEBUG >= 7:
            print(self.target_machine.emit_assembly(mod))
        return self.target_machine.emit_object(mod)
