"""The codegen side of running a kernel across CPU cores: on a renderer with `has_threads` (and no local dimensions)
the outermost GLOBAL loop after opts becomes `SPECIAL core0`, hoisted to the top of the program, and
`ProgramSpec.global_size` is `(size, 1, 1)`. A C test renderer runs core0 as a loop over a `[start, end)` range
passed as two trailing parameters, as the CPU device does, so a kernel split into several ranges can be checked
against numpy."""

from __future__ import annotations

import ctypes
import itertools
import subprocess
from pathlib import Path

import numpy as np
import pytest
from codegen_c import GridCRenderer, cc_available
from codegen_cases import column_sum, conv2d, elementwise, full_sum_and_max, load, matmul, sink, st, store

from lazygrad_codegen import CRenderer, Opt, OptOps, get_program
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp


class ThreadedC(CRenderer):
    """C whose `core0` is a loop over `[core_start, core_end)`, the kernel's last two parameters."""

    device = "TESTTHREADS"
    has_threads = True

    def render_kernel(self, name: str, body: list[str], params: list[tuple[str, DType]], uops: list[UOp]) -> str:
        opened = [i for i, line in enumerate(body) if line.strip().startswith("int core0 =")]
        if opened:
            (i,) = opened
            body = [*body[:i], "  for (int core0 = core_start; core0 < core_end; core0++) {", *body[i + 1 :], "  }"]
        extra = [("core_start", dtypes.int32), ("core_end", dtypes.int32)]
        return super().render_kernel(name, body, [*params, *extra], uops)

    def render_workitem(self, kind: str, dim: int, workgroup: tuple[int, int, int] | None) -> str:
        return "0"  # replaced by the loop above


def _run_split(tmp_path: Path, ast: UOp, inputs: dict[int, np.ndarray], opts, parts: int):
    spec = get_program(ast, ThreadedC(), opts)
    c_file, so_file = tmp_path / f"{spec.name}.c", tmp_path / f"{spec.name}.so"
    c_file.write_text(spec.src)
    proc = subprocess.run(
        ["cc", "-shared", "-O1", "-fPIC", "-o", str(so_file), str(c_file), "-lm"], capture_output=True
    )
    assert proc.returncode == 0, proc.stderr.decode() + spec.src
    fxn = getattr(ctypes.CDLL(str(so_file)), spec.name)
    arrays = {}
    for u in sorted((u for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg):
        given = inputs.get(u.arg)
        arrays[u.arg] = (
            np.ascontiguousarray(given, np.float32) if given is not None else np.zeros(u.dtype.size, np.float32)
        )
    size = int(spec.global_size[0])
    bounds = [size * i // parts for i in range(parts + 1)]
    # the parts in reverse order: each must be independent of the others
    for lo, hi in reversed(list(itertools.pairwise(bounds))):
        fxn(*(ctypes.c_void_p(arrays[s].ctypes.data) for s in spec.globals), ctypes.c_int(lo), ctypes.c_int(hi))
    return arrays, spec


def _specials(spec) -> list[UOp]:
    return [u for u in spec.uops if u.op is Ops.SPECIAL]


def test_outermost_global_loop_becomes_core0_at_the_top() -> None:
    case = matmul(16, 24, 8)
    spec = get_program(case.ast, ThreadedC(), [Opt(OptOps.UPCAST, 1, 4)])
    (core,) = _specials(spec)
    assert core.arg == ("core0", 16)
    assert spec.global_size == (16, 1, 1)
    params = [u for u in spec.uops if u.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR)]
    assert spec.uops.index(core) == len(params)  # right after the parameters, before any loop
    ranges = [u.src[0].arg for u in spec.uops if u.op is Ops.RANGE]
    assert ranges == [6, 8]  # the other output loop and the reduction stay loops


def test_swap_changes_which_axis_is_split() -> None:
    spec = get_program(matmul(16, 24, 8).ast, ThreadedC(), [Opt(OptOps.SWAP, 0, 1)])
    assert _specials(spec)[0].arg == ("core0", 24)


def test_no_core0_without_an_output_loop_or_on_gpus_or_for_symbolic_sizes() -> None:
    assert _specials(get_program(full_sum_and_max().ast, ThreadedC(), [])) == []
    assert get_program(full_sum_and_max().ast, ThreadedC(), []).global_size == (1, 1, 1)
    grid = get_program(elementwise().ast, GridCRenderer(), [])
    assert [u.arg[0] for u in _specials(grid)] == ["gidx0"]
    n = UOp.variable("n", 1, 32)
    ast = sink(store(0, load(1, dtypes.float32, st(n, 4), size=128) * 2, st(n, 4)))
    spec = get_program(ast, ThreadedC(), [])
    assert _specials(spec) == [] and spec.global_size == (1, 1, 1)


def test_renderers_without_threads_keep_loops() -> None:
    spec = get_program(elementwise().ast, CRenderer(), [])
    assert _specials(spec) == [] and spec.global_size == (1, 1, 1)


@pytest.mark.skipif(not cc_available(), reason="no C compiler (cc) on PATH")
@pytest.mark.parametrize("parts", [1, 3, 7])
def test_a_kernel_split_into_ranges_matches_numpy(tmp_path: Path, parts: int) -> None:
    for case, opts in [
        (matmul(16, 24, 8), [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 2)]),
        (column_sum(), [Opt(OptOps.UPCAST, 0, 4)]),
        (conv2d(), [Opt(OptOps.UNROLL, 2, 0)]),
        (elementwise(), None),
    ]:
        arrays, spec = _run_split(tmp_path, case.ast, case.inputs, opts, parts)
        assert _specials(spec)[0].arg[0] == "core0"
        for slot, want in case.expected.items():
            np.testing.assert_allclose(arrays[slot], want, rtol=1e-4, atol=1e-4)
