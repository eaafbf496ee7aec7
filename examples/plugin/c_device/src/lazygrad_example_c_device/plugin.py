"""The plugin: the device and its renderer, registered through the `lazygrad` entry point."""

from __future__ import annotations

from lazygrad_uop.device import CompiledDevice, Renderer
from lazygrad_uop.plugins import DeviceSpec, RendererSpec, hookimpl

# below the CPU (50) and the other real devices: used when asked for by name
PRIORITY = -50


def _open(name: str) -> CompiledDevice:
    # imported on first use, so that listing devices never loads codegen
    from lazygrad_example_c_device.device import open_cdev

    return open_cdev(name)


def _usable() -> str | None:
    from lazygrad_example_c_device.device import cdev_usable

    return cdev_usable()


def _renderer() -> Renderer:
    from lazygrad_example_c_device.device import CDevRenderer

    return CDevRenderer()


@hookimpl
def lazygrad_devices() -> list[DeviceSpec]:
    """The CDEV device."""
    return [DeviceSpec("CDEV", open=_open, usable=_usable, priority=PRIORITY, package="lazygrad-example-c-device")]


@hookimpl
def lazygrad_renderers() -> list[RendererSpec]:
    """C, CDEV's default renderer."""
    return [RendererSpec("CDEV", "C", make=_renderer, default=True)]
