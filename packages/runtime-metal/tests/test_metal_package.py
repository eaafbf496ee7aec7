"""The plugin: the METAL device, its renderer and tensor cores as the registry sees them, and what happens where
Metal doesn't exist (listed as installed, unusable, with the reason)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types

import pytest

from lazygrad_metal import plugin
from lazygrad_metal.objc import ObjCError
from lazygrad_metal.renderer import MetalRenderer
from lazygrad_metal.tensor_cores import SIMDGROUP_LAYOUT
from lazygrad_uop.device import CompiledDevice, TensorCore
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.plugins import TensorCoreSpec
from lazygrad_uop.registry import DeviceRegistry, DeviceUnavailableError

TC = TensorCore((8, 8, 8), 32, (2, 2, 2), dtypes.float16, dtypes.float32, swizzle=SIMDGROUP_LAYOUT)
TC9 = TensorCore((8, 8, 8), 32, (2, 2, 2), dtypes.bfloat16, dtypes.float32, swizzle=SIMDGROUP_LAYOUT)


def registry() -> DeviceRegistry:
    reg = DeviceRegistry(group="lazygrad_tests_no_entry_points")
    reg.register_plugin(plugin)
    return reg


def test_imports_and_exports() -> None:
    module = importlib.import_module("lazygrad_metal")
    assert module.__doc__
    for name in module.__all__:
        assert getattr(module, name).__name__ == name


def test_usable_only_on_macos() -> None:
    reason = plugin.metal_usable()
    assert reason is None or (isinstance(reason, str) and reason)
    if sys.platform != "darwin":
        assert reason == f"Metal is only available on macOS, this is {sys.platform}"


def test_registry_lists_the_device_and_opens_it_only_where_usable() -> None:
    reg = registry()
    assert reg.installed() == ["METAL"]
    assert reg.spec("metal").package == "lazygrad-runtime-metal"
    assert reg.spec("METAL").priority == plugin.PRIORITY == 100
    if (reason := reg.usable("METAL")) is None:
        dev = reg["METAL"]
        assert isinstance(dev, CompiledDevice) and isinstance(dev.renderer, MetalRenderer)
    else:
        with pytest.raises(DeviceUnavailableError, match=re.escape(reason)):
            reg["METAL"]


@pytest.mark.skipif(sys.platform == "darwin", reason="opening works on macOS")
def test_opening_off_macos_says_why() -> None:
    with pytest.raises(ObjCError, match="only on macOS"):
        plugin.open_metal("METAL")


def test_msl_is_the_default_renderer() -> None:
    (spec,) = registry().renderers("METAL")
    assert (spec.name, spec.default) == ("MSL", True)
    assert isinstance(spec.make(), MetalRenderer)


def test_no_tensor_cores_without_their_module(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail as if the module did not exist
    monkeypatch.setitem(sys.modules, plugin.TENSOR_CORES_MODULE, None)
    assert plugin.lazygrad_tensor_cores() == []
    assert registry().tensor_cores("METAL") == ()
    assert plugin.make_renderer().tensor_cores == ()


@pytest.mark.parametrize("per_target", [True, False], ids=["mapping", "sequence"])
def test_tensor_cores_come_from_their_module(monkeypatch: pytest.MonkeyPatch, per_target: bool) -> None:
    fake = types.ModuleType(plugin.TENSOR_CORES_MODULE)
    fake.TENSOR_CORES = {"apple7": [TC], "apple9": (TC, TC9)} if per_target else [TC]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, plugin.TENSOR_CORES_MODULE, fake)
    specs = plugin.lazygrad_tensor_cores()
    assert specs[0] == TensorCoreSpec("METAL", "apple7", (TC,))
    reg = registry()
    assert reg.tensor_cores("METAL", "apple7") == (TC,)
    assert reg.tensor_cores("METAL") == ((TC, TC9) if per_target else (TC,))
    assert reg.tensor_cores("METAL", "sm_80") == ()
    # the registry hands a renderer the descriptions of its target
    assert reg.tensor_cores_for("METAL", plugin.make_renderer()) == (TC,)
    assert reg.tensor_cores_for("METAL", MetalRenderer(target="apple9")) == ((TC, TC9) if per_target else ())


def test_the_real_descriptions_are_registered_and_valid() -> None:
    if importlib.util.find_spec(plugin.TENSOR_CORES_MODULE) is None:
        pytest.skip("lazygrad_metal.tensor_cores is not written yet")
    tcs = registry().tensor_cores("METAL", plugin.TENSOR_CORE_TARGET)
    assert tcs and all(tc.dims == (8, 8, 8) and tc.threads == 32 for tc in tcs)
    assert registry().tensor_cores_for("METAL", plugin.make_renderer()) == tcs


def test_a_broken_tensor_core_module_is_not_mistaken_for_a_missing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str) -> types.ModuleType:
        raise ModuleNotFoundError("No module named 'something_it_needs'", name="something_it_needs")

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="something_it_needs"):
        plugin.all_tensor_cores()
