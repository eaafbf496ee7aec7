"""The lazygrad plugin of the CUDA device: registers `CUDA` with the device registry.

The device is usable where cuda-bindings imports, the NVIDIA driver initialises and reports at least one GPU. Opening
it is not implemented yet (issue 7).
"""

from __future__ import annotations

from lazygrad_uop.device import CompiledDevice
from lazygrad_uop.plugins import DeviceSpec, hookimpl


def cuda_usable() -> str | None:
    """None if the CUDA driver and a GPU are present, else why not."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        return f"cuda-bindings is not importable: {exc}"
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # noqa: BLE001 - cuda-bindings reports a missing driver library with its own types
        return f"the NVIDIA driver library could not be loaded: {exc}"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"cuInit failed with {err.name}"
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"cuDeviceGetCount failed with {err.name}"
    return None if count > 0 else "the NVIDIA driver reports no GPU"


def open_cuda(name: str) -> CompiledDevice:
    """Open the CUDA device `name` ("CUDA", "CUDA:1")."""
    raise NotImplementedError(f"the CUDA device ({name}) is not implemented yet: see issue 7")


# Below every working device until opening is implemented (issue 7), so that a machine where CUDA is usable
# does not pick a device that can't open as its default. Raise it then.
_PRIORITY = -1


@hookimpl
def lazygrad_devices() -> list[DeviceSpec]:
    """The CUDA device."""
    return [DeviceSpec("CUDA", open=open_cuda, usable=cuda_usable, priority=_PRIORITY, package="lazygrad-runtime-cuda")]
