"""The opts a kernel gets by default (without BEAM): a few rules that are right for most kernels.

In order:

0. on GPUs with local memory, matmul-like kernels (convolutions too) get multi-warp workgroup tiles with their
   operands staged through local memory (`lazygrad_codegen.tiling`);
1. tensor cores, when the renderer has some and the kernel is a matmul they fit (padding allowed);
2. on GPUs, a reduction over rows and an axis outside them (BatchNorm statistics) a workgroup per output split
   across the row and that axis (`reductions.group_outer_rows`); a reduction along rows a workgroup per row
   (`reductions.group_rows`); a grouped reduction (GROUPTOP) when the output is too small to keep the device busy
   but the reduction is long; on GPUs with warp shuffles (`warp_size`), a reduction to very few outputs gets the
   largest workgroup (up to 1024 threads, whole warps that combine by shuffles), and a reduction whose length no such
   group divides is padded to a multiple of one first;
3. register reuse: a load that does not depend on an output axis (stride 0 along it, as B along the rows of a matmul)
   is read once for every output along that axis a thread computes, so such axes are upcast, first and widest one
   that an input is contiguous along (the output's contiguous one when it is such an axis; a multiple of the vector
   width, so loads are vectors), until the accumulators fill the register budget (`accumulator_budget`). When no
   input is contiguous along an output axis but two are along the reduction (`x @ W.T`, `q @ k^T`), dot products
   instead (`_dot_tiles`): the reduction unrolled by one vector, each output a vector of partial sums, 4x4 tiles;
4. without such reuse, vectors anyway: a reduction along the biggest input's contiguous axis unrolled so each step
   reads whole vectors; a reduction across it (a column sum) upcast along it as far as the accumulators allow, so
   each strided step reads a long run; elementwise kernels upcast along the output's contiguous axis;
5. short reduce axes unrolled completely (a 3x3 convolution window becomes straight-line code);
6. on GPUs, workgroups: LOCAL on the output axes up to 128 threads;
7. on CPUs, the loop order of a matmul: the axis with the widest upcast outermost, so the other operand's tile is
   what streams through the cache while this one's stays.

What assumes a CPU: the upcast widths come from the renderer's `vector_width` (the LLVM renderer's vectors) and
`max_upcast`; with `vector_width` 1 (GPUs, C) the same rules give 4x4 output tiles, float4 loads where
`supports_float4` allows, and workgroups.
"""

from __future__ import annotations

from lazygrad_codegen.bandwidth import ELEMENTWISE_THREADS, elementwise_workgroups
from lazygrad_codegen.kernel import AxisType, Kernel, KernelOptError, Opt, OptOps, warp_size
from lazygrad_codegen.memory_traffic import SECTOR_BYTES
from lazygrad_codegen.reductions import group_outer_rows, group_rows
from lazygrad_codegen.tiling import staged_matmul
from lazygrad_codegen.vectors import VECTOR_BYTES
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.symbolic import sym_infer
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker


def accumulator_budget(k: Kernel) -> int:
    """Outputs one thread may compute at once: 16 vectors of the renderer's width (a register file holds about
    twice that), within `max_upcast`."""
    return min(k.renderer.max_upcast, 16 * max(1, k.renderer.vector_width))


def _try(k: Kernel, opt: Opt) -> bool:
    try:
        k.apply_opt(opt)
    except KernelOptError:
        return False
    return True


def _stride(st: ShapeTracker, axis: int) -> int | None:
    """The stride of `st` along `axis` when it is one int (None: not a plain stride)."""
    s = st.real_strides(ignore_valid=True)[axis]
    return s if isinstance(s, int) else None


def _first_step(st: ShapeTracker, axis: int) -> int | None:
    """How far the address `st` reads moves from coordinate 0 to 1 of `axis` (the others 0): its stride where it
    has one, else that first step of it (rows of 14 pixels of several images merged into one axis step by 1 within
    a row). None where the axis is 1 long or a coordinate is symbolic."""
    if (s := _stride(st, axis)) is not None:
        return s
    if not all(isinstance(n, int) for n in st.shape) or st.shape[axis] < 2:
        return None
    coords = [UOp.const(dtypes.int32, 0)] * len(st.shape)
    first, _ = st.to_indexed_uops(coords)
    coords[axis] = UOp.const(dtypes.int32, 1)
    second, _ = st.to_indexed_uops(coords)
    return int(sym_infer(second, {})) - int(sym_infer(first, {}))


