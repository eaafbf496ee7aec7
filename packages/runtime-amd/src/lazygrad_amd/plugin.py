"""The lazygrad plugin of the AMD device: registers `AMD` with the device registry.

The device runs through OpenCL, so it is usable wherever pyopencl imports and an OpenCL platform is installed (an AMD
driver, or PoCL on any CPU). Opening it is not implemented yet (issue 8).
"""

from __future__ import annotations

from lazygrad_uop.device import CompiledDevice
from lazygrad_uop.plugins import DeviceSpec, hookimpl


def amd_usable() -> str | None:
    """None if pyopencl finds an OpenCL platform, else why not."""
    try:
        import pyopencl
    except ImportError as exc:
        return f"pyopencl is not importable: {exc}"
    try:
        platforms = pyopencl.get_platforms()
    except pyopencl.Error as exc:
        # No installable client driver at all makes the ICD loader fail rather than return an empty list.
        return f"no OpenCL platform is installed (e.g. apt-get install pocl-opencl-icd): {exc}"
    return None if platforms else "no OpenCL platform is installed (e.g. apt-get install pocl-opencl-icd)"


def open_amd(name: str) -> CompiledDevice:
    """Open the AMD device `name` ("AMD", "AMD:1")."""
    raise NotImplementedError(f"the AMD device ({name}) is not implemented yet: see issue 8")


# Below every working device until opening is implemented (issue 8), so that a machine where AMD is usable
# does not pick a device that can't open as its default. Raise it then, minding that PoCL makes this device usable
# on machines without a GPU, where the CPU device should stay the default.
_PRIORITY = -1


@hookimpl
def lazygrad_devices() -> list[DeviceSpec]:
    """The AMD device."""
    return [DeviceSpec("AMD", open=open_amd, usable=amd_usable, priority=_PRIORITY, package="lazygrad-runtime-amd")]
