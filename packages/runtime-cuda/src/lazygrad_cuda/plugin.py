"""The lazygrad plugin of the CUDA device: registers `CUDA` (GPU 0; `CUDA:1`, `CUDA:2`... for the others), its CUDA C
renderer, and the tensor cores of `lazygrad_cuda.tensor_cores` when that module is there.

The device is usable where cuda-bindings imports, the NVIDIA driver initialises, reports at least one GPU, and NVRTC
can compile for it; elsewhere it is listed as installed but unusable, with the reason, and never chosen as default.
"""

from __future__ import annotations

import importlib

from lazygrad_uop.device import CompiledDevice, Renderer
from lazygrad_uop.plugins import DeviceSpec, RendererSpec, TensorCoreSpec, hookimpl

# a dedicated accelerator: above the CPU (50) wherever it is usable
PRIORITY = 100


def cuda_usable() -> str | None:
    """None if the CUDA driver, a GPU and an NVRTC that compiles for it are present, else why not."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        return f"cuda-bindings is not importable: {exc}"
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # noqa: BLE001 - cuda-bindings reports a missing driver library with its own types
        return f"no NVIDIA driver: the CUDA driver library could not be loaded ({type(exc).__name__}: {exc})"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"the NVIDIA driver did not initialise: cuInit failed with {err.name}"
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"cuDeviceGetCount failed with {err.name}"
    if count == 0:
        return "no device: the NVIDIA driver reports no GPU"
    try:
        from lazygrad_cuda.compiler import compile_target

        err, dev = driver.cuDeviceGet(0)
        attr = driver.CUdevice_attribute
        _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        compile_target(f"sm_{major}{minor}")
    except Exception as exc:  # noqa: BLE001 - NVRTC missing, or too new for this GPU
        return f"NVRTC can't compile for this GPU: {exc}"
    return None


def open_cuda(name: str) -> CompiledDevice:
    """Open the CUDA device `name` ("CUDA" is GPU 0, "CUDA:1" GPU 1, ...)."""
    from lazygrad_cuda.device import CUDADevice

    return CUDADevice(name)


def _make_renderer() -> Renderer:
    # the device retargets it to its GPU's architecture when it is put to use (CUDADevice.use_renderer)
    from lazygrad_cuda.renderer import CUDARenderer

    return CUDARenderer()


@hookimpl
def lazygrad_devices() -> list[DeviceSpec]:
    """The CUDA device."""
    return [DeviceSpec("CUDA", open=open_cuda, usable=cuda_usable, priority=PRIORITY, package="lazygrad-runtime-cuda")]


@hookimpl
def lazygrad_renderers() -> list[RendererSpec]:
    """CUDA C compiled with NVRTC, the CUDA device's default renderer."""
    return [RendererSpec("CUDA", "CUDA", make=_make_renderer, default=True)]


@hookimpl
def lazygrad_tensor_cores() -> list[TensorCoreSpec]:
    """The mma tensor cores of each architecture, from `lazygrad_cuda.tensor_cores.TENSOR_CORES` (none while that
    module is absent)."""
    try:
        module = importlib.import_module("lazygrad_cuda.tensor_cores")
    except ModuleNotFoundError as exc:
        if exc.name != "lazygrad_cuda.tensor_cores":
            raise
        return []
    return [TensorCoreSpec("CUDA", target, tuple(tcs)) for target, tcs in module.TENSOR_CORES.items()]