def _index_among(k: Kernel, axis: int, *types: AxisType) -> int:
    return k.axes(*types).index(axis)


def _divisor(size: object, choices: list[int]) -> int | None:
    """The first of `choices` that divides `size` (an int) and is smaller than or equal to it."""
    if not isinstance(size, int):
        return None
    return next((c for c in choices if c <= size and size % c == 0), None)


class _Globals:
    """The GLOBAL axes of a kernel by their position at the start (GLOBAL axes come first, in order), followed as
    opts split them: upcasting a whole axis removes it, and the ones after it move up."""

    def __init__(self, k: Kernel) -> None:
        self.k = k
        self.now: list[int | None] = list(range(len(k.axes(AxisType.GLOBAL))))

    def axis(self, g: int) -> int | None:
        """The kernel axis that GLOBAL axis `g` (numbered at the start) is now, or None when it is gone."""
        cur = self.now[g]
        return None if cur is None else self.k.axes(AxisType.GLOBAL)[cur]

    def upcast(self, g: int, choices: list[int]) -> int:
        """Upcast GLOBAL axis `g` by the first of `choices` that fits; returns the amount (1 when none fit)."""
        cur, axis = self.now[g], self.axis(g)
        if cur is None or axis is None:
            return 1
        size = self.k.full_shape[axis]
        for amount in choices:
            if isinstance(size, int) and amount <= size and size % amount == 0:
                if _try(self.k, Opt(OptOps.UPCAST, cur, amount)):
                    if amount == size:
                        self.now[g] = None
                        self.now[g + 1 :] = [None if c is None else c - 1 for c in self.now[g + 1 :]]
                    return amount
        return 1


