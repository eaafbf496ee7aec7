"""Lowering: a `Kernel` (a kernel AST and the types of its axes) becomes a graph of linear-level ops.

Each axis gets an index by its type:

- GLOBAL: a RANGE loop, or on renderers with local dimensions a SPECIAL `gidx<d>` (`gidx0` the innermost axis,
  extra outer axes folded into `gidx2`); on renderers with `has_threads` the outermost GLOBAL loop is `SPECIAL
  core0` instead, which the renderer runs as a loop over the part of it given to one CPU thread;
- LOCAL, GROUP_REDUCE and the tensor core's threads: SPECIAL `lidx<d>` (the tensor core's the innermost, lidx0);
- REDUCE: a RANGE loop; UPCAST and UNROLL: a constant per vector lane (below);
- TC_M, TC_N, TC_K: the coordinate the tensor core's layout gives the thread and register (`tensor_cores`).

Values are vectors with one lane per combination of the UPCAST axes (above a reduction), or of the UNROLL and
UPCAST axes (below it, unrolled axes outermost; output lanes outermost in the dot layout). A LOAD or CONST becomes a
VECTORIZE of one scalar per lane, each indexed through its view with that lane's constants: the view's index is built
once with a variable per lane axis and simplified once (`lane_offsets`); where it is affine in them each lane is that
base plus a constant, and runs of neighbouring lanes are read (and stored) by vector loads (stores) right away, as
`vectors.group_memory` would merge them; elsewhere each lane substitutes its constants. ALU ops act on whole
vectors; a REDUCE_AXIS folds the unrolled lanes into an accumulator (`DEFINE_ACC` over the reduce loops, updated by
`ASSIGN`) that keeps one lane per output lane, or more when there are fewer output lanes than the renderer's vector
width (then they are summed after the loop), or, when the loads run along the innermost unrolled axis (`x @ W.T`),
whole vectors of unrolled lanes per output (the dot layout, `_acc_layout`); a STORE becomes one scalar STORE per
lane. `lazygrad_codegen.vectors` then cuts the vectors to what the renderer takes and merges neighbouring scalar
loads and stores into vector ones.

A grouped reduction (GROUP_REDUCE axes) stores each thread's partial result in local memory (`DEFINE_LOCAL`),
waits at a `BARRIER`, and lets every thread sum its group's partials in a loop; only the threads at group position 0
store the result. On a renderer with a `warp_size` (`Kernel.warp_split`), the threads of each warp first combine
their partials by a butterfly of `SHUFFLE_XOR`s; a group within one warp then needs no local memory at all, and a
group of several warps stores one partial per warp and combines those by shuffles again (or in a loop when their
number is not a power of two). A reduction on tensor cores is a chain of `WMMA` ops on the operands' register vectors.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from dataclasses import dataclass, field

from lazygrad_codegen.heuristic import accumulator_budget
from lazygrad_codegen.index_width import INT32_MAX, index_dtype
from lazygrad_codegen.kernel import REDUCE_TYPES, AxisType, Kernel, KernelASTError, warp_size
from lazygrad_codegen.launch import fitted_indices
from lazygrad_codegen.online_reductions import find_online, lower_online, pair_first
from lazygrad_codegen.selection import affine_fit, axes_read, find_selection, solve
from lazygrad_codegen.staging import Stager, grouped_launch, staged_loads
from lazygrad_codegen.tensor_cores import coordinate, layouts, wmma_arg
from lazygrad_codegen.vectors import (
    REGISTER_ARRAY,
    always_valid,
    concat,
    gep,
    grouped_stores,
    lane_loads,
    scalar_store,
    vec,
    vectorize,
)
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.pattern import PatternMatcher, UPat
from lazygrad_uop.uop import UOp, sint
from lazygrad_uop.views import ShapeTracker

# the hardware indices a renderer with local dimensions offers, for workgroups and for threads
MAX_DIMS = 3
# the loops of a nested reduction (level L) are numbered NEST_ARG * L + axis, apart from the kernel's own axes and
# the loops over a group's partial results
NEST_ARG = 1000


@dataclass(frozen=True)
class LoweredKernel:
    """A kernel after lowering: the linear-level graph, its launch dimensions, and the integer type of its index
    arithmetic (`index_width`)."""

    sink: UOp
    global_size: tuple[sint, sint, sint]
    local_size: tuple[int, int, int]
    index_dtype: DType = dtypes.int32


def hardware_indices(sizes: list[sint], prefix: str) -> tuple[list[UOp], tuple[sint, sint, sint]]:
    """SPECIAL indices `<prefix><d>` for axes of `sizes` (outermost first): the innermost axis gets dimension 0;
    when there are more than three, the outermost share dimension 2 and are recovered from it by division and
    remainder. Returns the index of each axis and the three launch dimensions."""
    if not sizes:
        return [], (1, 1, 1)
    order = list(range(len(sizes)))[::-1]  # innermost first
    direct, merged = order[: MAX_DIMS - 1], order[MAX_DIMS - 1 :]
    idxs: dict[int, UOp] = {}
    dims: list[sint] = []
    for n, a in enumerate(direct):
        idxs[a] = UOp.special(sizes[a], f"{prefix}{n}")  # type: ignore[arg-type]
        dims.append(sizes[a])
    if merged:
        if not all(isinstance(sizes[a], int) for a in merged):
            raise NotImplementedError(f"symbolic sizes on axes merged into {prefix}2 are not supported yet")
        total = math.prod(sizes[a] for a in merged)  # type: ignore[misc]
        g = UOp.special(total, f"{prefix}{len(direct)}")
        dims.append(total)
        place = 1
        # merged holds the axes innermost first, so the first one varies fastest within dimension 2
        for n, a in enumerate(merged):
            q = g if place == 1 else g // place
            idxs[a] = q if n == len(merged) - 1 else q % sizes[a]
            place *= sizes[a]  # type: ignore[operator]
    while len(dims) < MAX_DIMS:
        dims.append(1)
    return [idxs[a] for a in range(len(sizes))], (dims[0], dims[1], dims[2])


@dataclass(frozen=True)
class _Lanes:
    """The vector lanes of a context: the kernel axes (or "reg", a tensor-core register) they enumerate, outermost
    first, and whose tensor-core layout ("A", "B", "C", or "" outside tensor-core operands) places the TC axes.
    Where a one-hot selection is read (`lazygrad_codegen.selection`), `pins` gives some axes an index per lane
    instead of their loop, and `gate` per lane says whether there is anything to read (loads are gated by it)."""

    axes: tuple[int | str, ...]
    sizes: tuple[int, ...]
    operand: str = ""
    pins: tuple[tuple[int, tuple[UOp, ...]], ...] = ()
    gate: tuple[UOp, ...] = ()
    # which loops over the reduce axes index the source of a reduction: its nesting level (`_Lowerer.levels`)
    loop: int = 0

    @property
    def n(self) -> int:
        return math.prod(self.sizes)

    def coords(self) -> list[dict[int | str, int]]:
        """The coordinate of each lane ({axis: position}, outermost axis slowest); read-only, shared between calls."""
        return list(_coords(self.axes, self.sizes))


@functools.lru_cache(maxsize=1024)
def _coords(axes: tuple[int | str, ...], sizes: tuple[int, ...]) -> tuple[dict[int | str, int], ...]:
    # every view a kernel reads asks for its context's lanes, up to a thousand of them: built once per layout
    return tuple(dict(zip(axes, c, strict=True)) for c in itertools.product(*(range(s) for s in sizes)))


def _identity(op: Ops, dtype: DType) -> UOp:
    if op is Ops.ADD:
        return UOp.const(dtype, 0)
    if op is Ops.MUL:
        return UOp.const(dtype, 1)
    return UOp.const(dtype, dtypes.min(dtype))


def _reduce_alu(op: Ops, dtype: DType) -> Ops:
    # on bools a sum is "any", a product "all" and a max "any"
    return {Ops.ADD: Ops.OR, Ops.MUL: Ops.AND, Ops.MAX: Ops.OR}[op] if dtypes.is_bool(dtype) else op


def relevant_axes(st: ShapeTracker) -> tuple[int, ...]:
    """The axes whose index can change what `st` reads: all but size-1 axes, and for one view, stride-0 axes that
    no mask depends on."""
    if len(st.views) == 1:
        v = st.views[0]
        mask = v.mask
        return tuple(
            a
            for a, (s, stride) in enumerate(zip(v.shape, v.strides, strict=True))
            if not (isinstance(s, int) and s == 1)
            and (not (isinstance(stride, int) and stride == 0) or (mask is not None and mask[a] != (0, s)))
        )
    return tuple(a for a, s in enumerate(st.shape) if not (isinstance(s, int) and s == 1))


def _ordered(root: UOp) -> list[UOp]:
    """The AST nodes under `root`, sources first, without descending into REDUCE_AXIS sources or VIEWs."""
    out: list[UOp] = []
    seen: set[UOp] = set()
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        u, expanded = stack.pop()
        if u in seen:
            continue
        if expanded or u.op in (Ops.REDUCE_AXIS, Ops.VIEW, Ops.DEFINE_GLOBAL):
            seen.add(u)
            out.append(u)
            continue
        stack.append((u, True))
        stack.extend((s, False) for s in reversed(u.src) if s not in seen)
    return out


@dataclass
class _Lowerer:
    k: Kernel
    width: int
    idx: dict[int, UOp] = field(default_factory=dict)
    global_size: tuple[sint, sint, sint] = (1, 1, 1)
    local_size: tuple[int, int, int] = (1, 1, 1)
    tc_thread: UOp | None = None
    store_gate: UOp | None = None
    accumulators: int = 0
    local_buffers: int = 0
    memo: dict[tuple, UOp] = field(default_factory=dict)

    def __post_init__(self) -> None:
        k, r = self.k, self.k.renderer
        # int64 only where the kernel's index arithmetic can pass int32 (`index_width`)
        views = list(k.views.values()) + ([k.views[k.reduce_mask]] if k.reduce_mask in k.views else [])
        self.idx_dt = dt = index_dtype(views, tuple(k.full_shape), k.axes(*REDUCE_TYPES))
        globals_ = k.axes(AxisType.GLOBAL)
        if r.has_local:
            # within the renderer's launch limits: folded into fewer dimensions where the plain layout is over them
            gidx, self.global_size = fitted_indices(
                [k.full_shape[a] for a in globals_], "gidx", r.global_max, hardware_indices
            )
            if k.staged:
                gidx = grouped_launch(gidx, [k.full_shape[a] for a in globals_])
            # hardware indices are int32 on every device; an int64 kernel computes with them widened
            self.idx.update(zip(globals_, (g.cast(dt) if dt != g.dtype else g for g in gidx), strict=True))
            thread_axes = k.axes(AxisType.LOCAL, AxisType.GROUP_REDUCE)
            sizes: list[sint] = [k.full_shape[a] for a in thread_axes]
            if k.tensor_core is not None:
                sizes.append(k.tensor_core.threads)
            lidx, local_size = hardware_indices(sizes, "lidx")
            self.local_size = tuple(int(s) for s in local_size)  # type: ignore[assignment]
            self.idx.update(zip(thread_axes, lidx, strict=False))
            if k.tensor_core is not None:
                self.tc_thread = lidx[-1]
        else:
            for n, a in enumerate(globals_):
                size = k.full_shape[a]
                # (the thread split takes an int32 range: a longer outer axis is one loop)
                if n == 0 and r.has_threads and isinstance(size, int) and 0 < size <= INT32_MAX:
                    # the outermost output loop is split over CPU threads by the runtime
                    core = UOp.special(size, "core0")
                    self.idx[a] = core.cast(dt) if dt != core.dtype else core
                    self.global_size = (size, 1, 1)
                else:
                    self.idx[a] = UOp.range(size, a, dt)
        self.reduce_ranges = tuple(UOp.range(k.full_shape[a], a, dt) for a in k.axes(AxisType.REDUCE))
        self.idx.update(zip(k.axes(AxisType.REDUCE), self.reduce_ranges, strict=True))
        # a reduction whose source reads another one's result (broadcast over the same rows) loops over the rows
        # after it, with loops of its own: level 0 for reductions of loads alone, one more than the deepest below
        self.levels: dict[UOp, int] = {}
        # pairs computed in one loop (`online_reductions`): the sum joins its max's loops
        self.online = find_online(k)
        for red in k.reduceops:  # sources first
            if (pair := self.online.get(red)) is not None and red is not pair_first(pair):
                self.levels[red] = self.levels[pair_first(pair)]
                continue
            below = [self.levels[x] for x in red.src[0].toposort if x.op is Ops.REDUCE_AXIS]
            self.levels[red] = max(below) + 1 if below else 0
        self.ranges = [self.reduce_ranges] + [
            tuple(UOp.range(k.full_shape[a], NEST_ARG * level + a, dt) for a in k.axes(AxisType.REDUCE))
            for level in range(1, max(self.levels.values(), default=0) + 1)
        ]
        self.level_idx = [dict(zip(k.axes(AxisType.REDUCE), rs, strict=True)) for rs in self.ranges]
        upcast, unroll = k.axes(AxisType.UPCAST), k.axes(AxisType.UNROLL)
        up_sizes = tuple(int(k.full_shape[a]) for a in upcast)
        un_sizes = tuple(int(k.full_shape[a]) for a in unroll)
        tc = k.tensor_core
        if tc is None:
            self.out = _Lanes(tuple(upcast), up_sizes)
        else:
            e_a, e_b, e_c = tc.elements_per_thread
            self.out = _Lanes((*upcast, "reg"), (*up_sizes, e_c), "C")
            self.tc_a = _Lanes((*unroll, *upcast, "reg"), (*un_sizes, *up_sizes, e_a), "A")
            self.tc_b = _Lanes((*unroll, *upcast, "reg"), (*un_sizes, *up_sizes, e_b), "B")
            self.layouts = dict(zip("ABC", layouts(tc), strict=True))
        self.full = _Lanes((*unroll, *upcast), (*un_sizes, *up_sizes))
        self.stager = Stager(self) if k.staged else None

    # *** indices ***

    def idxs(self, lanes: _Lanes, coord: dict[int | str, int]) -> list[UOp]:
        """The index of every kernel axis for the lane at `coord` of `lanes`."""
        out: list[UOp] = []
        zero = UOp.const(self.idx_dt, 0)
        above_reduce = lanes is self.out
        pins = dict(lanes.pins)
        lane = 0
        if pins:
            for ax, size in zip(lanes.axes, lanes.sizes, strict=True):
                lane = lane * size + coord[ax]
        for a, t in enumerate(self.k.axis_types):
            if a in pins:
                out.append(pins[a][lane])
            elif a in coord:
                out.append(UOp.const(self.idx_dt, coord[a]))
            elif t in (AxisType.TC_M, AxisType.TC_N, AxisType.TC_K):
                if not lanes.operand or (above_reduce and t is AxisType.TC_K):
                    out.append(zero)
                else:
                    dim = {AxisType.TC_M: "m", AxisType.TC_N: "n", AxisType.TC_K: "k"}[t]
                    assert self.tc_thread is not None
                    out.append(coordinate(self.layouts[lanes.operand], dim, self.tc_thread, coord["reg"]))
            elif above_reduce and t in REDUCE_TYPES:
                out.append(zero)
            elif lanes.loop and a in self.level_idx[lanes.loop]:
                out.append(self.level_idx[lanes.loop][a])
            else:
                out.append(self.idx.get(a, zero))
        # hardware indices, tensor-core coordinates and selected positions are int32: views build their arithmetic
        # (constants included) in the type of the indices they are given, which must be the kernel's
        return [i if i.dtype == self.idx_dt else i.cast(self.idx_dt) for i in out]

    def lane_idxs(self, lanes: _Lanes) -> list[list[UOp]]:
        """`idxs` of every lane of `lanes`, in the order of `lanes.coords()`: computed once per context, since every
        view read in it (a kernel reads several, per lane) needs the same ones."""
        # `idxs` tells the output context from an equal one by identity (reduce axes read as 0 above the reduce)
        key = ("idxs", lanes, lanes is self.out)
        if (known := self.memo.get(key)) is None:
            known = self.memo[key] = [self.idxs(lanes, coord) for coord in lanes.coords()]  # type: ignore[assignment]
        return known  # type: ignore[return-value]

    def first_idxs(self, lanes: _Lanes) -> list[UOp]:
        """`idxs` of lane 0 of `lanes` (every lane axis at 0), without those of all lanes that `lane_idxs` builds."""
        key = ("first idxs", lanes, lanes is self.out)
        if (first := self.memo.get(key)) is None:
            first = self.memo[key] = self.idxs(lanes, dict.fromkeys(lanes.axes, 0))  # type: ignore[assignment]
        return first  # type: ignore[return-value]

    def indexed(self, view: UOp, lanes: _Lanes) -> list[tuple[UOp, UOp]]:
        """(index, valid) of `view` for each lane: from one symbolic index of all lanes (`lane_indexed`), or built
        lane by lane where the lanes' indices aren't constants (pinned lanes, tensor-core operands)."""
        st = self.k.views[view]
        relevant = relevant_axes(st)
        if (by_lane := self.lane_indexed(view, relevant, lanes)) is not None:
            return by_lane
        if not lanes.pins and not lanes.operand and not any(a in relevant for a in lanes.axes):
            # no lane moves the view: every lane reads what lane 0 reads (the memo below would find that lane by lane)
            key = ("index", view, tuple(self.first_idxs(lanes)[a] for a in relevant))
            if key not in self.memo:
                self.memo[key] = st.to_indexed_uops(self.first_idxs(lanes))  # type: ignore[assignment]
            return [self.memo[key]] * lanes.n  # type: ignore[list-item]
        out = []
        for idxs in self.lane_idxs(lanes):
            key = ("index", view, tuple(idxs[a] for a in relevant))
            if key not in self.memo:
                self.memo[key] = st.to_indexed_uops(idxs)  # type: ignore[assignment]
            out.append(self.memo[key])
        return out  # type: ignore[return-value]

    def lane_indexed(self, view: UOp, relevant: tuple[int, ...], lanes: _Lanes) -> list[tuple[UOp, UOp]] | None:
        """(index, valid) of `view` for each lane of `lanes`, from one index expression with a variable per lane axis,
        simplified once (`lane_offsets`); None where lanes are pinned or tensor-core operands (their indices aren't
        lane constants), or where no lane axis moves the view, to be built lane by lane."""
        lane_axes = [a for a in lanes.axes if isinstance(a, int) and a in relevant]
        if lanes.pins or lanes.operand or not lane_axes:
            return None
        first = self.first_idxs(lanes)
        key = ("lanes", view, tuple(first[a] for a in relevant), lanes.axes, lanes.sizes)
        if key in self.memo:
            return self.memo[key]  # type: ignore[return-value]
        sizes = dict(zip(lanes.axes, lanes.sizes, strict=True))
        variables = {a: UOp.variable(f"lane:{a}", 0, sizes[a] - 1, self.idx_dt) for a in lane_axes}
        idxs = list(first)
        for a, var in variables.items():
            idxs[a] = var
        out = lane_offsets(*self.k.views[view].to_indexed_uops(idxs), variables, lanes.coords())
        self.memo[key] = out  # type: ignore[assignment]
        return out

    # *** values ***

    def value(self, root: UOp, lanes: _Lanes) -> UOp:
        """`root` computed in the context `lanes`: a vector with one lane per element (a scalar for one lane)."""
        for u in _ordered(root):
            key = ("value", u, lanes)
            if key in self.memo:
                continue
            self.memo[key] = self._lower(u, lanes)
        return self.memo[("value", root, lanes)]

    def _lower(self, u: UOp, lanes: _Lanes) -> UOp:
        if u.op in (Ops.VIEW, Ops.DEFINE_GLOBAL):
            return u
        if u.op is Ops.LOAD:
            if self.stager is not None and self.stager.staged(u):
                return self.stager.read(u, lanes)
            buf = u.src[0]
            indexed = self.indexed(u.src[1], lanes)
            if lanes.gate:
                indexed = [(idx, valid & g) for (idx, valid), g in zip(indexed, lanes.gate, strict=True)]
            # lanes that read the same element (a view broadcast along some lane axes) share one load, and lanes
            # whose indices `lane_indexed` gave as one base plus offsets are read by vector loads right away (rather
            # than as scalars for `group_memory` to merge after the whole kernel is simplified)
            return vectorize(lane_loads(buf, u.dtype, UOp.const(u.dtype, 0), indexed, self.k.renderer))
        if u.op is Ops.CONST:
            value = UOp.const(u.dtype, u.arg)
            if not u.src:
                return vectorize([value] * lanes.n)
            zero = value.const_like(0)
            indexed = self.indexed(u.src[0], lanes)
            # (an always-true validity selects the value itself, as the simplification would make it)
            masked = {
                valid: value if always_valid(valid) else valid.where(value, zero)
                for valid in {valid for _, valid in indexed}
            }
            return vectorize([masked[valid] for _, valid in indexed])
        if u.op is Ops.REDUCE_AXIS:
            if ("reduced", u) not in self.memo:
                self.memo[("reduced", u)] = self._tc_reduce(u) if self.k.tensor_core is not None else self._reduce(u)
            reduced = self.memo[("reduced", u)]
            return reduced if lanes is self.out else self._broadcast(reduced, lanes)
        if u.op in GroupOp.Elementwise:
            srcs = tuple(self.memo[("value", s, lanes)] for s in u.src)
            return UOp(u.op, vec(u.dtype, lanes.n), srcs, u.arg)
        raise KernelASTError(f"kernel AST holds an op codegen can't lower: {u.op.name}")

    def _broadcast(self, reduced: UOp, lanes: _Lanes) -> UOp:
        """A reduction's result (one lane per output lane) read inside a later reduction's source over the same rows:
        each lane of `lanes` takes its output's lane, whatever its reduced (unrolled) coordinates."""
        if lanes.operand:
            raise KernelASTError("a reduction read inside a tensor-core operand can't be lowered")
        picks = []
        for coord in lanes.coords():
            j = 0
            for a, size in zip(self.out.axes, self.out.sizes, strict=True):
                j = j * size + coord[a]
            picks.append(j)
        return gep(reduced, tuple(picks))

    def _acc_multiplicity(self, n_out: int, n_unroll: int) -> int:
        """How many unrolled lanes per output lane the accumulator keeps apart (combined after the loop). With fewer
        output lanes than the renderer's vector width, enough for four vectors' worth: four independent chains of
        adds (or maxes, which can't be reordered) per loop step instead of one long one."""
        if n_out >= self.width:
            return 1
        target = min(4 * self.width, n_out * n_unroll)
        return next(d for d in range(1, n_unroll + 1) if n_unroll % d == 0 and n_out * d >= target)

    def _acc_layout(self, n_out: int, n_unroll: int) -> tuple[int, bool]:
        """(unrolled lanes kept apart per output lane, whether in the dot layout). When the loads below the reduction
        are mostly contiguous along the innermost UNROLL axis (`x @ W.T`: both operands along the reduction), each
        output keeps whole vectors of unrolled lanes (output-major, `_acc_lanes`): a step is then one vector
        multiply-add per output on vectors straight from memory, and the lanes are summed once after the loop.
        Otherwise each step would have to transpose its vectors into output order."""
        apart = self._acc_multiplicity(n_out, n_unroll)
        w = self.width
        unroll = self.k.axes(AxisType.UNROLL)
        if w <= 1 or not unroll or not self._contiguous_along_unroll():
            return apart, False
        # whole vectors per output, at least as many lanes as without the dot layout, within the register budget
        inner = int(self.k.full_shape[unroll[-1]])
        dot = next((d for d in range(max(w, apart), inner + 1, w) if inner % d == 0), None)
        if dot is None or n_out * dot > accumulator_budget(self.k):
            return apart, False
        return dot, True

    def _contiguous_along_unroll(self) -> bool:
        """Whether more loads below the reduction read consecutive elements along the innermost UNROLL axis than
        along the innermost UPCAST axis."""
        unroll, upcast = self.k.axes(AxisType.UNROLL)[-1], self.k.axes(AxisType.UPCAST)
        strides = [st.real_strides(ignore_valid=True) for ld, st in self.k.loads() if ld.src[1] in self.k.full_views]

        def along(axis: int) -> int:
            return sum(1 for s in strides if isinstance(s[axis], int) and s[axis] == 1)

        return along(unroll) > (along(upcast[-1]) if upcast else 0)

    def _select(self, red: UOp) -> UOp | None:
        """A one-hot selection read at the one position it picks, with no loop (see `lazygrad_codegen.selection`);
        None when `red` is not one (or its index math is not an arange), to be lowered as a reduction."""
        sel = find_selection(red, self.k)
        if sel is None:
            return None
        n = self.out.n
        valid: list[UOp] = [UOp.const(dtypes.bool, True)] * n
        pins: list[tuple[int, tuple[UOp, ...]]] = []
        for axis, index, target in sel.pins:
            size = self.k.full_shape[axis]
            # the index math reads no axis but this one: one lane of it, over the reduce loop, is all of it
            f = self.value(index, _Lanes((), ()))
            fit = affine_fit(f, self.idx[axis], size) if isinstance(size, int) else None
            if fit is None:
                return None
            solved = [solve(e, *fit, size) for e in self._per_lane(target)]
            valid = [v & ok for v, (ok, _) in zip(valid, solved, strict=True)]
            pins.append((axis, tuple(pos for _, pos in solved)))
        for g in sel.gates:
            valid = [v & gl for v, gl in zip(valid, self._per_lane(g), strict=True)]
        at = _Lanes(self.out.axes, self.out.sizes, pins=tuple(pins), gate=tuple(valid))
        x = self.value(sel.value, at)
        return vectorize([v.where(gep(x, (lane,)), sel.alt) for lane, v in enumerate(valid)])

    def _per_lane(self, u: UOp) -> list[UOp]:
        """AST value `u` (independent of the reduce axes) as one scalar per output lane, lanes that it can't tell
        apart sharing one node: the loads a selection makes from them then have the same base index and can be
        merged into vector loads."""
        read = axes_read(u, self.k)
        sub = [(a, s) for a, s in zip(self.out.axes, self.out.sizes, strict=True) if a in read]
        m = math.prod(s for _, s in sub)
        # above the reduction: the reduce axes (which `u` doesn't read) at 0, never their loop
        at_zero = tuple((a, (UOp.const(self.idx_dt, 0),) * m) for a in self.k.axes(*REDUCE_TYPES))
        v = self.value(u, _Lanes(tuple(a for a, _ in sub), tuple(s for _, s in sub), pins=at_zero))
        out = []
        for coord in self.out.coords():
            j = 0
            for a, s in sub:
                j = j * s + coord[a]
            out.append(gep(v, (j,)))
        return out

    def _reduce(self, red: UOp) -> UOp:
        if (pair := self.online.get(red)) is not None:
            if ("online", red) not in self.memo:
                self.memo.update({("online", r): res for r, res in lower_online(self, pair).items()})
            return self.memo[("online", red)]
        level = self.levels[red]
        # (a selection's positions are solved against the first loops)
        if level == 0 and (picked := self._select(red)) is not None:
            return picked
        ranges = self.ranges[level]
        op = _reduce_alu(red.arg[0], red.dtype)
        n_out = self.out.n
        n_unroll = self.full.n // n_out
        a, dot = self._acc_layout(n_out, n_unroll)
        # the dot layout computes the reduced value output-major, so that each vector runs along the unrolled axis
        full = self.full if level == 0 else _Lanes(self.full.axes, self.full.sizes, loop=level)
        if dot:
            n_un = len(self.k.axes(AxisType.UNROLL))
            full = _Lanes(full.axes[n_un:] + full.axes[:n_un], full.sizes[n_un:] + full.sizes[:n_un], loop=level)
        x = self.value(red.src[0], full)
        identity = _identity(red.arg[0], red.dtype)
        if self.k.reduce_mask is not None:
            # padded elements of the reduce axes count as the identity
            valid = [v for _, v in self.indexed(self.k.reduce_mask, full)]
            x = vectorize([v.where(gep(x, (i,)), identity) for i, v in enumerate(valid)])
        n_acc = n_out * a
        slices = [gep(x, _acc_lanes(step, n_out, n_unroll, a, dot)) for step in range(n_unroll // a)]
        if (folded := self._invariant_reduce(x, slices, op, n_out, a, dot, ranges)) is not None:
            return folded
        if ranges:
            acc = self._acc(red.dtype, n_acc, identity, ranges)
            new = acc
            for s in slices:
                new = new.alu(op, s)
            val = UOp(Ops.ASSIGN, acc.dtype, (acc, new))
        else:
            val = slices[0]
            for s in slices[1:]:
                val = val.alu(op, s)
        res = _fold_apart(val, op, n_out, a, dot)
        if self.k.axes(AxisType.GROUP_REDUCE):
            res = self._group_reduce(red, res, op, identity)
        return res

    def _invariant_reduce(
        self, x: UOp, slices: list[UOp], op: Ops, n_out: int, apart: int, dot: bool, ranges: tuple[UOp, ...]
    ) -> UOp | None:
        """The reduction's result without a loop when the reduced value `x` is the same at every position of the
        reduce loops and of the group's threads (a sum of a constant or of a broadcast load): a sum is the sum of one
        step's lanes times the number of steps (one rounding where a loop of float adds would round at every step;
        wrapping as its int adds would), a max or an any the value itself. None when `x` depends on them, or when
        their sizes are symbolic or zero (the loop then decides how often, or whether, it runs). `ranges`: the
        reduction's loops."""
        groups = self.k.axes(AxisType.GROUP_REDUCE)
        if op not in (Ops.ADD, Ops.MAX, Ops.OR) or not (ranges or groups):
            return None
        loops = [*ranges, *(self.idx[g] for g in groups)]
        if any(r in x.toposort for r in loops):
            return None
        sizes = [r.src[0] for r in ranges]
        if not all(e.op is Ops.CONST for e in sizes):
            return None
        trips = math.prod(e.arg for e in sizes) * math.prod(int(self.k.full_shape[g]) for g in groups)
        if trips == 0:
            return None
        once = slices[0]
        for s in slices[1:]:
            once = once.alu(op, s)
        res = _fold_apart(once, op, n_out, apart, dot)
        if groups:
            # every thread of a group holds the whole result; the first one stores it, as after a grouped reduction
            self.store_gate = self._first_in_group()
        return res * UOp.const(res.dtype, trips) if op is Ops.ADD else res

    def _acc(self, dtype: DType, n: int, identity: UOp, ranges: tuple[UOp, ...]) -> UOp:
        acc = UOp(Ops.DEFINE_ACC, vec(dtype, n), (vectorize([identity] * n), *ranges), arg=(self.accumulators,))
        self.accumulators += 1
        return acc

    def _flat(self, axes: list[int]) -> UOp:
        """Row-major flat index of the hardware indices of `axes`."""
        out = UOp.const(dtypes.int32, 0)
        for a in axes:
            out = out * int(self.k.full_shape[a]) + self.idx[a]
        return out

    def _first_in_group(self) -> UOp:
        """Whether this thread is at position 0 of every GROUP_REDUCE axis."""
        first: UOp | None = None
        for g in self.k.axes(AxisType.GROUP_REDUCE):
            is_first = self.idx[g].eq(0)
            first = is_first if first is None else first & is_first
        assert first is not None
        return first

    def _group_reduce(self, red: UOp, res: UOp, op: Ops, identity: UOp) -> UOp:
        k = self.k
        groups, local = k.axes(AxisType.GROUP_REDUCE), k.axes(AxisType.LOCAL)
        l_flat, g_flat = self._flat(local), self._flat(groups)
        # every thread of a group ends with the whole result; the first one stores it
        self.store_gate = self._first_in_group()
        if (split := k.warp_split()) is None:
            return self._through_shared(red, res, op, identity, l_flat, g_flat, k.lanes(AxisType.GROUP_REDUCE))
        lanes, warps = split
        res = _butterfly(res, op, lanes)
        if warps == 1:
            return res
        # one partial result per warp, written by the warp's first lane
        return self._through_shared(red, res, op, identity, l_flat, g_flat // lanes, warps, (g_flat % lanes).eq(0))

    def _through_shared(
        self,
        red: UOp,
        res: UOp,
        op: Ops,
        identity: UOp,
        row: UOp,
        slot: UOp,
        n: int,
        writer: UOp | None = None,
    ) -> UOp:
        """Combine the partial results `res` of `n` threads (or warps) per row of a workgroup through local memory:
        each stores its own at (`row`, `slot`) (only where `writer` holds), and after a barrier every thread combines
        its row's `n`: by a butterfly of shuffles when they fit one warp as a power of two, else in a loop."""
        n_out = res.dtype.count
        size = self.k.lanes(AxisType.LOCAL) * n * n_out
        buf = UOp(Ops.DEFINE_LOCAL, red.dtype.ptr(size, local=True), arg=f"temp{self.local_buffers}")
        self.local_buffers += 1
        base = (row * n + slot) * n_out
        gate = () if writer is None else (writer,)
        stores = tuple(
            UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, base + o)), gep(res, (o,)), *gate))
            for o in range(n_out)
        )
        barrier = UOp(Ops.BARRIER, dtypes.void, stores)

        def partials(i: UOp) -> UOp:
            first = (row * n + i) * n_out
            return vectorize(
                [UOp(Ops.LOAD, red.dtype, (UOp(Ops.INDEX, buf.dtype, (buf, first + o)), barrier)) for o in range(n_out)]
            )

        if self.k.warp_split() is not None and n & (n - 1) == 0 and n <= warp_size(self.k.renderer):
            # lane l of a warp reads partial l mod n: each aligned run of n lanes holds all n, once
            return _butterfly(partials(self._flat(self.k.axes(AxisType.GROUP_REDUCE)) % n), op, n)
        second = UOp.range(n, self.k.rank + self.local_buffers)
        acc = self._acc(red.dtype, n_out, identity, (second,))
        return UOp(Ops.ASSIGN, acc.dtype, (acc, acc.alu(op, partials(second))))

    def _tc_reduce(self, red: UOp) -> UOp:
        k = self.k
        tc = k.tensor_core
        assert tc is not None and k.tc_operands is not None
        if tc.shared_operands:
            return self._shared_tc_reduce(red)
        a_load, b_load = k.tc_operands
        a_vec, b_vec = self.value(a_load, self.tc_a), self.value(b_load, self.tc_b)
        e_a, e_b, e_c = tc.elements_per_thread
        n_up, n_un = k.lanes(AxisType.UPCAST), k.lanes(AxisType.UNROLL)
        zero = UOp.const(tc.dtype_out, 0)
        if self.reduce_ranges:
            acc = self._acc(tc.dtype_out, n_up * e_c, zero, self.reduce_ranges)
        else:
            acc = vectorize([zero] * (n_up * e_c))
        cur = [gep(acc, range(o * e_c, (o + 1) * e_c)) for o in range(n_up)]
        arg = wmma_arg(tc)
        for u in range(n_un):
            for o in range(n_up):
                lane = u * n_up + o
                a = gep(a_vec, range(lane * e_a, (lane + 1) * e_a))
                b = gep(b_vec, range(lane * e_b, (lane + 1) * e_b))
                cur[o] = UOp(Ops.WMMA, vec(tc.dtype_out, e_c), (a, b, cur[o]), arg)
        new = concat(cur)
        return UOp(Ops.ASSIGN, acc.dtype, (acc, new)) if self.reduce_ranges else new

    def _shared_tc_reduce(self, red: UOp) -> UOp:
        """The reduction on a tensor core that reads A and B from local memory itself (`WGMMA`): per step, for each
        UNROLL lane (a K slice) and each UPCAST lane (an output tile), one instruction from the two operands'
        origins in the staged tiles (`Stager.origin`) into that tile's accumulators."""
        k = self.k
        tc = k.tensor_core
        assert tc is not None and k.tc_operands is not None
        if self.stager is None:
            raise KernelASTError(f"tensor core {tc} reads its operands from local memory: the kernel needs STAGE")
        a_load, b_load = staged_loads(k)
        e_c = tc.elements_per_thread[2]
        upcast, unroll = k.axes(AxisType.UPCAST), k.axes(AxisType.UNROLL)
        up = _coords(tuple(upcast), tuple(int(k.full_shape[a]) for a in upcast))
        un = _coords(tuple(unroll), tuple(int(k.full_shape[a]) for a in unroll))
        zero = UOp.const(tc.dtype_out, 0)
        running = self.stager.running if self.reduce_ranges else 0
        accs: list[UOp] = []
        if running:
            # an accumulator per output tile, kept whole in the instructions' registers from step to step
            for _ in up:
                acc = self._acc(tc.dtype_out, e_c, zero, self.reduce_ranges)
                accs.append(acc.replace(arg=(*acc.arg, REGISTER_ARRAY)))
            cur = list(accs)
        else:
            n_acc = len(up) * e_c
            acc = (
                self._acc(tc.dtype_out, n_acc, zero, self.reduce_ranges)
                if self.reduce_ranges
                else vectorize([zero] * n_acc)
            )
            cur = [gep(acc, range(o * e_c, (o + 1) * e_c)) for o in range(len(up))]
        (n, m, kk), layout_c = tc.dims, tc.swizzle[2]
        matrices = {}
        for load in (a_load, b_load):
            shared = self.stager.operands[load].shared
            assert shared is not None
            m_ = shared.matrix
            matrices[load] = (m_.major, m_.lbo, m_.sbo, m_.swizzle)
        arg = ((n, m, kk), tc.dtype_in, tc.dtype_out, tc.threads, layout_c, matrices[a_load], matrices[b_load])
        if running:
            arg = (*arg, running)
        for u_coord in un:
            for o, o_coord in enumerate(up):
                coord = {**u_coord, **o_coord}
                a = self.stager.origin(a_load, coord)  # type: ignore[arg-type]
                b = self.stager.origin(b_load, coord)  # type: ignore[arg-type]
                assert self.stager.ready is not None
                cur[o] = UOp(Ops.WGMMA, vec(tc.dtype_out, e_c), (a, b, cur[o], self.stager.ready), arg)
        if running:
            return concat([UOp(Ops.ASSIGN, a.dtype, (a, c)) for a, c in zip(accs, cur, strict=True)])
        new = concat(cur)
        return UOp(Ops.ASSIGN, acc.dtype, (acc, new)) if self.reduce_ranges else new

    # *** stores ***

    def stores(self, store: UOp) -> list[UOp]:
        buf, view, value = store.src
        v = self.value(value, self.out)
        out = []
        for lane, (idx, valid) in enumerate(self.indexed(view, self.out)):
            if self.store_gate is not None:
                valid = valid & self.store_gate
            out.append(scalar_store(buf, idx, gep(v, (lane,)), valid))
        # lanes that `lane_indexed` gave as one base plus offsets are stored by vector stores right away (in the
        # order `group_memory` would give them; scalar stores that merge with none stay in lane order, as there)
        return grouped_stores(out, self.k.renderer) if len(out) > 1 else out


