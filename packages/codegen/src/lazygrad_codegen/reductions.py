"""Long reductions and reductions along rows: how a reduction is cut into partial reductions of bounded length
(`split_plan`, which the frontend applies while it builds the graph; on GPUs `axis_split` instead cuts column
reductions and reductions around a kept axis along one reduced axis), and the workgroups a reduction to many outputs
gets on GPUs (`group_rows`: a workgroup, or one warp for short rows, per output; `group_outer_rows`: the same with
its threads also across an axis outside the rows, for BatchNorm statistics).

A reduction keeps `accumulator_lanes(renderer)` partial results per output side by side: the threads of a workgroup
on GPUs, the vector lanes of the unrolled loop on CPUs, one on a device without either. Each lane adds its elements
in sequence, so a float sum's rounding error grows with the elements per lane; bounding them by `SEQUENTIAL` keeps it
near that of a pairwise sum. A longer reduction is cut into `parts` partial reductions of `length` consecutive
elements each, stored, and reduced again together with the elements left over, as often as needed; a reduction to
fewer outputs than the device has compute units is cut too, so that every unit gets a part.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from lazygrad_codegen.kernel import AxisType, Kernel, KernelOptError, Opt, OptOps, warp_size
from lazygrad_uop.device import Renderer
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker, View

# the elements one accumulator lane adds in sequence at most: a float32 sum of 64 equal values is off by ~1e-6
SEQUENTIAL = 64
# threads a GPU workgroup gives one long row (`group_rows`); also the lanes a split plan counts on there
ROW_THREADS = 256
# a part of a split reduction keeps each lane busy for at least this many steps
MIN_STEPS = 4
# shorter reductions are not cut only to spread them over more compute units: a kernel launch costs more
PARALLEL_MIN = 1 << 15


@dataclass(frozen=True)
class SplitPlan:
    """A reduction of N elements as `parts` partial reductions of `length` consecutive elements each, then one
    reduction of their results together with the `N - parts * length` elements left over (fewer than `length`),
    padded with the reduction's identity to `final` elements (whole lanes)."""

    parts: int
    length: int
    final: int