def hand_coded_optimizations(k: Kernel) -> Kernel:
    """Apply the default opts to `k` (see the module docstring) and return it."""
    r = k.renderer
    width = max(1, r.vector_width)
    if r.has_local and r.has_shared and staged_matmul(k):
        return k
    if r.tensor_cores and r.has_local and _tensor_cores(k):
        return k
    if _short_column_sums(k):
        return k
    if r.has_local and r.has_shared and k.reduceops:
        if group_outer_rows(k):
            # rows read by a workgroup's threads together with the axes outside them (BatchNorm statistics)
            return k
        if group_rows(k, FEW_OUTPUTS):
            # a workgroup per row (lazygrad_codegen.reductions): its threads are all the parallelism it needs
            return k
        _group(k)
    budget = accumulator_budget(k)
    g = _Globals(k)
    n_globals = len(g.now)
    store_st = k.stores()[0][1]
    out_contig = [i for i in range(n_globals) if _stride(store_st, i) == 1]
    full_loads = [st for ld, st in k.loads() if ld.src[1] in k.full_views]
    reuse = [
        i
        for i in range(n_globals)
        if any(_stride(st, i) == 0 for st in full_loads) and any(_stride(st, i) != 0 for st in full_loads)
    ]
    # a multiple of the vector width where the axis allows, else part of a vector
    vector_choices = [2 * width, width, 4, 2] if width > 1 else ([4] if r.supports_float4 else [])
    widest: tuple[int, int] | None = None  # (amount, GLOBAL axis) of the widest register-tiling upcast
    # output axes some input can be read along in vectors
    loadable = [i for i in reuse if any(_stride(st, i) == 1 for st in full_loads)]
    if k.reduceops and reuse and width > 1 and not loadable and (along := _dot_axis(k, full_loads)) is not None:
        _dot_tiles(k, g, full_loads, reuse, along)
    elif k.reduceops and reuse:
        # register tiling: an axis the output and an input are contiguous along in vectors, then the others while
        # the accumulators fit
        first = (
            [i for i in loadable if i in out_contig]
            or loadable[:1]
            or [i for i in reuse if i in out_contig]
            or reuse[:1]
        )
        order = first + [i for i in reuse if i not in first]

        # the vector's axis: the first that takes one; where it has no such size (a weight gradient's 147 taps of
        # 3 channels), the next axis an input is read along in vectors, the first one then tiles registers
        def takes_vector(i: int) -> bool:
            axis = g.axis(i)
            return axis is not None and _divisor(k.full_shape[axis], vector_choices) is not None

        vector_axis = order[0]
        if width > 1 and not takes_vector(order[0]):
            vector_axis = next((i for i in order[1:] if i in loadable and takes_vector(i)), order[0])
        order = [vector_axis] + [i for i in order if i != vector_axis]
        for n, i in enumerate(order):
            lanes = k.lanes(AxisType.UPCAST)
            if n == 0 and width > 1:
                choices = vector_choices
            else:
                choices = [c for c in (8, 4, 2) if c * lanes <= budget]
                if n == 1 and vector_axis != first[0]:
                    # the axis the vector went past: odd sizes take an odd tile
                    choices += [c for c in (7, 5, 3) if c * lanes <= budget]
            amount = g.upcast(i, choices)
            if amount > 1 and (widest is None or amount > widest[0]):
                widest = (amount, i)
    elif k.reduceops:
        # vectors along the axis the biggest input is contiguous in: unroll it when it is reduced (a row sum reads
        # whole vectors per step), upcast it when it is an output axis (a column sum keeps a vector of sums)
        biggest = max(full_loads, key=lambda st: st.real_size(), default=None)
        contiguous = [] if biggest is None else [a for a in range(k.rank) if _stride(biggest, a) == 1]
        reduce_axes = k.axes(AxisType.REDUCE)
        if contiguous and contiguous[-1] in reduce_axes and width > 1:
            axis = contiguous[-1]
            amount = _divisor(k.full_shape[axis], [4 * width, 2 * width, width, 4, 2])
            if amount is not None:
                _try(k, Opt(OptOps.UNROLL, reduce_axes.index(axis), amount))
        elif contiguous and contiguous[-1] < n_globals and vector_choices:
            # each step of the reduction reads a strided row: read as much of it as the accumulators hold
            wide = [budget >> i for i in range(budget.bit_length()) if (budget >> i) > 2 * width]
            g.upcast(contiguous[-1], wide + vector_choices)
        elif out_contig and vector_choices:
            g.upcast(out_contig[-1], vector_choices)
    elif out_contig and vector_choices:
        g.upcast(out_contig[-1], _wide_choices(k) + vector_choices)
        # a transpose: an input contiguous along another output axis is read in vectors along that one too, and the
        # tile turned around in registers, instead of a load per element from as many rows (the CPU: a 1536x1024
        # float32 transpose in 0.9 ms instead of 4)
        others = [i for i in range(n_globals) if i != out_contig[-1]]
        if not r.has_local and width > 1:
            across = [i for i in others if any(_stride(st, i) == 1 for _, st in k.loads())]
            if across:
                g.upcast(across[-1], [width, 8, 4])
        elif r.has_local and k.use_locals:
            # on a GPU, only an input read along both (a transpose, not a row's statistic broadcast along the
            # output), in steps of 1 or 2 elements (every other pixel: a stride-2 window); its rows may be the pixels
            # of several images merged into one axis, read in runs of a row's length
            moved = [
                i
                for i in others
                if any(_first_step(st, i) in (1, 2) and _stride(st, out_contig[-1]) != 0 for _, st in k.loads())
            ]
            if moved and _transpose_tiles(k, g, out_contig[-1], moved[-1]):
                return k
    # short reductions become straight-line code (from the last axis, so earlier indices stay valid)
    for n in reversed(range(len(k.axes(AxisType.REDUCE)))):
        size = k.full_shape[k.axes(AxisType.REDUCE)[n]]
        if isinstance(size, int) and size <= 8:
            _try(k, Opt(OptOps.UNROLL, n, 0))
    if r.has_local and k.use_locals:
        if not elementwise_workgroups(k):
            _locals(k)
    elif widest is not None:
        # the loop of the widest upcast outermost: its tile of the other operand stays cached while this one streams
        cur = g.now[widest[1]]
        if cur is not None and cur > 0:
            _try(k, Opt(OptOps.SWAP, 0, cur))
    return k


