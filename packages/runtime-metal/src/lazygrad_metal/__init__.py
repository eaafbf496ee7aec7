"""lazygrad's METAL device: kernels rendered as Metal Shading Language (`MetalRenderer`), compiled and run on Apple
GPUs through the Objective-C runtime (`MetalDevice`, `MetalAllocator`, `MetalCompiler`, `MetalProgram`), with
indirect command buffers as the graph type (`MetalGraph`). `lazygrad_metal.plugin` registers the `METAL` device.

The classes are imported on first use, so that loading the plugin stays cheap and works on every OS (the renderer
runs anywhere; the runtime needs macOS)."""

from __future__ import annotations

from lazygrad_uop.lazy_exports import lazy_exports

__version__ = "0.6.0"

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "MetalRenderer": "lazygrad_metal.renderer",
        "MetalDevice": "lazygrad_metal.device",
        "MetalAllocator": "lazygrad_metal.device",
        "MetalBuffer": "lazygrad_metal.device",
        "MetalCompiler": "lazygrad_metal.device",
        "MetalProgram": "lazygrad_metal.device",
        "MetalError": "lazygrad_metal.device",
        "MetalGraph": "lazygrad_metal.graph",
    },
)
