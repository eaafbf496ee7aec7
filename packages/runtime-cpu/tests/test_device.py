"""The CPU device's parts: the plugin and its place among devices, the allocator (alignment, zero-copy views,
sub-buffers, reuse), the compiler (errors, caching key, vectorised output), the program runner, and DEBUG output."""

from __future__ import annotations

import gc
import re

import numpy as np
import pytest

import lazygrad_cpu
from lazygrad_codegen import get_program
from lazygrad_cpu import plugin
from lazygrad_cpu.allocator import ALIGNMENT, CPUAllocator
from lazygrad_cpu.compiler import LLVMCompiler
from lazygrad_cpu.program import CPUProgram
from lazygrad_uop.config import Context
from lazygrad_uop.device import CompiledDevice, CompileError, TensorCore
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.plugins import DeviceSpec, TensorCoreSpec, hookimpl
from lazygrad_uop.registry import DeviceRegistry, LazygradPluginWarning

# *** plugin ***


class _FakeDevices:
    """A GPU-like device (priority 100) that opens only when usable (the registry opens the default it chooses, to
    pass over one that fails to open) and a reference device (priority 0) that never opens."""

    def __init__(self, gpu_usable: bool) -> None:
        self.gpu_usable = gpu_usable

    @hookimpl
    def lazygrad_devices(self) -> list[DeviceSpec]:
        def never(name: str) -> CompiledDevice:
            raise AssertionError(f"{name} should not be opened")

        def gpu(name: str) -> CompiledDevice:
            assert self.gpu_usable, f"{name} is not usable and should not be opened"
            return plugin.open_cpu("CPU")  # a working device stands in for the GPU

        gpu_reason = None if self.gpu_usable else "no GPU here"
        return [
            DeviceSpec("FAKEGPU", open=gpu, usable=lambda: gpu_reason, priority=100, package="fake"),
            DeviceSpec("PYTHON", open=never, usable=lambda: None, priority=0, package="fake"),
        ]


def _registry(*plugins: object) -> DeviceRegistry:
    reg = DeviceRegistry(group="lazygrad-tests-no-entry-points")
    for p in plugins:
        reg.register_plugin(p)
    return reg


def test_cpu_is_the_default_without_a_gpu_and_outranks_python() -> None:
    reg = _registry(plugin, _FakeDevices(gpu_usable=False))
    assert reg.DEFAULT == "CPU"
    dev = reg["CPU"]
    assert isinstance(dev, CompiledDevice)
    assert type(dev.renderer).__name__ == "CPURenderer"
    assert [r.name for r in reg.renderers("CPU")] == ["LLVM"]
    assert reg.renderers("CPU")[0].default


def test_a_usable_gpu_outranks_cpu() -> None:
    assert _registry(plugin, _FakeDevices(gpu_usable=True)).DEFAULT == "FAKEGPU"


def test_cpu_usable_and_named_renderer() -> None:
    reg = _registry(plugin)
    assert reg.usable("CPU") is None
    assert reg["CPU:LLVM"] is reg["CPU"]


def test_cpu_n_are_distinct_devices_with_their_own_buffers() -> None:
    reg = _registry(plugin)
    cpu0, cpu1, cpu2 = reg["CPU"], reg["CPU:1"], reg["cpu:2"]
    assert len({id(cpu0), id(cpu1), id(cpu2)}) == 3 and reg["CPU:0"] is cpu0
    assert [d.device for d in (cpu0, cpu1, cpu2)] == ["CPU", "CPU:1", "CPU:2"]
    assert cpu1.allocator is not cpu0.allocator
    # a block freed on one device is kept for reuse by that device only
    a = cpu1.allocator.alloc(64)
    cpu1.allocator.free(a, 64)
    assert cpu0.allocator.alloc(64) is not a and cpu1.allocator.alloc(64) is a


