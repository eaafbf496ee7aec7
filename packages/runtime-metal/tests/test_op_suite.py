"""Every op-suite kernel (see `op_suite`) lowered for METAL: its MSL must compile against Metal's declarations
(`msl_check`), and the same linear program, run by the PYTHON interpreter with Metal's limits and launch shape
(`metal_emulation`), must match numpy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lazygrad", reason="the op suite builds Tensor graphs: it needs the lazygrad frontend")
pytest.importorskip(
    "lazygrad_python", reason="the op suite runs on the PYTHON interpreter: install lazygrad-runtime-python"
)

import metal_emulation
from msl_check import check_msl, cxx

from lazygrad_codegen import get_program
from lazygrad_testkit.op_suite import CASES, OpCase
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device


@pytest.fixture(scope="module")
def emulation() -> Iterator[str]:
    """The METALEMU device, registered for these tests only."""
    plugin = metal_emulation.EmulationPlugin()
    Device.register_plugin(plugin, name="metal emulation (tests)")
    try:
        yield metal_emulation.NAME
    finally:
        Device.unregister_plugin(plugin)


@pytest.fixture(scope="module")
def have_cxx() -> None:
    if cxx() is None:
        pytest.skip("no C++ compiler (c++) on PATH to check the MSL with")


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_kernel_is_valid_msl_and_runs_with_metal_limits(
    case: OpCase, emulation: str, have_cxx: None, tmp_path: Path
) -> None:
    out, ref, tol = case.build(emulation)
    kernels = [si.ast for si in out.schedule() if si.ast.op is Ops.SINK]
    assert kernels, f"{case.name} scheduled no kernel"
    metal, emulated = metal_emulation.registered_metal_renderer(), Device[emulation].renderer
    sources = []
    for ast in kernels:
        spec = get_program(ast, metal)
        on_emulation = get_program(ast, emulated)
        # the interpreter runs the very program the MSL was rendered from
        assert spec.uops == on_emulation.uops
        assert (spec.global_size, spec.local_size) == (on_emulation.global_size, on_emulation.local_size)
        assert f"kernel void {spec.name}(" in spec.src
        sources.append(spec.src)
    check_msl(sources, tmp_path)
    ops = {u.op for ast in kernels for u in get_program(ast, metal).uops}
    if case.name.startswith("matmul_tc") and metal.tensor_cores:
        assert Ops.WMMA in ops, "the tensor cores were not used: the case checks nothing about them"
    if case.name.startswith("reduce_grouped"):
        assert {Ops.DEFINE_LOCAL, Ops.BARRIER} <= ops, "the reduction was not grouped through threadgroup memory"
    got, ref = out.numpy(), np.asarray(ref)
    assert got.shape == ref.shape and got.dtype == ref.dtype, (
        f"{got.shape} {got.dtype} != numpy's {ref.shape} {ref.dtype}"
    )
    np.testing.assert_allclose(got, ref, equal_nan=True, **tol)
