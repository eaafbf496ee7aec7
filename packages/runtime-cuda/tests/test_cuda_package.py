"""The plugin: the CUDA device is registered with its renderer and the tensor cores of `lazygrad_cuda.tensor_cores`,
says truthfully whether it is usable and why not, and is never the default where it is not usable."""

import importlib
import re
import sys
import types

import pytest
from cuda_helpers import has_nvrtc

from lazygrad_codegen import Opt, OptOps, get_program, kernel_ast
from lazygrad_cuda import plugin
from lazygrad_cuda.renderer import MMA_M16N8K8_LAYOUT, CUDARenderer
from lazygrad_cuda.tensor_cores import TENSOR_CORES
from lazygrad_uop.device import CompiledDevice, TensorCore
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.plugins import DeviceSpec, TensorCoreSpec, hookimpl
from lazygrad_uop.registry import DeviceRegistry, DeviceUnavailableError, LazygradPluginWarning


def _registry(*plugins: object) -> DeviceRegistry:
    registry = DeviceRegistry(group="lazygrad_tests_no_entry_points")
    for p in plugins:
        registry.register_plugin(p)
    return registry


def _stub_device(name: str) -> CompiledDevice:
    return CompiledDevice(name, None, None, None, None)  # type: ignore[arg-type]


class _FakeCPU:
    """A usable device of the CPU's priority, to see which one the registry picks as default."""

    @staticmethod
    @hookimpl
    def lazygrad_devices() -> list[DeviceSpec]:
        # the registry opens the default it chooses: an opened device with no parts is enough to be chosen
        return [DeviceSpec("CPU", open=_stub_device, usable=lambda: None, priority=50, package="test")]


def test_imports() -> None:
    module = importlib.import_module("lazygrad_cuda")
    assert module.__doc__ and module.CUDARenderer is CUDARenderer


def test_usable_gives_none_or_a_reason() -> None:
    reason = plugin.cuda_usable()
    assert reason is None or (isinstance(reason, str) and reason)


def test_registered_with_its_renderer_and_ranked_above_the_cpu() -> None:
    registry = _registry(plugin, _FakeCPU)
    assert registry.installed() == ["CPU", "CUDA"]
    assert registry.spec("cuda").package == "lazygrad-runtime-cuda" and registry.spec("CUDA").priority > 50
    (renderer,) = registry.renderers("CUDA")
    assert renderer.default and isinstance(renderer.make(), CUDARenderer)
    if (reason := registry.usable("CUDA")) is None:
        assert registry.DEFAULT == "CUDA"
    else:
        assert registry.DEFAULT == "CPU"
        with pytest.raises(DeviceUnavailableError, match=re.escape(reason)):
            registry["CUDA:1"]


def test_without_a_driver_the_reason_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.bindings import driver

    def no_driver(flags: int) -> tuple:
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(driver, "cuInit", no_driver)
    assert plugin.cuda_usable() == (
        "no NVIDIA driver: the CUDA driver library could not be loaded (OSError: libcuda.so.1: cannot open shared "
        "object file)"
    )
    monkeypatch.setattr(driver, "cuInit", lambda flags: (driver.CUresult.CUDA_SUCCESS,))
    monkeypatch.setattr(driver, "cuDeviceGetCount", lambda: (driver.CUresult.CUDA_SUCCESS, 0))
    assert plugin.cuda_usable() == "no device: the NVIDIA driver reports no GPU"


TC = TensorCore(
    dims=(8, 16, 16),
    threads=32,
    elements_per_thread=(8, 4, 4),
    dtype_in=dtypes.float16,
    dtype_out=dtypes.float32,
    opts=(),
    swizzle=(),
)


