"""The package imports on its own, and its plugin registers CL, AMD and HIP devices that say truthfully whether they
are usable, rank below the CPU where OpenCL is only PoCL, and publish the AMD tensor cores."""

import importlib
import re
import sys
import types

import pytest

from lazygrad_amd import plugin
from lazygrad_uop.plugins import TensorCoreSpec
from lazygrad_uop.registry import DeviceRegistry, DeviceUnavailableError


def registry() -> DeviceRegistry:
    reg = DeviceRegistry(group="lazygrad_tests_no_entry_points")
    reg.register_plugin(plugin)
    return reg


def test_imports() -> None:
    assert importlib.import_module("lazygrad_amd").__doc__


@pytest.mark.parametrize("check", [plugin.cl_usable, plugin.amd_usable, plugin.hip_usable])
def test_usable_gives_none_or_a_reason(check) -> None:
    reason = check()
    assert reason is None or (isinstance(reason, str) and reason)


def test_registry_finds_the_devices_and_their_renderers() -> None:
    reg = registry()
    assert reg.installed() == ["AMD", "CL", "HIP"]
    assert {reg.spec(n).package for n in reg.installed()} == {"lazygrad-runtime-amd"}
    assert [r.name for r in reg.renderers("CL")] == ["CL"]
    assert [r.name for r in reg.renderers("HIP")] == ["AMDGPU"]
    # PoCL makes CL usable on machines without a GPU: the CPU device (priority 50) must stay the default there
    assert reg.spec("CL").priority < 50 < reg.spec("HIP").priority < reg.spec("AMD").priority


@pytest.mark.parametrize("name", ["AMD", "HIP"])
def test_unusable_devices_say_why(name: str) -> None:
    reg = registry()
    if (reason := reg.usable(name)) is None:
        pytest.skip(f"{name} is usable here")
    with pytest.raises(DeviceUnavailableError, match=re.escape(reason)):
        reg[name]


def test_cl_opens_where_usable_and_names_missing_indices() -> None:
    reg = registry()
    if (reason := reg.usable("CL")) is not None:
        pytest.skip(f"no OpenCL device: {reason}")
    dev = reg["CL"]
    assert dev.device == "CL" and type(dev.renderer).__name__ == "OpenCLRenderer"
    with pytest.raises(ValueError, match=r"CL:99 does not exist: this machine has \d+ such devices"):
        plugin.open_cl("CL:99")


def test_tensor_cores_come_from_the_tensor_cores_module(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("lazygrad_amd.tensor_cores")
    fake.TENSOR_CORES = {"gfx1100": ("wmma",), "gfx942": ("mfma_a", "mfma_b")}  # plain markers: only passed through
    monkeypatch.setitem(sys.modules, "lazygrad_amd.tensor_cores", fake)
    specs = plugin.lazygrad_tensor_cores()
    assert {(s.device, s.target, s.tensor_cores) for s in specs} == {
        ("HIP", target, tcs) for target, tcs in fake.TENSOR_CORES.items()
    }
    assert all(isinstance(s, TensorCoreSpec) for s in specs)


def test_no_tensor_cores_module_means_no_tensor_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail as if the module did not exist
    monkeypatch.setitem(sys.modules, "lazygrad_amd.tensor_cores", None)
    monkeypatch.setattr(
        importlib,
        "import_module",
        lambda name: (_ for _ in ()).throw(ModuleNotFoundError(f"No module named {name!r}", name=name)),
    )
    assert plugin.lazygrad_tensor_cores() == []


def test_registered_tensor_cores_reach_the_registry() -> None:
    tc_module = pytest.importorskip("lazygrad_amd.tensor_cores")
    reg = registry()
    for target, tcs in tc_module.TENSOR_CORES.items():
        assert reg.tensor_cores("HIP", target) == tuple(tcs)
        # AMD renders OpenCL C, which has no matrix instructions
        assert reg.tensor_cores("AMD", target) == ()
