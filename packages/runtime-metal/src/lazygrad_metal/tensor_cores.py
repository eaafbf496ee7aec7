"""The tensor cores of Apple GPUs that lazygrad uses: `simdgroup_matrix` 8x8 multiply-accumulate
(`simdgroup_multiply_accumulate`), as plain data (`TensorCore` descriptions) that codegen applies generically and
the PYTHON device emulates.

Each of the 32 threads of a SIMD group holds two neighbouring elements of each 8x8 matrix (`thread_elements()`):
with quad q = lane // 4, row (q & 4) + (lane // 2) % 4 and columns 2 * (lane % 2) + 2 * (q & 2) and the next. The
same placement holds for A (rows m, columns k), B (rows k, columns n) and C (rows m, columns n). This is the layout
Apple's GPUs are documented by the community to use (Apple does not publish it); the PYTHON device's emulation checks
that codegen applies it consistently, not that the hardware agrees.
"""

from __future__ import annotations

from lazygrad_uop.device import TensorCore
from lazygrad_uop.dtype import DType, dtypes


def _fragment(row: str, col: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    # lane bit 0 -> column bit 1, lane bits 1-2 -> row bits 0-1, lane bit 3 -> column bit 2, lane bit 4 -> row bit 2;
    # the register -> column bit 0
    return (f"{col}1", f"{row}0", f"{row}1", f"{col}2", f"{row}2"), (f"{col}0",)


SIMDGROUP_LAYOUT = (_fragment("m", "k"), _fragment("k", "n"), _fragment("m", "n"))
"""Where each thread of a SIMD group holds its elements of A, B and C (`TensorCore.swizzle` notation)."""


def _simdgroup(dtype_in: DType, dtype_out: DType) -> TensorCore:
    return TensorCore(
        (8, 8, 8), 32, (2, 2, 2), dtype_in, dtype_out, ("simdgroup_multiply_accumulate",), SIMDGROUP_LAYOUT
    )


_APPLE = (
    _simdgroup(dtypes.float32, dtypes.float32),
    _simdgroup(dtypes.float16, dtypes.float32),
    _simdgroup(dtypes.float16, dtypes.float16),
)

TENSOR_CORES: dict[str, tuple[TensorCore, ...]] = {"apple7": _APPLE, "apple8": _APPLE, "apple9": _APPLE}
"""The tensor cores per target (Apple GPU family 7 = M1/A14 and later): simdgroup 8x8x8 for float inputs and half
inputs with float or half accumulators. bfloat16 simdgroup matrices need Metal 3.1 (family 9) and are not described."""
