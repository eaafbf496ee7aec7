"""Operand staging: the STAGE opt, which makes a workgroup copy the tiles of a reduction's inputs into local (shared)
memory once per reduction step, so that each value loaded from global memory is reused by every thread of the
workgroup that needs it.

What a staged kernel does in each step of its reduce loops (all of it ordinary UOps, so every renderer with local
memory and the PYTHON interpreter run it):

1. every thread of the workgroup copies its share of each operand's tile for this step from global memory into a
   `DEFINE_LOCAL` buffer: consecutive threads copy consecutive runs of the buffer's innermost dimension, as vectors of
   up to 16 bytes (128-bit loads) where the view allows, zeros where the view is masked (padding, edges);
2. one `BARRIER` after all the copies;
3. the thread's own reads (tensor-core fragments, or the register tile of an FMA kernel) come from local memory.

The tile of an operand is the part of it that the workgroup reads in one step: the extent of its view along the axes
that vary inside a workgroup (LOCAL, TC_M/N/K, UPCAST, UNROLL) and that the operand reads. Each operand gets two
buffers used in turn (by the parity of the step): a thread that writes step k+2's tile has passed step k+1's barrier,
which every thread reaches only after its reads of step k, so one barrier per step is enough (with a single buffer
step k+1's copies could overwrite what a slower warp still reads for step k). A pipeline of asynchronous copies
(`cp.async`) of S stages has S buffers, and copies each step's tiles S-1 steps ahead of its math (`Stager._build`),
again with one barrier per step.

A tensor core that reads its operands from local memory itself (Hopper's wgmma, `TensorCore.shared_operands`) takes
its tiles in the layout its descriptors describe (`SharedTile`), and with three or more stages leaves each step's
instructions running into the next (`in_flight`): its copies then go one step less ahead, since at a step's barrier
the slot of the step before may still be being read.

Local layout: rows padded by 16 bytes when they are long, so the threads of a warp that read one column of a
tile (a tensor-core fragment reads 8 rows of 4 words) hit different banks. On tensor cores the buffer keeps the
global layout of the operand (rows along the reduction for A, along N for B); an FMA kernel puts the reduction
outermost, so a thread's register tile for one step of the reduction is one contiguous run of the buffer.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lazygrad_codegen.kernel import REDUCE_TYPES, AxisType, KernelOptError
from lazygrad_codegen.tensor_cores import layouts
from lazygrad_codegen.vectors import gep, memory_widths, vectorize
from lazygrad_uop.device import TMA_MAX_BOX, TMA_MAX_RANK, SharedMatrix, TensorMap
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp, sint
from lazygrad_uop.views import ShapeTracker, View

if TYPE_CHECKING:
    from lazygrad_codegen.kernel import Kernel
    from lazygrad_codegen.lowerer import _Lanes, _Lowerer

# the axes whose index varies between the threads and registers of one workgroup in one reduction step
TILE_TYPES = frozenset({AxisType.LOCAL, AxisType.TC_M, AxisType.TC_N, AxisType.TC_K, AxisType.UPCAST, AxisType.UNROLL})
# the widest copy from global memory, in bytes (a 128-bit load)
COPY_BYTES = 16
# rows of a local buffer at least this long (bytes) are padded by COPY_BYTES to spread columns over the banks
PAD_FROM_BYTES = 64
# the deepest pipeline STAGE builds: copies started up to MAX_STAGES - 1 steps ahead of the math
MAX_STAGES = 4


SHARED_ROW_BYTES = (128, 64, 32)
"""The swizzled rows a tensor core reading local memory itself takes a K-major operand in, widest first: the first
that divides the tile's K extent (a 64-element step of fp16 fills 128-byte rows)."""


SHARED_ALIGN_SLACK = 1024
"""Bytes of local memory a kernel on a core that reads it itself may lose to aligning its buffers' start to the
swizzle's 1024-byte pattern (the CUDA renderer rounds the start of its shared memory up)."""


TMA_BOX_SHAPES = 64
"""Box shapes `tma_plan` tries for one operand, fewest boxes first, before it leaves the operand to cp.async."""
MBARRIER_BYTES = 8
"""Local memory of one barrier that counts the tensor memory accelerator's bytes (`MBARRIER_INIT`)."""


