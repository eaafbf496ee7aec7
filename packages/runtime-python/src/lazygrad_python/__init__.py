"""lazygrad's PYTHON device: a reference interpreter of linear UOps that runs a program a warp of threads at a time,
with workgroup-shared local memory and barriers, and the plugin module that registers the `PYTHON` device.

    from lazygrad_uop.registry import Device
    dev = Device["PYTHON"]
    lib = dev.compiler.compile(dev.renderer.render(linear_uops))
    dev.load_program("kernel", lib)(*buffer_handles, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=())
"""

from lazygrad_python.device import (
    GPUTarget,
    PythonAllocator,
    PythonCompiler,
    PythonProgram,
    PythonRenderer,
    open_python,
)
from lazygrad_python.interpreter import WARP_SIZE, Interpreter, InterpreterError
from lazygrad_python.program_text import Instr, ProgramTextError, parse_program, render_program

__version__ = "0.11.0"

__all__ = [
    "WARP_SIZE",
    "GPUTarget",
    "Instr",
    "Interpreter",
    "InterpreterError",
    "ProgramTextError",
    "PythonAllocator",
    "PythonCompiler",
    "PythonProgram",
    "PythonRenderer",
    "open_python",
    "parse_program",
    "render_program",
]
