"""The lazygrad plugin of the METAL device: registers `METAL` with the device registry.

Metal exists only on macOS. Opening the device is not implemented yet (issue 9).
"""

from __future__ import annotations

import sys

from lazygrad_uop.device import CompiledDevice
from lazygrad_uop.plugins import DeviceSpec, hookimpl


def metal_usable() -> str | None:
    """None on macOS, else why not."""
    return None if sys.platform == "darwin" else f"Metal is only available on macOS, this is {sys.platform}"


def open_metal(name: str) -> CompiledDevice:
    """Open the METAL device `name` ("METAL", "METAL:1")."""
    raise NotImplementedError(f"the METAL device ({name}) is not implemented yet: see issue 9")


# Below every working device until opening is implemented (issue 9), so that a machine where METAL is usable
# does not pick a device that can't open as its default. Raise it then.
_PRIORITY = -1


@hookimpl
def lazygrad_devices() -> list[DeviceSpec]:
    """The METAL device."""
    return [
        DeviceSpec("METAL", open=open_metal, usable=metal_usable, priority=_PRIORITY, package="lazygrad-runtime-metal")
    ]