def test_cpu_transfer_copies_between_devices_without_the_host() -> None:
    reg = _registry(plugin)
    src_dev, dest_dev = reg["CPU:1"], reg["CPU:2"]
    data = np.arange(1000, dtype=np.float32)
    src = src_dev.allocator.alloc(data.nbytes)
    dest = dest_dev.allocator.alloc(data.nbytes)
    src_dev.allocator.copyin(src, memoryview(data).cast("B"))
    dest_dev.allocator._transfer(dest, src, data.nbytes, src_dev, dest_dev)
    out = np.empty_like(data)
    dest_dev.allocator.copyout(memoryview(out).cast("B"), dest)
    np.testing.assert_array_equal(out, data)
    with pytest.raises(ValueError, match="transfer of"):
        dest_dev.allocator._transfer(dest, src, data.nbytes + 1, src_dev, dest_dev)


def test_package_exports_are_lazy() -> None:
    assert lazygrad_cpu.CPUAllocator is CPUAllocator
    with pytest.raises(AttributeError, match="no attribute"):
        lazygrad_cpu.Nothing  # noqa: B018


# *** allocator ***


def test_alignment_and_as_buffer_is_the_memory_itself(cpu, run, k) -> None:
    alloc: CPUAllocator = cpu.allocator
    handle = alloc.alloc(40)
    assert handle.addr % ALIGNMENT == 0
    view = np.frombuffer(alloc._as_buffer(handle), dtype=np.float32)
    assert view.shape == (10,)
    # a kernel's write shows up in the numpy view without any copy
    st = k.st(10)
    spec = get_program(k.sink(k.store(0, k.const(3.5, dtypes.float32, st), st)), cpu.renderer)
    CPUProgram(cpu, spec.name, cpu.compiler.compile(spec.src))(handle, global_size=spec.global_size)
    np.testing.assert_array_equal(view, 3.5)
    # and a write through the view is what the device reads
    view[:] = np.arange(10)
    out = bytearray(40)
    alloc.copyout(memoryview(out), handle)
    np.testing.assert_array_equal(np.frombuffer(out, np.float32), np.arange(10))


def test_copyin_from_read_only_memory_and_sub_buffers(cpu) -> None:
    alloc: CPUAllocator = cpu.allocator
    handle = alloc.alloc(16)
    alloc.copyin(handle, memoryview(bytes(range(16))))
    sub = alloc._offset(handle, 4, 8)
    assert bytes(alloc._as_buffer(sub)) == bytes(range(8, 12))
    alloc.copyin(sub, memoryview(b"\xff" * 4))
    out = bytearray(16)
    alloc.copyout(memoryview(out), handle)
    assert out == bytes(range(8)) + b"\xff" * 4 + bytes(range(12, 16))
    with pytest.raises(ValueError, match="doesn't fit"):
        alloc._offset(handle, 8, 12)
    with pytest.raises(ValueError, match="copyin of 20 bytes"):
        alloc.copyin(handle, memoryview(bytes(20)))


def test_freed_memory_is_reused_and_outlives_its_views() -> None:
    alloc = CPUAllocator()
    handle = alloc.alloc(4096)
    view = alloc._as_buffer(handle)
    view[:4] = b"abcd"
    alloc.free(handle, 4096)
    assert alloc.alloc(4096) is handle
    alloc.free(handle, 4096)
    alloc.free_cache()
    del handle
    gc.collect()
    assert bytes(view[:4]) == b"abcd"  # the view keeps the memory mapped


def test_new_memory_is_zeroed() -> None:
    alloc = CPUAllocator()
    assert not any(alloc._as_buffer(alloc.alloc(1000)))


# *** compiler and program ***

_COUNTED_LOOP = """define void @k(ptr %out, ptr %a, i32 %n) {
entry:
  br label %header
header:
  %i = phi i32 [0, %entry], [%next, %latch]
  %acc = phi float [0.0, %entry], [%sum, %latch]
  %go = icmp slt i32 %i, %n
  br i1 %go, label %latch, label %exit
latch:
  %j = mul nsw i32 %i, 3
  %p = getelementptr inbounds float, ptr %a, i32 %j
  %x = load float, ptr %p
  %sum = fadd float %acc, %x
  %next = add nuw nsw i32 %i, 1
  br label %header
exit:
  store float %acc, ptr %out
  ret void
}
"""


