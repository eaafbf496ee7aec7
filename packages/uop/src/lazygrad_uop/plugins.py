"""The plugin contract: the hooks a device package implements, and the plain data it returns from them.

A plugin is an ordinary module listed under the `lazygrad` entry-point group of its distribution:

    [project.entry-points.lazygrad]
    cuda = "lazygrad_cuda.plugin"

that defines any of the hooks below, each decorated with `hookimpl`:

    from lazygrad_uop.plugins import DeviceSpec, hookimpl

    @hookimpl
    def lazygrad_devices() -> list[DeviceSpec]:
        return [DeviceSpec("CUDA", open=open_cuda, usable=cuda_usable, priority=100, package="lazygrad-runtime-cuda")]

The registry (`lazygrad_uop.registry.Device`) finds, imports and calls them; nothing imports a plugin by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from lazygrad_uop.device import CompiledDevice, Compiler, Renderer, TensorCore

PROJECT = "lazygrad"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# What device and renderer names look like: upper case, as users write them after DEV=.
NAME_PATTERN = re.compile(r"[A-Z][A-Z0-9_]*")


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"{what} must be upper case letters, digits and underscores, starting with a letter: {name!r}")


@dataclass(frozen=True)
class DeviceSpec:
    """A device a plugin provides.

    name: the device name users write, upper case ("CUDA").
    open: called with the canonical full name ("CUDA" for the first device, "CUDA:1" for the second) and returns the
        opened `CompiledDevice`. Called at most once per name; the registry keeps the result.
    usable: returns None when the device can run on this machine, else one line saying why not ("no NVIDIA driver:
        libcuda.so.1 not found"). Must be cheap and must not raise; the registry calls it once.
    priority: rank for choosing the default device among the usable ones, highest first. Convention: dedicated
        accelerators 100, the CPU 50, reference and emulated devices 0.
    package: the distribution that provides it, named in error messages ("lazygrad-runtime-cuda").
    """

    name: str
    open: Callable[[str], CompiledDevice]
    usable: Callable[[], str | None]
    priority: int
    package: str

    def __post_init__(self) -> None:
        _check_name("device name", self.name)


@dataclass(frozen=True)
class RendererSpec:
    """A renderer a plugin offers for a device, selectable with `DEV=<device>:<name>` (e.g. `DEV=CUDA:PTX`).

    device: the device it renders for ("CUDA"); it may belong to another plugin.
    name: what users write after the colon ("PTX"), upper case.
    make: returns a new `Renderer`.
    default: whether this is the renderer the device uses when none is named.
    compiler: returns the `Compiler` that builds this renderer's source into what the device's `Program` loads, when
        that is not the device's own compiler (a C renderer for the CPU brings the system C compiler); None keeps the
        device's compiler. Selecting the renderer (`DEV=CPU:C`, `Device["CPU:C"]`, `Tensor(..., device="CPU:C")`)
        switches both.
    """

    device: str
    name: str
    make: Callable[[], Renderer]
    default: bool = False
    compiler: Callable[[], Compiler] | None = None

    def __post_init__(self) -> None:
        _check_name("renderer device", self.device)
        _check_name("renderer name", self.name)


@dataclass(frozen=True)
class TensorCoreSpec:
    """The tensor cores one target of a device supports.

    device: the device name ("CUDA").
    target: the architecture they exist on, as the device's renderer names it ("sm_80", "gfx1100").
    tensor_cores: their descriptions.
    """

    device: str
    target: str
    tensor_cores: tuple[TensorCore, ...]

    def __post_init__(self) -> None:
        _check_name("tensor-core device", self.device)


class LazygradSpec:
    """The hooks a lazygrad plugin may implement. Each takes no arguments and returns a list (empty if it has
    nothing of that kind); a plugin implements only the hooks it needs."""

    @hookspec
    def lazygrad_devices(self) -> list[DeviceSpec]:
        """The devices this plugin provides, as `DeviceSpec`s: name, how to open one, whether it is usable on this
        machine (and why not), priority for default selection, and the package name."""

    @hookspec
    def lazygrad_renderers(self) -> list[RendererSpec]:
        """The renderers this plugin offers, as `RendererSpec`s: the device each renders for, its name, a factory,
        and whether it is that device's default."""

    @hookspec
    def lazygrad_tensor_cores(self) -> list[TensorCoreSpec]:
        """The tensor-core descriptions this plugin knows, as `TensorCoreSpec`s: one per (device, target)."""
