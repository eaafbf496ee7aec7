"""The CPU's renderer: codegen's LLVM IR renderer, for the host."""

from __future__ import annotations

from lazygrad_codegen.llvmir import LLVMRenderer


class CPURenderer(LLVMRenderer):
    """LLVM IR for the host CPU: every axis is a loop (no hardware indices, no shared memory)."""

    device = "CPU"
    has_local = False
    has_shared = False
