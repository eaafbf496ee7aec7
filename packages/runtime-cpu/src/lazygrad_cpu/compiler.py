"""Compiling LLVM IR for the host CPU with llvmlite: parse, verify, optimise at O3 for the host's CPU and vector
features (without LLVM's loop vectoriser and unroller: codegen's kernels come vectorised and unrolled, and without
IndVarSimplify's widening of loop counters), and emit an object file, whose bytes are the cacheable binary."""

from __future__ import annotations

import functools
import hashlib
import threading

import llvmlite.binding as llvm

from lazygrad_codegen.llvm_compiler import LLVMIRCompiler, init_llvm

# LLVM "command-line" options for the CPU's kernels, set once per process (they are LLVM's process-wide settings;
# parsing them again for every compiler made would only repeat the first time). Without widening, IndVarSimplify
# leaves the 32-bit loop counters of codegen's loops as they are instead of rewriting every index computed from them
# in 64 bits: a seventh less time in LLVM over ResNet-18's kernels, and kernels that run as fast.
LLVM_OPTIONS = ("-indvars-widen-indvars=0",)


@functools.cache
def set_llvm_options() -> None:
    """Set `LLVM_OPTIONS` in this process's LLVM, the first time only. They hold for every module LLVM compiles in
    this process from then on (no other target in lazygrad depends on the options set here)."""
    for option in LLVM_OPTIONS:
        llvm.set_option("lazygrad", option)


@functools.cache
def _host() -> tuple[str, str, str]:
    # the process triple, CPU name and feature string: asking LLVM for them took ~5 ms per loaded kernel
    init_llvm()
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


class LLVMCompiler(LLVMIRCompiler):
    """LLVM IR text to an object file for the host CPU. Binaries are cached per CPU and feature set, since code
    using AVX-512 must not be loaded on a machine without it.

    Thread-safe: each thread parses into its own LLVM context (llvmlite serialises the calls into LLVM, and releases
    the GIL during them), so kernels compile on a worker thread while Python generates the next ones."""

    threadsafe = True

    what = "IR"
    # codegen has unrolled and upcast every loop already (vector IR, short reductions as straight-line code): LLVM's
    # loop vectoriser and unroller found nothing worth their time, about a tenth of compiling ResNet-18's kernels.
    # The SLP vectoriser stays: it merges the scalar code that is left (index math, lane-wise stores)
    loop_transforms = False

    def __init__(self, opt: int = 3) -> None:
        set_llvm_options()
        features = llvm.get_host_cpu_features().flatten()
        tag = hashlib.sha256(f"{llvm.llvm_version_info} {features}".encode()).hexdigest()[:16]
        super().__init__(
            host_target_machine(opt), opt, f"compile_cpu_llvm_{llvm.get_host_cpu_name()}_{tag}_O{opt}_noloop_nowiden"
        )
        # vectorised loops are most of a CPU kernel's speed; below O2, plain code that is quick to compile
        self.vectorize = opt >= 2

    def worker_factory(self) -> tuple[type[LLVMCompiler], tuple[int]]:
        """This class and its optimisation level: llvmlite runs one call into LLVM at a time per process, so kernels
        compile on several cores only in worker processes."""
        return type(self), (self.opt,)

    def parse_context(self) -> llvm.ContextRef:
        """This thread's LLVM context: compiles run on several threads, and a context must not be shared by them."""
        return _thread_context()
