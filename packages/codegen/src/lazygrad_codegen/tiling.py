"""Default tiles for matmul-like kernels (matmuls, batched matmuls, convolutions as implicit GEMM) on GPUs with local
memory: several warps per workgroup, each with a register tile, operands staged through local memory (`STAGE`).

A kernel is matmul-like when it is one sum of a product of two loads, A and B, with an output axis M that only A
reads, an output axis N that only B reads, and a reduce axis both read: a convolution's input is A (its pixels are M),
its weights are B (output channels are N), its input channels, and window positions, the reduction; its input- and
weight-gradient kernels are of the same form.

On tensor cores (fp16/bf16 inputs, fp32 accumulators; fp32 kernels stay on FMA units unless `TF32=1` lets them take
a TF32 core):

    TC, UPCAST M x4, UPCAST N x8, LOCAL N x2, LOCAL M x2, UNROLL K x2, STAGE 4

gives 4 warps of 64x64 outputs each, a 128x128 workgroup tile and two tensor cores' reductions (32 elements in fp16)
per step where the reduction is long (`TC_LONG_REDUCTION`) and runs along an axis an operand reads contiguously
(`_long_step_axes`; one core's, 16 elements, where it is short, as a 3x3 convolution's 576, or gathered, as a
convolution's input channels); each element loaded from global memory is then used 128 times (1/64 byte per FLOP in
fp16). An N axis too short for two warps (a convolution's 64 output channels) gives its warps to M, up to `TC_WARPS`
in all; an M that one warp's register tile takes whole (a 7x7 convolution's batch of 64) gives them all to N.
Where the copies are asynchronous (CUDA sm_80+) STAGE pipelines them over the deepest of `DEEP_STAGES` that fits the
shared memory. A renderer whose register budget (`max_upcast`) is below CUDA's 512 gets the largest tiles it allows.
On FMA units:

    UPCAST M x8, UPCAST N x8, LOCAL M x16, LOCAL N x16, UNROLL K x8, STAGE

gives 256 threads of 8x8 outputs each, again a 128x128 tile, 8 elements of the reduction per step (4 within the
default register budget); a kernel with too few outputs for `FMA_WARPS_PER_UNIT` warps per compute unit at 8x8 per
thread takes 8x4 or 4x4 (`fma_register_tile`: the copies of FMA tiles are synchronous, only other
warps hide them). Smaller kernels take the largest of each that divides their axes. An operand that is a padded
expression stored by a kernel of its own, `WHERE(valid, LOAD, 0)` with `valid` the load's own validity, counts as the
load, and the staged kernel drops the select (`without_padding_selects`). FMA tiles are the default only on
renderers that declare warps (`warp_size`: CUDA, GPU targets of the PYTHON device), tensor-core tiles wherever a
tensor core fits. Kernels too small for a tile (an M or N axis under 16,
a reduction under 16) and kernels on which STAGE does not fit are left to the general heuristics.

With `WGMMA=1`, a renderer with tensor cores that read their operands from shared memory (Hopper's wgmma) takes
`wgmma_tiles` first where one fits: two warpgroups of 64 x 256 outputs, a 64-element step, 4 stages (`WGMMA_TILES`).
"""

from __future__ import annotations

import math

from lazygrad_codegen.kernel import AxisType, Kernel, KernelOptError, Opt, OptOps, warp_size
from lazygrad_codegen.staging import TILE_TYPES, address_strides, plan, staged_loads
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker

TC_MATCHES = 8
"""How many of the (M, N, K) axis triples a tensor core could take are tried, in order."""
TC_TILES = (("M", (4, 2)), ("N", (8, 4, 2)), ("LN", (2,)), ("LM", (4, 2)), ("K", (2,)))
"""Tensor cores: each opt of the default tile and the amounts tried for it, largest first (warps along M only up to
`TC_WARPS` with those along N; K only on a long reduction, `TC_LONG_REDUCTION`). Measured on an H100, staged tiles
timed: the fp16 4096^3 matmul ran at 302 TFLOPS with 64x64 outputs per warp and a 32-element step (the CUDA
renderer's register budget allows it), 275 with a 16-element step, 178 with the earlier 8 warps of 64x32 and a
32-element step; ResNet's fp16 3x3 convolution at batch 64: forward and input gradient 35-37 TFLOPS at 64x64 per warp,
4 warps along the pixels and a 16-element step (23 before), weight gradient (64x576 outputs, 4 warps of 32x32)
16.5 with a 32-element step and 8.7 with 16. On an H200, ResNet-18's 512-channel 3x3 convolution at 7x7 (TF32,
batch 64, whose M is the batch) ran in 712 us with its 4 warps of 64x64 along the channels, 1120 us with the 2 warps
the earlier rule left it."""
TC_WARPS = 4
"""Warps per workgroup of the default tensor-core tile, at most."""
TC_LONG_REDUCTION = 1024
"""A tensor-core tile reduces 32 elements a step where the reduction is at least this long, else 16: a
convolution's 576 (64 channels x 3x3) ran faster in 36 steps of 16 than in 18 of 32, a matmul's 4096 and a weight
gradient's thousands in steps of 32."""
FMA_TILES = (("M", (8, 4, 2)), ("N", (8, 4, 2)), ("LM", (16, 8, 4, 2)), ("LN", (16, 8, 4, 2)), ("K", (8, 4, 2)))
"""FMA units: the same for a kernel without tensor cores. An 8-element reduction step, where the renderer's register
budget allows it (CUDA's), ran the fp32 4096^3 matmul on an H100 at 39.6 TFLOPS against 32.5 with 4 elements."""

MIN_SIZE = 16
"""M, N and the reduction (the product of their axes) must each be at least this long for a staged tile to pay."""


def _varies(st: ShapeTracker, axis: int) -> bool:
    s = address_strides(st)[axis]
    return not (isinstance(s, int) and s == 0)


def _source_load(u: UOp) -> UOp:
    """The node under any chain of CASTs (the frontend reads an fp16 gradient as CAST(half, CAST(float, LOAD)))."""
    while u.op is Ops.CAST:
        u = u.src[0]
    return u


def _same_validity(a: ShapeTracker, b: ShapeTracker) -> bool:
    """Whether views `a` and `b` are valid at exactly the same indices: the same stack of views, equal but for the
    strides and offset of the bottom one (which only place the address in the buffer)."""
    if len(a.views) != len(b.views) or a.views[1:] != b.views[1:]:
        return False
    return a.views[0].shape == b.views[0].shape and a.views[0].mask == b.views[0].mask


def _padded_load(u: UOp, views: dict[UOp, ShapeTracker]) -> UOp | None:
    """The LOAD of `u` when `u` is one selected by its own validity, `WHERE(valid, LOAD, 0)` with `valid` a constant
    True valid exactly where the load's view is (the frontend pads an expression that isn't 0 at 0 so, and the
    expression may be stored by a kernel of its own: its load then reads 0 in the padding already); else None."""
    if u.op is not Ops.WHERE:
        return None
    valid, load, zero = u.src
    if valid.op is not Ops.CONST or valid.arg is not True or load.op is not Ops.LOAD:
        return None
    if zero.op is not Ops.CONST or zero.arg != 0 or len(valid.src) != 1 or valid.src[0] not in views:
        return None
    return load if _same_validity(views[valid.src[0]], views[load.src[1]]) else None


def without_padding_selects(k: Kernel) -> Kernel:
    """`k` (no opts applied) rebuilt without the selects of padded loads (`_padded_load`) below its reduction: what
    they select the load reads anyway, and a staged tile would compute each select's validity again for every use
    of the staged value in the inner loop. `k` itself when it has none."""
    selects = {u: ld for r in k.reduceops for u in r.src[0].toposort if (ld := _padded_load(u, k.views)) is not None}
    return Kernel(k.ast.substitute(selects), k.renderer) if selects else k


def _operands(k: Kernel) -> tuple[ShapeTracker, ShapeTracker] | None:
    """The views of A and B of a matmul-like kernel (see the module docstring), or None when it isn't one. A load
    selected by its own validity (`_padded_load`) counts as the load."""
    reduces = k.reduceops
    if len(reduces) != 1 or reduces[0].arg[0] is not Ops.ADD:
        return None
    x = _source_load(reduces[0].src[0])
    if x.op is not Ops.MUL:
        return None
    loads = [_source_load(s) for s in x.src]
    loads = [_source_load(p) if (p := _padded_load(ld, k.views)) is not None else ld for ld in loads]
    if any(ld.op is not Ops.LOAD for ld in loads):
        return None
    return k.views[loads[0].src[1]], k.views[loads[1].src[1]]


