"""C source in the calling convention of the CPU device's programs (`lazygrad_cpu.program.CPUProgram`)."""

from __future__ import annotations

from typing import ClassVar

from lazygrad_codegen import CRenderer
from lazygrad_cpu.renderer import arity_symbol
from lazygrad_uop.dtype import DType
from lazygrad_uop.uop import UOp


class CPUCRenderer(CRenderer):
    """Codegen's plain C kernel, plus what a CPU program expects of a kernel: two trailing `int` parameters, the range
    of the `core0` axis a call runs (this renderer has no such axis, so a launch is one call that runs everything),
    and a constant named `<kernel>.arity` holding how many buffers and variables the kernel takes."""

    extra_params: ClassVar[tuple[str, ...]] = ("const int core_start", "const int core_end")

    def render_kernel(self, name: str, body: list[str], params: list[tuple[str, DType]], uops: list[UOp]) -> str:
        """The C kernel, then its arity constant (a symbol name with a dot, given through an asm label)."""
        src = super().render_kernel(name, body, params, uops)
        return f'{src}const int {name}_arity __asm__("{arity_symbol(name)}") = {len(params)};\n'