def test_tensor_cores_come_from_the_tensor_cores_module(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("lazygrad_cuda.tensor_cores")
    fake.TENSOR_CORES = {"sm_80": (TC,), "sm_90": (TC,)}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lazygrad_cuda.tensor_cores", fake)
    specs = plugin.lazygrad_tensor_cores()
    assert sorted(s.target for s in specs) == ["sm_80", "sm_90"] and all(s.device == "CUDA" for s in specs)
    registry = _registry(plugin)
    assert registry.tensor_cores("CUDA", "sm_80") == (TC,)
    # an sm_86 GPU uses sm_80's tensor cores, an sm_75 one none
    assert registry.tensor_cores_for("CUDA", CUDARenderer("sm_86")) == (TC,)
    assert registry.tensor_cores_for("CUDA", CUDARenderer("sm_75")) == ()


def test_no_tensor_cores_module_registers_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lazygrad_cuda.tensor_cores", None)  # as if the module did not exist
    assert plugin.lazygrad_tensor_cores() == []


class _TensorCores:
    """A plugin that only registers tensor-core descriptions for CUDA."""

    def __init__(self, target: str, *tcs: TensorCore) -> None:
        self.target, self.tcs = target, tcs

    @hookimpl
    def lazygrad_tensor_cores(self) -> list[TensorCoreSpec]:
        return [TensorCoreSpec("CUDA", self.target, self.tcs)]


# mma.sync.m16n8k8 with bf16 inputs, which the built-in descriptions leave out
BF16_K8 = TensorCore((8, 16, 8), 32, (4, 2, 4), dtypes.bfloat16, dtypes.float32, swizzle=MMA_M16N8K8_LAYOUT)


def test_sm86_additions_keep_the_sm80_builtins() -> None:
    registry = _registry(plugin, _TensorCores("sm_86", BF16_K8))
    handed = registry.tensor_cores_for("CUDA", CUDARenderer("sm_86"))
    assert handed == (BF16_K8, *TENSOR_CORES["sm_80"])
    # an sm_80 GPU doesn't get sm_86's addition
    assert registry.tensor_cores_for("CUDA", CUDARenderer("sm_80")) == TENSOR_CORES["sm_80"]


def test_a_description_the_renderer_cannot_emit_is_rejected_at_registration() -> None:
    f32 = TensorCore((8, 8, 8), 32, (2, 2, 2), dtypes.float32, dtypes.float32)
    registry = _registry(plugin)
    registry.register_plugin(_TensorCores("sm_90", f32), name="fp32-tensor-cores")
    with pytest.warns(LazygradPluginWarning, match=r"'fp32-tensor-cores': tensor core WMMA_8_8_8_float_float .*mma"):
        assert registry.tensor_cores("CUDA", "sm_90") == TENSOR_CORES["sm_90"]
    renderer = CUDARenderer("sm_90")
    renderer.add_tensor_cores(registry.tensor_cores_for("CUDA", renderer))
    # a float32 matmul, which the rejected description would have matched, renders (before: NotImplementedError)
    src = get_program(kernel_ast.matmul(32, 32, 32, dtypes.float32), renderer).src
    assert "mma.sync" not in src


@pytest.mark.skipif(not has_nvrtc(), reason="needs NVRTC to compile the kernel")
def test_an_added_tensor_core_compiles_for_the_gpu_it_was_added_for() -> None:
    from lazygrad_cuda.compiler import nvrtc_compile

    registry = _registry(plugin, _TensorCores("sm_86", BF16_K8))
    renderer = CUDARenderer("sm_86")
    renderer.add_tensor_cores(registry.tensor_cores_for("CUDA", renderer))
    opt = Opt(OptOps.TC, 0, (renderer.tensor_cores.index(BF16_K8), 0))
    spec = get_program(kernel_ast.matmul(32, 32, 32, dtypes.bfloat16), renderer, [opt])
    assert "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32" in spec.src
    nvrtc_compile(spec.src, "sm_86", spec.name)


def test_ptxas_usage_compiles_again_when_the_log_lacks_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """An NVRTC that now and then returns an empty log (seen on an H100 machine) costs a compile, not a failure;
    one that never reports is an NVRTCError naming the program. No NVRTC needed: its output is faked."""
    from lazygrad_cuda import compiler

    report = (
        "ptxas info    : Function properties for k\n"
        "ptxas         .     0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 93 registers, used 1 barriers\n"
    )
    logs = iter(["", report])
    calls: list[tuple[str, str]] = []

    def fake(src: str, arch: str, name: str = "kernel", options=()) -> compiler.NVRTCOutput:
        assert "--ptxas-options=-v" in options
        calls.append((arch, name))
        return compiler.NVRTCOutput(b"", b"", next(logs))

    monkeypatch.setattr(compiler, "nvrtc_compile", fake)
    use = compiler.ptxas_usage("src", "sm_80", "k")
    assert (use.registers, use.spill_stores, use.spill_loads, use.spills) == (93, 8, 12, 20)
    assert calls == [("sm_80", "k")] * 2
    monkeypatch.setattr(compiler, "nvrtc_compile", lambda *a, **k: compiler.NVRTCOutput(b"", b"", "no report"))
    with pytest.raises(compiler.NVRTCError, match="no ptxas register report for k on sm_90"):
        compiler.ptxas_usage("src", "sm_90", "k")