def _candidates(k: Kernel, which: str) -> list[int]:
    """The kernel axes of kind `which`, innermost first: M (or LM), the GLOBAL axes only A reads; N (or LN), those
    only B reads; K, the REDUCE axes both read."""
    ops = _operands(k)
    if ops is None:
        return []
    a, b = ops
    if which == "K":
        return [ax for ax in reversed(k.axes(AxisType.REDUCE)) if _varies(a, ax) and _varies(b, ax)]
    reads, other = (a, b) if which in ("M", "LM") else (b, a)
    return [ax for ax in reversed(k.axes(AxisType.GLOBAL)) if _varies(reads, ax) and not _varies(other, ax)]


def _extent(k: Kernel, which: str) -> int:
    """The product of the sizes of the axes of kind `which`, 0 when there is none or one is symbolic."""
    sizes = [k.full_shape[ax] for ax in _candidates(k, which)]
    return math.prod(sizes) if sizes and all(isinstance(s, int) for s in sizes) else 0  # type: ignore[misc]


def _apply_first(k: Kernel, which: str, amounts: tuple[int, ...], axes: list[int] | None = None) -> None:
    """The first of `amounts` (largest first) that some axis of kind `which` (of `axes` where given) takes, on the
    innermost that does: UPCAST for the register tile (M, N), LOCAL for the warps (LM, LN), UNROLL for the reduction
    step (K)."""
    op = {"M": OptOps.UPCAST, "N": OptOps.UPCAST, "LM": OptOps.LOCAL, "LN": OptOps.LOCAL, "K": OptOps.UNROLL}[which]
    kind = AxisType.REDUCE if which == "K" else AxisType.GLOBAL
    for amount in amounts:
        for axis in _candidates(k, which) if axes is None else axes:
            try:
                k.apply_opt(Opt(op, k.axes(kind).index(axis), amount))
                return
            except KernelOptError:
                continue


WARPS_AT_LEAST = 2
"""An FMA register tile leaves at least this many threads along its axis where the axis allows: a short M (a weight
gradient's 64 output channels) is better two warps of 32 rows than one of 64. Tensor-core tiles don't where the other
axis holds all their warps (`_tile`): an H100 ran ResNet's fp16 3x3 convolution at batch 64 fastest with all 64
output channels in one warp's tile, its 4 warps along the pixels (`TC_TILES`)."""


FMA_WARPS_PER_UNIT = 2
"""An FMA tile keeps at least this many warps per compute unit busy, all workgroups together, where a smaller register
tile allows: its copies into local memory are synchronous, so a unit hides their latency only behind other warps.
Measured on an H100: ResNet-18's float32 3x3 weight gradient (64 channels, 56x56, batch 64; its parts) ran at 26.9
TFLOPS with 8x8 per thread and an 8-element step (7.6 warps per multiprocessor), at 20.6 with 4x8 and at 15.5 with
4x4 (30 warps), the choice at 16 warps per unit."""


FMA_MIN_THREADS_PER_UNIT = 48
"""Where no register tile gives every compute unit `FMA_WARPS_PER_UNIT` warps, the largest that gives it this many
threads (a warp and a half). Measured on an H100: ResNet-18's stem weight gradient ran in 2.0 ms at 8x8 (62
threads per unit) and 9.9 ms at 4x4 (250), which also loads 4.5x the bytes per FLOP; its 512x256 1x1 weight
gradient in 0.83 ms at 8x8 (16 threads per unit) and 0.53 ms at 4x4 (62)."""


def fma_register_tile(k: Kernel) -> dict[str, int]:
    """The largest register tile (M x N outputs per thread, at most 8x8) of an FMA kernel `k` that leaves its threads,
    one per tile of the output, at least `FMA_WARPS_PER_UNIT` warps per compute unit of its renderer; where none
    does, the largest that leaves `FMA_MIN_THREADS_PER_UNIT` threads (a smaller tile costs reuse), else 4x4. The
    outputs count every output axis (a split reduction's parts, a batch of matmuls)."""
    outputs = 1
    for a in k.axes(AxisType.GLOBAL):
        size = k.full_shape[a]
        outputs *= size if isinstance(size, int) else 1 << 20
    units = max(1, k.renderer.compute_units)
    tiles = ((8, 8), (8, 4), (4, 4))
    for want in (units * FMA_WARPS_PER_UNIT * (warp_size(k.renderer) or 32), units * FMA_MIN_THREADS_PER_UNIT):
        for m, n in tiles:
            if outputs // (m * n) >= want:
                return {"M": m, "N": n}
    return {"M": 4, "N": 4}


