"""The lazygrad plugin of lazygrad-runtime-amd: registers the `CL` device (any OpenCL platform, PoCL on a CPU
included), the `AMD` device (an AMD GPU through AMD's OpenCL platform), the `HIP` device (an AMD GPU through
libamdhip64, running AMDGPU code objects that LLVM builds), their renderers, and the AMD tensor cores.

The usability checks import nothing heavy until they must: `AMD` and `HIP` first look for the ROCm kernel driver,
so machines without an AMD GPU never pay for loading an OpenCL or HIP runtime.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from lazygrad_uop.device import CompiledDevice, Renderer
from lazygrad_uop.plugins import DeviceSpec, RendererSpec, TensorCoreSpec, hookimpl

PACKAGE = "lazygrad-runtime-amd"
# An AMD GPU is a dedicated accelerator (100); HIP runs the same GPUs as AMD, so it ranks just below it.
AMD_PRIORITY = 100
HIP_PRIORITY = 90
# Below the CPU (50): on a machine whose only OpenCL platform is PoCL, CL is the same CPU through a generic
# compiler, and the CPU device must stay the default. A GPU reached through OpenCL is picked with DEV=CL.
CL_PRIORITY = 40
# the devices whose renderer calls the matrix instructions (AMD renders OpenCL C, which has none)
TENSOR_CORE_DEVICES = ("HIP",)


def _pyopencl_reason() -> str | None:
    try:
        import pyopencl  # noqa: F401
    except ImportError as exc:
        return f"pyopencl is not importable: {exc}"
    return None


def cl_usable() -> str | None:
    """None if pyopencl finds an OpenCL device, else why not."""
    if (reason := _pyopencl_reason()) is not None:
        return reason
    from lazygrad_amd.opencl import cl_devices

    if not cl_devices():
        return "no OpenCL platform with a device is installed (e.g. apt-get install pocl-opencl-icd)"
    return None


def _rocm_driver_reason() -> str | None:
    # the ROCm kernel driver's device node: without it no AMD GPU runtime can work on Linux
    if sys.platform.startswith("linux") and not os.path.exists("/dev/kfd"):
        return "no AMD GPU driver: /dev/kfd does not exist"
    return None


def amd_usable() -> str | None:
    """None if AMD's OpenCL platform shows an AMD GPU, else why not."""
    if (reason := _rocm_driver_reason() or _pyopencl_reason()) is not None:
        return reason
    from lazygrad_amd.opencl import cl_devices, is_amd_gpu

    if not any(is_amd_gpu(d) for d in cl_devices()):
        return "no AMD GPU on an installed OpenCL platform (AMD's OpenCL runtime, from ROCm, is needed)"
    return None


def hip_usable() -> str | None:
    """None if libamdhip64 loads and sees a GPU, llvmlite targets AMDGPU and ld.lld can link code objects."""
    if (reason := _rocm_driver_reason()) is not None:
        return reason
    from lazygrad_amd.amdgpu_compiler import amdgpu_target_reason, find_ld_lld
    from lazygrad_amd.hip import hip_reason

    if (reason := amdgpu_target_reason() or hip_reason()) is not None:
        return reason
    if find_ld_lld() is None:
        return "ld.lld is not installed: HIP loads linked code objects (apt-get install lld, or ROCm's llvm/bin)"
    return None


def open_cl(name: str) -> CompiledDevice:
    """Open `CL` (the first OpenCL device: a GPU where there is one) or `CL:n`."""
    from lazygrad_amd.opencl import CLDevice, cl_devices, describe

    return CLDevice(name, _pick(name, list(cl_devices()), describe))


def open_amd(name: str) -> CompiledDevice:
    """Open `AMD` (the first AMD GPU on AMD's OpenCL platform) or `AMD:n`."""
    from lazygrad_amd.opencl import CLDevice, cl_devices, describe, is_amd_gpu

    return CLDevice(name, _pick(name, [d for d in cl_devices() if is_amd_gpu(d)], describe))


def open_hip(name: str) -> CompiledDevice:
    """Open `HIP` (the first GPU HIP sees) or `HIP:n`."""
    from lazygrad_amd.hip import HIPDevice

    return HIPDevice(name)


def _pick(name: str, devices: list[Any], describe: Callable[[Any], str]) -> Any:
    """The device that `name` ("CL", "CL:1") indexes in `devices`, or a ValueError listing the ones there are."""
    base, _, index = name.partition(":")
    n = int(index or 0)
    if n >= len(devices):
        listing = "; ".join(f"{base}:{i} {describe(d)}" for i, d in enumerate(devices)) or "none"
        raise ValueError(f"{name} does not exist: this machine has {len(devices)} such devices ({listing})")
    return devices[n]


def _opencl_renderer() -> Renderer:
    from lazygrad_amd.opencl_renderer import OpenCLRenderer

    return OpenCLRenderer()


def _amdgpu_renderer() -> Renderer:
    from lazygrad_amd.amdgpu_renderer import AMDGPURenderer

    return AMDGPURenderer()


@hookimpl
def lazygrad_devices() -> list[DeviceSpec]:
    """The CL, AMD and HIP devices."""
    return [
        DeviceSpec("CL", open=open_cl, usable=cl_usable, priority=CL_PRIORITY, package=PACKAGE),
        DeviceSpec("AMD", open=open_amd, usable=amd_usable, priority=AMD_PRIORITY, package=PACKAGE),
        DeviceSpec("HIP", open=open_hip, usable=hip_usable, priority=HIP_PRIORITY, package=PACKAGE),
    ]


@hookimpl
def lazygrad_renderers() -> list[RendererSpec]:
    """OpenCL C for CL and AMD (their default); LLVM IR for amdgcn for HIP (its default)."""
    return [
        RendererSpec("CL", "CL", make=_opencl_renderer, default=True),
        RendererSpec("AMD", "CL", make=_opencl_renderer, default=True),
        RendererSpec("HIP", "AMDGPU", make=_amdgpu_renderer, default=True),
    ]


def _tensor_core_module() -> ModuleType | None:
    try:
        return importlib.import_module("lazygrad_amd.tensor_cores")
    except ModuleNotFoundError as exc:
        if exc.name != "lazygrad_amd.tensor_cores":
            raise
        return None


@hookimpl
def lazygrad_tensor_cores() -> list[TensorCoreSpec]:
    """The WMMA (RDNA3) and MFMA (CDNA) tensor cores of each AMD target, from `lazygrad_amd.tensor_cores`."""
    module = _tensor_core_module()
    if module is None:
        return []
    return [
        TensorCoreSpec(device, target, tuple(tcs))
        for target, tcs in module.TENSOR_CORES.items()
        for device in TENSOR_CORE_DEVICES
    ]