def lane_offsets(
    idx: UOp, valid: UOp, variables: dict[int, UOp], coords: list[dict[int | str, int]]
) -> list[tuple[UOp, UOp]]:
    """(index, valid) per lane coordinate in `coords` of an index expression `idx` and validity `valid` over lane
    variables (`variables`, by axis): both are simplified once, and where the index is a sum of terms free of the
    variables plus `c * variable` terms, each lane's index is that base plus its constant offset (the form that
    `vectors.group_memory` merges into vector accesses); a validity that reads the variables gets them replaced by
    the lane's constants. Where a variable appears other than so (under a division, a modulo, a product with
    another index), each lane gets the simplified expressions with the variables replaced by its constants
    (`_substituted`), which the kernel's simplification finishes."""
    idx, valid = idx.simplify(), valid.simplify()
    var_set = set(variables.values())
    coeff: dict[UOp, int] = dict.fromkeys(var_set, 0)
    base_terms: list[UOp] = []
    const = 0
    terms, stack = [], [idx]
    while stack:
        t = stack.pop()
        if t.op is Ops.ADD:
            stack.extend(reversed(t.src))
        else:
            terms.append(t)
    for t in terms:
        if t.op is Ops.CONST:
            const += t.arg
        elif t in var_set:
            coeff[t] += 1
        elif var_set.isdisjoint(t.toposort):
            base_terms.append(t)
        elif t.op is Ops.MUL and t.src[0] in var_set and t.src[1].op is Ops.CONST:
            coeff[t.src[0]] += t.src[1].arg
        else:
            return _substituted(idx, valid, variables, coords)
    base: UOp | None = None
    for t in base_terms:
        base = t if base is None else base + t
    # the validity of a lane depends on the variables it reads alone: lanes that agree on those share one
    in_valid = [(a, v) for a, v in variables.items() if v in valid.toposort]
    valids: dict[tuple[int, ...], UOp] = {}
    # lanes that differ only along axes the view doesn't read share their pair
    pairs: dict[object, tuple[UOp, UOp]] = {}
    # a lane's coordinates along the variables (one int for one variable): the key its pair is shared under
    lane_of = operator.itemgetter(*variables) if variables else lambda coord: ()
    terms_of = [(a, c) for a, v in variables.items() if (c := coeff[v])]
    out = []
    for coord in coords:
        if (pair := pairs.get(lane := lane_of(coord))) is not None:
            out.append(pair)
            continue
        off = const + sum(c * coord[a] for a, c in terms_of)
        if base is None:
            lane_idx = UOp.const(idx.dtype, off)
        else:
            lane_idx = base if off == 0 else base + UOp.const(idx.dtype, off)
        at = tuple(coord[a] for a, _ in in_valid)
        if (lane_valid := valids.get(at)) is None:
            # simplified like the index, so that lanes of one validity share its node (and group into vector loads)
            lane_valid = valid.substitute({v: UOp.const(v.dtype, coord[a]) for a, v in in_valid})
            lane_valid = valids[at] = lane_valid.simplify() if in_valid else lane_valid
        out.append(pairs.setdefault(lane, (lane_idx, lane_valid)))
    return out


