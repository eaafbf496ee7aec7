"""Errors of the CUDA driver API, and `check`, which turns a cuda-python result tuple into its values or an error."""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver


class CUDAError(RuntimeError):
    """A CUDA driver call failed; the message names the call, the error code and the driver's description."""

    def __init__(self, what: str, code: Any) -> None:
        self.code = code
        name = getattr(code, "name", str(code))
        try:
            err, text = driver.cuGetErrorString(code)
            described = text.decode() if err == driver.CUresult.CUDA_SUCCESS and text else ""
        except Exception:  # noqa: BLE001 - describing an error must never hide the error itself
            described = ""
        super().__init__(f"{what} failed with {name}" + (f": {described}" if described else ""))


class CUDAOutOfMemoryError(CUDAError, MemoryError):
    """The GPU (or pinned host memory) is out of memory. A MemoryError, so the LRU allocator frees its cache and
    retries."""


def check(result: tuple, what: str) -> Any:
    """The value(s) a cuda-python driver call returned after its status: None, the single value, or a tuple.
    Raises CUDAError (CUDAOutOfMemoryError for CUDA_ERROR_OUT_OF_MEMORY) naming `what` when the status is an
    error."""
    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        oom = err == driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
        raise (CUDAOutOfMemoryError if oom else CUDAError)(what, err)
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)
