"""Compiling LLVM IR with llvmlite, for every device whose renderer is of the LLVM family (`llvmir.py`): LLVM's
one-time initialisation, and a compiler that parses, verifies and optimises a module for a target machine and emits
its object file. The CPU device and the AMDGPU compiler specialise it with their target machines.

Needs llvmlite (the `llvm` extra of lazygrad-codegen); the device packages that import this module depend on it.
"""

from __future__ import annotations

import threading

import llvmlite.binding as llvm

from lazygrad_uop.config import DEBUG
from lazygrad_uop.device import CompileError, Compiler

_init_lock = threading.Lock()
_initialized = False


def init_llvm() -> None:
    """Initialise LLVM's targets and assembly printers, once per process (every target: the host's and GPUs')."""
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


class LLVMIRCompiler(Compiler):
    """LLVM IR text to an object file for `target_machine`, optimised at level `opt`.

    Subclasses name what they compile in errors (`what`), may add to the module's text (`module_text`) and set
    `vectorize` (None keeps LLVM's pipeline defaults; a bool turns loop and SLP vectorisation and loop unrolling on
    or off together) and `loop_transforms` (False: no loop vectorisation or unrolling whatever `vectorize` says,
    for IR whose loops codegen has already unrolled and vectorised)."""

    what = "LLVM IR"
    vectorize: bool | None = None
    loop_transforms = True

    def __init__(self, target_machine: llvm.TargetMachine, opt: int, cachekey: str | None) -> None:
        self.target_machine, self.opt = target_machine, opt
        super().__init__(cachekey)

    def parse_context(self) -> llvm.ContextRef | None:
        """The LLVM context modules are parsed in (None: LLVM's global one); compilers used from several threads
        return one per thread."""
        return None

    def module_text(self, src: str) -> str:
        """The text LLVM parses for `src` (by default `src` itself)."""
        return src

    def optimized_module(self, src: str) -> llvm.ModuleRef:
        """`src` parsed, verified and optimised for the target; raises CompileError with LLVM's message when the IR
        is invalid."""
        try:
            mod = llvm.parse_assembly(self.module_text(src), context=self.parse_context())
            mod.verify()
        except RuntimeError as exc:
            raise CompileError(f"LLVM rejected the {self.what}: {exc}\n{src}") from exc
        tm = self.target_machine
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        tuning = llvm.create_pipeline_tuning_options(speed_level=self.opt)
        if self.vectorize is not None:
            tuning.loop_vectorization = tuning.slp_vectorization = tuning.loop_unrolling = self.vectorize
        if not self.loop_transforms:
            tuning.loop_vectorization = tuning.loop_unrolling = False
        builder = llvm.create_pass_builder(tm, tuning)
        builder.getModulePassManager().run(mod, builder)
        return mod

    def object(self, src: str) -> bytes:
        """The relocatable object file of `src`. `DEBUG>=7` prints its assembly."""
        mod = self.optimized_module(src)
        if DEBUG >= 7:
            # of a copy: the code generator rewrites the module it runs on (CodeGenPrepare sinks addresses into
            # their uses), so running it twice on one module can give a different object than the one without DEBUG
            print(self.target_machine.emit_assembly(mod.clone()))
        return self.target_machine.emit_object(mod)

    def compile(self, src: str) -> bytes:
        """The object file of `src`; devices that load something else (a linked code object) override this."""
        return self.object(src)
