"""lazygrad's METAL device: kernels rendered as Metal Shading Language (`MetalRenderer`), compiled and run on Apple
GPUs through the Objective-C runtime (`MetalDevice`, `MetalAllocator`, `MetalCompiler`, `MetalProgram`), with
indirect command buffers as the graph type (`MetalGraph`). `lazygrad_metal.plugin` registers the `METAL` device.

The classes are imported on first use, so that loading the plugin stays cheap and works on every OS (the renderer
runs anywhere; the runtime needs macOS)."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.3.0"

_EXPORTS = {
    "MetalRenderer": "lazygrad_metal.renderer",
    "MetalDevice": "lazygrad_metal.device",
    "MetalAllocator": "lazygrad_metal.device",
    "MetalBuffer": "lazygrad_metal.device",
    "MetalCompiler": "lazygrad_metal.device",
    "MetalProgram": "lazygrad_metal.device",
    "MetalError": "lazygrad_metal.device",
    "MetalGraph": "lazygrad_metal.graph",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lazygrad_metal' has no attribute {name!r}")
