"""Builders of kernel ASTs, for tests that make kernels without a Tensor graph: codegen's `kernel_ast`, the one
place they are written (buffers by slot, loads and stores through views, reductions, sinks, row reductions,
matmuls)."""

from lazygrad_codegen.kernel_ast import buf, const, load, matmul, reduce, row_reduce, sink, st, store, strided

__all__ = ["buf", "const", "load", "matmul", "reduce", "row_reduce", "sink", "st", "store", "strided"]
