"""Default tiles for matmul-like kernels (matmuls, batched matmuls, convolutions as implicit GEMM) on GPUs with local
memory: several warps per workgroup, each with a register tile, operands staged through local memory (`STAGE`).

A kernel is matmul-like when it is one sum of a product of two loads, A and B, with an output axis M that only A
reads, an output axis N that only B reads, and a reduce axis both read: a convolution's input is A (its pixels are M),
its weights are B (output channels are N), its input channels, and window positions, the reduction; its input- and
weight-gradient kernels are of the same form.

On tensor cores (fp16/bf16 inputs, fp32 accumulators; fp32 kernels stay on FMA units, TF32 only when the renderer
offers such a core):

    TC, UPCAST M x4, UPCAST N x4, LOCAL M x2, LOCAL N x4, UNROLL K x2, STAGE

gives 8 warps of 64x32 outputs each, a 128x128 workgroup tile and 32 elements of the reduction per step; each element
loaded from global memory is then used 128 times (1/64 byte per FLOP in fp16). On FMA units:

    UPCAST M x8, UPCAST N x8, LOCAL M x16, LOCAL N x16, UNROLL K x4, STAGE

gives 256 threads of 8x8 outputs each, again a 128x128 tile. Smaller kernels take the largest of each that divides
their axes. Kernels too small for a tile (an M or N axis under 16, a reduction under 16) and kernels on which STAGE
does not fit are left to the general heuristics.
"""

from __future__ import annotations

import math

from lazygrad_codegen.kernel import AxisType, Kernel, KernelOptError, Opt, OptOps
from lazygrad_codegen.staging import staged_loads
from lazygrad_uop.ops import Ops
from lazygrad_uop.views import ShapeTracker

TC_TILES = (("M", (4, 2)), ("N", (4, 2)), ("LM", (2,)), ("LN", (4, 2)), ("K", (2,)))
"""Tensor cores: each opt of the default tile and the amounts tried for it, largest first."""
FMA_TILES = (("M", (8, 4, 2)), ("N", (8, 4, 2)), ("LM", (16, 8, 4, 2)), ("LN", (16, 8, 4, 2)), ("K", (4, 2)))
"""FMA units: the same for a kernel without tensor cores."""

MIN_SIZE = 16
"""M, N and the reduction (the product of their axes) must each be at least this long for a staged tile to pay."""


def _varies(st: ShapeTracker, axis: int) -> bool:
    s = st.real_strides(ignore_valid=True)[axis]
    return not (isinstance(s, int) and s == 0)


def _operands(k: Kernel) -> tuple[ShapeTracker, ShapeTracker] | None:
    """The views of A and B of a matmul-like kernel (see the module docstring), or None when it isn't one."""
    reduces = k.reduceops
    if len(reduces) != 1 or reduces[0].arg[0] is not Ops.ADD:
        return None
    x = reduces[0].src[0]
    if x.op is Ops.CAST:
        x = x.src[0]
    if x.op is not Ops.MUL:
        return None
    loads = [s.src[0] if s.op is Ops.CAST else s for s in x.src]
    if any(ld.op is not Ops.LOAD for ld in loads):
        return None
    return k.views[loads[0].src[1]], k.views[loads[1].src[1]]


def _axis(k: Kernel, which: str) -> tuple[OptOps, int] | None:
    """The opt and axis argument that split the M, N (register tile: UPCAST; warps: LOCAL) or K (UNROLL) axis, taking
    the innermost GLOBAL axis that only A (M) or only B (N) reads, the innermost REDUCE axis for K."""
    ops = _operands(k)
    if ops is None:
        return None
    a, b = ops
    if which == "K":
        reduce = k.axes(AxisType.REDUCE)
        both = [n for n, ax in enumerate(reduce) if _varies(a, ax) and _varies(b, ax)]
        return (OptOps.UNROLL, both[-1]) if both else None
    reads, other = (a, b) if which in ("M", "LM") else (b, a)
    globals_ = k.axes(AxisType.GLOBAL)
    found = [n for n, ax in enumerate(globals_) if _varies(reads, ax) and not _varies(other, ax)]
    if not found:
        return None
    return (OptOps.UPCAST if which in ("M", "N") else OptOps.LOCAL), found[-1]


def _extent(k: Kernel, which: str) -> int:
    """The product of the sizes of all axes of kind `which` (M: GLOBAL axes only A reads, N: only B, K: REDUCE axes
    both read), 0 when there is none or one is symbolic."""
    ops = _operands(k)
    if ops is None:
        return 0
    a, b = ops
    if which == "K":
        axes = [ax for ax in k.axes(AxisType.REDUCE) if _varies(a, ax) and _varies(b, ax)]
    else:
        reads, other = (a, b) if which == "M" else (b, a)
        axes = [ax for ax in k.axes(AxisType.GLOBAL) if _varies(reads, ax) and not _varies(other, ax)]
    sizes = [k.full_shape[ax] for ax in axes]
    return math.prod(sizes) if axes and all(isinstance(s, int) for s in sizes) else 0  # type: ignore[misc]


def _apply_first(k: Kernel, which: str, amounts: tuple[int, ...]) -> None:
    for amount in amounts:
        where = _axis(k, which)
        if where is None:
            return
        try:
            k.apply_opt(Opt(where[0], where[1], amount))
            return
        except KernelOptError:
            continue


def staged_matmul(k: Kernel) -> bool:
    """Apply the default tiles of the module docstring to `k` when it is matmul-like and its renderer has local and
    shared memory; returns whether it did (`k` is left unchanged otherwise)."""
    r = k.renderer
    if not (r.has_local and r.has_shared and k.use_locals) or k.applied_opts or _operands(k) is None:
        return False
    if any(_extent(k, which) < MIN_SIZE for which in ("M", "N", "K")):
        return False
    trial = k.copy()
    tiles = FMA_TILES
    if r.tensor_cores:
        try:
            trial.apply_opt(Opt(OptOps.TC, 0, (-1, 1)))
            tiles = TC_TILES
        except KernelOptError:
            pass
    if trial.tensor_core is None and len(staged_loads(trial)) != 2:
        return False
    for which, amounts in tiles:
        _apply_first(trial, which, amounts)
    try:
        trial.apply_opt(Opt(OptOps.STAGE))
    except KernelOptError:
        return False
    k.__dict__.update(trial.__dict__)
    return True
