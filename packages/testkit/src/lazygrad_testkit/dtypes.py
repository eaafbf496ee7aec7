"""The dtype lists the conformance suite and the device packages' tests draw from."""

from __future__ import annotations

import numpy as np

from lazygrad_uop.dtype import DType, dtypes

FLOATS: list[DType] = [dtypes.float32, dtypes.float16, dtypes.float64]
"""The float types every device is expected to compute in (float64 where the device has it)."""
INTS: list[DType] = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint32]
"""Signed and unsigned integers of each width the suite covers."""
ALL: list[DType] = [dtypes.bool, *INTS, *FLOATS]
"""Every dtype with a numpy counterpart that the suite covers."""
CAST_DTYPES: list[DType] = [*ALL, dtypes.bfloat16]
"""The dtypes casts go between: ALL and bfloat16."""
ALL_INTS: list[DType] = [
    dtypes.int8,
    dtypes.uint8,
    dtypes.int16,
    dtypes.uint16,
    dtypes.int32,
    dtypes.uint32,
    dtypes.int64,
    dtypes.uint64,
]
"""Every integer type."""
ARITH_DTYPES: list[DType] = [dtypes.float32, dtypes.float16, *ALL_INTS]
"""The dtypes of the op suite's elementwise arithmetic cases."""
NUMPY_SCALARS: list[DType] = [dtypes.bool, *ALL_INTS, dtypes.float16, dtypes.float32, dtypes.float64]
"""Every scalar type numpy has."""
SCALARS: list[DType] = [dtypes.bool, *ALL_INTS, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
"""Every scalar type kernels compute in (fp8 is storage only)."""
PORTABLE_CAST_DTYPES: list[DType] = [d for d in NUMPY_SCALARS if d not in (dtypes.uint64, dtypes.float64)]
"""The dtypes every device casts between (Apple GPUs have no float64; uint64 is the rarest integer)."""
UNARY: tuple[str, ...] = ("exp", "log", "exp2", "log2", "sqrt", "sin", "cos", "relu", "sigmoid", "tanh", "abs", "neg")
"""The unary Tensor methods the kernel graphs cover on each float type."""


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values as the bits (uint16) of the nearest bfloat16, ties to even; NaN as the quiet NaN 0x7FC0."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def bf16_value(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 `bits` (uint16)."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)
