"""Running kernels rendered by C-style renderers: compiled with the system C compiler (`cc -shared -O2`) and called
through ctypes, over the whole grid for `GridCRenderer`, a GPU-shaped C dialect."""

from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import numpy as np

from lazygrad_codegen import CRenderer, ProgramSpec, get_program
from lazygrad_codegen.cstyle import CStyleLanguage
from lazygrad_uop.dtype import DType, to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp


class GridCRenderer(CStyleLanguage):
    """A GPU-shaped C dialect for tests: output axes become gidx hardware indices, which the kernel takes as its
    first three parameters, so a host loop over the grid can run it like a GPU would."""

    device = "TESTGPU"
    has_local = True
    # the host loop runs one thread per workgroup, in plain C
    has_shared = False
    local_max = (1, 1, 1)
    supports_float4 = False
    prelude = CRenderer.prelude
    type_map = CRenderer.type_map
    code_for_workitem: ClassVar[dict[str, Callable[[int], str]]] = {"g": lambda d: f"grid{d}"}

    def render_kernel(self, name: str, body: list[str], params: list[tuple[str, DType]], uops: list[UOp]) -> str:
        src = super().render_kernel(name, body, params, uops)
        return src.replace(f"void {name}(", f"void {name}(int grid0, int grid1, int grid2, ", 1)


def cc_available() -> bool:
    return shutil.which("cc") is not None


_counter = itertools.count()


def run_c(
    src_dir: Path,
    ast: UOp,
    renderer: CStyleLanguage,
    inputs: dict[int, np.ndarray],
    vals: tuple[int, ...] = (),
    opts: list | None = None,
) -> tuple[dict[int, np.ndarray], ProgramSpec]:
    """Render `ast` (with `opts`, or codegen's choice), compile it with `cc -shared -O2`, run it (over its whole grid
    when it has one) and return the output buffers."""
    spec = get_program(ast, renderer, opts)
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
    # the program takes the buffers it still touches after simplification (spec.globals), in slot order
    args = [ctypes.c_void_p(arrays[slot].ctypes.data) for slot in spec.globals] + [ctypes.c_int(v) for v in vals]
    if renderer.has_local:
        for g2, g1, g0 in itertools.product(*(range(int(s)) for s in spec.global_size[::-1])):
            fxn(ctypes.c_int(g0), ctypes.c_int(g1), ctypes.c_int(g2), *args)
    else:
        fxn(*args)
    return {slot: arrays[slot] for slot in spec.outs}, spec
