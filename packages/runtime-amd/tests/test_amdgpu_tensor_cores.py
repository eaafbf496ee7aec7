"""AMD tensor cores through the AMDGPU renderer, without a GPU.

A matmul kernel that codegen lowers with a TC opt for an AMD target is checked twice from the same linear program:
its LLVM IR compiles (llvmlite, linked with ld.lld where installed) to ISA that contains the target's matrix
instruction (`v_wmma_*` on RDNA 3, `v_mfma_*` on CDNA), and its UOps, written as PYTHON program text, run through the
PYTHON device's emulation of the tensor-core description and match numpy. The emulation places every element where the
description says, so the pair shows that the program the GPU gets feeds the instruction the layout it documents.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import numpy as np
import pytest

from lazygrad_amd.amdgpu_compiler import (
    EM_AMDGPU,
    AMDGPUCompiler,
    amdgpu_target_reason,
    code_object_kernels,
    find_ld_lld,
)
from lazygrad_amd.amdgpu_renderer import AMDGPURenderer
from lazygrad_amd.tensor_cores import TENSOR_CORES
from lazygrad_codegen import Kernel, KernelOptError, Opt, OptOps, get_program
from lazygrad_uop import DType, Ops, UOp, dtypes
from lazygrad_uop.device import TensorCore
from lazygrad_uop.registry import Device
from lazygrad_uop.views import ShapeTracker

if (REASON := amdgpu_target_reason()) is not None:
    pytest.skip(REASON, allow_module_level=True)

python_device = pytest.importorskip("lazygrad_python", reason="runs the programs through the PYTHON device")
program_text = pytest.importorskip("lazygrad_python.program_text")

RNG = np.random.default_rng(11)


def registered_renderer(arch: str) -> AMDGPURenderer:
    """An AMDGPU renderer for `arch` with the tensor cores the registry hands it, as the HIP device gets them."""
    renderer = AMDGPURenderer(arch)
    renderer.add_tensor_cores(Device.tensor_cores_for("HIP", renderer))
    return renderer


LINK = find_ld_lld() is not None


@cache
def compiler(arch: str) -> AMDGPUCompiler:
    return AMDGPUCompiler(arch, link=LINK)


def assembly(arch: str, src: str) -> str:
    c = compiler(arch)
    return c.target_machine.emit_assembly(c.optimized_module(src))


def matrix_instructions(asm: str) -> list[str]:
    return re.findall(r"^\s*(v_(?:wmma|mfma)_\w+)", asm, re.MULTILINE)


def expected_mnemonic(tc: TensorCore) -> re.Pattern[str]:
    """The instruction the description names, as the target's assembly spells it (gfx94x and gfx950 write the MFMA
    `v_mfma_f32_16x16x16_f16` and `..._bf16` for what gfx90a writes `..16f16` and `..16bf16_1k`)."""
    kind = "wmma" if tc.threads == 32 else "mfma"
    dtype = "bf16" if tc.dtype_in == dtypes.bfloat16 else "f16"
    return re.compile(rf"v_{kind}_f32_16x16x16_?{dtype}(_1k)?")


# *** kernels ***


def _load(slot: int, dtype: DType, view: ShapeTracker) -> UOp:
    buf = UOp(Ops.DEFINE_GLOBAL, dtype.ptr(view.real_size()), arg=slot)
    return UOp(Ops.LOAD, dtype, (buf, UOp(Ops.VIEW, arg=view)))


def matmul_ast(m: int, n: int, k: int, dtype_in: DType) -> UOp:
    """C (m x n, float32) = A (m x k) @ B (k x n), both of `dtype_in`, products and sums in float32."""
    a = _load(1, dtype_in, ShapeTracker.from_shape((m, 1, k)).expand((m, n, k)))
    b = _load(2, dtype_in, ShapeTracker.from_shape((1, k, n)).permute((0, 2, 1)).expand((m, n, k)))
    red = UOp(Ops.REDUCE_AXIS, dtypes.float32, (a.cast(dtypes.float32) * b.cast(dtypes.float32),), (Ops.ADD, (2,)))
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(m * n), arg=0)
    view = UOp(Ops.VIEW, arg=ShapeTracker.from_shape((m, n, 1)))
    return UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (out, view, red)),))


def encode(x: np.ndarray, dtype: DType) -> tuple[bytes, np.ndarray]:
    """The bytes of `x` as `dtype` (float16 or bfloat16, rounded to nearest even), and the values they hold."""
    if dtype == dtypes.bfloat16:
        bits32 = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = ((bits32 + 0x7FFF + ((bits32 >> 16) & 1)) >> 16).astype(np.uint16)
        return bits.tobytes(), (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    v = x.astype(np.float16)
    return v.tobytes(), v.astype(np.float64)


def run_on_python_device(spec: Any, m: int, n: int, k: int, dtype_in: DType) -> tuple[np.ndarray, np.ndarray]:
    """Run the linear program of `spec` (lowered for an AMD target) on the PYTHON device; (result, numpy's)."""
    a_raw, a = encode(RNG.standard_normal((m, k)), dtype_in)
    b_raw, b = encode(RNG.standard_normal((k, n)), dtype_in)
    mems = {0: memoryview(bytearray(4 * m * n)), 1: memoryview(bytearray(a_raw)), 2: memoryview(bytearray(b_raw))}
    lib = python_device.PythonCompiler().compile(program_text.render_program(spec.uops))
    program = python_device.PythonProgram(Device["PYTHON"], spec.name, lib)
    program(*(mems[s] for s in spec.globals), global_size=spec.global_size, local_size=spec.local_size)
    got = np.frombuffer(bytes(mems[0]), np.float32).reshape(m, n)
    return got, a.reshape(m, k) @ b.reshape(k, n)


def tc_opt(arch: str, tc: TensorCore, pad: int = 0) -> Opt:
    return Opt(OptOps.TC, 0, (list(TENSOR_CORES[arch]).index(tc), pad))


def check_compiles(arch: str, tc: TensorCore, spec: Any) -> list[str]:
    """Compile `spec` for `arch`; its matrix instructions (each the one `tc` names) from the assembly."""
    n_wmma = sum(u.op is Ops.WMMA for u in spec.uops)
    assert n_wmma >= 1
    intrinsic = "@llvm.amdgcn." + ("wmma" if tc.threads == 32 else "mfma")
    assert spec.src.count(f"call <{tc.elements_per_thread[2]} x float> {intrinsic}") == n_wmma
    found = matrix_instructions(assembly(arch, spec.src))
    assert found and all(expected_mnemonic(tc).fullmatch(f) for f in found), found
    lib = compiler(arch).compile(spec.src)
    assert lib[:4] == b"\x7fELF" and int.from_bytes(lib[18:20], "little") == EM_AMDGPU
    # the code object runs in waves of the instruction's width (wave32 WMMA on RDNA 3, wave64 MFMA on CDNA)
    assert code_object_kernels(lib)[spec.name].wavefront_size == tc.threads
    return found


# *** every target's tensor cores compile to its matrix instructions ***

TARGET_CORES = [(arch, tc) for arch, cores in TENSOR_CORES.items() for tc in cores]


@pytest.mark.parametrize(("arch", "tc"), TARGET_CORES, ids=[f"{a}-{tc.opts[0]}" for a, tc in TARGET_CORES])
def test_every_target_compiles_its_tensor_cores_to_matrix_instructions(arch: str, tc: TensorCore) -> None:
    renderer = registered_renderer(arch)
    assert tc in renderer.tensor_cores
    spec = get_program(matmul_ast(32, 32, 32, tc.dtype_in), renderer, [tc_opt(arch, tc)])
    assert spec.local_size[0] == tc.threads  # one wave: 32 lanes on RDNA 3, 64 on CDNA
    check_compiles(arch, tc, spec)


# *** the same programs, emulated, against numpy ***

CASES = {
    # (m, n, k, opts beyond TC, pad): tiles only; every axis padded; more tiles per thread, unrolled K, two waves
    "tiles": (32, 32, 48, [], 0),
    "padded": (19, 24, 21, [], 1),
    "more_opts": (32, 64, 64, [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.LOCAL, 0, 2)], 0),
}
EMULATED = [(arch, tc) for arch in ("gfx1100", "gfx942") for tc in TENSOR_CORES[arch]]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("arch", "tc"), EMULATED, ids=[f"{a}-{tc.dtype_in.name}" for a, tc in EMULATED])
def test_tensor_core_programs_match_numpy_on_the_python_device(arch: str, tc: TensorCore, case: str) -> None:
    m, n, k, more, pad = CASES[case]
    spec = get_program(matmul_ast(m, n, k, tc.dtype_in), registered_renderer(arch), [tc_opt(arch, tc, pad), *more])
    check_compiles(arch, tc, spec)
    got, want = run_on_python_device(spec, m, n, k, tc.dtype_in)
    # the emulation sums exactly and rounds once; the inputs are exact in float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
