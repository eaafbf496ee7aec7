"""The plugin: a `TensorCoreSpec` for a device that another package provides."""

from __future__ import annotations

from lazygrad_uop.device import TensorCore
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.plugins import TensorCoreSpec, hookimpl

# mma.sync.aligned.m16n8k8, as the PTX ISA lays out its fragments: A (16 x 8) in 4 registers per lane, B (8 x 8) in
# 2, C (16 x 8) in 4. Thread bits, lowest first, then register bits, name the coordinate bit each selects.
M16N8K8_BF16 = TensorCore(
    dims=(8, 16, 8),
    threads=32,
    elements_per_thread=(4, 2, 4),
    dtype_in=dtypes.bfloat16,
    dtype_out=dtypes.float32,
    opts=("mma.sync.aligned.m16n8k8.row.col",),
    swizzle=(
        (("k1", "k2", "m0", "m1", "m2"), ("k0", "m3")),
        (("k1", "k2", "n0", "n1", "n2"), ("k0",)),
        (("n1", "n2", "m0", "m1", "m2"), ("n0", "m3")),
    ),
)


@hookimpl
def lazygrad_tensor_cores() -> list[TensorCoreSpec]:
    """The bf16 m16n8k8 mma for sm_86 GPUs."""
    return [TensorCoreSpec("CUDA", "sm_86", (M16N8K8_BF16,))]