def _wide_choices(k: Kernel) -> list[int]:
    """Upcasts of an elementwise kernel that make its widest elements one 16-byte vector, where the renderer loads and
    stores such vectors of elements narrower than 4 bytes (`Renderer.wide_vectors`): 8 halves, 16 bytes."""
    if not k.renderer.wide_vectors or k.renderer.vector_width > 1:
        return []
    sizes = [u.dtype.itemsize for u, _ in k.loads()] + [u.src[2].dtype.itemsize for u, _ in k.stores()]
    itemsize = max(sizes, default=4)
    lanes = VECTOR_BYTES // itemsize
    return [lanes] if lanes > 4 else []


def _dot_axis(k: Kernel, full_loads: list[ShapeTracker]) -> int | None:
    """The REDUCE axis that at least two inputs are contiguous along (the last such), when whole vectors of it fit
    its length: the reduction of a matmul like `x @ W.T`."""
    width = max(1, k.renderer.vector_width)
    along = [a for a in k.axes(AxisType.REDUCE) if sum(_stride(st, a) == 1 for st in full_loads) >= 2]
    if not along or not isinstance(size := k.full_shape[along[-1]], int) or size % width:
        return None
    return along[-1]


def _dot_tiles(k: Kernel, g: _Globals, full_loads: list[ShapeTracker], reuse: list[int], along: int) -> None:
    """Dot products for a matmul whose inputs are both contiguous along the reduction axis `along` (`x @ W.T`):
    that axis unrolled by one vector, each output keeping a vector of partial sums (the lowerer's dot layout, summed
    once after the loop), a tile of up to 4x4 outputs. The outer loop walks the rows of the bigger input, 4 at a
    time: the inner loop streams the smaller one, which a bigger cache may hold whole, past those rows. Batch axes
    (both inputs move along them) stay outermost."""
    width = max(1, k.renderer.vector_width)
    if not _try(k, Opt(OptOps.UNROLL, k.axes(AxisType.REDUCE).index(along), width)):
        return

    def operand_size(axis: int) -> int:
        # the input read along `axis`: nonzero stride on it (stride 0 along the other output axis)
        return min((st.real_size() for st in full_loads if _stride(st, axis) != 0), default=0)

    if len(reuse) == 1:
        # a matrix-vector product: rows of the matrix at a time, each its own chain of multiply-adds
        g.upcast(reuse[0], [8, 4, 2])
        return
    # on a tie the axis that is outer already stays outer
    inner, outer = sorted(reuse[-2:], key=lambda a: (operand_size(a), -a))
    stationary = g.upcast(outer, [4, 2])
    g.upcast(inner, [c for c in (4, 2) if stationary * c * width <= accumulator_budget(k)])
    # the outer loop outside the inner one, but inside the batch loops: a batch's inputs stay cached while it runs
    first, second = g.now[inner], g.now[outer]
    if first is not None and second is not None and first < second:
        _try(k, Opt(OptOps.SWAP, first, second))


def _tensor_cores(k: Kernel) -> bool:
    if not _try(k, Opt(OptOps.TC, 0, (-1, 1))):
        return False
    # a second tile along each of the last two output axes: each loaded operand is used twice
    g = _Globals(k)
    for i in reversed(range(len(g.now))[-2:]):
        g.upcast(i, [2])
    return True


# at most this many outputs count as "very few": each gets a whole workgroup of warps to itself
FEW_OUTPUTS = 16
# a sum across at most this many rows, each a whole output apart (the parts of a split reduction: `SPLIT_K_MAX`), to
# at least SHORT_SUM_OUTPUTS outputs is a loop of each thread's own on a GPU
SHORT_SUM_ROWS = 64
SHORT_SUM_OUTPUTS = 4096


