"""`Device.list()`: every installed device with its package, version, usability, default, renderers and tensor
cores, checked against plugins the test registers (and importlib.metadata for versions)."""

from __future__ import annotations

import importlib.metadata

import pytest

from lazygrad_uop.config import Context
from lazygrad_uop.device import CompiledDevice, TensorCore
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.plugins import DeviceSpec, RendererSpec, TensorCoreSpec, hookimpl
from lazygrad_uop.registry import DeviceRegistry

TC_A = TensorCore((8, 16, 16), 32, (8, 4, 4), dtypes.half, dtypes.float)
TC_B = TensorCore((8, 16, 8), 32, (4, 2, 4), dtypes.half, dtypes.float)


class Plugin:
    """One device with the given usability, renderers and tensor cores."""

    def __init__(self, name: str, priority: int, package: str, reason: str | None = None, **hooks: list) -> None:
        # the registry opens the default it chooses: a bare device object stands in (nothing runs on it here)
        def open_device(n: str) -> CompiledDevice:
            return CompiledDevice(n, None, None, None, None)  # type: ignore[arg-type]

        self.spec = DeviceSpec(name, open_device, lambda: reason, priority, package)
        self.hooks = hooks

    @hookimpl
    def lazygrad_devices(self) -> list[DeviceSpec]:
        return [self.spec]

    @hookimpl
    def lazygrad_renderers(self) -> list[RendererSpec]:
        return self.hooks.get("renderers", [])

    @hookimpl
    def lazygrad_tensor_cores(self) -> list[TensorCoreSpec]:
        return self.hooks.get("tensor_cores", [])


@pytest.fixture
def registry() -> DeviceRegistry:
    reg = DeviceRegistry(group="lazygrad_tests_no_entry_points")
    reg.register_plugin(
        Plugin(
            "FAST",
            100,
            "pluggy",  # an installed distribution, so it has a version to report
            renderers=[
                RendererSpec("FAST", "ALT", lambda: None),  # type: ignore[arg-type,return-value]
                RendererSpec("FAST", "MAIN", lambda: None, default=True),  # type: ignore[arg-type,return-value]
            ],
            tensor_cores=[TensorCoreSpec("FAST", "arch_1", (TC_A,)), TensorCoreSpec("FAST", "arch_2", (TC_A, TC_B))],
        )
    )
    reg.register_plugin(Plugin("SLOW", 50, "not-a-distribution-anywhere"))
    reg.register_plugin(Plugin("GONE", 200, "pluggy", reason="no driver: libgone.so not found"))
    return reg


def test_list_describes_every_device(registry: DeviceRegistry) -> None:
    with Context(DEV=""):
        infos = registry.list()
    assert [i.name for i in infos] == ["GONE", "FAST", "SLOW"]  # by priority, highest first
    gone, fast, slow = infos
    assert gone.usable == "no driver: libgone.so not found" and not gone.default
    assert fast.usable is None and fast.default  # the usable device of highest priority
    assert slow.usable is None and not slow.default
    assert fast.package == "pluggy" and fast.version == importlib.metadata.version("pluggy")
    assert slow.version is None
    assert fast.renderers == (("MAIN", True), ("ALT", False))
    assert fast.tensor_cores == {"arch_1": (TC_A,), "arch_2": (TC_A, TC_B)}
    assert slow.renderers == () and slow.tensor_cores == {}


def test_list_follows_dev(registry: DeviceRegistry) -> None:
    with Context(DEV="SLOW"):
        assert [i.name for i in registry.list() if i.default] == ["SLOW"]


def test_list_when_nothing_is_usable() -> None:
    reg = DeviceRegistry(group="lazygrad_tests_no_entry_points")
    reg.register_plugin(Plugin("ONLY", 1, "pluggy", reason="needs hardware"))
    with Context(DEV=""):
        (info,) = reg.list()
    assert info.usable == "needs hardware" and not info.default
