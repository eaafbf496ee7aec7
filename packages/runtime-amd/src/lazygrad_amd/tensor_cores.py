"""The tensor cores of AMD GPUs that lazygrad uses, as plain data (`TensorCore` descriptions) that codegen applies
generically and the PYTHON device emulates.

- RDNA 3 and 3.5 (gfx110x, gfx115x) `v_wmma_f32_16x16x16_f16` / `_bf16`, wave32: lane l holds row l % 16 of A
  (all 16 of its k) and column l % 16 of B (all 16 k), both repeated in the upper half of the wave (lanes 16-31 hold
  what lanes 0-15 hold, the layout's "" thread bit); of C it holds column l % 16 and the rows 2 * r + l // 16 for its
  registers r.
- CDNA 1 to 4 (gfx908, gfx90a, gfx942, gfx950) `v_mfma_f32_16x16x16f16` / `..bf16_1k`, wave64: lane l holds
  A[l % 16][4 * (l // 16) + r] and B[4 * (l // 16) + r][l % 16] in its registers r, and C[4 * (l // 16) + r][l % 16].

Each is written as the coordinate bit selected by each bit of the lane and of the register index (see
`lazygrad_uop.device.TensorCore`). Register r is lane r of the operand vector that the LLVM intrinsic takes (16-bit
values packed two to a VGPR, lower r in the low half), as AMD documents them (RDNA 3 ISA guide, WMMA; CDNA ISA guides
and AMD's matrix instruction calculator, MFMA); `lazygrad_amd.amdgpu_renderer` passes the vectors to the intrinsics
unchanged.
"""

from __future__ import annotations

from lazygrad_uop.device import TensorCore
from lazygrad_uop.dtype import DType, dtypes

_WMMA_RDNA3 = (
    (("m0", "m1", "m2", "m3", ""), ("k0", "k1", "k2", "k3")),  # A: 16 halves per lane, replicated over l // 16
    (("n0", "n1", "n2", "n3", ""), ("k0", "k1", "k2", "k3")),  # B: 16 halves per lane, replicated over l // 16
    (("n0", "n1", "n2", "n3", "m0"), ("m1", "m2", "m3")),  # C: 8 floats per lane
)
_MFMA_16X16X16 = (
    (("m0", "m1", "m2", "m3", "k2", "k3"), ("k0", "k1")),  # A: 4 halves per lane
    (("n0", "n1", "n2", "n3", "k2", "k3"), ("k0", "k1")),  # B: 4 halves per lane
    (("n0", "n1", "n2", "n3", "m2", "m3"), ("m0", "m1")),  # C: 4 floats per lane
)


def _wmma(dtype_in: DType) -> TensorCore:
    name = "v_wmma_f32_16x16x16_" + ("f16" if dtype_in == dtypes.float16 else "bf16")
    return TensorCore((16, 16, 16), 32, (16, 16, 8), dtype_in, dtypes.float32, (name,), _WMMA_RDNA3)


def _mfma(dtype_in: DType) -> TensorCore:
    name = "v_mfma_f32_16x16x16" + ("f16" if dtype_in == dtypes.float16 else "bf16_1k")
    return TensorCore((16, 16, 16), 64, (4, 4, 4), dtype_in, dtypes.float32, (name,), _MFMA_16X16X16)


_RDNA3 = (_wmma(dtypes.float16), _wmma(dtypes.bfloat16))
_CDNA = (_mfma(dtypes.float16), _mfma(dtypes.bfloat16))

# RDNA 3 and 3.5 (gfx110x, gfx115x) share the WMMA instructions and their layout (RDNA 4's differ). CDNA 1 (gfx908)
# lacks the bf16_1k MFMA, which CDNA 2, 3 and 4 (gfx90a, gfx942, gfx950) have.
TENSOR_CORES: dict[str, tuple[TensorCore, ...]] = {
    **dict.fromkeys(("gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151"), _RDNA3),
    "gfx908": _CDNA[:1],
    **dict.fromkeys(("gfx90a", "gfx942", "gfx950"), _CDNA),
}
"""The tensor cores per target (gfx architecture name), all 16x16x16 with fp32 accumulators."""

BY_INSTRUCTION: dict[str, TensorCore] = {tc.opts[0]: tc for tc in (*_RDNA3, *_CDNA)}
"""Each matrix instruction's description (by its name, `opts[0]`): what a description naming it must say."""
# the target family each kind of matrix instruction exists on: WMMA on RDNA 3 (gfx11), MFMA on CDNA (gfx9)
INSTRUCTION_FAMILY = {"v_wmma": "gfx11", "v_mfma": "gfx9"}