def _leaving_warps(k: Kernel, which: str, amounts: tuple[int, ...]) -> tuple[int, ...]:
    """The register-tile `amounts` for M or N that leave `WARPS_AT_LEAST` warps along it (all of them when none
    does: the axis is too short for warps anyway)."""
    extent = _extent(k, which)
    leaving = tuple(a for a in amounts if a * WARPS_AT_LEAST <= extent)
    return leaving or amounts


def _warps(k: Kernel) -> int:
    """The warps (tensor cores: LOCAL opts beyond the tensor core's own threads) `k`'s opts have made so far."""
    return math.prod(int(o.arg) for o in k.applied_opts if o.op is OptOps.LOCAL)


PAD_WASTE = 8
"""An axis that no tile of the default size divides (4095, 1000) is padded to whole tiles (PADTO; the padding reads
zeros and its outputs are not stored) where that adds at most 1/PAD_WASTE of its length; else the largest tile,
halving, for which it does."""


def _tile(k: Kernel, register_tile: dict[str, int]) -> Kernel | None:
    """`k` (no opts but PADTOs) with the default tiles applied and staged, or None when they don't fit; an FMA tile
    takes at most `register_tile` (`fma_register_tile` of the unpadded kernel) outputs per thread along M and N."""
    r = k.renderer
    trial = k.copy()
    tiles = FMA_TILES
    # the first of the ways tensor cores fit (which M, N and K axes) that needs no more than doubling an axis: a
    # convolution's batch axis may not fit while its pixels do
    for match in range(TC_MATCHES if r.tensor_cores else 0):
        try:
            trial.apply_opt(Opt(OptOps.TC, match, (-1, 1)))
            tiles = TC_TILES
            break
        except KernelOptError:
            continue
    # FMA tiles only where the renderer declares warps, i.e. is known to be a GPU: a generic OpenCL target may be a CPU
    # (PoCL), where barriers make big work-groups slow to compile and run; STAGE stays there for BEAM and explicit opts
    if trial.tensor_core is None and (not warp_size(r) or len(staged_loads(trial)) != 2):
        return None
    # tries of (the amounts allowed for some of the tile's opts, whether M and N leave warps along them), first that
    # stages wins. An FMA tile takes `register_tile`, then the full one: a smaller register tile spreads a
    # workgroup's tile over more threads, whose copies may then need more local memory than there is (a strided
    # window's rows; a shorter reduction step instead made the 7x7 stem's weight gradient load 8 times more per FLOP).
    # A tensor-core tile first takes the largest register tiles and is kept only with all `TC_WARPS` warps (the other
    # axis holding them); then all of them along N, where M has no axis left for them (a 7x7 convolution's M is its
    # batch of 64, which one warp's 64 rows take); else it leaves warps along M and N as FMA tiles do, at most 64x32
    # per warp (a weight gradient's 64 x 576 outputs: 4 warps of 32x32)
    if trial.tensor_core is None:
        tries = [(_at_most(tiles, register_tile), True), ({}, True)] if register_tile else [({}, True)]
    else:
        tries = [({}, False), ({"LN": (TC_WARPS,), "LM": ()}, False), (_at_most(tiles, {"N": 4}), True)]
    for allowed, leave in tries:
        tiled = trial.copy()
        for which, amounts in tiles:
            amounts = allowed.get(which, amounts)
            if which in ("M", "N") and leave:
                amounts = _leaving_warps(tiled, which, amounts)
            if which == "LM" and tiled.tensor_core is not None:
                amounts = tuple(a for a in amounts if a * _warps(tiled) <= TC_WARPS)
            axes = _long_step_axes(tiled) if which == "K" and tiled.tensor_core is not None else None
            _apply_first(tiled, which, amounts, axes)
        if not leave and _warps(tiled) < TC_WARPS:
            continue
        if (staged := _staged(tiled)) is not None:
            return staged
    return None


