"""The tensor cores of NVIDIA GPUs that lazygrad uses: `mma.sync` warp-level matrix multiply-accumulate, and
Hopper's warpgroup `wgmma.mma_async` (m64nNk16, operands read from shared memory: `TensorCore.shared_operands`), as
plain data (`TensorCore` descriptions) that codegen applies generically and the PYTHON device emulates.

Layouts follow the PTX ISA's fragment tables for `mma.m16n8k16` and `mma.m16n8k8` with `.f16`/`.bf16` inputs and
`.f32` accumulators. With lane = 4 * groupID + threadID_in_group (groupID = lane >> 2):

- A (16 x K, row-major fragments): register pairs hold two neighbouring columns; row groupID, and groupID + 8 for
  the second pair; for K = 16 the third and fourth pairs repeat this 8 columns further on;
- B (K x 8): column groupID, rows 2 * threadID_in_group and the next, and 8 rows further on for K = 16;
- C (16 x 8): row groupID (and groupID + 8 for registers 2 and 3), columns 2 * threadID_in_group and the next.

`mma.m16n8k8` with `.tf32` inputs (float32 values the renderer rounds with `cvt.rna.tf32.f32`; its
`TensorCore.input_mantissa_bits` is 10, so codegen takes it only with `TF32=1`) holds one 32-bit element per register:

- A (16 x 8): a0 at (groupID, threadID_in_group), a1 8 rows further on, a2 4 columns further on, a3 both;
- B (8 x 8): b0 at row threadID_in_group, column groupID, b1 4 rows further on;
- C: as above.

Each is written as the coordinate bit selected by each bit of the lane and of the register index (see
`lazygrad_uop.device.TensorCore`).
"""

from __future__ import annotations

from lazygrad_uop.device import TensorCore
from lazygrad_uop.dtype import dtypes

# C (16 x 8, fp32): lane bits 0-1 pick columns 2 and 4, lane bits 2-4 rows 1-4; register bit 0 the column's low
# bit, register bit 1 rows 8 further on
_C = (("n1", "n2", "m0", "m1", "m2"), ("n0", "m3"))
_M16N8K16 = (
    (("k1", "k2", "m0", "m1", "m2"), ("k0", "m3", "k3")),  # A: 8 halves per lane
    (("k1", "k2", "n0", "n1", "n2"), ("k0", "k3")),  # B: 4 halves per lane
    _C,
)
_M16N8K8 = (
    (("k1", "k2", "m0", "m1", "m2"), ("k0", "m3")),  # A: 4 halves per lane
    (("k1", "k2", "n0", "n1", "n2"), ("k0",)),  # B: 2 halves per lane
    _C,
)


# TF32: lane bits 0-1 pick columns 1 and 2 of A (rows of B), lane bits 2-4 rows 1-4 of A (columns of B); register
# bit 0 of A rows 8 further on, register bit 1 of A (bit 0 of B) columns (rows) 4 further on
_M16N8K8_TF32 = (
    (("k0", "k1", "m0", "m1", "m2"), ("m3", "k2")),  # A: 4 floats per lane
    (("k0", "k1", "n0", "n1", "n2"), ("k2",)),  # B: 2 floats per lane
    _C,
)


def _mma(k: int, dtype_in: object) -> TensorCore:
    swizzle = _M16N8K16 if k == 16 else _M16N8K8
    per_thread = (16 * k // 32, k * 8 // 32, 16 * 8 // 32)
    return TensorCore(
        dims=(8, 16, k),
        threads=32,
        elements_per_thread=per_thread,
        dtype_in=dtype_in,  # type: ignore[arg-type]
        dtype_out=dtypes.float32,
        opts=(f"mma.sync.aligned.m16n8k{k}.row.col",),
        swizzle=swizzle,
    )


_TF32 = TensorCore(
    dims=(8, 16, 8),
    threads=32,
    elements_per_thread=(4, 2, 4),
    dtype_in=dtypes.float32,
    dtype_out=dtypes.float32,
    opts=("mma.sync.aligned.m16n8k8.row.col", "tf32"),
    swizzle=_M16N8K8_TF32,
    input_mantissa_bits=10,  # TF32: float32's exponent range, 10 of its 23 mantissa bits
)

# the TF32 core last: a TC opt's select counts from the first, and the fp16/bf16 cores keep their places
_AMPERE = (_mma(16, dtypes.float16), _mma(16, dtypes.bfloat16), _mma(8, dtypes.float16), _TF32)


def wgmma_c_layout(n: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """C (64 x N, fp32) of `wgmma.mma_async` m64nNk16: warp w of the warpgroup holds rows 16w to 16w + 15, as
    mma.m16n8's C, repeated over the N / 8 groups of 8 columns (register bits 2 and up)."""
    return ("n1", "n2", "m0", "m1", "m2", "m4", "m5"), ("n0", "m3", *(f"n{b}" for b in range(3, n.bit_length() - 1)))


def _wgmma(n: int, dtype_in: object) -> TensorCore:
    return TensorCore(
        dims=(n, 64, 16),
        threads=128,
        elements_per_thread=(0, 0, n // 2),
        dtype_in=dtype_in,  # type: ignore[arg-type]
        dtype_out=dtypes.float32,
        opts=(f"wgmma.mma_async.sync.aligned.m64n{n}k16",),
        swizzle=((), (), wgmma_c_layout(n)),
        shared_operands=True,
    )


# Hopper's warpgroup MMA (sm_90a only: Blackwell has no wgmma), A and B read from shared memory by descriptors; after
# the mma.sync cores so that their TC select numbers stay, and taken only when named (TC's select, `WGMMA`)
HOPPER = tuple(_wgmma(n, dt) for dt in (dtypes.float16, dtypes.bfloat16) for n in (128, 256, 64))

TENSOR_CORES: dict[str, tuple[TensorCore, ...]] = {"sm_80": _AMPERE, "sm_89": _AMPERE, "sm_90": _AMPERE + HOPPER}
"""The tensor cores per target (compute capability): `mma.sync` m16n8k16 for fp16 and bf16 and m16n8k8 for fp16,
accumulating in fp32, and m16n8k8 for float32 inputs rounded to TF32 (used only with `TF32=1`), on Ampere (sm_80),
Ada (sm_89) and Hopper (sm_90, which also runs the Ampere instructions)."""
