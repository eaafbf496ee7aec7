"""The plugin: the CUDA device is registered with its renderer and the tensor cores of `lazygrad_cuda.tensor_cores`,
says truthfully whether it is usable and why not, and is never the default where it is not usable."""

import importlib
import re
import sys
import types

import pytest

from lazygrad_cuda import plugin
from lazygrad_cuda.device import registered_tensor_cores
from lazygrad_cuda.renderer import CUDARenderer
from lazygrad_uop.device import CompiledDevice, TensorCore
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.plugins import DeviceSpec, hookimpl
from lazygrad_uop.registry import DeviceRegistry, DeviceUnavailableError


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
    monkeypatch.setattr("lazygrad_uop.registry.Device", registry)
    # an sm_86 GPU uses sm_80's tensor cores, an sm_75 one none
    assert registered_tensor_cores("sm_86") == (TC,) and registered_tensor_cores("sm_75") == ()


def test_no_tensor_cores_module_registers_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lazygrad_cuda.tensor_cores", None)  # as if the module did not exist
    assert plugin.lazygrad_tensor_cores() == []
