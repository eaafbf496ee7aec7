"""Kernel ASTs built by hand (as the scheduler would emit them), and a runner that compiles a kernel rendered by a
C-style renderer with the system C compiler and calls it through ctypes, so results can be compared with numpy."""

from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from lazygrad_codegen import CRenderer, ProgramSpec, get_program
from lazygrad_codegen.cstyle import CStyleLanguage
from lazygrad_uop.dtype import DType, dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker


class Kernels:
    """Builders of kernel-AST nodes."""

    @staticmethod
    def buf(slot: int, dtype: DType, size: int) -> UOp:
        return UOp(Ops.DEFINE_GLOBAL, dtype.ptr(size), arg=slot)

    @staticmethod
    def load(slot: int, dtype: DType, st: ShapeTracker, size: int | None = None) -> UOp:
        size = st.real_size() if size is None else size
        return UOp(Ops.LOAD, dtype, (Kernels.buf(slot, dtype, size), UOp(Ops.VIEW, arg=st)))

    @staticmethod
    def const(value: Any, dtype: DType, st: ShapeTracker) -> UOp:
        return UOp(Ops.CONST, dtype, (UOp(Ops.VIEW, arg=st),), dtypes.as_const(value, dtype))

    @staticmethod
    def store(slot: int, value: UOp, st: ShapeTracker, size: int | None = None) -> UOp:
        size = st.real_size() if size is None else size
        return UOp(Ops.STORE, dtypes.void, (Kernels.buf(slot, value.dtype, size), UOp(Ops.VIEW, arg=st), value))

    @staticmethod
    def reduce(x: UOp, op: Ops, axes: tuple[int, ...]) -> UOp:
        return UOp(Ops.REDUCE_AXIS, x.dtype, (x,), (op, axes))

    @staticmethod
    def sink(*stores: UOp) -> UOp:
        return UOp(Ops.SINK, dtypes.void, stores)

    @staticmethod
    def st(*shape: Any) -> ShapeTracker:
        return ShapeTracker.from_shape(shape)


@pytest.fixture
def k() -> type[Kernels]:
    return Kernels


class GridCRenderer(CStyleLanguage):
    """A GPU-shaped C dialect for tests: output axes become gidx hardware indices, which the kernel takes as its
    first three parameters, so a host loop over the grid can run it like a GPU would."""

    device = "TESTGPU"
    has_local = True
    prelude = CRenderer.prelude
    type_map = CRenderer.type_map
    code_for_workitem: ClassVar[dict[str, Callable[[int], str]]] = {"g": lambda d: f"grid{d}"}

    def render_kernel(self, name: str, body: list[str], params: list[tuple[str, DType]]) -> str:
        src = super().render_kernel(name, body, params)
        return src.replace(f"void {name}(", f"void {name}(int grid0, int grid1, int grid2, ", 1)


def cc_available() -> bool:
    return shutil.which("cc") is not None


_counter = itertools.count()


def run_c(
    src_dir: Path, ast: UOp, renderer: CStyleLanguage, inputs: dict[int, np.ndarray], vals: tuple[int, ...] = ()
) -> tuple[dict[int, np.ndarray], ProgramSpec]:
    """Render `ast`, compile it with `cc -shared -O2`, run it (over its whole grid when it has one) and return the
    output buffers."""
    spec = get_program(ast, renderer)
    n = next(_counter)
    c_file, so_file = src_dir / f"k{n}.c", src_dir / f"k{n}.so"
    c_file.write_text(spec.src)
    proc = subprocess.run(
        ["cc", "-shared", "-O2", "-fPIC", "-o", str(so_file), str(c_file), "-lm"], capture_output=True, text=True
    )
    assert proc.returncode == 0, f"cc failed:\n{proc.stderr}\n{spec.src}"
    fxn = getattr(ctypes.CDLL(str(so_file)), spec.name)
    arrays: dict[int, np.ndarray] = {}
    for buf in sorted((u for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg):
        npdt = to_numpy_dtype(buf.dtype.base)
        given = inputs.get(buf.arg)
        arrays[buf.arg] = np.ascontiguousarray(given, npdt) if given is not None else np.zeros(buf.dtype.size, npdt)
    args = [ctypes.c_void_p(a.ctypes.data) for _, a in sorted(arrays.items())] + [ctypes.c_int(v) for v in vals]
    if renderer.has_local:
        for g2, g1, g0 in itertools.product(*(range(int(s)) for s in spec.global_size[::-1])):
            fxn(ctypes.c_int(g0), ctypes.c_int(g1), ctypes.c_int(g2), *args)
    else:
        fxn(*args)
    return {slot: arrays[slot] for slot in spec.outs}, spec


@pytest.fixture
def run_cc(tmp_path: Path) -> Callable[..., dict[int, np.ndarray]]:
    if not cc_available():
        pytest.skip("no C compiler (cc) on PATH to compile the C renderer's output")

    def go(ast: UOp, inputs: dict[int, np.ndarray], vals: tuple[int, ...] = (), grid: bool = False) -> dict:
        return run_c(tmp_path, ast, GridCRenderer() if grid else CRenderer(), inputs, vals)[0]

    return go
