"""lazygrad's code generator: turns a kernel AST into a linear program (lowering, symbolic simplification,
linearization) and renders it with one of the two renderer families device packages specialise: C-style
(`CStyleLanguage`, the base of C, OpenCL, CUDA and Metal) and LLVM IR (`LLVMRenderer`).

    from lazygrad_codegen import get_program
    spec = get_program(ast, renderer)   # ProgramSpec: name, src, uops, launch sizes, estimates
"""

from lazygrad_codegen.cstyle import CRenderer, CStyleLanguage
from lazygrad_codegen.linearizer import LinearizeError, linearize
from lazygrad_codegen.llvmir import LLVMRenderer
from lazygrad_codegen.lowerer import KernelASTError, LoweredKernel, lower
from lazygrad_codegen.program import Estimates, ProgramSpec, get_program, print_uops

__version__ = "0.1.0"

__all__ = [
    "CRenderer",
    "CStyleLanguage",
    "Estimates",
    "KernelASTError",
    "LLVMRenderer",
    "LinearizeError",
    "LoweredKernel",
    "ProgramSpec",
    "get_program",
    "linearize",
    "lower",
    "print_uops",
]
