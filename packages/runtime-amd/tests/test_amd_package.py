"""The package imports on its own, and its plugin registers a AMD device that says truthfully whether it is usable."""

import importlib
import re

import pytest

from lazygrad_amd import plugin
from lazygrad_uop.registry import DeviceRegistry, DeviceUnavailableError


def test_imports() -> None:
    assert importlib.import_module("lazygrad_amd").__doc__


def test_usable_gives_none_or_a_reason() -> None:
    reason = plugin.amd_usable()
    assert reason is None or (isinstance(reason, str) and reason)


def test_registry_finds_the_device_and_opening_says_it_is_not_implemented() -> None:
    registry = DeviceRegistry(group="lazygrad_tests_no_entry_points")
    registry.register_plugin(plugin)
    assert registry.installed() == ["AMD"]
    assert registry.spec("amd").package == "lazygrad-runtime-amd"
    if (reason := registry.usable("AMD")) is None:
        with pytest.raises(NotImplementedError, match="issue 8"):
            registry["AMD"]
    else:
        with pytest.raises(DeviceUnavailableError, match=re.escape(reason)):
            registry["AMD"]
    with pytest.raises(NotImplementedError, match="issue 8"):
        plugin.open_amd("AMD")
