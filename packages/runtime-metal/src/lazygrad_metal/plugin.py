"""The lazygrad plugin of the METAL device: registers `METAL`, its MSL renderer and its simdgroup-matrix tensor cores
with the device registry.

Metal exists only on macOS; elsewhere the device is listed as installed and reports why it can't be used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from lazygrad_uop.plugins import DeviceSpec, RendererSpec, TensorCoreSpec, hookimpl

if TYPE_CHECKING:
    from lazygrad_metal.renderer import MetalRenderer
    from lazygrad_uop.device import CompiledDevice, TensorCore

# A dedicated accelerator: preferred over the CPU wherever it is usable.
PRIORITY = 100
# simdgroup_matrix exists from the Apple7 GPU family (M1, A14) on: the target a renderer made without a device uses.
TENSOR_CORE_TARGET = "apple7"
TENSOR_CORES_MODULE = "lazygrad_metal.tensor_cores"


def metal_usable() -> str | None:
    """None where a Metal GPU can be opened, else why not (never raises)."""
    if sys.platform != "darwin":
        return f"Metal is only available on macOS, this is {sys.platform}"
    from lazygrad_metal.device import metal_device_usable

    return metal_device_usable()


def open_metal(name: str) -> CompiledDevice:
    """Open the METAL device `name` ("METAL" is the system's default GPU, "METAL:1" the second one)."""
    from lazygrad_metal.device import MetalDevice

    return MetalDevice(name)


def all_tensor_cores() -> dict[str, tuple[TensorCore, ...]]:
    """The simdgroup-matrix tensor-core descriptions per target ("apple7", ...): `TENSOR_CORES` of
    `lazygrad_metal.tensor_cores` (a mapping of target to descriptions, or one sequence for `TENSOR_CORE_TARGET`),
    or none while that module doesn't exist."""
    try:
        module = importlib.import_module(TENSOR_CORES_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != TENSOR_CORES_MODULE:
            raise
        return {}
    found = module.TENSOR_CORES
    if isinstance(found, Mapping):
        return {target: tuple(tcs) for target, tcs in found.items()}
    return {TENSOR_CORE_TARGET: tuple(found)}


def make_renderer() -> MetalRenderer:
    """The MSL renderer for GPUs of the Apple7 family and later (the registry hands it that family's tensor cores)."""
    # imported here: codegen is only needed once a renderer is asked for
    from lazygrad_metal.renderer import MetalRenderer

    return MetalRenderer(target=TENSOR_CORE_TARGET)


@hookimpl
def lazygrad_devices() -> list[DeviceSpec]:
    """The METAL device."""
    return [
        DeviceSpec("METAL", open=open_metal, usable=metal_usable, priority=PRIORITY, package="lazygrad-runtime-metal")
    ]


@hookimpl
def lazygrad_renderers() -> list[RendererSpec]:
    """MSL, the METAL device's default and only renderer."""
    return [RendererSpec("METAL", "MSL", make=make_renderer, default=True)]


@hookimpl
def lazygrad_tensor_cores() -> list[TensorCoreSpec]:
    """The simdgroup_matrix 8x8x8 tensor cores of each Apple GPU family, once their descriptions exist."""
    return [TensorCoreSpec("METAL", target, tcs) for target, tcs in all_tensor_cores().items() if tcs]