def _at_most(tiles: tuple[tuple[str, tuple[int, ...]], ...], limits: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """The amounts of `tiles` (kind, amounts) no larger than `limits` of their kind (all of a kind's where none is)."""
    amounts = dict(tiles)
    return {w: tuple(a for a in amounts[w] if a <= n) or amounts[w] for w, n in limits.items()}


def _long_step_axes(k: Kernel) -> list[int]:
    """The reduce axes along which the tensor-core tile `k` may reduce two of its core's steps at a time (UNROLL K
    x2): on a long reduction (`TC_LONG_REDUCTION`), those that an operand reads contiguously, so that the longer step
    makes longer runs of its copies. Along others (a convolution's input channels, 49 elements apart at 7x7) the
    copies are gathered either way and the longer step only costs registers: on an H200, ResNet-18's 512-channel 3x3
    convolution at 7x7 (TF32) ran its fastest six tiles (712-722 us) all in steps of 8 elements, and the default of
    steps of 16 along the channels in 1120 us; its 64-channel weight gradient, whose reduction runs along the pixels,
    ran its fastest six in steps of 16."""
    tc = k.tensor_core
    assert tc is not None
    if _extent(k, "K") * tc.dims[2] < TC_LONG_REDUCTION:
        return []
    ops = _operands(k)
    assert ops is not None
    (tck,) = k.axes(AxisType.TC_K)
    runs = []  # per operand, the stride that continues its contiguous run: past the core's K where that is one
    for st in ops:
        s = address_strides(st)
        runs.append((s, k.full_shape[tck] if s[tck] == 1 else 1))
    return [ax for ax in _candidates(k, "K") if any(isinstance(s[ax], int) and s[ax] == run for s, run in runs)]


DEEP_STAGES: tuple[int, ...] = (4, 3)
"""Pipeline stages the default tensor-core tile tries first where the renderer copies asynchronously, deepest first:
the first whose buffers fit its shared memory (STAGE's two otherwise). On an H100 the default fp16 4096^3 tile (a
32-element step, 75776 bytes of dynamic shared memory in four stages) ran at 302 TFLOPS with four stages, 296 with
three and 280 with two; with a 16-element step, 275 with four and 273 with three."""


def _staged(k: Kernel) -> Kernel | None:
    """`k` staged with the deepest pipeline that fits (`DEEP_STAGES` for tensor cores on a renderer with asynchronous
    copies, else STAGE's default), or None when STAGE does not fit at all."""
    deep = DEEP_STAGES if k.renderer.has_async_copy and k.tensor_core is not None else ()
    for stages in (*deep, None):
        trial = k.copy()
        try:
            trial.apply_opt(Opt(OptOps.STAGE, None, stages))
        except KernelOptError:
            continue
        return trial
    return None


def tile_extents(k: Kernel) -> dict[str, int]:
    """The workgroup tile of the matmul-like kernel `k` in one reduction step: how many rows of M, columns of N and
    elements of the reduction K its threads and registers cover (the product of its tile axes that only A, only B,
    or both read)."""
    out = {"M": 1, "N": 1, "K": 1}
    ops = _operands(k)
    if ops is None:
        return out
    a, b = ops
    for ax in range(k.rank):
        size = k.full_shape[ax]
        if k.axis_types[ax] not in TILE_TYPES or not isinstance(size, int):
            continue
        va, vb = _varies(a, ax), _varies(b, ax)
        if va or vb:
            out["K" if va and vb else "M" if va else "N"] *= size
    return out


def _targets(k: Kernel, register_tile: dict[str, int]) -> dict[str, int]:
    """The tile extents (`tile_extents`) the default tile of `k` (staged by `_tile`) would have on axes that every
    amount divides: 128x128x32 on tensor cores (fp16), 128x128x8 on FMA units (less with a smaller `register_tile`:
    padding doesn't pay for the parallelism that asked for it)."""
    tiles = dict(TC_TILES if k.tensor_core is not None else FMA_TILES)
    n_dim, m_dim, k_dim = k.tensor_core.dims if k.tensor_core is not None else (1, 1, 1)
    regs = {"M": max(tiles["M"]), "N": max(tiles["N"])}
    warps_m = max(tiles["LM"])
    if k.tensor_core is None:
        regs = {w: min(regs[w], register_tile[w]) for w in regs}
    else:
        warps_m = min(warps_m, TC_WARPS // max(tiles["LN"]))
    return {
        "M": regs["M"] * warps_m * m_dim,
        "N": regs["N"] * max(tiles["LN"]) * n_dim,
        "K": max(tiles["K"], default=1) * k_dim,
    }


def _padding(k: Kernel, which: str, axes: list[int], have: int, want: int, loose: bool) -> tuple[int, int, int] | None:
    """The best (tile, axis, padded size) among `axes` of kind `which` for a tile over `have` (at most `want`): the
    largest tile that adds at most 1/`PAD_WASTE`; with `loose` (M and N), the tile largest for the work it does (its
    size over the padding's factor; on a tie, the smaller padding), up to doubling an axis (a 7-tap window to 8)."""
    best: tuple[float, int, int, int, int] | None = None  # score, -padding, tile, axis, padded size
    for axis in axes:
        size = k.full_shape[axis]
        if not isinstance(size, int):
            continue
        tile = want
        while tile > have:
            padded = -(-size // tile) * tile
            if loose and padded <= 2 * size and tile * size / padded > have:
                score = tile * size / padded
            elif padded * PAD_WASTE <= size * (PAD_WASTE + 1):
                score = tile
            else:
                tile //= 2
                continue
            if best is None or (score, size - padded) > best[:2]:
                best = (score, size - padded, tile, axis, padded)
            if not loose:
                break
            tile //= 2
    return None if best is None else best[2:]


def _paddings(k: Kernel, have: dict[str, int], want: dict[str, int], loose: bool = False) -> list[Opt]:
    """PADTOs that make an axis of `k` of each kind a multiple of a larger tile than `have` (at most `want`, see
    `_padding`); with `loose`, a second axis of M and of N too, for the warps along it (a 7x7 window's two taps)."""
    opts = []
    n_globals = len(k.axes(AxisType.GLOBAL))
    for which in ("M", "N", "K"):
        wide = loose and which != "K"
        axes, floor, target = _candidates(k, which), have[which], want[which]
        for _ in range(2 if wide else 1):
            best = _padding(k, which, axes, floor, target, wide)
            if best is None:
                break
            tile, axis, padded = best
            axes = [a for a in axes if a != axis]
            # the second axis: whatever tile is left of the target, for the warps
            floor, target = 1, max(2, target // tile)
            if padded == k.full_shape[axis]:
                continue
            kind = AxisType.REDUCE if which == "K" else AxisType.GLOBAL
            index = k.axes(kind).index(axis) + (n_globals if which == "K" else 0)
            opts.append(Opt(OptOps.PADTO, index, tile))
    return opts


def _cost(k: Kernel, work: float) -> tuple[float, float]:
    """Bytes loaded per FLOP of a staged tile, up to a constant: 1/M + 1/N of its extents, times the work the padding
    adds (`work`, padded over real), rounded to 5%; then per reduction element, barriers (1/K): a padding that only
    lengthens the reduction step to the full tile pays when it adds under 5%."""
    e = tile_extents(k)
    return round(math.log((1 / e["M"] + 1 / e["N"]) * work, 1.05)), 1 / e["K"]


WGMMA_TILES = ((256, 2, 1), (128, 2, 1), (128, 1, 2), (256, 1, 1), (128, 1, 1), (64, 2, 1), (64, 1, 1), (128, 2, 2))
"""Tiles on a tensor core that reads its operands from shared memory (wgmma, `WGMMA=1`), the default first: (the
instruction's N, warpgroups along M, 64-row tiles per warpgroup along M). The default, 128 x 256 outputs per
workgroup from two warpgroups of 64 x 256, is the shape the vendor's Hopper kernels use for large fp16 matmuls; 128
accumulators per thread, 184 registers and no spills on sm_90a; with 4 stages each step's instructions run on into
the next (`staging.in_flight`). The last, 256 x 128 from two warpgroups of two 64 x 128 tiles (the same registers),
the other shape the vendor's kernels use, comes after the smaller tiles that fit wherever it does: for BEAM. Not yet
timed on a GPU."""
WGMMA_K = (4, 2)
"""UNROLL of the K step on wgmma tiles: 64 elements a step (fp16 rows of 128 bytes, the widest swizzle), or 32."""


def _shared_core_kernels(k: Kernel, pad: int) -> list[Kernel]:
    """`k` with each tensor core that reads its operands from shared memory and fits it (TC opt, padding its axes to
    the core's tile where `pad`), in the renderer's order."""
    out = []
    for select, tc in enumerate(k.renderer.tensor_cores):
        if not tc.shared_operands:
            continue
        for match in range(TC_MATCHES):
            trial = k.copy()
            try:
                trial.apply_opt(Opt(OptOps.TC, match, (select, pad)))
            except KernelOptError:
                continue
            out.append(trial)
            break
    return out


def wgmma_tiles(k: Kernel, stages: tuple[int, ...] = DEEP_STAGES) -> list[Kernel]:
    """Staged tiles of the matmul-like kernel `k` (no opts yet) on tensor cores that read shared memory, in the
    order of `WGMMA_TILES` and `WGMMA_K`, each with the deepest of `stages` that fits the shared memory; first those
    whose padding to the core's tile adds at most 1/`PAD_WASTE` of the work (a convolution's 64 output channels take
    the N = 64 core rather than twice the work on the default's; a weight gradient's 576 the N = 128 one, padded
    to 640), then the others, least padded first: empty unless `WGMMA=1` and the renderer has such a core that
    fits."""
    from lazygrad_uop.config import WGMMA

    if not WGMMA or not any(tc.shared_operands for tc in k.renderer.tensor_cores):
        return []
    work = math.prod(int(s) for s in k.full_shape)
    ranked: list[tuple[int, Kernel]] = []
    for pad in (0, 1):
        cores = {t.tensor_core.dims[0]: t for t in _shared_core_kernels(k, pad) if t.tensor_core is not None}
        for rank, tile in _shared_tiles(cores, stages):
            if tile.applied_opts not in [o.applied_opts for _, o in ranked]:
                ranked.append((rank, tile))

    def key(rt: tuple[int, Kernel]) -> tuple[float, int]:
        # the cheap ones by rank (at one rank the unpadded first: the sort is stable), then by the work they add
        ratio = math.prod(int(s) for s in rt[1].full_shape) / work
        return (0.0 if ratio * PAD_WASTE <= PAD_WASTE + 1 else ratio, rt[0])

    return [t for _, t in sorted(ranked, key=key)]


def _shared_tiles(cores: dict[int, Kernel], stages: tuple[int, ...]) -> list[tuple[int, Kernel]]:
    """The tiles of `WGMMA_TILES` and `WGMMA_K` on the kernels `cores` (by the core's N) that stage, each with its
    rank in that order."""
    out = []
    for rank, (n, lm, m) in enumerate(WGMMA_TILES):
        if n not in cores:
            continue
        for unroll in WGMMA_K:
            tile = cores[n].copy()
            if not all(_apply_exact(tile, which, amount) for which, amount in (("LM", lm), ("M", m), ("K", unroll))):
                continue
            for n_stages in stages:
                staged = tile.copy()
                try:
                    staged.apply_opt(Opt(OptOps.STAGE, None, n_stages))
                except KernelOptError:
                    continue
                # only where both operands are copied 16 bytes at a time, asynchronously: narrower copies (an
                # unaligned window of a convolution) would starve the instruction, which the mma.sync tiles feed
                # from registers instead
                if all(o.vector * o.load.dtype.itemsize == 16 for o in plan(staged)):
                    out.append((rank * len(WGMMA_K) + WGMMA_K.index(unroll), staged))
                break
    return out


def staged_matmul(k: Kernel) -> bool:
    """Apply the default tiles of the module docstring to `k` when it is matmul-like and its renderer has local and
    shared memory, padding odd axes to whole tiles where that pays (`PAD_WASTE`); returns whether it did (`k` is
    left unchanged otherwise). With `WGMMA=1`, the first of `wgmma_tiles` where one fits."""
    r = k.renderer
    if not (r.has_local and r.has_shared and k.use_locals) or k.applied_opts or _operands(k) is None:
        return False
    if any(_extent(k, which) < MIN_SIZE for which in ("M", "N", "K")):
        return False
    if wgmma := wgmma_tiles(k):
        k.__dict__.update(wgmma[0].__dict__)
        return True
    k_in = k
    k = without_padding_selects(k)
    register_tile = fma_register_tile(k)
    best = _tile(k, register_tile)
    have = tile_extents(best) if best is not None else {"M": 1, "N": 1, "K": 1}
    # the targets need the tensor core the tile got (its dims); without a tile, those of a first TC alone
    probe = best
    if probe is None and r.tensor_cores:
        probe = k.copy()
        try:
            probe.apply_opt(Opt(OptOps.TC, 0, (-1, 1)))
        except KernelOptError:
            probe = k
    want = _targets(probe if probe is not None else k, register_tile)
    plans = [_paddings(k, have, want, loose) for loose in (False, True)] if any(have[w] < want[w] for w in want) else []
    cost = _cost(best, 1.0) if best is not None else None
    for pads in [p for n, p in enumerate(plans) if p and p not in plans[:n]]:
        padded = k.copy()
        try:
            padded.apply_opts(pads)
            tiled = _tile(padded, register_tile)
        except KernelOptError:
            tiled = None
        work = math.prod(int(s) for s in padded.full_shape) / math.prod(int(s) for s in k.full_shape)
        if tiled is not None and (cost is None or _cost(tiled, work) < cost):
            best, cost = tiled, _cost(tiled, work)
    if best is None:
        return False
    k_in.__dict__.update(best.__dict__)
    return True


TC_VARIANTS = {
    "M": (2, 4),
    "N": (2, 4, 8),
    "warps": ((1, 4), (2, 2), (4, 1), (2, 4), (4, 2)),
    "K": (1, 2),
}
"""The staged tensor-core tiles BEAM tries around the default: register tile (UPCAST M, N), warps (LOCAL M x N), and
K step (UNROLL), each combination with one, two and (where its buffers fit the shared memory) three and four pipeline
stages."""
FMA_VARIANTS = {
    "M": (4, 8),
    "N": (4, 8),
    "warps": ((8, 8), (16, 8), (8, 16), (16, 16)),
    "K": (2, 4),
}
"""The same for FMA tiles (threads rather than warps along M x N)."""


def _apply_exact(k: Kernel, which: str, amount: int) -> bool:
    """`amount` (1: nothing) on the innermost axis of kind `which` that takes it; whether one did."""
    if amount == 1:
        return True
    op = {"M": OptOps.UPCAST, "N": OptOps.UPCAST, "LM": OptOps.LOCAL, "LN": OptOps.LOCAL, "K": OptOps.UNROLL}[which]
    kind = AxisType.REDUCE if which == "K" else AxisType.GLOBAL
    for axis in _candidates(k, which):
        try:
            k.apply_opt(Opt(op, k.axes(kind).index(axis), amount))
            return True
        except KernelOptError:
            continue
    return False


def staged_tiles(k: Kernel) -> list[Kernel]:
    """Staged tiles of the matmul-like kernel `k` (no opts applied yet) for BEAM to time: every combination of
    `TC_VARIANTS` (tensor cores) or `FMA_VARIANTS` that fits the kernel exactly, staged with two pipeline stages
    and, for tensor cores on a renderer with asynchronous copies to pipeline, with one, three and four. Each kernel
    returned has passed every opt's checks (threads, registers, shared memory), so it compiles; none repeats
    another's opts.
    Empty when `k` is not matmul-like, has opts, or its renderer lacks local and shared memory."""
    r = k.renderer
    if not (r.has_local and r.has_shared and k.use_locals) or k.applied_opts or _operands(k) is None:
        return []
    if any(_extent(k, which) < MIN_SIZE for which in ("M", "N", "K")):
        return []
    base, variants = k.copy(), FMA_VARIANTS
    for match in range(TC_MATCHES if r.tensor_cores else 0):
        trial = k.copy()
        try:
            trial.apply_opt(Opt(OptOps.TC, match, (-1, 1)))
        except KernelOptError:
            continue
        base, variants = trial, TC_VARIANTS
        break
    if base.tensor_core is None and len(staged_loads(base)) != 2:
        return []
    out: dict[tuple[Opt, ...], Kernel] = {}
    # the stages differ only where the copies can be asynchronous: tensor-core tiles on such a renderer
    stages = (2, 3, 4, 1) if r.has_async_copy and base.tensor_core is not None else (2,)
    for m in variants["M"]:
        for n in variants["N"]:
            for lm, ln in variants["warps"]:
                for step in variants["K"]:
                    tile = base.copy()
                    plan_ = (("M", m), ("N", n), ("LN", ln), ("LM", lm), ("K", step))  # the default's order
                    if not all(_apply_exact(tile, which, amount) for which, amount in plan_):
                        continue
                    for n_stages in stages:
                        staged = tile.copy()
                        try:
                            staged.apply_opt(Opt(OptOps.STAGE, None, None if n_stages == 2 else n_stages))
                        except KernelOptError:
                            continue
                        out.setdefault(tuple(staged.applied_opts), staged)
    for tile in wgmma_tiles(k, (4, 3, 2)):
        out.setdefault(tuple(tile.applied_opts), tile)
    return list(out.values())
