"""lazygrad's code generator: turns a kernel AST into a linear program (lowering, symbolic simplification,
linearization) and renders it with one of the two renderer families device packages specialise: C-style
(`CStyleLanguage`, the base of C, OpenCL, CUDA and Metal) and LLVM IR (`LLVMRenderer`).

    from lazygrad_codegen import get_program
    spec = get_program(ast, renderer)   # ProgramSpec: name, src, uops, launch sizes, estimates

Optimisation: `Kernel` and `OptOps` (kernel.py), hand-coded heuristics (heuristic.py), BEAM search (search.py),
tensor cores applied from their descriptions (tensor_cores.py).
"""

from __future__ import annotations

from lazygrad_uop.lazy_exports import lazy_exports

__version__ = "0.27.0"

# imported on first use: a module that needs one piece (a compile worker loading llvm_compiler alone) doesn't pay
# for the whole code generator
__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "AxisType": "lazygrad_codegen.kernel",
        "CRenderer": "lazygrad_codegen.cstyle",
        "CStyleLanguage": "lazygrad_codegen.cstyle",
        "Estimates": "lazygrad_codegen.program",
        "Kernel": "lazygrad_codegen.kernel",
        "KernelASTError": "lazygrad_codegen.kernel",
        "KernelOptError": "lazygrad_codegen.kernel",
        "LLVMRenderer": "lazygrad_codegen.llvmir",
        "LinearizeError": "lazygrad_codegen.linearizer",
        "LoweredKernel": "lazygrad_codegen.lowerer",
        "Opt": "lazygrad_codegen.kernel",
        "OptOps": "lazygrad_codegen.kernel",
        "ProgramSpec": "lazygrad_codegen.program",
        "get_program": "lazygrad_codegen.program",
        "linearize": "lazygrad_codegen.linearizer",
        "lower": "lazygrad_codegen.lowerer",
        "optimized_kernel": "lazygrad_codegen.program",
        "print_uops": "lazygrad_codegen.program",
        "program_of": "lazygrad_codegen.program",
    },
)
