"""The package imports on its own, and its plugin registers a METAL device that says truthfully whether it is usable."""

import importlib
import re
import sys

import pytest

from lazygrad_metal import plugin
from lazygrad_uop.registry import DeviceRegistry, DeviceUnavailableError


def test_imports() -> None:
    assert importlib.import_module("lazygrad_metal").__doc__


def test_usable_gives_none_or_a_reason() -> None:
    reason = plugin.metal_usable()
    assert reason is None or (isinstance(reason, str) and reason)


def test_registry_finds_the_device_and_opening_says_it_is_not_implemented() -> None:
    registry = DeviceRegistry(group="lazygrad_tests_no_entry_points")
    registry.register_plugin(plugin)
    assert registry.installed() == ["METAL"]
    assert registry.spec("metal").package == "lazygrad-runtime-metal"
    if (reason := registry.usable("METAL")) is None:
        with pytest.raises(NotImplementedError, match="issue 9"):
            registry["METAL"]
    else:
        with pytest.raises(DeviceUnavailableError, match=re.escape(reason)):
            registry["METAL"]
    with pytest.raises(NotImplementedError, match="issue 9"):
        plugin.open_metal("METAL")


def test_usable_only_on_macos() -> None:
    reason = plugin.metal_usable()
    assert (reason is None) == (sys.platform == "darwin")
