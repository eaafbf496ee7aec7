"""The plugin contract: the hook specifications and the data plugins return."""

from __future__ import annotations

import dataclasses
import inspect

import pluggy
import pytest

from lazygrad_uop.device import TensorCore
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.plugins import DeviceSpec, LazygradSpec, RendererSpec, TensorCoreSpec, hookimpl, hookspec

HOOKS = {"lazygrad_devices": DeviceSpec, "lazygrad_renderers": RendererSpec, "lazygrad_tensor_cores": TensorCoreSpec}


def test_markers_belong_to_the_lazygrad_project() -> None:
    assert hookspec.project_name == hookimpl.project_name == "lazygrad"


def test_every_hook_is_a_documented_spec_naming_what_it_returns() -> None:
    specs = {name: fn for name, fn in inspect.getmembers(LazygradSpec, inspect.isfunction)}
    assert set(specs) == set(HOOKS)
    for name, fn in specs.items():
        assert hasattr(fn, "lazygrad_spec"), name
        assert HOOKS[name].__name__ in (fn.__doc__ or ""), name


def test_a_plain_module_like_plugin_is_called_through_pluggy() -> None:
    class Plugin:
        @hookimpl
        def lazygrad_devices(self) -> list[DeviceSpec]:
            return [DeviceSpec("TOY", open=lambda name: None, usable=lambda: None, priority=1, package="toy")]

    pm = pluggy.PluginManager("lazygrad")
    pm.add_hookspecs(LazygradSpec)
    pm.register(Plugin())
    pm.check_pending()
    (devices,) = pm.hook.lazygrad_devices()
    assert [d.name for d in devices] == ["TOY"]
    assert pm.hook.lazygrad_renderers() == []


@pytest.mark.parametrize("name", ["cuda", "CUDA:1", "", "1GPU", "MY-GPU"])
def test_names_must_be_canonical(name: str) -> None:
    with pytest.raises(ValueError, match="upper case"):
        DeviceSpec(name, open=lambda n: None, usable=lambda: None, priority=0, package="p")
    with pytest.raises(ValueError, match="upper case"):
        RendererSpec("CUDA", name, make=lambda: None)
    with pytest.raises(ValueError, match="upper case"):
        TensorCoreSpec(name, "sm_80", ())


def test_specs_are_frozen_plain_data() -> None:
    tc = TensorCore((8, 16, 16), 32, (8, 4, 4), dtypes.half, dtypes.float, ())
    spec = TensorCoreSpec("CUDA", "sm_80", (tc,))
    renderer = RendererSpec("CUDA", "PTX", make=lambda: None)
    assert renderer.default is False
    for obj in (spec, renderer):
        with pytest.raises(dataclasses.FrozenInstanceError):
            obj.device = "AMD"  # type: ignore[misc]
