"""lazygrad's code generator: turns a kernel AST into a linear program (lowering, symbolic simplification,
linearization) and renders it with one of the two renderer families device packages specialise: C-style
(`CStyleLanguage`, the base of C, OpenCL, CUDA and Metal) and LLVM IR (`LLVMRenderer`).

    from lazygrad_codegen import get_program
    spec = get_program(ast, renderer)   # ProgramSpec: name, src, uops, launch sizes, estimates

Optimisation: `Kernel` and `OptOps` (kernel.py), hand-coded heuristics (heuristic.py), BEAM search (search.py),
tensor cores applied from their descriptions (tensor_cores.py).
"""

from lazygrad_codegen.cstyle import CRenderer, CStyleLanguage
from lazygrad_codegen.kernel import AxisType, Kernel, KernelASTError, KernelOptError, Opt, OptOps
from lazygrad_codegen.linearizer import LinearizeError, linearize
from lazygrad_codegen.llvmir import LLVMRenderer
from lazygrad_codegen.lowerer import LoweredKernel, lower
from lazygrad_codegen.program import Estimates, ProgramSpec, get_program, optimized_kernel, print_uops, program_of

__version__ = "0.15.0"

__all__ = [
    "AxisType",
    "CRenderer",
    "CStyleLanguage",
    "Estimates",
    "Kernel",
    "KernelASTError",
    "KernelOptError",
    "LLVMRenderer",
    "LinearizeError",
    "LoweredKernel",
    "Opt",
    "OptOps",
    "ProgramSpec",
    "get_program",
    "linearize",
    "lower",
    "optimized_kernel",
    "print_uops",
    "program_of",
]