def _substituted(
    idx: UOp, valid: UOp, variables: dict[int, UOp], coords: list[dict[int | str, int]]
) -> list[tuple[UOp, UOp]]:
    """(index, valid) per lane coordinate of the simplified `idx` and `valid` with the lane variables replaced by
    the lane's constants (left for the kernel's simplification to finish): a lane built from the expression that
    was simplified once for all lanes, not from the view."""
    used = [(a, v) for a, v in variables.items() if v in idx.toposort or v in valid.toposort]
    known: dict[tuple[int, ...], tuple[UOp, UOp]] = {}
    out = []
    for coord in coords:
        at = tuple(coord[a] for a, _ in used)
        if (pair := known.get(at)) is None:
            mapping = {v: UOp.const(v.dtype, coord[a]) for a, v in used}
            pair = known[at] = (idx.substitute(mapping), valid.substitute(mapping))
        out.append(pair)
    return out


def _acc_lanes(step: int, n_out: int, n_unroll: int, apart: int, dot: bool) -> list[int]:
    """The lanes of the reduced value that reduction step `step` combines into an accumulator of `n_out` x `apart`
    lanes, in the accumulator's order: (kept-apart unrolled lane, output) from a value with its unrolled lanes
    outermost, or in the dot layout (output, kept-apart unrolled lane) from a value with its output lanes outermost."""
    first = step * apart
    if dot:
        return [o * n_unroll + first + u for o in range(n_out) for u in range(apart)]
    return list(range(first * n_out, (first + apart) * n_out))


