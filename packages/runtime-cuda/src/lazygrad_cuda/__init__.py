"""lazygrad's CUDA device: CUDA C rendered for the GPU's architecture, compiled with NVRTC, run through the CUDA
driver API (cuda-python's `cuda.bindings`) with pinned-memory copies, peer transfers between GPUs, event timing and
CUDA graphs. The `lazygrad_cuda.plugin` module registers the `CUDA` device.

The classes are imported on first use, so that loading the plugin stays cheap and a missing driver shows up as
"CUDA not usable" rather than as a plugin that fails to import."""

from __future__ import annotations

from lazygrad_uop.lazy_exports import lazy_exports

__version__ = "0.13.0"

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "CUDAAllocator": "lazygrad_cuda.allocator",
        "CUDABuffer": "lazygrad_cuda.allocator",
        "CUDADevice": "lazygrad_cuda.device",
        "CUDAError": "lazygrad_cuda.errors",
        "CUDAGraph": "lazygrad_cuda.graph",
        "CUDAProgram": "lazygrad_cuda.program",
        "CUDARenderer": "lazygrad_cuda.renderer",
        "NVRTCCompiler": "lazygrad_cuda.compiler",
    },
)
