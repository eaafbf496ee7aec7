"""The plugin: one `RendererSpec`, for a device another package provides, naming its compiler."""

from __future__ import annotations

from lazygrad_uop.device import Compiler, Renderer
from lazygrad_uop.plugins import RendererSpec, hookimpl


def make_renderer() -> Renderer:
    """A C renderer for the CPU device (imported on first use: codegen loads only when a renderer is needed)."""
    from lazygrad_example_c_renderer.renderer import CPUCRenderer

    return CPUCRenderer()


def make_compiler() -> Compiler:
    """The system C compiler for that renderer's source."""
    from lazygrad_example_c_renderer.compiler import CCompiler

    return CCompiler()


@hookimpl
def lazygrad_renderers() -> list[RendererSpec]:
    """`CPU:C`: not the CPU's default, selected by name (`DEV=CPU:C`, `device="CPU:C"`)."""
    return [RendererSpec("CPU", "C", make=make_renderer, compiler=make_compiler)]
