"""Fault injection into the device registry: a device that claims to be usable but fails to open, hook
implementations with misspelled names, and registrations of things that are not plugins. Each degrades with a warning
or a clear error, and the registry keeps working for the healthy plugins."""

from __future__ import annotations

import types
import warnings

import pytest
from uop_stand_ins import NamedRenderer, NullAllocator, NullCompiler, NullProgram

from lazygrad_uop.config import Context
from lazygrad_uop.device import CompiledDevice
from lazygrad_uop.plugins import DeviceSpec, hookimpl
from lazygrad_uop.registry import (
    DeviceRegistry,
    DeviceUnavailableError,
    LazygradPluginWarning,
    PluginRegistrationError,
)


class FakePlugin:
    """A plugin providing one usable device."""

    def __init__(self, name: str, priority: int = 0, package: str | None = None) -> None:
        self.name, self.priority, self.package = name, priority, package or f"pkg-{name.lower()}"
        self.opened: list[str] = []

    def open(self, name: str) -> CompiledDevice:
        self.opened.append(name)
        return CompiledDevice(name, NullAllocator(), NamedRenderer(""), NullCompiler(), NullProgram)

    @hookimpl
    def lazygrad_devices(self) -> list[DeviceSpec]:
        return [DeviceSpec(self.name, self.open, lambda: None, self.priority, self.package)]


def registry_with(*plugins: object) -> DeviceRegistry:
    registry = DeviceRegistry(group="lazygrad_tests_no_entry_points")
    for plugin in plugins:
        registry.register_plugin(plugin)
    return registry


class BrokenOpen(FakePlugin):
    """Says it is usable, with a high priority, but raises when opened."""

    def open(self, name: str):  # type: ignore[override]
        self.opened.append(name)
        raise OSError("device node /dev/fake0 vanished")


@pytest.fixture(autouse=True)
def no_dev():
    with Context(DEV=""):
        yield


def test_device_that_fails_to_open_is_skipped_as_default() -> None:
    broken = BrokenOpen("FLAKY", priority=100, package="flaky-plugin")
    good = FakePlugin("GOOD", priority=50)
    registry = registry_with(broken, good)
    with pytest.warns(LazygradPluginWarning, match=r"FLAKY from flaky-plugin was skipped .*OSError.*vanished"):
        assert registry.DEFAULT == "GOOD"
    assert broken.opened == ["FLAKY"]
    assert good.opened == ["GOOD"]
    # asked again: the answer is remembered and the broken device is not retried
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert registry.DEFAULT == "GOOD"
    assert broken.opened == ["FLAKY"]
    assert registry.usable("FLAKY") is not None and "vanished" in registry.usable("FLAKY")


def test_opening_a_broken_device_by_name_is_a_clear_error() -> None:
    registry = registry_with(BrokenOpen("FLAKY", package="flaky-plugin"))
    with pytest.raises(DeviceUnavailableError, match=r"FLAKY \(from flaky-plugin\) failed to open: OSError") as info:
        registry["FLAKY"]
    assert isinstance(info.value.__cause__, OSError)


def test_every_device_failing_to_open_lists_the_reasons() -> None:
    registry = registry_with(BrokenOpen("A", priority=2, package="pkg-a"), BrokenOpen("B", priority=1))
    with pytest.warns(LazygradPluginWarning), pytest.raises(DeviceUnavailableError, match=r"A \(pkg-a\): opening A"):
        _ = registry.DEFAULT


def _module(name: str, **functions) -> types.ModuleType:
    m = types.ModuleType(name)
    for attr, fn in functions.items():
        setattr(m, attr, fn)
    return m


def test_misspelled_hook_warns_with_the_likely_name() -> None:
    @hookimpl
    def lazygrad_device() -> list[DeviceSpec]:
        return []

    registry = registry_with(FakePlugin("GOOD"))
    with pytest.warns(LazygradPluginWarning, match=r"'lazygrad_device'.*not a lazygrad hook.*'lazygrad_devices'"):
        registry.register_plugin(_module("typo_plugin", lazygrad_device=lazygrad_device))
    assert registry.installed() == ["GOOD"]


def test_correct_hooks_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry = registry_with(FakePlugin("GOOD"))
        assert registry.installed() == ["GOOD"]


class _NoHooks:
    def lazygrad_devices(self) -> list[DeviceSpec]:  # not decorated: pluggy never calls it
        return []


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (42, "implements none of lazygrad's hooks"),
        ("lazygrad_cpu.plugin", "implements none of lazygrad's hooks"),
        ({"lazygrad_devices": []}, "implements none of lazygrad's hooks"),
        (DeviceSpec("SPEC", open=print, usable=lambda: None, priority=1, package="p"), "implements none of"),
        (FakePlugin, "class whose hooks lazygrad_devices are instance methods; register an instance"),
        (_NoHooks(), "decorated with lazygrad_uop.plugins.hookimpl"),
        (types.ModuleType("empty"), "implements none of lazygrad's hooks"),
    ],
    ids=["int", "str", "dict", "spec", "plugin-class", "undecorated", "empty-module"],
)
def test_malformed_registration_is_rejected_and_the_registry_keeps_working(bad: object, why: str) -> None:
    good = FakePlugin("GOOD", priority=5)
    registry = registry_with(good)
    with pytest.raises(PluginRegistrationError, match=why):
        registry.register_plugin(bad)
    assert registry.installed() == ["GOOD"]
    assert registry.DEFAULT == "GOOD"
    assert registry["GOOD"].device == "GOOD"


def test_a_class_of_static_hooks_is_a_plugin() -> None:
    class Static:
        @staticmethod
        @hookimpl
        def lazygrad_devices() -> list[DeviceSpec]:
            return FakePlugin("STATIC").lazygrad_devices()

    assert registry_with(Static).installed() == ["STATIC"]


def test_hook_with_a_wrong_signature_is_rejected() -> None:
    @hookimpl
    def lazygrad_devices(extra) -> list[DeviceSpec]:
        return []

    registry = registry_with(FakePlugin("GOOD"))
    with pytest.raises(PluginRegistrationError, match="extra"):
        registry.register_plugin(_module("bad_signature", lazygrad_devices=lazygrad_devices))
    assert registry.installed() == ["GOOD"]


def test_registering_twice_is_rejected() -> None:
    plugin = FakePlugin("GOOD")
    registry = registry_with(plugin)
    with pytest.raises(PluginRegistrationError, match="already registered"):
        registry.register_plugin(plugin)
    assert registry["GOOD"].device == "GOOD"
