"""The PYTHON device configured with Metal's limits: a test-only device, METALEMU, whose renderer is the PYTHON
interpreter's, carrying every limit and the tensor cores of `MetalRenderer`. Codegen lowers a kernel for it exactly
as for METAL (the tests check the linear programs are the same objects), and the interpreter runs that program with
Metal's launch: `global_size` threadgroups of `local_size` threads, in SIMD groups of 32."""

from __future__ import annotations

from typing import Any

from lazygrad_metal.plugin import TENSOR_CORE_TARGET
from lazygrad_metal.renderer import MetalRenderer
from lazygrad_python import PythonCompiler, PythonProgram, PythonRenderer
from lazygrad_python.device import PythonAllocator
from lazygrad_uop.device import CompiledDevice, Renderer
from lazygrad_uop.plugins import DeviceSpec, hookimpl
from lazygrad_uop.registry import Device

NAME = "METALEMU"

# What a renderer tells codegen about its target: every class attribute of Renderer but its names.
LIMITS = [
    k for k, v in vars(Renderer).items() if not k.startswith("_") and not callable(v) and k not in ("device", "suffix")
]


def metal_limits_renderer(metal: MetalRenderer) -> PythonRenderer:
    """A PYTHON renderer with `metal`'s limits and tensor cores."""
    attrs: dict[str, Any] = {k: getattr(metal, k) for k in LIMITS}
    return type("MetalLimitsPythonRenderer", (PythonRenderer,), attrs)()


def registered_metal_renderer() -> MetalRenderer:
    """The MSL renderer with the tensor cores the registry hands it, as the METAL device gets them."""
    metal = MetalRenderer(target=TENSOR_CORE_TARGET)
    metal.add_tensor_cores(Device.tensor_cores_for("METAL", metal))
    return metal


def open_emulation(name: str) -> CompiledDevice:
    """The METALEMU device: PYTHON's allocator, compiler and interpreter, lowering with Metal's limits."""
    renderer = metal_limits_renderer(registered_metal_renderer())
    return CompiledDevice(name, PythonAllocator(), renderer, PythonCompiler(), PythonProgram)


class EmulationPlugin:
    """Registers METALEMU with a device registry (never the default device)."""

    @hookimpl
    def lazygrad_devices(self) -> list[DeviceSpec]:
        return [DeviceSpec(NAME, open_emulation, lambda: None, priority=-1000, package="lazygrad-runtime-metal tests")]
