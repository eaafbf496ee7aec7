"""Every kind of kernel the frontend's op suite produces renders for CUDA and compiles with NVRTC for sm_80 and sm_90,
and ptxas assembles its PTX. No GPU needed: the kernels are built from Tensor graphs (the op suite's operations over
its dtypes), scheduled, and turned into programs with the CUDA renderer; nothing runs.

Needs the lazygrad frontend (installed in `nox -s tests` and `nox -s cuda`, not in the package-alone session)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_helpers import ARCHS, assemble, ptxas

from lazygrad_codegen import get_program
from lazygrad_cuda.compiler import nvrtc_compile
from lazygrad_cuda.renderer import CUDARenderer
from lazygrad_testkit.kernel_graphs import kernel_graphs
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device

lazygrad = pytest.importorskip("lazygrad", reason="builds kernels from Tensor graphs: needs the lazygrad frontend")
Tensor = lazygrad.Tensor


def op_suite_sources() -> dict[str, str]:
    """The CUDA source of every distinct kernel the graphs schedule into, by kernel name."""
    renderer = CUDARenderer("sm_80")
    renderer.add_tensor_cores(Device.tensor_cores_for("CUDA", renderer))  # as the CUDA device gets them
    sources: dict[str, str] = {}
    for _name, build in kernel_graphs():
        for si in build().schedule():
            if si.ast.op is Ops.SINK:
                spec = get_program(si.ast, renderer)
                sources.setdefault(spec.src, spec.name)
    return {name: src for src, name in sources.items()}


def _split(src: str) -> tuple[str, str]:
    """A kernel's source as (prelude, kernel function)."""
    at = src.index('extern "C" __global__')
    return src[:at], src[at:]


def test_every_op_suite_kernel_compiles_for_sm80_and_sm90(tmp_path: Path) -> None:
    sources = op_suite_sources()
    assert len(sources) > 150, f"expected the op suite's variety of kernels, got {len(sources)}"
    assert any("mma.sync" in src for src in sources.values()), "no kernel used the tensor cores"
    # Kernels with the same prelude are compiled together, as one translation unit per prelude: each kernel still
    # sees exactly its own prelude, and NVRTC and ptxas start a few times instead of hundreds. A unit that fails is
    # compiled kernel by kernel to name the culprits.
    units: dict[str, dict[str, str]] = {}
    for name, src in sources.items():
        prelude, kernel = _split(src)
        units.setdefault(prelude, {})[name] = kernel
    failures = []
    for n, (prelude, kernels) in enumerate(units.items()):
        for arch in ARCHS:
            try:
                out = nvrtc_compile(prelude + "\n".join(kernels.values()), arch, f"unit{n}")
                if ptxas()[0] is not None:
                    assemble(out.ptx, arch, tmp_path, f"unit{n}")
            except (AssertionError, Exception):  # noqa: BLE001 - find which kernels fail, report them all
                for name, kernel in kernels.items():
                    try:
                        out = nvrtc_compile(prelude + kernel, arch, name)
                        if ptxas()[0] is not None:
                            assemble(out.ptx, arch, tmp_path, name)
                    except (AssertionError, Exception) as exc:  # noqa: BLE001
                        failures.append(f"{name} ({arch}): {exc}")
    assert not failures, "\n\n".join(failures[:5]) + f"\n\n{len(failures)} of {2 * len(sources)} compilations failed"
