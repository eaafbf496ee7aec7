"""Kernel ASTs built by hand (as the scheduler would emit them) and a runner that executes one on the CPU device
through codegen, so tests can compare the result with numpy."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest

from lazygrad_codegen import ProgramSpec, get_program, kernel_ast
from lazygrad_cpu.plugin import open_cpu
from lazygrad_uop.device import CompiledDevice
from lazygrad_uop.dtype import dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp


@pytest.fixture
def k() -> ModuleType:
    """The kernel-AST builders."""
    return kernel_ast


@pytest.fixture(scope="session")
def cpu() -> CompiledDevice:
    return open_cpu("CPU")


def _buffers(ast: UOp) -> dict[int, UOp]:
    return {u.arg: u for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL}


def run_kernel(
    device: CompiledDevice, ast: UOp, inputs: dict[int, np.ndarray], vals: tuple[int, ...] = ()
) -> tuple[dict[int, np.ndarray], ProgramSpec]:
    """Compile and run `ast` with `inputs` (slot -> array) and return every output slot's contents."""
    spec = get_program(ast, device.renderer)
    program = device.load_program(spec.name, device.compiler.compile(spec.src))
    handles, outs = {}, {}
    for slot, buf in sorted(_buffers(ast).items()):
        dtype = buf.dtype.base
        nbytes = max(buf.dtype.size * dtype.itemsize, 1)
        handle = device.allocator.alloc(nbytes)
        if slot in inputs:
            device.allocator.copyin(handle, memoryview(np.ascontiguousarray(inputs[slot])).cast("B"))
        handles[slot] = handle
        if slot in spec.outs:
            outs[slot] = (handle, buf.dtype.size, dtype)
    # a buffer whose loads were simplified away is not a parameter of the program, as in the frontend's engine
    args = [handles[slot] for slot in spec.globals]
    program(*args, global_size=spec.global_size, local_size=spec.local_size, vals=vals)
    result = {}
    for slot, (handle, size, dtype) in outs.items():
        npdt = np.uint16 if dtype == dtypes.bfloat16 else to_numpy_dtype(dtype)
        out = np.empty(size, dtype=npdt)
        device.allocator.copyout(memoryview(out).cast("B"), handle)
        result[slot] = out
    return result, spec


@pytest.fixture
def run(cpu: CompiledDevice) -> Callable[..., dict[int, np.ndarray]]:
    def go(ast: UOp, inputs: dict[int, np.ndarray], vals: tuple[int, ...] = ()) -> dict[int, np.ndarray]:
        return run_kernel(cpu, ast, inputs, vals)[0]

    return go


@pytest.fixture
def run_with_spec(cpu: CompiledDevice) -> Callable[..., tuple[dict[int, np.ndarray], ProgramSpec]]:
    """Like `run`, also returning the ProgramSpec that codegen made."""

    def go(ast: UOp, inputs: dict[int, np.ndarray], vals: tuple[int, ...] = ()):
        return run_kernel(cpu, ast, inputs, vals)

    return go