def accumulator_lanes(renderer: Renderer) -> int:
    """Partial results one output's reduction keeps side by side on `renderer`: a workgroup's threads on a GPU,
    four vectors of the unrolled loop on a CPU (the heuristic's unroll), else one."""
    if renderer.has_local and renderer.has_shared:
        return min(ROW_THREADS, renderer.max_workgroup_threads)
    if renderer.vector_width > 1:
        return 4 * renderer.vector_width
    return 1


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def split_plan(renderer: Renderer, outputs: int, length: int, op: Ops) -> SplitPlan | None:
    """How to cut a reduction with `op` (ADD, MUL, MAX) of `length` elements to each of `outputs` outputs into
    partial reductions, or None to leave it whole: cut when a lane would add more than `SEQUENTIAL` elements and the
    partial results stay fewer than the input (few outputs, a long axis), or when there are fewer outputs than the
    device's compute units and enough elements to share among them."""
    if op not in (Ops.ADD, Ops.MUL, Ops.MAX) or outputs < 1 or length < 2:
        return None
    lanes = accumulator_lanes(renderer)
    longest = lanes * SEQUENTIAL
    parts = 1
    if length > longest and outputs * longest <= length:
        parts = -(-length // longest)
    units = max(renderer.compute_units, 1)
    if outputs < units and length >= PARALLEL_MIN:
        # each part at least MIN_STEPS steps of every lane
        parts = max(parts, min(-(-2 * units // outputs), length // (lanes * MIN_STEPS)))
    if parts < 2:
        return None
    # parts of whole lanes; of equal length where some length near the one wanted divides the reduction, so that no
    # remainder needs a kernel of its own
    want = min(longest, max(lanes, length // parts // lanes * lanes))
    exact = [n for n in range(want, max(lanes, want // 2) - 1, -lanes) if length % n == 0]
    part = exact[0] if exact else want
    final = length // part + length % part
    return SplitPlan(length // part, part, _round_up(final, lanes) if final > lanes else final)


# a column reduction's parts sum at most this many rows each (the parts' kernel is a short column sum), and at least
# COLUMN_PART_MIN: fewer would store nearly as many partial results as it reads
COLUMN_PART_ROWS = 64
COLUMN_PART_MIN = 8


@dataclass(frozen=True)
class AxisSplit:
    """A reduction cut along one of its reduced axes: `axis` split into `parts` (outer) times `shape[axis] // parts`
    (inner); the first reduction reduces the inner part and the reduced axes after `axis` (`parts` becomes an output
    axis of it), the second the parts and the reduced axes before `axis`. No axis is moved, so both kernels read
    their inputs through the same strides as the unsplit one."""

    axis: int
    parts: int
    """1: leave the reduction whole (one kernel serves it better than any cut)."""


def _divisors(n: int) -> list[int]:
    return [p for p in range(2, n + 1) if n % p == 0]


def axis_split(renderer: Renderer, shape: tuple[int, ...], axes: tuple[int, ...], op: Ops) -> AxisSplit | None:
    """How to cut a reduction with `op` of a tensor of `shape` over `axes` (sorted) along one reduced axis (the first
    of more than one element), on a GPU (a renderer with local and shared memory; None elsewhere, and where a cut
    along the flattened reduced axes, `split_plan`, or none serves):

    - a column reduction (an output axis after the reduced ones, the one that neighbouring addresses run along)
      with too few outputs to give each compute unit `ROW_THREADS` threads of vectors of 4: parts of
      `COLUMN_PART_MIN` to `COLUMN_PART_ROWS` rows, so that the partial results are that many (the 4096x4096
      `max(0)` had 8 workgroups of 32 threads);
    - a reduction over axes with an output axis between them (a BatchNorm statistic of an NCHW tensor) that
      `split_plan` would cut: parts of whole rows of the axes after the cut one, as many or more than the plan's, each
      no longer than a plan's part (its flattened cut crossed images, and the index of every element became
      divisions and remainders); whole (`parts` 1) where only the plan's spreading over the device would cut and
      outputs enough for half the compute units have a workgroup each."""
    if not (renderer.has_local and renderer.has_shared) or op not in (Ops.ADD, Ops.MUL, Ops.MAX) or not axes:
        return None
    sized = [a for a in axes if shape[a] > 1]
    if not sized:
        return None
    first = sized[0]
    length = math.prod(shape[a] for a in axes)
    outputs = math.prod(d for a, d in enumerate(shape) if a not in axes)
    kept = [b for b, d in enumerate(shape) if b not in axes and d > 1]
    if kept and kept[-1] > sized[-1]:
        if length <= COLUMN_PART_ROWS or outputs * length < PARALLEL_MIN:
            return None
        need = -(-max(renderer.compute_units, 1) * ROW_THREADS * 4 // outputs)
        fits = [p for p in _divisors(shape[first]) if length // p >= COLUMN_PART_MIN]
        if need < 2 or not fits:
            return None
        short = [p for p in fits if length // p <= COLUMN_PART_ROWS]
        parts = next((p for p in short if p >= need), next((p for p in fits if p >= need), fits[-1]))
        return AxisSplit(first, parts)
    if not any(first < b < sized[-1] for b in kept):
        return None
    plan = split_plan(renderer, outputs, length, op)
    if plan is None:
        return None
    longest = accumulator_lanes(renderer) * SEQUENTIAL
    if 2 * outputs >= renderer.compute_units and outputs * longest > length:
        # cut only to spread few outputs over the device, but a workgroup per output (`group_outer_rows`) already
        # covers half of it: one kernel, not a partial reduction and a kernel per output buffer to combine it
        return AxisSplit(first, 1)
    fits = [p for p in _divisors(shape[first]) if p >= plan.parts and length // p <= longest]
    return AxisSplit(first, fits[0]) if fits else None


def _stride(st: ShapeTracker, axis: int) -> int | None:
    s = st.real_strides(ignore_valid=True)[axis]
    return s if isinstance(s, int) else None


def _is_matmul(k: Kernel, loads: list[ShapeTracker]) -> bool:
    """Whether two inputs are each reused along a different output axis (a matmul, a convolution): those want
    register tiles, not a workgroup per output."""
    axes = [a for a in k.axes(AxisType.GLOBAL) if k.full_shape[a] != 1]
    for i in axes:
        for j in axes:
            if i == j:
                continue
            on_i = [st for st in loads if _stride(st, i) == 0 and _stride(st, j) != 0]
            on_j = [st for st in loads if _stride(st, j) == 0 and _stride(st, i) != 0]
            if on_i and on_j:
                return True
    return False


def group_rows(k: Kernel, few: int) -> bool:
    """On a GPU, a workgroup per output for a reduction to more than `few` outputs along rows its biggest input is
    contiguous in (softmax, layernorm, the parts of a split reduction; not a matmul): `ROW_THREADS` threads for long
    rows, fewer or one warp for short ones, each thread reading vectors of 16 bytes that its neighbours continue
    (GROUP on the inner part of the row, after an UNROLL by the vector), rows that no group divides padded. Returns
    whether it applied."""
    r = k.renderer
    reduce_axes = k.axes(AxisType.REDUCE)
    if not reduce_axes or not (r.has_local and r.has_shared) or k.tensor_core is not None:
        return False
    if k.axes(AxisType.GROUP_REDUCE, AxisType.UPCAST, AxisType.UNROLL, AxisType.LOCAL):
        return False
    outputs = 1
    for s in k.sizes(AxisType.GLOBAL):
        outputs *= s if isinstance(s, int) else few + 1
    axis = reduce_axes[-1]
    size = k.full_shape[axis]
    loads = [st for ld, st in k.loads() if ld.src[1] in k.full_views]
    biggest = max(loads, key=lambda st: st.real_size(), default=None)
    if outputs <= few or not isinstance(size, int) or biggest is None or _stride(biggest, axis) != 1:
        return False
    if _is_matmul(k, loads):
        return False
    warp = warp_size(r) or 32
    limit = r.max_workgroup_threads
    # the threads of one row: more for long rows, each with at least MIN_STEPS vectors; one warp for short rows
    threads = next((t for t in (ROW_THREADS, 128, 64) if t <= limit and size >= t * MIN_STEPS * 4), 0)
    if not threads:
        threads = warp if warp <= limit and size >= warp * 2 else 0
    if not threads:
        return False
    itemsize = max((ld.dtype.itemsize for ld, _ in k.loads()), default=4)
    vector = min(4, max(1, 16 // itemsize)) if r.supports_float4 else 1
    n = reduce_axes.index(axis)
    opts: list[Opt] = []
    if vector > 1 and size % (vector * threads) == 0:
        opts.append(Opt(OptOps.UNROLL, n, vector))
    elif size % threads:
        # a row no group divides: padded to whole groups (sums read zeros there, other reductions their identity)
        opts.append(Opt(OptOps.PADTO, len(k.axes(AxisType.GLOBAL)) + n, threads))
    opts.append(Opt(OptOps.GROUP, n, threads))
    try:
        k.copy().apply_opts(opts)
    except KernelOptError:
        return False
    k.apply_opts(opts)
    return True


# threads of one workgroup of a reduction whose rows are read by several threads of it (`group_outer_rows`)
OUTER_ROW_THREADS = 512
# warps per compute unit that a reduction to few outputs is spread over, all its workgroups together
OUTER_ROW_WARPS = 32
# threads of a workgroup that `group_outer_rows` prefers at least: fewer workgroups of one or two warps fit an SM
OUTER_ROW_MIN = 128


def group_outer_rows(k: Kernel) -> bool:
    """On a GPU with warp shuffles, a reduction over rows its biggest input is contiguous along and over axes outside
    them (a BatchNorm statistic of an NCHW tensor: per channel C, the H*W values of each of N images): a workgroup per
    output, its threads split across each row (lidx0: a warp reads neighbouring addresses, in 16-byte vectors where
    the row allows) and across the outer reduce axis (GROUPTOP), so that each output gets up to `OUTER_ROW_THREADS`
    threads and the device `OUTER_ROW_WARPS` warps per compute unit. A row shorter than two warps (49 values of a 7x7
    map) is padded to one. `group_rows` gave such kernels one workgroup of 32 to 256 threads per output over the row
    alone (64 channels: 64 workgroups looping over the batch), or, for short rows, a thread per output walking 49
    values at a stride of 49 values from its neighbours. Returns whether it applied."""
    r = k.renderer
    warp = warp_size(r)
    reduce_axes = k.axes(AxisType.REDUCE)
    if not (r.has_local and r.has_shared and warp and k.use_locals) or k.applied_opts or len(reduce_axes) < 2:
        return False
    if k.tensor_core is not None or not k.reduceops:
        return False
    sizes = [k.full_shape[a] for a in k.axes(AxisType.GLOBAL) + reduce_axes]
    if not all(isinstance(s, int) for s in sizes):
        return False
    loads = [(ld, st) for ld, st in k.loads() if ld.src[1] in k.full_views]
    if not loads or _is_matmul(k, [st for _, st in loads]):
        return False
    row_axis, outer_axis = reduce_axes[-1], reduce_axes[-2]
    biggest = max(loads, key=lambda x: x[1].real_size())[1]
    if _stride(biggest, row_axis) != 1:
        return False
    row, outer = int(k.full_shape[row_axis]), int(k.full_shape[outer_axis])
    outputs = math.prod(int(s) for s in k.sizes(AxisType.GLOBAL))
    limit = min(OUTER_ROW_THREADS, r.max_workgroup_threads)
    itemsize = max((ld.dtype.itemsize for ld, _ in loads), default=4)
    vector = min(4, max(1, 16 // itemsize)) if r.supports_float4 else 1
    # threads along the row: whole vectors of it where some group of at least 16 threads (256 bytes) divides it,
    # else single elements (groups that divide the row first), the row padded to whole groups where that wastes at
    # most a sixteenth (a row shorter than a warp's MIN_STEPS elements: to one warp)
    plans = [(t, vector) for t in (256, 128, 64, 32, 16) if vector > 1 and row % (t * vector) == 0]
    plans = [(t, v) for t, v in plans if row >= t * v * MIN_STEPS and t <= limit]
    padded = {t: -(-row // t) * t for t in (256, 128, 64, warp) if t <= limit}
    scalar = [(t, 1) for t, p in padded.items() if row >= t * MIN_STEPS and (p - row) * 16 <= p]
    scalar.sort(key=lambda plan: padded[plan[0]] != row)  # groups that divide the row first
    plans += scalar or ([(warp, 1)] if warp in padded and 2 * row >= warp else [])
    # threads across the outer axis: enough warps for the device, within the workgroup; the first plan that gives
    # workgroups of OUTER_ROW_MIN threads, else of at least a warp
    chosen: list[tuple[int, int, int, int]] = []
    for row_threads, v in plans:
        want = -(-max(r.compute_units, 1) * OUTER_ROW_WARPS * warp // (outputs * row_threads))
        want = max(want, -(-OUTER_ROW_MIN // row_threads))
        across = [g for g in (1, 2, 4, 8, 16, 32) if row_threads * g <= limit and outer % g == 0]
        g = next((g for g in across if g >= want), across[-1])
        if row_threads * g >= warp:
            chosen.append((row_threads * g, row_threads, v, g))
    if not chosen:
        return False
    _, row_threads, unroll, g = next((c for c in chosen if c[0] >= OUTER_ROW_MIN), chosen[0])
    pad = row % row_threads != 0
    trial = k.copy()
    try:
        # the outer group first: its threads are numbered after the row's, which get lidx0 (neighbouring addresses)
        if g > 1:
            trial.apply_opt(Opt(OptOps.GROUPTOP, len(reduce_axes) - 2, g))
        n = len(trial.axes(AxisType.REDUCE)) - 1
        if unroll > 1:
            trial.apply_opt(Opt(OptOps.UNROLL, n, unroll))
        if pad:
            trial.apply_opt(Opt(OptOps.PADTO, len(trial.axes(AxisType.GLOBAL)) + n, row_threads))
        trial.apply_opt(Opt(OptOps.GROUP, n, row_threads))
    except KernelOptError:
        return False
    k.__dict__.update(trial.__dict__)
    return True


# *** split-K for matmul-like reductions to few outputs (a convolution's weight gradient) ***

SPLIT_K_MIN = 256
"""Each part of a split matmul-like reduction sums at least this many products per output: enough steps of the
staged tile's pipeline to pay for the workgroup's start and for storing its partial tile. At 1024, ResNet-18's
1x1 downsampling weight gradients (a reduction of 64 x 7 x 7 at 512x256 outputs) stayed whole: 8 workgroups on an
H200's 132 multiprocessors, 0.67 ms at 1.2 TFLOPS."""
SPLIT_K_MAX = 256
"""At most this many parts: their sum (a second, short kernel) reads `parts` values per output. Only a reduction
whose unsplit kernel has one or two workgroups asks for more than 64 (a workgroup per multiprocessor), so the parts
hold at most 256 x two tiles of values. At 64, ResNet-18's stem weight gradient on an H100 (TF32, batch 64, 64 x 147
outputs, one tile) took 1.38 ms in 64 workgroups for 132 multiprocessors."""


def _gemm_ast(dtype: DType, m: tuple[int, ...], n: tuple[int, ...], k: tuple[int, ...]) -> UOp:
    """The kernel `C[m, n] = sum_k A[m, k] * B[k, n]` over the axes `m`, `n` and `k` (sizes), products and sums in
    float32 for 16-bit `dtype`. Each operand's axes lie with gaps between them (strides twice the contiguous ones,
    the last reduce axis contiguous), so that no two axes merge: a convolution's window axes stay apart from its
    channels, as in the kernel the scheduler makes of it."""
    acc = dtypes.float32 if dtype.itemsize < 4 else dtype
    full = (*m, *n, *k)

    def operand(slot: int, axes: list[int]) -> UOp:
        strides, size = [0] * len(full), 1
        for a in reversed(axes):
            strides[a] = size
            size *= 2 * full[a]
        view = ShapeTracker((View.create(full, tuple(strides)),))
        x = UOp(Ops.LOAD, dtype, (UOp(Ops.DEFINE_GLOBAL, dtype.ptr(size), arg=slot), UOp(Ops.VIEW, arg=view)))
        return x.cast(acc) if dtype != acc else x

    reduce_axes = list(range(len(m) + len(n), len(full)))
    a = operand(1, [*range(len(m)), *reduce_axes])
    b = operand(2, [*range(len(m), len(m) + len(n)), *reduce_axes])
    out = ShapeTracker.from_shape((*m, *n, *(1,) * len(k)))
    value = UOp(Ops.REDUCE_AXIS, acc, (a * b,), (Ops.ADD, tuple(reduce_axes)))
    buffer = UOp(Ops.DEFINE_GLOBAL, acc.ptr(out.real_size()), arg=0)
    return UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (buffer, UOp(Ops.VIEW, arg=out), value)),))


SPLIT_K_WARPS = 4
"""A split reduction gives each compute unit at least this many warps, all workgroups together (a tensor-core tile of
4 warps; a workgroup narrower than a warp still takes a whole one). Measured at 8 on an H200 (ResNet-18, TF32, batch
64): the stem's weight gradient went from 4.39 to 4.26 ms, each 64-channel 3x3 one from 0.77 to 0.85 ms."""


@dataclass(frozen=True)
class GemmLaunch:
    """How the default opts launch a matmul-like kernel: `workgroups` of `threads` threads each; a split of its
    reduction (`split_k_parts`) gives each compute unit at least `warps_per_unit` warps in all (`SPLIT_K_WARPS` on
    tensor cores, `tiling.FMA_WARPS_PER_UNIT` on FMA units)."""

    workgroups: int
    threads: int
    warps_per_unit: int = SPLIT_K_WARPS


def gemm_launch(
    renderer: Renderer, dtype: DType, m: tuple[int, ...], n: tuple[int, ...], k: tuple[int, ...]
) -> GemmLaunch:
    """The launch the default opts give a matmul-like kernel of `dtype` operands with output axes `m` (read by A
    only) and `n` (B only) and reduce axes `k` (both), each axis kept apart: the tile actually chosen
    (`lazygrad_codegen.tiling`: 128x128 where the axes allow, 64 wide along a 64-channel axis, none along a 3-tap
    window axis), counted over every axis. One workgroup of one thread on a device without local memory."""
    if not (renderer.has_local and renderer.has_shared):
        return GemmLaunch(1, 1)
    return _gemm_launch(renderer, dtype, m, n, k)


@functools.lru_cache(maxsize=256)
def _gemm_launch(
    renderer: Renderer, dtype: DType, m: tuple[int, ...], n: tuple[int, ...], k: tuple[int, ...]
) -> GemmLaunch:
    # cached: a model's backward asks once per convolution layer, most of them alike (Renderers hash by identity).
    # The default opts, never a BEAM search: this kernel only stands for the real one's shape
    from lazygrad_codegen.heuristic import hand_coded_optimizations
    from lazygrad_codegen.tiling import FMA_WARPS_PER_UNIT

    kernel = hand_coded_optimizations(Kernel(_gemm_ast(dtype, m, n, k), renderer))
    # FMA tiles copy their operands synchronously: only other warps hide the latency of those copies
    warps = FMA_WARPS_PER_UNIT if kernel.staged and kernel.tensor_core is None else SPLIT_K_WARPS
    return GemmLaunch(math.prod(int(s) for s in kernel.sizes(AxisType.GLOBAL)), kernel.workgroup_threads(), warps)


def split_k_parts(renderer: Renderer, launch: GemmLaunch, axis: int, length: int) -> int:
    """Into how many parts (a divisor of `axis`, the size of the reduced axis to cut) to cut a matmul-like reduction
    of `length` products per output whose unsplit kernel has `launch` (`gemm_launch`), so that a GPU with local
    memory gets at least one workgroup per compute unit and the launch's `warps_per_unit` in all; 1 to leave it
    whole (CPUs, enough work already, a reduction too short to share). The parts are summed by a second kernel."""
    units = renderer.compute_units
    if not (renderer.has_local and renderer.has_shared) or units < 2 or axis < 2:
        return 1
    warps = launch.workgroups * -(-launch.threads // (warp_size(renderer) or 32))
    want = max(-(-units // max(launch.workgroups, 1)), -(-units * launch.warps_per_unit // max(warps, 1)))
    if want < 2:
        return 1
    fits = [p for p in range(2, min(axis, SPLIT_K_MAX) + 1) if axis % p == 0 and length // p >= SPLIT_K_MIN]
    return next((p for p in fits if p >= want), fits[-1] if fits else 1)