def _fold_apart(val: UOp, op: Ops, n_out: int, apart: int, dot: bool) -> UOp:
    """The `n_out` results of an accumulator that keeps `apart` lanes per output (see `_acc_lanes`). The dot layout
    halves its lanes per output at each step (log2 of `apart` vector ops) rather than one op per kept-apart lane."""
    if not dot:
        res = gep(val, range(n_out))
        for u in range(1, apart):
            res = res.alu(op, gep(val, range(u * n_out, (u + 1) * n_out)))
        return res
    while apart % 2 == 0:
        half = apart // 2
        lo = gep(val, [o * apart + u for o in range(n_out) for u in range(half)])
        val = lo.alu(op, gep(val, [o * apart + half + u for o in range(n_out) for u in range(half)]))
        apart = half
    res = gep(val, [o * apart for o in range(n_out)])
    for u in range(1, apart):
        res = res.alu(op, gep(val, [o * apart + u for o in range(n_out)]))
    return res


def _butterfly(x: UOp, op: Ops, lanes: int) -> UOp:
    """`x` combined with `op` over each aligned run of `lanes` threads of a warp (a power of two): log2(lanes) steps,
    each combining a thread's value with that of the thread whose lane differs in one bit, after which every thread
    of the run holds the result. Vectors are shuffled lane by lane."""
    offset = lanes // 2
    while offset >= 1:
        lanes_of_x = [gep(x, (o,)) for o in range(x.dtype.count)]
        other = vectorize([UOp(Ops.SHUFFLE_XOR, v.dtype, (v,), offset) for v in lanes_of_x])
        x = x.alu(op, other)
        offset //= 2
    return x


