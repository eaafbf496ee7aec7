"""Device registries for tests, through the registry's public interface only.

- `isolated_registry(*plugins)`: a new `DeviceRegistry` that sees only the plugins given (no installed entry points),
  for testing a plugin's hooks, its error handling and default selection without touching the process's registry.
- `stand_in(name)`: the process's registry with the device `name` usable while a test drives it over a stand-in for
  its driver (`Device.stand_in`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lazygrad_uop.registry import Device, DeviceRegistry

# an entry-point group no distribution declares: an isolated registry finds no installed plugin
NO_ENTRY_POINTS = "lazygrad_testkit_no_entry_points"


def isolated_registry(*plugins: object) -> DeviceRegistry:
    """A registry of exactly `plugins` (modules or objects with lazygrad hooks), registered in order."""
    registry = DeviceRegistry(group=NO_ENTRY_POINTS)
    for plugin in plugins:
        registry.register_plugin(plugin)
    return registry


@contextlib.contextmanager
def stand_in(name: str) -> Iterator[DeviceRegistry]:
    """The process's registry, with the device `name` usable inside the block (see `DeviceRegistry.stand_in`)."""
    with Device.stand_in(name):
        yield Device