def test_plain_half_matmul_picks_tensor_cores_by_default(arch: str) -> None:
    tc = TENSOR_CORES[arch][0]
    m, n, k = 64, 48, 80
    spec = get_program(matmul_ast(m, n, k, dtypes.float16), registered_renderer(arch))
    # tensor cores, possibly after padding N (48) to a whole tile
    assert OptOps.TC in [o.op for o in spec.opts], spec.opts
    check_compiles(arch, tc, spec)
    got, want = run_on_python_device(spec, m, n, k, dtypes.float16)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("arch", ["gfx1100", "gfx90a"])
def test_frontend_matmuls_choose_tensor_cores_by_dtype(arch: str) -> None:
    lazygrad = pytest.importorskip("lazygrad", reason="builds the matmul from Tensors: needs the lazygrad frontend")

    def program(dtype: Any) -> Any:
        a = lazygrad.Tensor.empty(64, 96, dtype=dtype, device="PYTHON")
        b = lazygrad.Tensor.empty(96, 32, dtype=dtype, device="PYTHON")
        (si,) = (a @ b).schedule()[-1:]
        return get_program(si.ast, registered_renderer(arch))

    half = program(lazygrad.dtypes.float16)
    assert half.opts[0].op is OptOps.TC
    check_compiles(arch, TENSOR_CORES[arch][0], half)
    single = program(lazygrad.dtypes.float32)
    assert all(o.op is not OptOps.TC for o in single.opts)
    assert not matrix_instructions(assembly(arch, single.src))


def test_targets_without_tensor_cores_get_none() -> None:
    renderer = AMDGPURenderer("gfx1030")  # RDNA 2: no matrix instructions
    assert renderer.tensor_cores == ()
    with pytest.raises(KernelOptError, match="no tensor cores"):
        Kernel(matmul_ast(32, 32, 32, dtypes.float16), renderer).apply_opt(Opt(OptOps.TC, 0, (0, 0)))
    spec = get_program(matmul_ast(32, 32, 32, dtypes.float16), renderer)
    assert all(o.op is not OptOps.TC for o in spec.opts)


def test_a_tensor_core_of_another_target_is_refused_when_rendering() -> None:
    renderer = AMDGPURenderer("gfx1100")
    # CDNA's MFMA layout on an RDNA 3 target: codegen can lower it, the renderer must not pass it to WMMA
    renderer.tensor_cores = TENSOR_CORES["gfx942"]
    with pytest.raises(NotImplementedError, match="gfx1100 has no matrix instruction for the tensor core"):
        get_program(matmul_ast(32, 32, 32, dtypes.float16), renderer, [Opt(OptOps.TC, 0, (0, 0))])
