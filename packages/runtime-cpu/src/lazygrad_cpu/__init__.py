"""lazygrad's CPU device: kernels rendered as LLVM IR, compiled with llvmlite for the host CPU and its vector units,
run through ctypes on host memory. The `lazygrad_cpu.plugin` module registers the `CPU` device.

The classes are imported on first use, so that loading the plugin stays cheap and a broken llvmlite shows up as
"CPU not usable" rather than as a plugin that fails to import."""

from __future__ import annotations

from lazygrad_uop.lazy_exports import lazy_exports

__version__ = "0.10.0"

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "CPUAllocator": "lazygrad_cpu.allocator",
        "CPUBuffer": "lazygrad_cpu.allocator",
        "LLVMCompiler": "lazygrad_cpu.compiler",
        "CPUProgram": "lazygrad_cpu.program",
        "CPURenderer": "lazygrad_cpu.renderer",
    },
)
