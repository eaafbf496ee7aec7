"""The testkit's own machinery: isolated registries, stand-in devices, and the pytest options a third party uses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lazygrad_testkit.registry import isolated_registry, stand_in
from lazygrad_uop.device import CompiledDevice
from lazygrad_uop.plugins import DeviceSpec, hookimpl
from lazygrad_uop.registry import Device, DeviceUnavailableError, UnknownDeviceError


class _Unusable:
    """A device that says it can't run here, opened as PYTHON's parts when a test makes it usable anyway."""

    @hookimpl
    def lazygrad_devices(self) -> list[DeviceSpec]:
        from lazygrad_python.device import open_python

        def open_as_python(name: str) -> CompiledDevice:
            return open_python(name)

        return [DeviceSpec("TKFAKE", open_as_python, lambda: "no such hardware", 0, "pkg-tkfake")]


def test_an_isolated_registry_sees_only_its_plugins() -> None:
    registry = isolated_registry(_Unusable())
    assert registry.installed() == ["TKFAKE"]
    with pytest.raises(UnknownDeviceError, match="unknown device 'CPU'"):
        registry.spec("CPU")
    assert "TKFAKE" not in Device.installed()


def test_stand_in_makes_a_device_usable_for_the_block_only() -> None:
    pytest.importorskip("lazygrad_python")
    plugin = _Unusable()
    Device.register_plugin(plugin)
    try:
        default = Device.DEFAULT
        with pytest.raises(DeviceUnavailableError, match="no such hardware"):
            Device["TKFAKE"]
        with stand_in("TKFAKE") as registry:
            assert registry.usable("TKFAKE") is None
            inside = registry["TKFAKE"]
            assert registry["TKFAKE"] is inside and Device.DEFAULT == default
        assert Device.usable("TKFAKE") == "no such hardware"
        with pytest.raises(DeviceUnavailableError):
            Device["TKFAKE"]
    finally:
        Device.unregister_plugin(plugin)


def _pytest(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:xdist", "--pyargs", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def test_a_device_named_explicitly_that_is_not_installed_fails_the_run() -> None:
    proc = _pytest("lazygrad_testkit", "--lazygrad-device=NOSUCHDEV", "-k", "round_trips")
    assert proc.returncode == 1 and "unknown device 'NOSUCHDEV'" in proc.stdout
