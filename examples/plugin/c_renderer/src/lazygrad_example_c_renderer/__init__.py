"""An example renderer-only lazygrad plugin: C for the CPU device, compiled by the system C compiler."""

from lazygrad_example_c_renderer.compiler import CCompiler
from lazygrad_example_c_renderer.renderer import CPUCRenderer

__all__ = ["CCompiler", "CPUCRenderer"]