def lower(k: Kernel, width: int = 1) -> LoweredKernel:
    """Lower kernel `k` for its renderer, with vectors of any width (`width` is the renderer's vector width, which
    decides how many lanes an accumulator keeps). The index math is left unsimplified."""
    lw = _Lowerer(k, width)
    stores = [s for st in k.ast.src for s in lw.stores(st)]
    sink = UOp(Ops.SINK, dtypes.void, tuple(stores))
    return LoweredKernel(sink, lw.global_size, lw.local_size, lw.idx_dt)


def _drop_false_stores(sink: UOp) -> UOp | None:
    kept = tuple(s for s in sink.src if not (s.op is Ops.STORE and len(s.src) == 3 and _is_const(s.src[2], False)))
    return None if len(kept) == len(sink.src) else sink.replace(src=kept)


def _is_const(u: UOp, value: bool) -> bool:
    return u.op is Ops.CONST and u.arg is value


_TRUE, _FALSE = UPat.const(dtypes.bool, True), UPat.const(dtypes.bool, False)

# After the symbolic engine has folded gates to constants: an always-true gate is no gate, an always-false gate
# means the memory is never touched.
cleanup_rules = PatternMatcher(
    [
        (
            UPat(Ops.INDEX, src=(UPat.var("buf"), UPat.var("idx"), _TRUE), name="x"),
            lambda x, buf, idx: x.replace(src=(buf, idx)),
        ),
        (UPat(Ops.LOAD, src=(UPat.var("index"), UPat(), _TRUE), name="x"), lambda x, index: x.replace(src=(index,))),
        (UPat(Ops.LOAD, src=(UPat(), UPat.var("alt"), _FALSE)), lambda alt: alt),
        (
            UPat(Ops.STORE, src=(UPat.var("index"), UPat.var("value"), _TRUE), name="x"),
            lambda x, index, value: x.replace(src=(index, value)),
        ),
        (UPat(Ops.SINK, name="sink"), _drop_false_stores),
        (UPat(Ops.WHERE, src=(_TRUE, UPat.var("a"), UPat())), lambda a: a),
        (UPat(Ops.WHERE, src=(_FALSE, UPat(), UPat.var("b"))), lambda b: b),
        # every thread of a warp holds the same constant
        (UPat(Ops.SHUFFLE_XOR, src=(UPat(Ops.CONST, name="c"),)), lambda c: c),
    ]
)
