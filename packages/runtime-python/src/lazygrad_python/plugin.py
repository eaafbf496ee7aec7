"""The lazygrad plugin of the PYTHON device: registers `PYTHON` and its renderer with the device registry.

This module is the whole of what a device package must provide, so it doubles as the smallest example of a plugin.
"""

from __future__ import annotations

from lazygrad_python.device import PythonRenderer, open_python
from lazygrad_uop.plugins import DeviceSpec, RendererSpec, hookimpl

# Below every other device: the interpreter is a reference for testing, slow by design, never the default unless
# DEV=PYTHON or Device["PYTHON"] asks for it (or nothing else is installed).
PRIORITY = -100


def python_usable() -> str | None:
    """Always None: the interpreter runs wherever Python does."""
    return None


@hookimpl
def lazygrad_devices() -> list[DeviceSpec]:
    """The PYTHON device."""
    return [DeviceSpec("PYTHON", open_python, python_usable, PRIORITY, package="lazygrad-runtime-python")]


@hookimpl
def lazygrad_renderers() -> list[RendererSpec]:
    """The PYTHON renderer, the PYTHON device's default and only one."""
    return [RendererSpec("PYTHON", "PYTHON", make=PythonRenderer, default=True)]