@dataclass(frozen=True)
class SharedTile:
    """The layout of an operand that the tensor core reads from local memory itself (`TensorCore.shared_operands`):
    the tile is an MN x K matrix, its MN index the row-major index over the axes `mn` (outermost first, the
    tensor-core axis innermost), its K index over `k` (TC_K innermost), each (axis, size). K-major (`major` "k", the
    copy's innermost axis is TC_K): element (mn, k) at (k // row) * (MN * row) + mn * row + k % row, rows of `row`
    elements; MN-major ("mn", the copy's innermost is the tensor-core axis of M or N): at (mn // row) * (K * row) +
    k * row + mn % row. Then the rows are swizzled (`SharedMatrix`'s XOR of bits 4-6 by 7-9 of the byte address), so
    that the 16-byte copies of one row, and the instruction's reads of 8 rows, meet no bank twice. An instruction
    whose operand starts at (mn0, k0) reads it as the `SharedMatrix` `matrix` from the unswizzled offset of (mn0,
    k0): the swizzle of each element it reads depends only on the address bits the layout gives it."""

    mn: tuple[tuple[int, int], ...]
    k: tuple[tuple[int, int], ...]
    row: int
    itemsize: int
    major: str

    @property
    def mn_size(self) -> int:
        return math.prod(n for _, n in self.mn)

    @property
    def k_size(self) -> int:
        return math.prod(n for _, n in self.k)

    @property
    def matrix(self) -> SharedMatrix:
        """The descriptor's layout of an instruction's operand in this tile."""
        row_bytes = self.row * self.itemsize
        if self.major == "k":
            return SharedMatrix("k", 16, 8 * row_bytes, row_bytes)
        return SharedMatrix("mn", self.k_size * row_bytes, 8 * row_bytes, row_bytes)

    def offset(self, coords: dict[int, UOp | int]) -> UOp | int:
        """The unswizzled element offset of the element at tile coordinates `coords` (every axis of `mn` and `k`)."""
        mn: UOp | int = 0
        k: UOp | int = 0
        for a, size in self.mn:
            mn = mn * size + coords[a]
        for a, size in self.k:
            k = k * size + coords[a]
        row = self.row
        if self.major == "k":
            return (k // row) * (self.mn_size * row) + mn * row + k % row
        return (mn // row) * (self.k_size * row) + k * row + mn % row

    def swizzle(self, offset: UOp) -> UOp:
        """Element `offset` of the tile (from a 1024-byte aligned start) at its swizzled place."""
        per_line = 128 // self.itemsize  # the elements of one 128-byte line, whose 16-byte units the XOR moves
        unit = 16 // self.itemsize
        mask = self.row * self.itemsize // 16 - 1
        return offset ^ (((offset // per_line) % (mask + 1)) * unit)


@dataclass(frozen=True)
class StagedOperand:
    """How one operand (a LOAD of the kernel AST) is staged: its tile axes in the order the copy walks them
    (outermost first), the stride of each of them in the local buffer, the elements of the tile, of one buffer slot
    (with padding) and of one copy from global memory (`vector`), whether a copy is one vector store into the buffer
    too (`store_vector`; else one store per element), and how many slots (2 when the reduction is a loop)."""

    load: UOp
    copy_order: tuple[int, ...]
    local_strides: tuple[tuple[int, int], ...]
    tile: int
    slot: int
    vector: int
    store_vector: bool
    slots: int
    shared: SharedTile | None = None

    @property
    def bytes(self) -> int:
        """Local memory the operand takes."""
        return self.slot * self.slots * self.load.dtype.itemsize


def _under_casts(u: UOp) -> UOp:
    while u.op is Ops.CAST:
        u = u.src[0]
    return u


def staged_loads(k: Kernel) -> list[UOp]:
    """The loads a STAGE opt copies through local memory: the tensor core's operands, or (FMA) every load below the
    reduction whose value changes along a reduce axis."""
    from lazygrad_codegen.selection import axes_read

    if k.tc_operands is not None:
        return [_under_casts(u) for u in k.tc_operands]
    reduce_axes = set(k.axes(*REDUCE_TYPES))
    return [ld for ld, _ in k.loads() if ld.src[1] in k.full_views and axes_read(ld, k) & reduce_axes]


def _unmasked(st: ShapeTracker) -> ShapeTracker:
    """`st` with every mask dropped, simplified: the same addresses (masks decide only validity), and a masked view
    reshaped across its mask (an axis padded to whole tiles, then split into them), which stays a stack of views
    whose index math hides the strides, merges back into one view."""
    return ShapeTracker(tuple(View.create(v.shape, v.strides, v.offset) for v in st.views)).simplify()


@functools.lru_cache(maxsize=4096)
def address_strides(st: ShapeTracker) -> tuple[sint | None, ...]:
    """How far the address `st` reads moves per step of each axis, whatever its masks (None: not one stride). Cached:
    the default tiles ask it of the same views for every axis and opt they try."""
    strides = st.real_strides(ignore_valid=True)
    if all(s is not None for s in strides) or all(v.mask is None for v in st.views):
        return strides
    return _unmasked(st).real_strides()


def _lower_dims(st: ShapeTracker) -> tuple[list[tuple[int, int] | None], list[int]] | None:
    """For a stack of two views of ints whose upper one has no mask (a padded view split into tiles): per axis, the
    dim of the lower view its step moves and by how much (None: none), and the lower view's coordinates at index 0.
    None for any other stack, or when an axis moves across dims (a step could carry into the next dim)."""
    if len(st.views) != 2:
        return None
    low, top = st.views
    fields = (*low.shape, *top.shape, *top.strides, top.offset)
    if top.mask is not None or not all(isinstance(x, int) for x in fields) or top.offset < 0:  # type: ignore[operator]
        return None
    shape = [int(n) for n in low.shape]
    inner = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    start, rest = [], int(top.offset)
    for c in inner:
        start.append(rest // c)
        rest %= c
    if start and start[0] >= shape[0]:
        return None
    reach, out = list(start), []
    for s, n in zip(top.strides, top.shape, strict=True):
        if s == 0 or n == 1:
            out.append(None)
            continue
        d = next((d for d in range(len(shape)) if inner[d] <= s and shape[d] > 1), None)  # type: ignore[operator]
        if d is None or s < 0 or s % inner[d]:  # type: ignore[operator]
            return None
        out.append((d, s // inner[d]))  # type: ignore[operator]
        reach[d] += s // inner[d] * (n - 1)  # type: ignore[operator]
    if any(r >= n for r, n in zip(reach, shape, strict=True)):
        return None
    return out, start


def _valid_by_vectors(st: ShapeTracker, axis: int, v: int) -> bool:
    """Whether every run of `v` elements along `axis` that starts at a multiple of `v` is valid or masked as a
    whole, so that one gated vector copy moves it: `st`'s masks along `axis` (through a split, in the lower view's
    dim that `axis` moves) fall on multiples of the run. `st` is simplified (views merged where they compose)."""
    if len(st.views) == 1:
        mask = st.views[0].mask
        return mask is None or all(isinstance(b, int) and b % v == 0 for b in mask[axis])
    dims = _lower_dims(st)
    if dims is None:
        return False
    moves, start = dims
    low = st.views[0]
    if moves[axis] is None or low.mask is None:
        return moves[axis] is not None or low.mask is None
    d, step = moves[axis]  # type: ignore[misc]
    run = step * v
    others = [m[1] for a, m in enumerate(moves) if m is not None and m[0] == d and a != axis]
    return all(x % run == 0 for x in (*low.mask[d], start[d], *others))


def _read_axes(k: Kernel, load: UOp, read: set[int]) -> set[int]:
    """`read` (the axes `load`'s index or validity depends on, as the index math shows them) less those its address
    does not move along, for a padded view split into tiles (`_lower_dims`) whose masks lie on dims it moves along:
    its validity then depends on those axes only. Its index math seems to depend on every axis (through the
    unravel of the split), which would make each operand's tile the whole workgroup's. Axes that move only a dim the
    lower view has stride 0 along (and no mask on) are dropped."""
    st = k.views[load.src[1]]
    dims = _lower_dims(st)
    if len(st.views) == 1 or dims is None:
        return read
    low = st.views[0]
    if low.mask is not None and any(m != (0, n) and s == 0 for m, n, s in zip(low.mask, low.shape, low.strides)):
        return read
    return {a for a in read if (m := dims[0][a]) is not None and low.strides[m[0]] != 0}


def _int_strides(k: Kernel, load: UOp) -> list[int] | None:
    strides = address_strides(k.views[load.src[1]])
    return list(strides) if all(isinstance(s, int) for s in strides) else None  # type: ignore[arg-type]


def _vector(k: Kernel, load: UOp, axis: int, size: int) -> int:
    """Elements per copy along the tile's innermost axis `axis`: up to 16 bytes (and as many elements as the renderer
    loads at once, `memory_widths`) when the view is contiguous along `axis`, every other stride and the offset keep
    the copies aligned, and its masks (padding, edges) take or leave each copy whole (`_valid_by_vectors`)."""
    st = k.views[load.src[1]]
    strides = _int_strides(k, load)
    # one view with its masks where the stack merges as it is (windows over a stored input: the masks bound how far
    # the steps reach), else one without them (a padded view split into tiles)
    merged = st.simplify()
    free = merged if len(merged.views) == 1 else _unmasked(st)
    if strides is None or len(free.views) != 1 or strides[axis] != 1:
        return 1
    offset = free.views[0].offset
    # no wider than the renderer loads (Metal: 4 halves; CUDA: 8, its `wide_vectors`)
    widths, _ = memory_widths(k.renderer, load.dtype.itemsize)
    v = min(COPY_BYTES // load.dtype.itemsize, max(widths, default=1))
    while v > 1:
        if (
            size % v == 0
            and isinstance(offset, int)
            and offset % v == 0
            and all(s % v == 0 for a, s in enumerate(strides) if a != axis)
            and _valid_by_vectors(merged, axis, v)
        ):
            return v
        v //= 2
    return 1


def plan(k: Kernel, stages: int | None = None) -> list[StagedOperand]:
    """How each operand of a staged kernel with `stages` pipeline stages (default: the kernel's) is staged (see the
    module docstring)."""
    from lazygrad_codegen.selection import axes_read

    # a slot per stage, at least two (one being read while the next is written)
    slots = max(2, k.stages if stages is None else stages) if k.axes(AxisType.REDUCE) else 1
    out = []
    for operand, load in enumerate(staged_loads(k)):
        read = _read_axes(k, load, axes_read(load, k))
        axes = [a for a in range(k.rank) if k.axis_types[a] in TILE_TYPES and a in read]
        sizes = {a: int(k.full_shape[a]) for a in axes}
        strides = _int_strides(k, load)
        # the copy walks the tile in the order of the operand's memory, so neighbouring threads read neighbours
        copy = sorted(axes, key=lambda a: -abs(strides[a])) if strides is not None else list(axes)
        if k.tensor_core is not None:
            layout = copy
        else:
            # FMA: one reduction step of a thread's register tile is one contiguous run of the buffer
            layout = [a for a in axes if k.axis_types[a] in REDUCE_TYPES] + [
                a for a in axes if k.axis_types[a] not in REDUCE_TYPES
            ]
        item = load.dtype.itemsize
        vector = _vector(k, load, copy[-1], sizes[copy[-1]]) if copy else 1
        if k.tensor_core is not None and k.tensor_core.shared_operands:
            shared = _shared_tile(k, operand, copy, sizes, vector, item)
            tile = math.prod(sizes.values())
            # each slot starts 1024 bytes aligned, where the swizzle's pattern of 8 lines repeats
            slot = -(-tile * item // 1024) * 1024 // item
            out.append(StagedOperand(load, tuple(copy), (), tile, slot, vector, True, slots, shared))
            continue
        if k.tensor_core is not None and item == 4:
            layout, pads = _fragment_layout(k, operand, copy, sizes, vector)
        else:
            if k.tensor_core is not None:
                layout = _tensor_core_axes_last(k, layout)
            inner, row = _row(k, layout, sizes)
            pads = {inner: COPY_BYTES // item} if inner < len(layout) and _pads_row(k, row * item) else {}
        local, stride = _local_strides(layout, sizes, pads)
        tile = math.prod(sizes.values())
        slot = stride if axes else 1
        store_vector = _store_vector(local, copy, vector, slot)
        out.append(StagedOperand(load, tuple(copy), tuple(local.items()), tile, slot, vector, store_vector, slots))
    return out


def _shared_tile(k: Kernel, operand: int, copy: list[int], sizes: dict[int, int], vector: int, item: int) -> SharedTile:
    """The `SharedTile` of tensor-core operand `operand` (0: A, 1: B) of a core that reads local memory itself, whose
    tile the copy walks in the order `copy` with vectors of `vector` elements (at most 16 bytes, which the swizzle
    keeps together); KernelOptError where none fits: the copy's innermost axis, the one of the operand's memory,
    must be the tensor-core axis of K (K-major) or of the operand's M or N (MN-major)."""
    tc = k.tensor_core
    assert tc is not None
    own = AxisType.TC_M if operand == 0 else AxisType.TC_N
    if not copy or COPY_BYTES % (vector * item):
        raise KernelOptError(f"tensor core {tc}: operand {'AB'[operand]} has no tile or copies past 16 bytes")
    inner = k.axis_types[copy[-1]]
    if inner not in (own, AxisType.TC_K):
        raise KernelOptError(
            f"tensor core {tc}: operand {'AB'[operand]} is read contiguously along neither K nor its "
            f"{'M' if operand == 0 else 'N'} tensor-core axis, which a shared layout needs innermost"
        )
    k_axes = [a for a in copy if k.axis_types[a] in REDUCE_TYPES]
    mn_axes = [a for a in copy if k.axis_types[a] not in REDUCE_TYPES]
    # the tensor-core axes innermost: an instruction's rows and its K step are runs of the tile's indices
    k_axes.sort(key=lambda a: k.axis_types[a] is AxisType.TC_K)
    mn_axes.sort(key=lambda a: k.axis_types[a] is own)
    if (
        not mn_axes
        or k.axis_types[mn_axes[-1]] is not own
        or not k_axes
        or k.axis_types[k_axes[-1]] is not AxisType.TC_K
    ):
        raise KernelOptError(f"tensor core {tc}: operand {'AB'[operand]}'s tile lacks its tensor-core axes")
    k_size = math.prod(sizes[a] for a in k_axes)
    if inner is AxisType.TC_K:
        row = next((r // item for r in SHARED_ROW_BYTES if k_size % (r // item) == 0), None)
        if row is None:
            raise KernelOptError(f"tensor core {tc}: a K step of {k_size} fills no swizzled row of 32 to 128 bytes")
        major = "k"
    else:
        row = 128 // item
        if sizes[mn_axes[-1]] % row:
            raise KernelOptError(
                f"tensor core {tc}: an MN-major operand needs its tensor-core axis a multiple of {row}"
            )
        major = "mn"
    return SharedTile(tuple((a, sizes[a]) for a in mn_axes), tuple((a, sizes[a]) for a in k_axes), row, item, major)


def _tensor_core_axes_last(k: Kernel, layout: list[int]) -> list[int]:
    """`layout` with the tensor-core axes last in each run of axes on one side of the reduction, so that a fragment's
    rows (8 of its M or N coordinates for A or B) are one row of the buffer apart: a convolution read channels-last
    copies its tile in the order of the input's memory, the batch outermost, which would put TC_M's rows a whole
    tile apart, all in one bank."""
    tc = (AxisType.TC_M, AxisType.TC_N, AxisType.TC_K)
    runs: list[list[int]] = []
    for a in layout:
        if runs and (k.axis_types[a] in REDUCE_TYPES) == (k.axis_types[runs[-1][-1]] in REDUCE_TYPES):
            runs[-1].append(a)
        else:
            runs.append([a])
    return [a for run in runs for a in sorted(run, key=lambda a: k.axis_types[a] in tc)]


def _pads_row(k: Kernel, row_bytes: int) -> bool:
    """Whether rows of `row_bytes` are padded by COPY_BYTES: long ones (PAD_FROM_BYTES), so that the threads of a warp
    reading one column hit different banks; and, on tensor cores, rows of two 16-byte units, which `ldmatrix` would
    read 8 at a time two to a bank (rows 48 bytes apart meet none)."""
    return row_bytes >= PAD_FROM_BYTES or (k.tensor_core is not None and row_bytes == 2 * COPY_BYTES)


def _local_strides(layout: list[int], sizes: dict[int, int], pads: dict[int, int]) -> tuple[dict[int, int], int]:
    """The stride in the local buffer of each axis of `layout` (outermost first), and the elements of the whole
    buffer: packed, but the stride of the axis `n` places from the innermost is `pads[n]` elements longer (padding
    after each of its steps; `n` the row length `_row` gives pads the rows)."""
    local: dict[int, int] = {}
    stride = 1
    for n, a in enumerate(reversed(layout)):
        stride += pads.get(n, 0)
        local[a] = stride
        stride *= sizes[a]
    return local, stride


def _row(k: Kernel, layout: list[int], sizes: dict[int, int]) -> tuple[int, int]:
    """The rows of a local buffer laid out as `layout` (outermost first): how many of its innermost axes are on the
    same side of the reduction (all reduce axes, or none), and the elements of that run."""
    inner = 0
    while inner < len(layout) and (k.axis_types[layout[-1 - inner]] in REDUCE_TYPES) == (
        k.axis_types[layout[-1]] in REDUCE_TYPES
    ):
        inner += 1
    return inner, math.prod(sizes[a] for a in layout[len(layout) - inner :])


def _store_vector(local: dict[int, int], copy: list[int], vector: int, slot: int) -> bool:
    """Whether a copy of `vector` elements along the innermost copy axis is one vector store into the buffer: its
    elements neighbours in the buffer, at an aligned index."""
    return vector > 1 and (
        local.get(copy[-1]) == 1
        and not any(s % vector for a, s in local.items() if a != copy[-1])
        and slot % vector == 0
    )


def _fragment_layout(
    k: Kernel, operand: int, copy: list[int], sizes: dict[int, int], vector: int
) -> tuple[list[int], dict[int, int]]:
    """The layout and paddings (`_local_strides`) of tensor-core operand `operand` (0: A, 1: B) of 4-byte elements,
    whose fragments are read by plain loads (ldmatrix moves 16-bit elements): of the copy's order, that order with the
    tensor-core axes last in each run of axes on one side of the reduction, and with them last of all, each row padded
    by a multiple of COPY_BYTES up to 128 bytes (rows shorter than PAD_FROM_BYTES by none too), the one under which
    the warp's read of one register meets the fewest distinct words in one bank, keeping the copies' vector stores
    where the copy's order has them; the copy's order and the least padding on a tie. Where reads still meet in a
    bank, the stride of a tensor-core axis outside the rows is padded too, by what removes the most conflicts.
    TF32's fragments are 8 by 4 elements: B's (8 columns of 4 rows of 128 floats) need rows 8 banks apart, which 16
    bytes of padding does not give; A's rows of 8 floats (a reduction step of one TC_K) put rows g and g + 4 in one
    bank unpadded; a convolution's A with its TC_K axis at stride 2 inside a row and TC_M outside an UPCAST met 4 to
    a bank in the copy's order at any padding; a weight gradient's A, TC_K 128 floats apart, 4 in every order."""
    tc = k.tensor_core
    assert tc is not None
    lay = layouts(tc)[operand]
    dims = {AxisType.TC_M: "m", AxisType.TC_N: "n", AxisType.TC_K: "k"}

    def conflicts(local: dict[int, int]) -> int:
        # a lane's registers that are neighbours along an UPCAST or UNROLL axis of stride 1 are read as one vector
        # (codegen merges the loads), for which the banks serve 128 bytes of lanes at a time
        width = next(
            (sizes[a] for a, s in local.items() if s == 1 and k.axis_types[a] in (AxisType.UPCAST, AxisType.UNROLL)), 1
        )
        width = width if width in (2, 4) else 1
        lanes = tc.threads // width
        worst = 1
        terms = [(coords[a], s) for a, s in local.items() if a in coords]
        for register in range(tc.elements_per_thread[operand]):
            starts = [sum(c[register][lane] * s for c, s in terms) for lane in range(tc.threads)]
            for first in range(0, tc.threads, lanes):
                words: dict[int, set[int]] = {}
                for start in starts[first : first + lanes]:
                    for word in range(start, start + width):
                        words.setdefault(word % 32, set()).add(word)
                worst = max(worst, *(len(w) for w in words.values()))
        return worst

    tc_axes = {a for a in copy if k.axis_types[a] in dims}
    # each tensor-core axis's coordinate of each lane's element in each register, whatever the layout's strides
    coords = {
        a: [
            [_coordinate(lay, dims[k.axis_types[a]], lane, register) for lane in range(tc.threads)]
            for register in range(tc.elements_per_thread[operand])
        ]
        for a in tc_axes
    }
    step = COPY_BYTES // 4
    best: tuple[tuple[bool, int, int, int], list[int], dict[int, int]] | None = None
    # the copy's order; the tensor-core axes last in each run of axes on one side of the reduction; last of all
    candidates = (copy, _tensor_core_axes_last(k, copy), sorted(copy, key=lambda a: k.axis_types[a] in dims))
    for n, layout in enumerate(dict.fromkeys(tuple(c) for c in candidates)):
        inner, row = _row(k, list(layout), sizes)
        # rows the general rule pads (PAD_FROM_BYTES) keep some padding; shorter ones take it only where it pays
        least = step if row * 4 >= PAD_FROM_BYTES else 0
        for pad in range(least, 32 + 1, step) if inner < len(layout) else (0,):
            local, stride = _local_strides(list(layout), sizes, {inner: pad} if pad else {})
            keeps = _store_vector(local, copy, vector, stride) or n == 0 or vector == 1
            score = (not keeps, conflicts(local), pad, n)
            if best is None or score < best[0]:
                best = (score, list(layout), {inner: pad} if pad else {})
    assert best is not None
    _, layout, pads = best
    local, stride = _local_strides(layout, sizes, pads)
    worst, vectors = conflicts(local), _store_vector(local, copy, vector, stride)
    for n, a in enumerate(reversed(layout)):
        if worst == 1 or n == 0 or a not in tc_axes or n in pads:
            continue
        chosen = pads
        for extra in range(step, 32 + 1, step):
            local, stride = _local_strides(layout, sizes, {**pads, n: extra})
            if (c := conflicts(local)) < worst and (not vectors or _store_vector(local, copy, vector, stride)):
                worst, chosen = c, {**pads, n: extra}
        pads = chosen
    return layout, pads


def asynchronous_copies(k: Kernel, operands: list[StagedOperand], stages: int) -> bool:
    """Whether the copies of `operands` (`plan(k, stages)`) can be `ASYNC_COPY`s: two to `MAX_STAGES` stages (STAGE's
    default is two), a renderer that has them, a reduce loop of int sizes, and every operand copied in whole vectors
    of 4, 8 or 16 bytes (what cp.async moves) to neighbouring elements of local memory (not an FMA kernel's
    transposed tile)."""
    if stages < 2 or not k.renderer.has_async_copy:
        return False
    if not all(isinstance(k.full_shape[a], int) for a in k.axes(AxisType.REDUCE)):
        return False
    return all(
        o.slots == stages and o.store_vector and o.vector * o.load.dtype.itemsize in (4, 8, 16) for o in operands
    )


@dataclass(frozen=True)
class TmaPlan:
    """How the tensor memory accelerator copies one operand's tile (`tma_plan`): the operand as a `TensorMap`, each
    of its dims as the kernel axes it spans (innermost first: the tile's axes, then those the workgroup or the
    reduction step pick; (axis, size) each), and the boxes that make up the tile: (where the box starts in the slot,
    in elements, unswizzled; its start along each dim within the tile). `tile`: the tile's axes among them."""

    tmap: TensorMap
    dims: tuple[tuple[tuple[int, int], ...], ...]
    boxes: tuple[tuple[int, tuple[int, ...]], ...]
    tile: frozenset[int]


def tma_plan(k: Kernel, o: StagedOperand) -> TmaPlan | None:
    """The tensor memory accelerator's copy of the staged operand `o` of a core that reads local memory itself
    (`o.shared`), or None where it can't make one, and the operand's threads copy it (`ASYNC_COPY`).

    The operand must be a plain strided tensor: one view of int strides, no mask (its boxes read no padding), no
    two axes at one stride, each dim's stride past the extent of those inside it (a convolution's overlapping
    windows are not). Its axes, innermost stride first, form the map's dims: runs of axes each of whose stride
    is the one before times that one's size, and in each run the tile's own axes before those the workgroup and the
    reduction step choose (a new dim starts where a tile axis follows one of those, or would make the dim's part of
    the tile more than one box holds); at most `TMA_MAX_RANK` dims. The boxes land row-major, which must put every
    element of the tile where `SharedTile` does, as checked element by element: of the box shapes that cut each
    dim's tile part evenly (at most the swizzle's row along the innermost dim, `TMA_MAX_BOX` along the others), the
    one of the fewest boxes that does."""
    shared = o.shared
    if shared is None:
        return None
    st = k.views[o.load.src[1]].simplify()
    if len(st.views) != 1 or st.views[0].mask is not None:
        return None
    view = st.views[0]
    shape = [s if isinstance(s, int) else None for s in k.full_shape]
    strides = view.strides
    if not isinstance(view.offset, int) or not all(isinstance(s, int) for s in strides):
        return None
    axes = [a for a in range(k.rank) if strides[a] != 0 and shape[a] != 1]
    if any(shape[a] is None or strides[a] < 0 for a in axes):  # type: ignore[operator]
        return None
    axes.sort(key=lambda a: strides[a])
    if len({strides[a] for a in axes}) != len(axes) or not axes or strides[axes[0]] != 1:
        return None
    tile = {a for a in o.copy_order if shape[a] != 1}
    if not tile <= set(axes):
        return None
    dims: list[list[tuple[int, int]]] = []
    for a in axes:
        size = int(shape[a])  # type: ignore[arg-type]
        if dims:
            last, last_size = dims[-1][-1]
            # a tile axis joins the dim only while the dim's part of the tile fits one box (one swizzled row along
            # the innermost dim): boxes cut a dim only along its innermost axis
            fits = a not in tile or (
                last in tile
                and size * math.prod(n for b, n in dims[-1] if b in tile)
                <= (shared.row if len(dims) == 1 else TMA_MAX_BOX)
            )
            if strides[a] == strides[last] * last_size and fits:
                dims[-1].append((a, size))
                continue
        dims.append([(a, size)])
    if len(dims) > TMA_MAX_RANK:
        return None
    # a dim's stride spans the dims inside it (the driver's layouts: no two coordinates address one element)
    spans = [strides[d[0][0]] * math.prod(n for _, n in d) for d in dims]
    if any(strides[d[0][0]] < span for d, span in zip(dims[1:], spans, strict=False)):
        return None
    extent = [math.prod(n for a, n in d if a in tile) for d in dims]
    full = tuple(math.prod(n for _, n in d) for d in dims)
    # every element of the tile, by its coordinate along each dim, and where SharedTile puts it
    grid = np.indices([int(k.full_shape[a]) for a in o.copy_order]).reshape(len(o.copy_order), -1)
    coords = dict(zip(o.copy_order, grid, strict=True))
    along, want = _along(dims, tile, coords), shared.offset(coords)  # type: ignore[arg-type]
    ones = dict.fromkeys(o.copy_order, 0)  # a tile axis of size 1
    # boxes of a dim's whole tile part where they fit (the innermost dim's one swizzled row wide), else of less: the
    # fewest boxes whose rows land where SharedTile puts them
    caps = [shared.row, *[TMA_MAX_BOX] * (len(dims) - 1)]
    options = [[b for b in range(min(e, c), 0, -1) if e % b == 0] for e, c in zip(extent, caps, strict=True)]
    shapes = sorted(itertools.product(*options), key=lambda box: math.prod(e // b for e, b in zip(extent, box)))
    for box in shapes[:TMA_BOX_SHAPES]:
        try:
            tmap = TensorMap(
                o.load.dtype,
                int(view.offset),
                full,
                tuple(int(strides[d[0][0]]) for d in dims),
                box,
                shared.row * shared.itemsize,
            )
        except ValueError:
            continue
        counts = [e // b for e, b in zip(extent, box, strict=True)]
        origins = [tuple(i * b for i, b in zip(j, box, strict=True)) for j in np.ndindex(*counts)]
        starts = np.array([shared.offset({**ones, **_tile_coords(dims, tile, origin)}) for origin in origins])
        # each element's box (`origins`' order: row-major over `counts`, dim 0 slowest) and place in it (row-major,
        # dim 0 fastest)
        which, position, place = 0, 0, 1
        for c, b, n in zip(along, box, counts, strict=True):
            which = which * n + c // b
            position, place = position + (c % b) * place, place * b
        if not np.array_equal(starts[which] + position, want):
            continue
        # a box's rows are swizzled by their shared address: each starts where the swizzle's pattern of 8 rows does
        if any(int(start) * shared.itemsize % (8 * tmap.swizzle or 16) for start in starts):
            continue
        boxes = tuple((int(start), origin) for start, origin in zip(starts, origins, strict=True))
        return TmaPlan(tmap, tuple(tuple(d) for d in dims), boxes, frozenset(tile))
    return None


def _along(dims: Sequence[Sequence[tuple[int, int]]], tile: set[int], coords: dict[int, Any]) -> list[Any]:
    """The coordinate along each dim of a `TmaPlan` of the tile element at the tile axes' `coords`."""
    out = []
    for d in dims:
        c, place = 0, 1
        for a, n in d:
            if a in tile:
                c, place = c + coords[a] * place, place * n
        out.append(c)
    return out


def _tile_coords(dims: Sequence[Sequence[tuple[int, int]]], tile: set[int], along: tuple[int, ...]) -> dict[int, int]:
    """The tile axes' coordinates of the tile element at `along` (one per dim of a `TmaPlan`)."""
    out = {}
    for d, c in zip(dims, along, strict=True):
        for a, n in d:
            if a in tile:
                out[a], c = c % n, c // n
    return out


def tma_plans(k: Kernel, operands: list[StagedOperand]) -> dict[UOp, TmaPlan]:
    """Each staged operand's `TmaPlan` (by its load), where the tensor memory accelerator copies them all: `WGMMA`
    set to 2, a renderer that has it (`has_tma`), a core that reads local memory itself and a pipeline of
    asynchronous copies (`asynchronous_copies`), and a plan for every operand; else none (the threads copy)."""
    from lazygrad_uop.config import WGMMA

    tc = k.tensor_core
    if WGMMA.value != 2 or not k.renderer.has_tma or tc is None or not tc.shared_operands or not k.staged:
        return {}
    if not asynchronous_copies(k, operands, k.stages):
        return {}
    plans = {o.load: tma_plan(k, o) for o in operands}
    return {} if any(p is None for p in plans.values()) else plans  # type: ignore[return-value]


def in_flight(k: Kernel, operands: list[StagedOperand] | None = None) -> int:
    """Groups of WGMMAs a staged kernel on a core that reads local memory itself leaves running at the end of each
    step (0 or 1): one with three or more stages of asynchronous copies, so that the tensor cores never wait for the
    loop's barrier and the next step's copies; its accumulators then stay in the instructions' registers across
    the steps. Its copies run `stages - 2` steps ahead (`Stager._build`). `operands`: `plan(k)`, when known."""
    tc = k.tensor_core
    if tc is None or not tc.shared_operands or not k.staged or k.stages < 3:
        return 0
    return int(asynchronous_copies(k, plan(k) if operands is None else operands, k.stages))


def apply_stage(k: Kernel, stages: int | None = None) -> None:
    """The STAGE opt: checks that it fits `k` on its renderer and marks the kernel staged, or raises KernelOptError.
    `stages` (the opt's arg): 1 for copies and a barrier in each step, 2 or None to pipeline asynchronous copies
    where the renderer has them, 3 or 4 (`MAX_STAGES`) to start the copies of each step two or three steps ahead
    (asynchronous copies only)."""
    r = k.renderer
    if stages not in (None, *range(1, MAX_STAGES + 1)):
        raise KernelOptError(f"STAGE takes 1 to {MAX_STAGES} pipeline stages (or None for 2), got {stages!r}")
    if stages is not None and stages > 2 and not r.has_async_copy:
        raise KernelOptError(f"{stages} pipeline stages need asynchronous copies, which {type(r).__name__} lacks")
    if not (r.has_local and r.has_shared and k.use_locals):
        raise KernelOptError(f"STAGE needs local dimensions and shared memory, which {type(r).__name__} lacks")
    if k.staged:
        raise KernelOptError("the kernel is staged already")
    if len(k.reduceops) != 1:
        raise KernelOptError("STAGE takes a kernel with one reduction")
    if k.axes(AxisType.GROUP_REDUCE) or k.reduce_mask is not None:
        raise KernelOptError("STAGE can't be combined with a grouped reduction or a masked reduce padding")
    if not k.axes(AxisType.REDUCE):
        raise KernelOptError("nothing to stage: no reduce loop is left (the reduction is fully unrolled)")
    if any(not isinstance(k.full_shape[a], int) for a in range(k.rank) if k.axis_types[a] in TILE_TYPES):
        raise KernelOptError("STAGE needs int sizes on the axes inside a workgroup")
    operands = plan(k, 2 if stages is None else stages)
    if not operands:
        raise KernelOptError("STAGE found no operand that changes along the reduction")
    if stages is not None and stages > 2 and not asynchronous_copies(k, operands, stages):
        # synchronous copies don't overlap the math: the slots past two would only take shared memory
        raise KernelOptError(
            f"{stages} pipeline stages need asynchronous copies, and this kernel's operands can't be copied so "
            "(16-, 8- or 4-byte vectors of contiguous, aligned elements): use 1 or 2 stages"
        )
    need = sum(o.bytes for o in operands)
    if k.tensor_core is not None and k.tensor_core.shared_operands:
        from lazygrad_uop.config import WGMMA

        need += SHARED_ALIGN_SLACK
        if WGMMA.value == 2 and r.has_tma:
            need += MBARRIER_BYTES * MAX_STAGES  # the barriers the tensor memory accelerator's copies count on
    if need > r.shared_max:
        raise KernelOptError(
            f"staging needs {need} bytes of local memory, over the renderer's shared_max {r.shared_max}"
        )
    k.staged, k.stages = True, 2 if stages is None else stages


# rows of workgroup tiles a grouped launch order walks together (the largest that divides the rows)
LAUNCH_GROUPS = (8, 4, 2)


def grouped_launch(idxs: list[UOp], sizes: list[sint]) -> list[UOp]:
    """The indices of the GLOBAL axes (`idxs`, outermost first, as `hardware_indices` gives them) of a staged kernel
    with its workgroups in a grouped order: the hardware launches workgroups with gidx0 fastest, which would sweep a
    whole row of output tiles (every tile of B) for each row of A; instead consecutive workgroups cover a band of G
    rows, column by column, so the tiles of A and B they read stay in the L2 cache. The same workgroups, renumbered;
    `idxs` unchanged when there are fewer than two int axes or no G divides the rows."""
    if len(idxs) < 2 or not all(isinstance(s, int) for s in sizes[-2:]):
        return idxs
    rows, cols = int(sizes[-2]), int(sizes[-1])
    group = next((g for g in LAUNCH_GROUPS if rows % g == 0 and g < rows), None)
    if group is None or cols < 2:
        return idxs
    linear = idxs[-2] * cols + idxs[-1]
    band, within = linear // (group * cols), linear % (group * cols)
    return [*idxs[:-2], band * group + within % group, within // group]


class Stager:
    """Builds, for one lowering, the copies of every staged operand into local memory and the reads from there.
    `lowerer` is the `_Lowerer` (its indices, thread index and `idxs`)."""

    def __init__(self, lowerer: _Lowerer) -> None:
        self.lw = lowerer
        self.k = k = lowerer.k
        self.operands = {o.load: o for o in plan(k)}
        # groups of tensor-core instructions left running at the end of a step (`in_flight`)
        self.running = in_flight(k, list(self.operands.values()))
        self.tma = tma_plans(k, list(self.operands.values()))
        self.buffers: dict[UOp, UOp] = {}
        # what the reads of local memory follow: the barrier after the copies, or (pipelined) the copies of a later
        # step that they overlap
        self.ready: UOp | None = None

    def _thread(self) -> tuple[UOp, int]:
        """The flat index of the thread in its workgroup (neighbouring lanes of a warp get neighbouring numbers), and
        the number of threads."""
        lw, k = self.lw, self.k
        axes = k.axes(AxisType.LOCAL)
        tid = lw._flat(axes)
        n = k.lanes(AxisType.LOCAL)
        if k.tensor_core is not None:
            tid = tid * k.tensor_core.threads + lw.tc_thread
            n *= k.tensor_core.threads
        return tid, n

    def _slot_offset(self, o: StagedOperand, step: UOp | None = None) -> UOp:
        """Where the buffer slot of reduction step `step` (default: this one) starts."""
        if o.slots == 1:
            return UOp.const(dtypes.int32, 0)
        step = self.lw._flat(self.k.axes(AxisType.REDUCE)) if step is None else step
        return (step % o.slots) * o.slot

    def _copies(self, reduce_at: dict[int, UOp], step: UOp | None, asynchronous: bool, extra: tuple[UOp, ...] = ()):
        """Every operand's tile at the reduce indices `reduce_at` copied into the slot of `step`: STOREs of loaded
        values, or ASYNC_COPYs (whose global INDEX is gated by `extra[0]` when given, and which follow `extra[1:]`)."""
        k, lw = self.k, self.lw
        tid, n_threads = self._thread()
        zero_index = UOp.const(dtypes.int32, 0)
        out: list[UOp] = []
        for load, o in self.operands.items():
            dt, buf = load.dtype, self.buffers[load]
            gbuf, st = load.src[0], k.views[load.src[1]]
            local = dict(o.local_strides)
            sizes = [int(k.full_shape[a]) for a in o.copy_order]
            base = self._slot_offset(o, step)
            copies = o.tile // o.vector
            for i in range(-(-copies // n_threads)):
                e = tid + i * n_threads
                if asynchronous and copies % n_threads:
                    # an asynchronous copy can't be switched off: the threads past the end copy an element again
                    e = e % copies
                # coordinates of the copy's first element, in the copy order (row-major, unpadded)
                rest, coords = e * o.vector, {}
                for a, size in zip(reversed(o.copy_order), reversed(sizes), strict=True):
                    coords[a] = rest % size
                    rest = rest // size
                # the workgroup's own tile (GLOBAL indices) at this reduction step
                idxs = [
                    coords.get(a, reduce_at.get(a, lw.idx[a] if k.axis_types[a] is AxisType.GLOBAL else zero_index))
                    for a in range(k.rank)
                ]
                # views compute in the type of their first index: the kernel's index type (`index_width`)
                gidx, valid = st.to_indexed_uops([i if i.dtype == lw.idx_dt else i.cast(lw.idx_dt) for i in idxs])
                if o.shared is not None:
                    lidx = base + o.shared.swizzle(o.shared.offset(coords))  # type: ignore[arg-type]
                else:
                    lidx = base
                    for a, c in coords.items():
                        lidx = lidx + c * local[a]
                dst = UOp(Ops.INDEX, buf.dtype, (buf, lidx))
                if asynchronous:
                    gate = valid & extra[0] if extra else valid
                    src = UOp(Ops.INDEX, gbuf.dtype, (gbuf, gidx, gate))
                    out.append(UOp(Ops.ASYNC_COPY, dtypes.void, (dst, src, *extra[1:]), arg=o.vector))
                    continue
                if copies % n_threads:
                    valid = valid & (e < copies)
                vdt = dt.vec(o.vector) if o.vector > 1 else dt
                zero = UOp.const(dt, 0)
                alt = UOp(Ops.VECTORIZE, vdt, (zero,) * o.vector) if o.vector > 1 else zero
                value = UOp(Ops.LOAD, vdt, (UOp(Ops.INDEX, gbuf.dtype, (gbuf, gidx, valid)), alt, valid))
                gate_ = (e < copies,) if copies % n_threads else ()
                if o.vector == 1 or o.store_vector:
                    out.append(UOp(Ops.STORE, dtypes.void, (dst, value, *gate_)))
                    continue
                # the buffer's layout scatters the vector's elements (an FMA kernel's transposed tile)
                step_ = local[o.copy_order[-1]]
                for lane in range(o.vector):
                    index = UOp(Ops.INDEX, buf.dtype, (buf, lidx + lane * step_))
                    out.append(UOp(Ops.STORE, dtypes.void, (index, gep(value, (lane,)), *gate_)))
        return out

    def _build(self) -> UOp:
        """The copies of every operand's tile into local memory, and the barrier after which the reads of this
        reduction step may run.

        Synchronous: each step loads its tiles, stores them in its slot, one BARRIER. Asynchronous (cp.async), a
        pipeline of S = 2 to `MAX_STAGES` stages: before the loop, the copies of steps 0 .. S-2 start, each step's a
        group of its own; each step waits for its own group (started S-1 steps earlier; the S-2 groups after it stay
        in flight), one BARRIER, the copies of step + S-1 start into the slot of step - 1, then the reads of this
        step's slot.

        The one BARRIER is enough: after it every thread's copies into this step's slot have landed (each waited for
        its own, and the barrier makes them visible to the workgroup), and every thread has finished its reads of
        step - 1, so no thread still reads the slot the new copies overwrite; nothing else reads or writes that slot
        until step + S-1 waits for those copies behind its own BARRIER. The reads need only come after the copies
        in program order, so that the copies overlap the math: a NOOP that follows the copies orders them, and is
        nothing on the GPU."""
        k, lw = self.k, self.lw
        for n, (load, o) in enumerate(self.operands.items()):
            self.buffers[load] = UOp(Ops.DEFINE_LOCAL, load.dtype.ptr(o.slot * o.slots, local=True), arg=f"stage{n}")
        reduce_axes = k.axes(AxisType.REDUCE)
        if not self.tma and not asynchronous_copies(k, list(self.operands.values()), k.stages):
            here = {a: lw.idx[a] for a in reduce_axes}
            return UOp(Ops.BARRIER, dtypes.void, tuple(self._copies(here, None, False)))
        # with a step's tensor-core instructions left running into the next (`in_flight`), the slot of the step
        # before is still being read at the barrier: copies go one step less ahead, into the slot of step - 2
        steps = math.prod(int(k.full_shape[a]) for a in reduce_axes)
        ahead = k.stages - 1 - self.running
        if self.tma:
            return self._build_tma(steps, ahead)
        # before the loop: steps 0 .. ahead-1, each closed as a group by a wait that lets it stay in flight
        started: list[UOp] = []
        for j in range(ahead):
            gate = (UOp.const(dtypes.bool, j < steps), UOp(Ops.ASYNC_WAIT, dtypes.void, tuple(started), arg=ahead - 1))
            started = self._copies(self._indices(j), UOp.const(dtypes.int32, j), True, gate if j else ())
        wait = UOp(Ops.ASYNC_WAIT, dtypes.void, (*started, *lw.reduce_ranges), arg=ahead - 1 or None)
        landed = UOp(Ops.BARRIER, dtypes.void, (wait,))
        nxt = lw._flat(reduce_axes) + ahead
        started = self._copies(self._indices(nxt), nxt, True, (nxt < steps, landed))
        return UOp(Ops.NOOP, dtypes.void, tuple(started))

    def _indices(self, step: UOp | int) -> dict[int, UOp]:
        """The reduce indices of reduction step `step`, in the row-major order of the reduce loops."""
        place, out = 1, {}
        for a in reversed(self.k.axes(AxisType.REDUCE)):
            size = int(self.k.full_shape[a])
            i = (step // place) % size
            out[a] = UOp.const(dtypes.int32, i) if isinstance(i, int) else i
            place *= size
        return out

    def _build_tma(self, steps: int, ahead: int) -> UOp:
        """`_build` where the tensor memory accelerator copies every operand (`tma_plans`): a barrier per stage
        (`MBARRIER_INIT`, by the workgroup's first thread, before everything); the first thread starts each step's
        copies, one `TMA_LOAD` per box, after announcing their bytes on the step's barrier (`MBARRIER_EXPECT`); every
        thread waits on it (`MBARRIER_WAIT`, the parity of the slot's use: step // stages), then one BARRIER, after
        which the next copies start. The pipeline is `_build`'s, over `steps` reduction steps: copies `ahead` steps
        ahead, into the slot whose last readers the BARRIER has waited for."""
        k, lw = self.k, self.lw
        stages, zero = k.stages, UOp.const(dtypes.int32, 0)
        bars = UOp(Ops.DEFINE_LOCAL, dtypes.uint64.ptr(stages, local=True), arg="mbar")
        tid, _ = self._thread()
        leader = tid < 1

        def barrier(step: UOp | int) -> UOp:
            slot = step % stages
            return UOp(Ops.INDEX, bars.dtype, (bars, slot if isinstance(slot, UOp) else UOp.const(dtypes.int32, slot)))

        inits = [UOp(Ops.MBARRIER_INIT, dtypes.void, (barrier(s), leader), arg=1) for s in range(stages)]
        ready = UOp(Ops.BARRIER, dtypes.void, tuple(inits))
        nbytes = sum(len(p.boxes) * p.tmap.box_bytes for p in self.tma.values())

        def copies(step: UOp | int, gate: UOp, after: UOp) -> list[UOp]:
            expect = UOp(Ops.MBARRIER_EXPECT, dtypes.void, (barrier(step), gate, after), arg=nbytes)
            out, at = [expect], self._indices(step)
            for load, p in self.tma.items():
                o, buf = self.operands[load], self.buffers[load]
                base = self._slot_offset(o, step if isinstance(step, UOp) else UOp.const(dtypes.int32, step))
                for start, origin in p.boxes:
                    coords = []
                    for d, first in zip(p.dims, origin, strict=True):
                        c, place = UOp.const(dtypes.int32, first), 1
                        for a, n in d:
                            if a not in p.tile:
                                i = at[a] if a in at else lw.idx.get(a, zero)
                                c = c + (i if i.dtype == dtypes.int32 else i.cast(dtypes.int32)) * place
                            place *= n
                        coords.append(c)
                    dst = UOp(Ops.INDEX, buf.dtype, (buf, base + start))
                    src = (dst, load.src[0], barrier(step), gate, *coords, expect)
                    out.append(UOp(Ops.TMA_LOAD, dtypes.void, src, arg=p.tmap))
            return out

        started: list[UOp] = []
        for j in range(ahead):
            started += copies(j, leader & UOp.const(dtypes.bool, j < steps), ready)
        step = lw._flat(k.axes(AxisType.REDUCE))
        parity = (step // stages) % 2
        wait = UOp(Ops.MBARRIER_WAIT, dtypes.void, (barrier(step), parity, *started, *lw.reduce_ranges))
        landed = UOp(Ops.BARRIER, dtypes.void, (wait,))
        nxt = step + ahead
        return UOp(Ops.NOOP, dtypes.void, tuple(copies(nxt, leader & (nxt < steps), landed)))

    def origin(self, load: UOp, coord: dict[int, int]) -> UOp:
        """Where the instruction of the register lanes `coord` (UPCAST and UNROLL axes) finds its part of operand
        `load` of a core that reads local memory itself: the unswizzled offset in this step's slot of the element at
        its tensor-core axes' 0, the workgroup's own LOCAL indices, and `coord`."""
        if self.ready is None:
            self.ready = self._build()
        o, buf = self.operands[load], self.buffers[load]
        assert o.shared is not None
        zero = UOp.const(dtypes.int32, 0)
        at: dict[int, UOp | int] = {}
        for a, _ in (*o.shared.mn, *o.shared.k):
            if self.k.axis_types[a] in (AxisType.TC_M, AxisType.TC_N, AxisType.TC_K):
                at[a] = 0
            elif a in coord:
                at[a] = coord[a]
            else:
                idx = self.lw.idx.get(a, zero)
                at[a] = idx if idx.dtype == dtypes.int32 else idx.cast(dtypes.int32)
        offset = self._slot_offset(o) + o.shared.offset(at)
        return UOp(Ops.INDEX, buf.dtype, (buf, offset))

    def staged(self, load: UOp) -> bool:
        """Whether `load` is read from local memory."""
        return load in self.operands

    def read(self, load: UOp, lanes: _Lanes) -> UOp:
        """The staged operand `load` in the lane context `lanes`: tensor-core fragments by `LDMATRIX` where the
        renderer has it and the layout fits (`ldmatrix_plan`), one read of local memory per lane otherwise."""
        if self.ready is None:
            self.ready = self._build()
        o, buf = self.operands[load], self.buffers[load]
        local = dict(o.local_strides)
        base = self._slot_offset(o)
        fragments = self._ldmatrix(load, lanes)
        if fragments is not None:
            return fragments
        out = []
        for coord in lanes.coords():
            idxs = self.lw.idxs(lanes, coord)
            lidx = base
            for a, stride in local.items():
                lidx = lidx + idxs[a] * stride
            out.append(UOp(Ops.LOAD, load.dtype, (UOp(Ops.INDEX, buf.dtype, (buf, lidx)), self.ready)))
        return vectorize(out)

    def _ldmatrix(self, load: UOp, lanes: _Lanes) -> UOp | None:
        """The fragments of `load` in `lanes` (a tensor core's A or B) read by `LDMATRIX`s, or None when the renderer
        lacks it or the layout does not fit (see `ldmatrix_plan`)."""
        k, lw = self.k, self.lw
        tc = k.tensor_core
        if not k.renderer.has_ldmatrix or tc is None or lanes.operand not in ("A", "B") or tc.threads != 32:
            return None
        if load.dtype.itemsize != 2 or lw.tc_thread is None:
            return None
        o, buf = self.operands[load], self.buffers[load]
        local = dict(o.local_strides)
        layout = lw.layouts[lanes.operand]
        tc_dims = {AxisType.TC_M: "m", AxisType.TC_N: "n", AxisType.TC_K: "k"}
        coords = lanes.coords()
        # the part of the address every lane of the warp shares: the slot and the warp's own (LOCAL) tile
        base = self._slot_offset(o)
        shared = [o.slot] if o.slots > 1 else []
        idxs = lw.idxs(lanes, coords[0])
        for a, stride in local.items():
            if a not in coords[0] and k.axis_types[a] not in tc_dims:
                base = base + idxs[a] * stride
                shared.append(stride)
        if any(s % 8 for s in shared):
            return None  # a row of a matrix must start 16 bytes into local memory
        # each element's offset from `base` in every lane: registers and UPCAST/UNROLL lanes are constants
        offsets = []
        for coord in coords:
            per_lane = []
            for lane in range(32):
                off = 0
                for a, stride in local.items():
                    if a in coord:
                        off += coord[a] * stride
                    elif k.axis_types[a] in tc_dims:
                        off += _coordinate(layout, tc_dims[k.axis_types[a]], lane, coord["reg"]) * stride
                per_lane.append(off)
            offsets.append(tuple(per_lane))
        plan_ = ldmatrix_plan(offsets)
        if plan_ is None:
            return None
        # thread t gives row t % 8 of matrix t // 8; the address must be a sum of one weight per bit of the lane
        tables = [[matrices[(t // 8) % len(matrices)][1][t % 8] for t in range(32)] for _, matrices in plan_]
        for rows in tables:
            weights = [rows[1 << b] - rows[0] for b in range(5)]
            if any(rows[t] != rows[0] + sum(w for b, w in enumerate(weights) if t >> b & 1) for t in range(32)):
                return None
        lane = lw.tc_thread
        values: list[UOp | None] = [None] * len(offsets)
        for (trans, matrices), rows in zip(plan_, tables, strict=True):
            address = base + rows[0]
            for b in range(5):
                weight = rows[1 << b] - rows[0]
                if weight:
                    address = address + ((lane if b == 0 else lane // (1 << b)) % 2) * weight
            index = UOp(Ops.INDEX, buf.dtype, (buf, address))
            frag = UOp(Ops.LDMATRIX, load.dtype.vec(2 * len(matrices)), (index, self.ready), (len(matrices), trans))
            for i, (elements, _) in enumerate(matrices):
                for half_, element in enumerate(elements):
                    for e in element:
                        values[e] = gep(frag, (2 * i + half_,))
        assert all(v is not None for v in values)
        return vectorize(values)  # type: ignore[arg-type]


def _coordinate(layout, dim: str, lane: int, register: int) -> int:  # type: ignore[no-untyped-def]
    """`tensor_cores.coordinate` for a known lane: coordinate `dim` of the element `lane` holds in `register`."""
    value = sum(((register >> rb) & 1) << int(n[1:]) for rb, n in enumerate(layout.register_bits) if n[0] == dim)
    value += sum(((lane >> tb) & 1) << int(n[1:]) for tb, n in enumerate(layout.thread_bits) if n and n[0] == dim)
    return value


Matrix = tuple[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...]]
"""One 8x8 matrix of an LDMATRIX: the fragment elements that its two lanes per thread give (each a tuple, since
equal elements are read once), and the offsets of its 8 rows."""


def ldmatrix_plan(offsets: list[tuple[int, ...]]) -> list[tuple[bool, list[Matrix]]] | None:
    """How a warp's fragment, whose element e sits at `offsets[e][lane]` of local memory (relative to a 16-byte
    aligned address every lane shares), is read by LDMATRIXs: a list of (trans, matrices), at most 4 matrices each;
    None when some element doesn't fit the instruction's distribution.

    Elements go in pairs (2j, 2j + 1), the two 16-bit halves of one register of one matrix. Without trans lane l
    holds row l // 4, columns 2(l % 4) and the next, so the pair is (R[l // 4] + 2(l % 4), that + 1) for 8 row
    offsets R; with trans it is (R[2(l % 4)] + l // 4, R[2(l % 4) + 1] + l // 4). Rows must be 16-byte aligned,
    and pairs that read the same offsets in every lane (an operand repeated along an axis it doesn't read) share
    one matrix."""
    if len(offsets) % 2 or any(len(o) != 32 for o in offsets):
        return None
    found: dict[tuple[bool, tuple[int, ...]], list[tuple[int, ...]]] = {}
    for j in range(0, len(offsets), 2):
        first, second = offsets[j], offsets[j + 1]
        straight = tuple(first[4 * r] for r in range(8))
        trans = tuple((first, second)[r % 2][r // 2] for r in range(8))
        if all(first[t] == straight[t // 4] + 2 * (t % 4) and second[t] == first[t] + 1 for t in range(32)):
            key = (False, straight)
        elif all(
            first[t] == trans[2 * (t % 4)] + t // 4 and second[t] == trans[2 * (t % 4) + 1] + t // 4 for t in range(32)
        ):
            key = (True, trans)
        else:
            return None
        if any(row % 8 for row in key[1]):
            return None
        found.setdefault(key, []).append((j, j + 1))
    out: list[tuple[bool, list[Matrix]]] = []
    for flag in (False, True):
        mats: list[Matrix] = []
        for (t, rows), pairs in found.items():
            if t is flag:
                mats.append(((tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)), rows))
        for n in range(0, len(mats), 4):
            out.append((flag, mats[n : n + 4]))
    # an instruction loads 1, 2 or 4 matrices: a group of 3 becomes one of 2 and one of 1
    fixed: list[tuple[bool, list[Matrix]]] = []
    for flag, mats in out:
        if len(mats) == 3:
            fixed += [(flag, mats[:2]), (flag, mats[2:])]
        else:
            fixed.append((flag, mats))
    return fixed