def _short_column_sums(k: Kernel) -> bool:
    """On a GPU (`warp_size`), a short sum across rows to many outputs (the sum of a split-K matmul's parts:
    C[n] = sum_p P[p, n]): each thread sums its own vector of 16 bytes of outputs, neighbouring threads the next
    vectors, so every row is read in whole coalesced runs, in workgroups of an elementwise kernel's size
    (`elementwise_workgroups`, padded where none divides). The general rules gave such a kernel a 16-output register
    tile and 4-thread workgroups (the 7x7 stem's weight gradient: 588 threads in all, 234 registers each). Returns
    whether it applied."""
    r = k.renderer
    if not (r.has_local and warp_size(r) and k.use_locals) or len(k.reduceops) != 1 or k.applied_opts:
        return False
    reduce_axes, globals_ = k.axes(AxisType.REDUCE), k.axes(AxisType.GLOBAL)
    sizes = [k.full_shape[a] for a in reduce_axes + globals_]
    if not reduce_axes or not globals_ or not all(isinstance(s, int) for s in sizes):
        return False
    rows = 1
    for a in reduce_axes:
        rows *= int(k.full_shape[a])
    outputs = 1
    for a in globals_:
        outputs *= int(k.full_shape[a])
    loads = [(ld, st) for ld, st in k.loads() if ld.src[1] in k.full_views]
    if rows > SHORT_SUM_ROWS or not loads:
        return False
    ld, biggest = max(loads, key=lambda x: x[1].real_size())
    inner = globals_[-1]
    if _stride(biggest, inner) != 1 or _stride(k.stores()[0][1], inner) != 1:
        return False
    if outputs < SHORT_SUM_OUTPUTS:
        return _few_column_sums(k, rows, len(globals_) - 1)
    trial = k.copy()
    # few outputs (a weight gradient's 9408) must still spread over every compute unit: vectors only while each
    # unit keeps a full workgroup, and smaller workgroups (down to two warps) before fewer of them
    units = max(1, r.compute_units)
    vector = VECTOR_BYTES // ld.dtype.itemsize if r.supports_float4 else 1
    size = int(k.full_shape[inner])
    for amount in (vector, 4, 2):
        if amount > 1 and size % amount == 0 and outputs // amount >= units * ELEMENTWISE_THREADS:
            if _try(trial, Opt(OptOps.UPCAST, len(globals_) - 1, amount)):
                outputs //= amount
                break
    threads = next((t for t in (ELEMENTWISE_THREADS, 128) if outputs >= units * t), 64)
    if not elementwise_workgroups(trial, reductions=True, threads=threads):
        return False
    k.__dict__.update(trial.__dict__)
    return True