_ZERO_ROWS = """define void @zeros(ptr %out, i32 %start, i32 %end) {
entry:
  br label %header
header:
  %row = phi i32 [%start, %entry], [%next, %latch]
  %go = icmp slt i32 %row, %end
  br i1 %go, label %body, label %exit
body:
  %i = mul nsw i32 %row, 2
  %p = getelementptr inbounds float, ptr %out, i32 %i
  store <2 x float> zeroinitializer, ptr %p, align 4
  br label %latch
latch:
  %next = add nuw nsw i32 %row, 1
  br label %header
exit:
  ret void
}
"""


def test_printing_the_assembly_leaves_the_object_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    # DEBUG=7 prints each kernel's assembly; the code generator rewrites the module it runs on, so printing from
    # the module itself changed the object code emitted after it (this loop's, and most of ResNet-18's kernels')
    compiler = LLVMCompiler()
    plain = compiler.compile(_ZERO_ROWS)
    with Context(DEBUG=7):
        printed = compiler.compile(_ZERO_ROWS)
    assert "zeros:" in capsys.readouterr().out
    assert printed == plain


def test_loop_counters_stay_32_bit() -> None:
    # IndVarSimplify does not widen a 32-bit counter whose index is sign-extended into a 64-bit one (LLVM's default
    # does: `phi i64`), which spares LLVM rewriting every index computed from it
    phis = [line for line in str(LLVMCompiler().optimized_module(_COUNTED_LOOP)).splitlines() if " phi " in line]
    assert any("phi i32" in line for line in phis) and not any("phi i64" in line for line in phis), phis


def test_invalid_ir_raises_compile_error() -> None:
    with pytest.raises(CompileError, match="LLVM rejected"):
        LLVMCompiler().compile("define void @f() { ret i32 0 }")


def test_cache_key_names_the_host_cpu() -> None:
    import llvmlite.binding as llvm

    assert llvm.get_host_cpu_name() in LLVMCompiler().cachekey


_SCALAR_LOOP = """
define void @f(ptr noalias %out, ptr noalias %a, i32 %n) {
entry:
  br label %loop
loop:
  %i = phi i32 [0, %entry], [%next, %loop]
  %p = getelementptr inbounds float, ptr %a, i32 %i
  %x = load float, ptr %p
  %y = fmul float %x, 2.0
  %q = getelementptr inbounds float, ptr %out, i32 %i
  store float %y, ptr %q
  %next = add nsw i32 %i, 1
  %go = icmp slt i32 %next, %n
  br i1 %go, label %loop, label %done
done:
  ret void
}
"""

_STRAIGHT_LINE = (
    "define void @g(ptr noalias %out, ptr noalias %a) {\n"
    + "".join(
        f"  %p{i} = getelementptr inbounds float, ptr %a, i32 {i}\n  %x{i} = load float, ptr %p{i}\n"
        f"  %y{i} = fmul float %x{i}, 2.0\n  %q{i} = getelementptr inbounds float, ptr %out, i32 {i}\n"
        f"  store float %y{i}, ptr %q{i}\n"
        for i in range(8)
    )
    + "  ret void\n}\n"
)


def test_llvm_leaves_loops_to_codegen_but_merges_straight_line_code() -> None:
    # codegen's kernels come unrolled and vectorised: the CPU compiler skips LLVM's loop vectoriser and unroller (a
    # plain scalar loop stays scalar, where LLVM's default pipeline vectorises it) and keeps the SLP vectoriser
    # (eight scalar multiplies of neighbouring elements become vector code)
    class DefaultPipeline(LLVMCompiler):
        loop_transforms = True

    vector = re.compile(r"<\d+ x float>")
    assert not vector.search(str(LLVMCompiler().optimized_module(_SCALAR_LOOP)))
    assert vector.search(str(DefaultPipeline().optimized_module(_SCALAR_LOOP))), "the loop should be vectorisable"
    assert vector.search(str(LLVMCompiler().optimized_module(_STRAIGHT_LINE)))


def _sum_kernel(k, n: int):
    st = k.st(n)
    x = k.load(1, dtypes.float32, st)
    value = x * k.const(2.0, dtypes.float32, st) + k.const(1.0, dtypes.float32, st)
    return k.sink(k.store(0, k.reduce(value, Ops.ADD, (0,)), k.st(1)))


