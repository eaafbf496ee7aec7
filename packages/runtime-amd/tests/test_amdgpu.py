"""The AMDGPU path without a GPU: every kind of kernel the op suite produces renders as amdgcn LLVM IR and compiles
for gfx1100 (RDNA 3) and gfx942 (CDNA 3) — linked into a loadable code object where ld.lld is installed, else as the
relocatable object — and the double-precision math that replaces LLVM's unsupported intrinsics matches numpy."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from lazygrad_amd import amdgpu_math
from lazygrad_amd.amdgpu_compiler import EM_AMDGPU, AMDGPUCompiler, amdgpu_target_reason, find_ld_lld
from lazygrad_amd.amdgpu_renderer import AMDGPURenderer
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device

if (REASON := amdgpu_target_reason()) is not None:
    pytest.skip(REASON, allow_module_level=True)

ET_REL, ET_DYN = 1, 3


def elf_header(lib: bytes) -> tuple[int, int]:
    """(e_type, e_machine) of a little-endian ELF file."""
    assert lib[:4] == b"\x7fELF", "not an ELF file"
    return int.from_bytes(lib[16:18], "little"), int.from_bytes(lib[18:20], "little")


# *** double-precision math, run on the host ***


@pytest.fixture(scope="module")
def host_math() -> dict[str, ctypes._CFuncPtr]:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    src = "\n".join([*amdgpu_math.DEFINITIONS.values(), *amdgpu_math.DECLARATIONS]).replace("internal ", "")
    mod = llvm.parse_assembly(src)
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, llvm.Target.from_default_triple().create_target_machine(opt=2))
    engine.finalize_object()
    fns = {
        n: ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double)(engine.get_function_address(n))
        for n in (amdgpu_math.DEFINITIONS)
    }
    fns["engine"] = engine  # keeps the code alive
    return fns


def ulps(got: np.ndarray, want: np.ndarray) -> float:
    """The largest distance between `got` and `want` in units of `want`'s last place (NaN and infinities must match
    exactly)."""
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(invalid="ignore"):
        return float(np.max(np.where(same, 0, np.abs(got - want) / np.spacing(np.abs(want)))))


def apply(fn, xs: np.ndarray) -> np.ndarray:
    return np.array([fn(float(x)) for x in xs])


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 5e-324, 2.2250738585072014e-308])


def test_exp2_f64(host_math) -> None:
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.uniform(-1080, 1030, 4000), rng.uniform(-2, 2, 4000), SPECIAL, [1023.99, -1074.0]])
    with np.errstate(over="ignore"):
        want = np.exp2(xs)
    got = apply(host_math[amdgpu_math.EXP2], xs)
    assert ulps(got, want) <= 2


def test_log2_f64(host_math) -> None:
    rng = np.random.default_rng(1)
    xs = np.concatenate([np.exp(rng.uniform(-740, 709, 4000)), rng.uniform(0, 4, 4000), SPECIAL, [1e-310]])
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.log2(xs)
    assert ulps(apply(host_math[amdgpu_math.LOG2], xs), want) <= 4


def test_sin_f64(host_math) -> None:
    rng = np.random.default_rng(2)
    xs = np.concatenate([rng.uniform(-4, 4, 4000), rng.uniform(-1e5, 1e5, 4000), SPECIAL])
    with np.errstate(invalid="ignore"):
        want = np.sin(xs)
    got = apply(host_math[amdgpu_math.SIN], xs)
    assert ulps(got, want) <= 2
    zeros = apply(host_math[amdgpu_math.SIN], np.array([0.0, -0.0]))
    assert not np.signbit(zeros[0]) and np.signbit(zeros[1])
    far = rng.uniform(-1e12, 1e12, 1000)
    np.testing.assert_allclose(apply(host_math[amdgpu_math.SIN], far), np.sin(far), rtol=0, atol=1e-15)


# *** the op suite's kernels ***

lazygrad = pytest.importorskip("lazygrad", reason="builds kernels from Tensor graphs: needs the lazygrad frontend")

from lazygrad_codegen import get_program  # noqa: E402
from lazygrad_testkit.kernel_graphs import kernel_graphs  # noqa: E402


def op_suite_asts() -> dict:
    asts: dict = {}
    for name, build in kernel_graphs():
        for si in build().schedule():
            if si.ast.op is Ops.SINK:
                asts.setdefault(si.ast, name)
    return asts


@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
def test_every_op_suite_kernel_compiles(arch: str) -> None:
    renderer = AMDGPURenderer(arch)
    renderer.add_tensor_cores(Device.tensor_cores_for("HIP", renderer))  # as the HIP device gets them
    link = find_ld_lld() is not None
    compiler = AMDGPUCompiler(arch, link=link)
    sources = {}
    for ast, name in op_suite_asts().items():
        sources.setdefault(get_program(ast, renderer).src, name)
    assert len(sources) > 150, f"expected the op suite's variety of kernels, got {len(sources)}"
    for src, name in sources.items():
        lib = compiler.compile(src)
        assert elf_header(lib) == (ET_DYN if link else ET_REL, EM_AMDGPU), name


def test_renderer_writes_amdgpu_kernels() -> None:
    t = lazygrad.Tensor.empty(4, 8, dtype=lazygrad.dtypes.float64, device="PYTHON")
    (si,) = t.sin().exp2().schedule()
    src = get_program(si.ast, AMDGPURenderer("gfx90a")).src
    assert "define amdgpu_kernel void @" in src and "ptr addrspace(1) %data0.global" in src
    # the f64 intrinsics LLVM can't select for AMDGPU are replaced by the package's own functions
    assert "@llvm.sin.f64" not in src and "@llvm.exp2.f64" not in src
    assert f"@{amdgpu_math.SIN}" in src and f"@{amdgpu_math.EXP2}" in src
    assert elf_header(AMDGPUCompiler("gfx90a", link=False).compile(src)) == (ET_REL, EM_AMDGPU)


def test_grouped_reductions_use_local_memory_and_barriers() -> None:
    # the kernel AST itself: the frontend would split a long sum into parts for the PYTHON device it schedules for
    from lazygrad_codegen.kernel_ast import load, reduce, sink, st, store
    from lazygrad_uop.dtype import dtypes

    ast = sink(store(0, reduce(load(1, dtypes.float32, st(64 * 64)), Ops.ADD, (0,)), st(1)))
    spec = get_program(ast, AMDGPURenderer("gfx942"))
    assert "addrspace(3) global" in spec.src and "@llvm.amdgcn.s.barrier()" in spec.src
    compiler = AMDGPUCompiler("gfx942", link=False)
    asm = compiler.target_machine.emit_assembly(compiler.optimized_module(spec.src))
    # address-space inference turned the flat accesses into local (ds_) and global ones
    assert "ds_write" in asm and "s_barrier" in asm and "global_store" in asm


def test_without_ld_lld_linking_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lazygrad_amd.amdgpu_compiler.find_ld_lld", lambda: None)
    with pytest.raises(RuntimeError, match=r"ld\.lld is needed to link AMDGPU code objects"):
        AMDGPUCompiler("gfx1100")


def test_int64_indices_and_guarded_division_compile() -> None:
    """A loop and offsets past 2^31 (64-bit indices) and an integer division by a loaded divisor (guarded so that it
    can't trap) compile for AMDGPU."""
    from lazygrad_codegen.kernel_ast import load, reduce, sink, st, store
    from lazygrad_uop.dtype import dtypes

    n = 2**31 + 6
    x, y = load(1, dtypes.int32, st(n)), load(2, dtypes.int32, st(n))
    ast = sink(store(0, reduce(x // y + x % y, Ops.ADD, (0,)), st(1)))
    spec = get_program(ast, AMDGPURenderer("gfx1100"))
    assert "i64" in spec.src and any(u.op is Ops.WHERE for u in spec.uops)
    link = find_ld_lld() is not None
    assert elf_header(AMDGPUCompiler("gfx1100", link=link).compile(spec.src))[1] == EM_AMDGPU
