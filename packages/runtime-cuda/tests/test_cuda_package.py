"""The package imports on its own, and its plugin registers a CUDA device that says truthfully whether it is usable."""

import importlib
import re

import pytest

from lazygrad_cuda import plugin
from lazygrad_uop.registry import DeviceRegistry, DeviceUnavailableError


def test_imports() -> None:
    assert importlib.import_module("lazygrad_cuda").__doc__


def test_usable_gives_none_or_a_reason() -> None:
    reason = plugin.cuda_usable()
    assert reason is None or (isinstance(reason, str) and reason)


def test_registry_finds_the_device_and_opening_says_it_is_not_implemented() -> None:
    registry = DeviceRegistry(group="lazygrad_tests_no_entry_points")
    registry.register_plugin(plugin)
    assert registry.installed() == ["CUDA"]
    assert registry.spec("cuda").package == "lazygrad-runtime-cuda"
    if (reason := registry.usable("CUDA")) is None:
        with pytest.raises(NotImplementedError, match="issue 7"):
            registry["CUDA"]
    else:
        with pytest.raises(DeviceUnavailableError, match=re.escape(reason)):
            registry["CUDA"]
    with pytest.raises(NotImplementedError, match="issue 7"):
        plugin.open_cuda("CUDA")