def _few_column_sums(k: Kernel, rows: int, inner: int) -> bool:
    """A short sum across rows to fewer outputs than `SHORT_SUM_OUTPUTS` (the parts of a matrix-vector product cut
    along its rows: C[n] = sum_p P[p, n] for a few thousand n): a warp's threads on neighbouring outputs (coalesced
    rows) and the workgroup's warps each on their share of the rows (GROUPTOP, combined in shared memory), so that
    the kernel has a workgroup per warp's width of outputs rather than a 16-output register tile per thread in a
    handful of workgroups. Returns whether it applied (global axis `inner` is the one the rows run along)."""
    size = int(k.full_shape[k.axes(AxisType.GLOBAL)[inner]])
    warp = warp_size(k.renderer) or 32
    group = next((g for g in (8, 4, 2) if rows % g == 0 and rows // g >= 2), 1)
    if size % warp or group == 1:
        return False
    trial = k.copy()
    # the group first: the axis applied last is threadIdx.x, which neighbouring outputs must be
    if not (_try(trial, Opt(OptOps.GROUPTOP, 0, group)) and _try(trial, Opt(OptOps.LOCAL, inner, warp))):
        return False
    k.__dict__.update(trial.__dict__)
    return True


def _group(k: Kernel) -> None:
    """GROUPTOP a long reduction when there are few outputs; with warp shuffles, bigger groups for very few outputs
    and padding (sums) when no group size divides the reduction."""
    outputs = 1
    for s in k.sizes(AxisType.GLOBAL):
        outputs *= s if isinstance(s, int) else 1024
    reduce_axes = k.axes(AxisType.REDUCE)
    if not reduce_axes or outputs > 2048:
        return
    axis = reduce_axes[-1]
    n = _index_among(k, axis, AxisType.REDUCE)
    amounts = [256, 128, 64, 32, 16]
    warp = warp_size(k.renderer)
    if warp and outputs <= FEW_OUTPUTS:
        amounts = [a for a in (1024, 512) if a <= k.renderer.max_workgroup_threads] + amounts
    size = k.full_shape[axis]
    if not isinstance(size, int):
        return
    for amount in amounts:
        if size % amount == 0 and size >= 2 * amount and _try(k, Opt(OptOps.GROUPTOP, n, amount)):
            return
    if not warp:
        return
    # no group divides the length: pad it to whole warps, at most a quarter more elements
    pad_axis = len(k.axes(AxisType.GLOBAL)) + n
    for amount in amounts:
        if amount % warp == 0 and size >= 4 * amount:
            trial = k.copy()
            opts = [Opt(OptOps.PADTO, pad_axis, amount), Opt(OptOps.GROUPTOP, n, amount)]
            if all(_try(trial, o) for o in opts):
                k.apply_opts(opts)
                return


TRANSPOSE_THREADS = 256


def _transpose_tiles(k: Kernel, g: _Globals, out_axis: int, in_axis: int) -> bool:
    """A GPU transpose (NCHW to channels-last, a matrix's transpose), after the output's vector upcast: each thread
    also a run of a few elements along the input's contiguous axis `in_axis`, and the lanes of a warp split between
    the two axes so that it reads a whole 32-byte sector of each input row it touches (that axis padded to whole
    sectors where it has none: a padded image's 58 pixels) and writes as much of each output row. With its lanes
    all along the output's axis a warp read an element or two of as many rows, a sector each: 12-40% of the bytes it
    moved were used, by `memory_traffic.sector_use`. Then more threads over the other output axes, and the input's
    outside the warp, up to `TRANSPOSE_THREADS`. Returns whether it applied."""
    # bytes an input row moves per step of `in_axis` (a stride of 2: the window of a 1x1 stride-2 convolution)
    item = max(
        (ld.dtype.itemsize * abs(step) for ld, st in k.loads() if (step := _first_step(st, in_axis)) in (1, 2)),
        default=4,
    )
    sector = max(1, SECTOR_BYTES // item)  # steps of `in_axis` across a sector of an input row
    a, b = g.axis(out_axis), g.axis(in_axis)
    if a is None or b is None or not isinstance(k.full_shape[a], int) or not isinstance(size := k.full_shape[b], int):
        return False
    if size % sector and size > sector and not _try(k, Opt(OptOps.PADTO, _index_among(k, b, AxisType.GLOBAL), sector)):
        return False
    run = g.upcast(in_axis, [c for c in (8, 4, 2) if c * k.lanes(AxisType.UPCAST) <= 64])
    a, b = g.axis(out_axis), g.axis(in_axis)
    if a is None or b is None:
        return False
    lanes_b = max(1, sector // run)
    while lanes_b > 1 and int(k.full_shape[b]) % lanes_b:
        lanes_b //= 2
    lanes_a = 32 // lanes_b
    while lanes_a > 1 and int(k.full_shape[a]) % lanes_a:
        lanes_a //= 2
    if lanes_a * lanes_b < 8:
        return False
    amounts = {a: lanes_a, b: lanes_b}
    threads = lanes_a * lanes_b
    for axis in reversed(k.axes(AxisType.GLOBAL)):
        size = k.full_shape[axis]
        if axis in amounts or not isinstance(size, int) or threads >= TRANSPOSE_THREADS:
            continue
        amount = TRANSPOSE_THREADS // threads
        while amount > 1 and size % amount:
            amount //= 2
        if amount > 1:
            amounts[axis] = amount
            threads *= amount
    # short of threads (a matrix: no other axis), more along the input's axis, outside the warp's lanes
    extra = TRANSPOSE_THREADS // threads
    while extra > 1 and (int(k.full_shape[b]) // lanes_b) % extra:
        extra //= 2
    amounts[b] *= extra
    # from the last axis back, so that a split that takes a whole axis moves none still to come
    globals_ = k.axes(AxisType.GLOBAL)
    for axis in sorted(amounts, reverse=True):
        if amounts[axis] > 1:
            _try(k, Opt(OptOps.LOCAL, globals_.index(axis), amounts[axis]))
    return True


def _locals(k: Kernel) -> None:
    """Workgroups of up to 128 threads over the last output axes."""
    threads = k.workgroup_threads()
    for axis in reversed(k.axes(AxisType.GLOBAL)):
        size = k.full_shape[axis]
        for amount in (32, 16, 8, 4, 2):
            if threads * amount > 128 or not isinstance(size, int) or size % amount or amount > size:
                continue
            if _try(k, Opt(OptOps.LOCAL, _index_among(k, axis, AxisType.GLOBAL), amount)):
                threads *= amount
                break
