"""The tensor-core-only plugin: installed, its description reaches the CUDA renderer of an sm_86 GPU next to sm_80's
built-ins, the renderer writes it, and its layout computes a matmul exactly on the PYTHON device's emulation."""

from __future__ import annotations

import numpy as np
import pytest
from lazygrad_example_tensor_cores.plugin import M16N8K8_BF16

from lazygrad_uop.registry import Device

cuda_renderer = pytest.importorskip("lazygrad_cuda.renderer")
codegen = pytest.importorskip("lazygrad_codegen")
kernel_ast = pytest.importorskip("lazygrad_codegen.kernel_ast")


def _renderer(arch: str) -> object:
    renderer = cuda_renderer.CUDARenderer(arch)
    renderer.add_tensor_cores(Device.tensor_cores_for("CUDA", renderer))
    return renderer


def test_the_description_is_added_to_sm80s() -> None:
    from lazygrad_cuda.tensor_cores import TENSOR_CORES

    handed = _renderer("sm_86").tensor_cores
    assert M16N8K8_BF16 in handed and set(TENSOR_CORES["sm_80"]) <= set(handed)
    assert M16N8K8_BF16 not in _renderer("sm_80").tensor_cores


def test_the_cuda_renderer_writes_it() -> None:
    renderer = _renderer("sm_86")
    opt = codegen.Opt(codegen.OptOps.TC, 0, (renderer.tensor_cores.index(M16N8K8_BF16), 0))
    spec = codegen.get_program(kernel_ast.matmul(32, 32, 32, M16N8K8_BF16.dtype_in), renderer, [opt])
    assert "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32" in spec.src
    try:
        from lazygrad_cuda.compiler import nvrtc_compile, nvrtc_version

        nvrtc_version()
    except Exception as exc:  # noqa: BLE001 - no NVRTC here: the source check above is what can run
        pytest.skip(f"NVRTC is not usable here: {exc}")
    nvrtc_compile(spec.src, "sm_86", spec.name)


def test_the_layout_computes_a_matmul_on_the_python_emulation() -> None:
    python = pytest.importorskip("lazygrad_python")
    renderer = python.PythonRenderer(python.GPUTarget(tensor_cores=(M16N8K8_BF16,)))
    m, n, k = 32, 16, 16
    spec = codegen.get_program(
        kernel_ast.matmul(m, n, k, M16N8K8_BF16.dtype_in), renderer, [codegen.Opt(codegen.OptOps.TC, 0, (0, 0))]
    )
    assert any(u.op.name == "WMMA" for u in spec.uops)
    rng = np.random.default_rng(0)
    # small integers: exact in bfloat16, and their products and sums exact in float32
    a, b = rng.integers(-4, 5, (m, k)).astype(np.float32), rng.integers(-4, 5, (k, n)).astype(np.float32)
    bits = {1: (a.view(np.uint32) >> 16).astype(np.uint16), 2: (b.view(np.uint32) >> 16).astype(np.uint16)}
    mems = {0: memoryview(bytearray(m * n * 4)), **{s: memoryview(bytearray(x.tobytes())) for s, x in bits.items()}}
    prg = python.PythonProgram(Device["PYTHON"], spec.name, python.PythonCompiler().compile(spec.src))
    prg(*(mems[s] for s in spec.globals), global_size=spec.global_size, local_size=spec.local_size)
    np.testing.assert_array_equal(np.frombuffer(bytes(mems[0]), np.float32).reshape(m, n), a @ b)