def test_sum_reduction_is_vectorised(cpu, k) -> None:
    spec = get_program(_sum_kernel(k, 4096), cpu.renderer)
    assert "fadd reassoc" in spec.src
    optimized = str(cpu.compiler.optimized_module(spec.src))
    assert re.search(r"<\d+ x float>", optimized), "LLVM did not vectorise the reduction"


def test_fused_sum_matches_numpy(run, k) -> None:
    x = np.random.default_rng(0).standard_normal(100_003).astype(np.float32)
    out = run(_sum_kernel(k, x.size), {1: x})[0]
    np.testing.assert_allclose(out[0], (x.astype(np.float64) * 2 + 1).sum(), rtol=1e-4)


def test_program_runs_and_times(cpu, k) -> None:
    spec = get_program(_sum_kernel(k, 64), cpu.renderer)
    prg = CPUProgram(cpu, spec.name, cpu.compiler.compile(spec.src))
    out, inp = cpu.allocator.alloc(4), cpu.allocator.alloc(256)
    cpu.allocator.copyin(inp, memoryview(np.ones(64, np.float32)).cast("B"))
    elapsed = prg(out, inp, wait=True)
    assert isinstance(elapsed, float) and elapsed >= 0
    assert prg(out, inp) is None
    assert np.frombuffer(cpu.allocator._as_buffer(out), np.float32)[0] == 64 * 3
    with pytest.raises(ValueError, match="global_size"):
        prg(out, inp, global_size=(1, 2, 1))


def test_kernels_use_the_hosts_widest_vectors(cpu, k) -> None:
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features()
    bits = 512 if features.get("avx512f") else 256 if features.get("avx") else 128
    assert cpu.renderer.vector_width == bits // 32
    if not llvm.get_process_triple().startswith("x86_64"):
        pytest.skip("register names checked on x86-64 only")
    st = k.st(4096)
    ast = k.sink(k.store(0, k.load(1, dtypes.float32, st) * k.const(3.0, dtypes.float32, st), st))
    asm = cpu.compiler.target_machine.emit_assembly(cpu.compiler.optimized_module(get_program(ast, cpu.renderer).src))
    register = {512: "zmm", 256: "ymm", 128: "xmm"}[bits]
    assert re.search(rf"\bv?mul[a-z]*\s+.*%{register}", asm), f"no {bits}-bit multiply in the kernel"


def test_program_with_missing_function_name(cpu, k) -> None:
    spec = get_program(_sum_kernel(k, 8), cpu.renderer)
    with pytest.raises(RuntimeError, match="no function"):
        CPUProgram(cpu, "not_" + spec.name, cpu.compiler.compile(spec.src))


def test_debug_prints_source_and_uops(cpu, k, capsys) -> None:
    ast = _sum_kernel(k, 4096)  # long enough to stay a loop whatever codegen unrolls
    with Context(DEBUG=4):
        spec = get_program(ast, cpu.renderer)
    printed = capsys.readouterr().out
    assert spec.src.strip() in printed
    assert "define void @" in printed and "UOp(" not in printed
    with Context(DEBUG=6):
        get_program(ast, cpu.renderer)
    printed = capsys.readouterr().out
    assert "UOp(Ops.SINK" in printed and "RANGE" in printed and "DEFINE_ACC" in printed
    with Context(DEBUG=7):
        cpu.compiler.compile(spec.src)
    assert spec.name in capsys.readouterr().out


class _CPUTensorCores:
    @hookimpl
    def lazygrad_tensor_cores(self) -> list[TensorCoreSpec]:
        tc = TensorCore((2, 2, 2), 1, (4, 4, 4), dtypes.float32, dtypes.float32)
        return [TensorCoreSpec("CPU", "x86_64", (tc,))]


def test_tensor_cores_registered_for_the_cpu_are_rejected_with_a_warning() -> None:
    # the LLVM renderer has no WMMA lowering: a description for it would make matching matmuls fail to render
    reg = _registry(plugin)
    reg.register_plugin(_CPUTensorCores(), name="cpu-tc")
    with pytest.warns(LazygradPluginWarning, match="'cpu-tc': tensor core .* CPURenderer renders no tensor cores"):
        assert reg.tensor_cores("CPU") == ()
    assert reg["CPU"].renderer.tensor_cores == ()
