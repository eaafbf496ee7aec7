"""The kernel view that optimisations work on: every view of a kernel AST reshaped to one shape, the kernel's axes,
each with a type that says how it will run, and the OptOps that split, pad and permute those axes.

A kernel AST starts with one full shape F (see the package README): its axes are GLOBAL (output axes) or REDUCE.
Size-1 axes are dropped, output axes are put before reduce axes, and neighbouring axes that every view can merge
are merged, so `E_64_32` over a contiguous buffer becomes one axis of 2048. Each opt then changes every view of the
kernel the same way:

- `UPCAST(axis, amt)`: splits `amt` off a GLOBAL axis as an UPCAST axis: each thread computes `amt` outputs, in
  vector lanes;
- `UNROLL(axis, amt)`: splits `amt` off a REDUCE axis as an UNROLL axis: `amt` elements of the reduction per loop step;
- `LOCAL(axis, amt)`: splits `amt` off a GLOBAL axis as a LOCAL axis: threads of one workgroup (GPUs);
- `GROUP(axis, amt)`, `GROUPTOP`: split `amt` off a REDUCE axis (its inner / outer part) as a GROUP_REDUCE axis:
  threads of a workgroup reduce parts of the axis and combine them through shared memory, or, on a renderer that
  declares a `warp_size`, first within each warp by shuffles (`Kernel.warp_split`);
- `PADTO(axis, amt)`: pads a GLOBAL or REDUCE axis (`axis` indexes the GLOBAL axes, then the REDUCE axes) to a
  multiple of `amt`; the padding is masked: loads read 0 there, and a reduction that zeros would change (a max, or
  a sum of something nonzero at zero) gets its reduction's identity for the padded elements (`reduce_mask`);
- `SWAP(axis, other)`: swaps two GLOBAL axes (their loop order, or which hardware dimension each gets);
- `NOLOCALS`: no LOCAL axes at all on a GPU (must come before any LOCAL);
- `TC(axis, (select, pad))`: runs the matmul of the kernel on tensor cores: `axis` picks one of the matching (N, M, K)
  axis triples, `select` a tensor core of the renderer (-1: the first that fits), `pad` 1 lets it pad axes to the
  core's dims; it comes first, or after PADTOs only (the default tiles pad odd axes to whole tiles first);
- `STAGE`: the workgroup copies the tiles of the reduction's operands into local memory once per reduce step and
  reads them from there (`lazygrad_codegen.staging`); only SWAP may follow it, since the tiles are sized by then.
  `STAGE` with arg 1 keeps one stage (copies, then a barrier, in every step) where the renderer could pipeline
  asynchronous copies over two (arg None or 2, the default); arg 3 or 4 pipelines them over three or four
  (asynchronous copies only, a buffer per stage and operand).

`axis` is an index into the kernel's GLOBAL axes for UPCAST, LOCAL and SWAP, into its REDUCE axes for UNROLL, GROUP
and GROUPTOP. `amt` 0 means the whole axis. An opt that does not fit the kernel or the renderer's limits raises
`KernelOptError`, which search catches to skip that candidate.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any

from lazygrad_uop.device import Renderer, TensorCore
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp, sint
from lazygrad_uop.views import ShapeTracker, View


class KernelASTError(ValueError):
    """A kernel AST breaks the scheduler-codegen contract (see the package README)."""


@dataclass(frozen=True)
class KernelShape:
    """The shapes a kernel AST works on: the full shape F (below its reductions), the output shape R, and the axes
    it reduces over (empty without a reduction, when F == R)."""

    full: tuple[sint, ...]
    output: tuple[sint, ...]
    reduce_axes: tuple[int, ...]

    @property
    def has_reduce(self) -> bool:
        """Whether the kernel holds a REDUCE_AXIS."""
        return bool(self.reduce_axes)


def _is_one(s: sint) -> bool:
    return isinstance(s, int) and s == 1


def kernel_shape(ast: UOp) -> KernelShape:
    """Check that `ast` is a kernel AST as the contract describes, and return its shapes."""
    if ast.op is not Ops.SINK or not ast.src:
        raise KernelASTError(f"a kernel AST is a SINK of one or more STOREs, got {ast.op} with {len(ast.src)} sources")
    outputs: set[tuple[sint, ...]] = set()
    for st in ast.src:
        if (
            st.op is not Ops.STORE
            or len(st.src) != 3
            or st.src[0].op is not Ops.DEFINE_GLOBAL
            or st.src[1].op is not Ops.VIEW
        ):
            raise KernelASTError(
                f"every source of a kernel SINK must be STORE(DEFINE_GLOBAL, VIEW, value), got {st.op}"
            )
        outputs.add(st.src[1].arg.shape)
    if len(outputs) != 1:
        raise KernelASTError(f"all STOREs of one kernel must have the same shape, got {sorted(outputs, key=str)}")
    (output,) = outputs
    reduces = [u for u in ast.toposort if u.op is Ops.REDUCE_AXIS]
    if not reduces:
        return KernelShape(output, output, ())
    fulls: set[tuple[sint, ...]] = set()
    axes_seen: set[tuple[int, ...]] = set()
    for r in reduces:
        op, axes = r.arg
        if op not in (Ops.ADD, Ops.MAX, Ops.MUL):
            raise KernelASTError(f"REDUCE_AXIS reduces with ADD, MAX or MUL, got {op}")
        # a REDUCE_AXIS in another's source (an earlier value of the same rows, broadcast back over them) has the
        # same axes, which the check below asks of every REDUCE_AXIS
        fulls.add(_ast_shape(r.src[0], past_reduce=True))
        axes_seen.add(tuple(sorted(axes)))
    if len(fulls) != 1 or len(axes_seen) != 1:
        raise KernelASTError(
            f"all REDUCE_AXIS of one kernel must share the full shape and axes, got shapes {sorted(fulls, key=str)} "
            f"and axes {sorted(axes_seen)}"
        )
    (full,), (axes,) = fulls, axes_seen
    if len(full) != len(output) or any(not 0 <= a < len(full) for a in axes):
        raise KernelASTError(f"reduce axes {axes} of full shape {full} don't fit output shape {output}")
    expected = tuple(1 if i in axes else s for i, s in enumerate(full))
    if expected != output:
        raise KernelASTError(f"reducing {full} over axes {axes} gives {expected}, but the STOREs have shape {output}")
    return KernelShape(full, output, axes)


def _ast_shape(u: UOp, past_reduce: bool = False) -> tuple[sint, ...]:
    """The shape of a value in a kernel AST: that of the nearest LOAD, CONST or REDUCE_AXIS below it (elementwise
    ops keep their sources' shape). `past_reduce`: the shape of a reduction's source, where a REDUCE_AXIS below is
    an earlier reduction broadcast back over the reduced axes, and the LOADs and CONSTs beside it tell the shape."""
    frontier, seen = deque([u]), set()
    while frontier:
        n = frontier.popleft()
        if n in seen:
            continue
        seen.add(n)
        if n.op in (Ops.LOAD, Ops.CONST) and n.src and n.src[-1].op is Ops.VIEW:
            return n.src[-1].arg.shape
        if n.op is Ops.REDUCE_AXIS:
            if past_reduce:
                continue
            return tuple(1 if i in n.arg[1] else s for i, s in enumerate(_ast_shape(n.src[0])))
        frontier.extend(n.src)
    raise KernelASTError(f"can't tell the shape of {u.op}: no LOAD or CONST with a VIEW below it")


class KernelOptError(ValueError):
    """An opt that can't be applied to this kernel on this renderer; the message says which limit it breaks."""


class OptOps(Enum):
    """The optimisations a kernel can take (see the module docstring)."""

    TC = auto()
    UPCAST = auto()
    UNROLL = auto()
    LOCAL = auto()
    GROUP = auto()
    GROUPTOP = auto()
    NOLOCALS = auto()
    PADTO = auto()
    SWAP = auto()
    STAGE = auto()

    def __repr__(self) -> str:
        return f"OptOps.{self.name}"


@dataclass(frozen=True)
class Opt:
    """One optimisation: `op` on kernel axis `axis` (see the module docstring for which list it indexes) with `arg`
    (an amount, another axis for SWAP, `(select, pad)` for TC)."""

    op: OptOps
    axis: int | None = None
    arg: Any = None

    def __repr__(self) -> str:
        return f"Opt(op={self.op!r}, axis={self.axis}, arg={self.arg!r})"


class AxisType(Enum):
    """How an axis of the kernel runs. The order here is the order axes are kept in."""

    GLOBAL = auto()  # a loop over outputs (CPU) or a workgroup index (GPU)
    LOCAL = auto()  # a thread index inside a workgroup
    TC_M = auto()  # the rows of a tensor-core tile, spread over threads and registers by the core's layout
    TC_N = auto()  # its columns
    UPCAST = auto()  # outputs computed by one thread, in vector lanes
    GROUP_REDUCE = auto()  # a reduction split over the threads of a workgroup
    REDUCE = auto()  # a reduction loop
    TC_K = auto()  # the reduction inside one tensor-core instruction
    UNROLL = auto()  # reduction elements handled by one loop step, in vector lanes


REDUCE_TYPES = frozenset({AxisType.GROUP_REDUCE, AxisType.REDUCE, AxisType.TC_K, AxisType.UNROLL})
_RANK = {t: i for i, t in enumerate(AxisType)}
# ops f with f(0, ..., 0) == 0: a reduction over a padded axis stays exact when every op under it is one of these
_ZERO_PRESERVING = frozenset(
    {Ops.ADD, Ops.MUL, Ops.MAX, Ops.NEG, Ops.CAST, Ops.BITCAST, Ops.SQRT, Ops.SIN, Ops.TRUNC, Ops.WHERE}
    | {Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.MULACC, Ops.LOAD, Ops.CONST, Ops.VIEW}
    | {Ops.DEFINE_GLOBAL}
)


def _is_int(s: sint) -> bool:
    return isinstance(s, int)


def warp_size(renderer: Renderer) -> int:
    """The threads of one warp (SIMD group) whose values `SHUFFLE_XOR` exchanges on `renderer`, or 0 when it has no
    shuffles: its `warp_size` (CUDA 32, Metal 32), which must be a power of two that divides the hardware's warps,
    on a renderer with local dimensions."""
    width = renderer.warp_size
    if not isinstance(width, int) or width < 0 or width & (width - 1):
        raise ValueError(
            f"{type(renderer).__name__}.warp_size must be 0 (no shuffles) or a power of two, got {width!r}"
        )
    return width if width >= 2 and renderer.has_local else 0


@dataclass
class Kernel:
    """A kernel AST together with the shape its loops will have: one ShapeTracker per VIEW of the AST (all with the
    same number of axes, 1 on reduce axes for views above a reduction) and the type of each axis."""

    ast: UOp
    renderer: Renderer
    shape: KernelShape = field(init=False)
    views: dict[UOp, ShapeTracker] = field(init=False)
    full_views: frozenset[UOp] = field(init=False)
    full_shape: tuple[sint, ...] = field(init=False)
    axis_types: list[AxisType] = field(init=False)
    applied_opts: list[Opt] = field(init=False, default_factory=list)
    tensor_core: TensorCore | None = field(init=False, default=None)
    # the AST nodes that give the tensor core's A and B operands (a LOAD, or a CAST of one)
    tc_operands: tuple[UOp, UOp] | None = field(init=False, default=None)
    use_locals: bool = field(init=False, default=True)
    # after PADTO on a reduce axis that zeros can't pad: a view (key of `views`, not in the AST) of the full shape
    # that is valid exactly on the elements that are not padding
    reduce_mask: UOp | None = field(init=False, default=None)
    # STAGE: the reduction's operands are copied through local memory (`lazygrad_codegen.staging`)
    staged: bool = field(init=False, default=False)
    # STAGE's pipeline stages: 2 lets asynchronous copies of the next step overlap this one, 3 and 4 those of the
    # next two and three, 1 does not pipeline
    stages: int = field(init=False, default=2)

    def __post_init__(self) -> None:
        self.shape = kernel_shape(self.ast)
        below_reduce = {
            v for r in self.ast.toposort if r.op is Ops.REDUCE_AXIS for v in r.src[0].toposort if v.op is Ops.VIEW
        }
        self.views = {u: u.arg for u in self.ast.toposort if u.op is Ops.VIEW}
        self.full_views = frozenset(below_reduce)
        self.full_shape = self.shape.full
        reduce = set(self.shape.reduce_axes)
        for v, st in self.views.items():
            expected = self.shape.full if v in self.full_views else self.shape.output
            if st.shape != expected:
                # a view above the reduction with the full shape (or the other way round) breaks the contract
                raise KernelASTError(
                    f"a VIEW of shape {st.shape} should have shape {expected} where it sits in the kernel"
                )
        self.axis_types = [AxisType.REDUCE if a in reduce else AxisType.GLOBAL for a in range(len(self.full_shape))]
        self.applied_opts = []
        self._squeeze()
        self._sort_axes()
        self._merge_adjacent()

    # *** reading the kernel ***

    def copy(self) -> Kernel:
        """An independent copy to apply more opts to."""
        k = Kernel.__new__(Kernel)
        k.__dict__.update(self.__dict__)
        k.views, k.axis_types, k.applied_opts = dict(self.views), list(self.axis_types), list(self.applied_opts)
        return k

    @property
    def rank(self) -> int:
        """The number of axes."""
        return len(self.full_shape)

    def axes(self, *types: AxisType) -> list[int]:
        """The positions of the axes of the given types, in order."""
        return [a for a, t in enumerate(self.axis_types) if t in types]

    def sizes(self, *types: AxisType) -> list[sint]:
        """The sizes of the axes of the given types, in order."""
        return [self.full_shape[a] for a in self.axes(*types)]

    def lanes(self, *types: AxisType) -> int:
        """The product of the sizes of the axes of the given types (all of them ints)."""
        return math.prod(int(s) for s in self.sizes(*types))

    @property
    def reduceops(self) -> list[UOp]:
        """The REDUCE_AXIS nodes of the AST."""
        return [u for u in self.ast.toposort if u.op is Ops.REDUCE_AXIS]

    @property
    def output_shape(self) -> tuple[sint, ...]:
        """The full shape with the reduce axes set to 1."""
        return tuple(1 if t in REDUCE_TYPES else s for s, t in zip(self.full_shape, self.axis_types, strict=True))

    def loads(self) -> list[tuple[UOp, ShapeTracker]]:
        """Each LOAD of a global buffer with its (current) view."""
        return [(u, self.views[u.src[1]]) for u in self.ast.toposort if u.op is Ops.LOAD]

    def stores(self) -> list[tuple[UOp, ShapeTracker]]:
        """Each STORE with its (current) view."""
        return [(u, self.views[u.src[1]]) for u in self.ast.src]

    def colored_shape(self) -> str:
        """The shape with each axis's type, for DEBUG output: `64g 4u 32r` (g global, l local, u upcast, G group,
        r reduce, ur unroll, tm/tn/tk tensor core)."""
        tag = {
            AxisType.GLOBAL: "g",
            AxisType.LOCAL: "l",
            AxisType.TC_M: "tm",
            AxisType.TC_N: "tn",
            AxisType.UPCAST: "u",
            AxisType.GROUP_REDUCE: "G",
            AxisType.REDUCE: "r",
            AxisType.TC_K: "tk",
            AxisType.UNROLL: "ur",
        }
        return " ".join(f"{s if _is_int(s) else s.render()}{tag[t]}" for s, t in zip(self.full_shape, self.axis_types))

    # *** changing every view the same way ***

    def _reshape_axis(self, axis: int, sizes: tuple[sint, ...], types: tuple[AxisType, ...]) -> None:
        """Axis `axis` becomes axes of `sizes` (row-major, product equal to its size) with `types`."""
        for v, st in self.views.items():
            one = (
                _is_int(st.shape[axis])
                and st.shape[axis] == 1
                and not (_is_int(self.full_shape[axis]) and self.full_shape[axis] == 1)
            )
            new = (1,) * len(sizes) if one else sizes
            self.views[v] = st.reshape(st.shape[:axis] + new + st.shape[axis + 1 :])
        self.full_shape = self.full_shape[:axis] + sizes + self.full_shape[axis + 1 :]
        self.axis_types = self.axis_types[:axis] + list(types) + self.axis_types[axis + 1 :]

    def _permute(self, order: list[int]) -> None:
        for v, st in self.views.items():
            self.views[v] = st.permute(order)
        self.full_shape = tuple(self.full_shape[o] for o in order)
        self.axis_types = [self.axis_types[o] for o in order]

    def _sort_axes(self) -> None:
        order = sorted(range(self.rank), key=lambda a: _RANK[self.axis_types[a]])
        if order != list(range(self.rank)):
            self._permute(order)

    def _squeeze(self) -> None:
        """Drop axes of size 1."""
        keep = [a for a, s in enumerate(self.full_shape) if not (_is_int(s) and s == 1)]
        if len(keep) == self.rank:
            return
        for v, st in self.views.items():
            self.views[v] = st.reshape(tuple(st.shape[a] for a in keep))
        self.full_shape = tuple(self.full_shape[a] for a in keep)
        self.axis_types = [self.axis_types[a] for a in keep]

    def _merge_adjacent(self) -> None:
        """Merge neighbouring axes of the same type wherever every view can be reshaped without stacking a view."""
        a = self.rank - 2
        while a >= 0:
            if (
                self.axis_types[a] is self.axis_types[a + 1]
                and _is_int(self.full_shape[a])
                and _is_int(self.full_shape[a + 1])
            ):
                merged: dict[UOp, ShapeTracker] = {}
                for v, st in self.views.items():
                    new_shape = st.shape[:a] + (st.shape[a] * st.shape[a + 1],) + st.shape[a + 2 :]  # type: ignore[operator]
                    view = st.views[-1].reshape(new_shape)
                    if view is None:
                        break
                    merged[v] = ShapeTracker((*st.views[:-1], view))
                else:
                    self.views = merged
                    s = self.full_shape
                    self.full_shape = s[:a] + (s[a] * s[a + 1],) + s[a + 2 :]  # type: ignore[operator]
                    del self.axis_types[a + 1]
            a -= 1

    def split_axis(self, axis: int, amount: int, new_type: AxisType, top: bool = False) -> None:
        """Split `amount` off axis `axis` (its inner part, or its outer part with `top`) as a new axis of
        `new_type`; axes are then kept in type order and size-1 axes dropped."""
        size = self.full_shape[axis]
        if not _is_int(size):
            raise KernelOptError(f"can't split axis {axis} of symbolic size {size.render()}")  # type: ignore[union-attr]
        if amount <= 0 or size % amount != 0:
            raise KernelOptError(f"axis {axis} of size {size} can't be split by {amount}: it must divide the size")
        rest = size // amount
        old = self.axis_types[axis]
        sizes, types = ((amount, rest), (new_type, old)) if top else ((rest, amount), (old, new_type))
        self._reshape_axis(axis, sizes, types)
        self._squeeze()
        self._sort_axes()

    def pad_axis(self, axis: int, to: int) -> None:
        """Pad axis `axis` with masked elements up to size `to`. Along an output axis a view that does not move
        along it (stride 0: B along the rows of a matmul) stays unmasked: it reads in bounds at every index, and what
        it gives at padded outputs reaches only the stores the padding masks, so staged tiles need not depend on it."""
        output = self.axis_types[axis] is AxisType.GLOBAL
        for v, st in self.views.items():
            if output and (widened := _widened(st, axis, self.full_shape[axis], to)) is not None:
                self.views[v] = widened
            elif st.shape[axis] == self.full_shape[axis]:
                self.views[v] = st.pad(tuple((0, to - s if a == axis else 0) for a, s in enumerate(st.shape)))
        self.full_shape = tuple(to if a == axis else s for a, s in enumerate(self.full_shape))

    # *** opts ***

    def apply_opts(self, opts: list[Opt] | tuple[Opt, ...]) -> Kernel:
        """Apply each opt in order; returns self."""
        for opt in opts:
            self.apply_opt(opt)
        return self

    def apply_opt(self, opt: Opt) -> None:
        """Apply one opt, or raise KernelOptError (leaving the kernel unchanged) when it is not valid here."""
        saved = self.copy()
        try:
            self._apply(opt)
        except KernelOptError:
            self.__dict__.update(saved.__dict__)
            raise
        self.applied_opts.append(opt)

    def _pick(self, axis: int | None, types: tuple[AxisType, ...], what: str) -> int:
        candidates = self.axes(*types)
        if axis is None or not isinstance(axis, int) or not 0 <= axis < len(candidates):
            raise KernelOptError(f"{what} axis {axis} does not exist: the kernel has {len(candidates)} such axes")
        return candidates[axis]

    def _amount(self, axis: int, arg: Any) -> int:
        size = self.full_shape[axis]
        if not _is_int(size):
            raise KernelOptError(f"axis of symbolic size {size.render()} can't be split")  # type: ignore[union-attr]
        if not isinstance(arg, int) or isinstance(arg, bool) or arg < 0:
            raise KernelOptError(f"the amount must be a non-negative int (0: the whole axis), got {arg!r}")
        if size == 0:
            raise KernelOptError("an axis of size 0 has nothing to split")
        amount = size if arg == 0 else arg
        if amount == 1:
            raise KernelOptError("splitting off an axis of 1 changes nothing")
        if size % amount != 0:
            raise KernelOptError(f"amount {amount} does not divide the axis size {size}")
        return amount  # type: ignore[return-value]

    def _apply(self, opt: Opt) -> None:
        r = self.renderer
        if self.staged and opt.op is not OptOps.SWAP:
            raise KernelOptError("STAGE fixes the tiles it copies: only SWAP may follow it")
        if opt.op is OptOps.STAGE:
            from lazygrad_codegen.staging import apply_stage

            apply_stage(self, opt.arg)
            return
        if opt.op is OptOps.TC:
            from lazygrad_codegen.tensor_cores import apply_tensor_core

            # PADTOs may come first: a tile that pads its axes to whole workgroup tiles (`tiling`) before the core
            if any(o.op is not OptOps.PADTO for o in self.applied_opts) or self.reduce_mask is not None:
                raise KernelOptError("TC must be the first opt applied to a kernel (PADTOs of zero padding aside)")
            apply_tensor_core(self, opt)
            return
        if opt.op is OptOps.NOLOCALS:
            if not r.has_local:
                raise KernelOptError(f"{type(r).__name__} has no local dimensions to turn off")
            if self.axes(AxisType.LOCAL, AxisType.GROUP_REDUCE) or self.tensor_core is not None:
                raise KernelOptError("NOLOCALS must come before any LOCAL, GROUP or TC")
            self.use_locals = False
            return
        if opt.op is OptOps.SWAP:
            a = self._pick(opt.axis, (AxisType.GLOBAL,), "SWAP")
            b = self._pick(opt.arg, (AxisType.GLOBAL,), "SWAP")
            if a >= b:
                raise KernelOptError("SWAP takes two GLOBAL axes with axis < arg")
            order = list(range(self.rank))
            order[a], order[b] = order[b], order[a]
            self._permute(order)
            return
        if opt.op is OptOps.PADTO:
            self._padto(opt)
            return
        if opt.op is OptOps.UPCAST:
            axis = self._pick(opt.axis, (AxisType.GLOBAL,), "UPCAST")
            amount = self._amount(axis, opt.arg)
            self._check_upcast(amount)
            self.split_axis(axis, amount, AxisType.UPCAST)
            return
        if opt.op is OptOps.UNROLL:
            axis = self._pick(opt.axis, (AxisType.REDUCE,), "UNROLL")
            amount = self._amount(axis, opt.arg)
            self._check_upcast(amount)
            self.split_axis(axis, amount, AxisType.UNROLL)
            return
        if opt.op is OptOps.LOCAL:
            self._check_locals("LOCAL")
            axis = self._pick(opt.axis, (AxisType.GLOBAL,), "LOCAL")
            amount = self._amount(axis, opt.arg)
            self._check_threads(amount)
            self.split_axis(axis, amount, AxisType.LOCAL)
            return
        if opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
            self._check_locals(opt.op.name)
            if not r.has_shared:
                raise KernelOptError(f"{type(r).__name__} has no shared memory to combine a grouped reduction in")
            if self.tensor_core is not None:
                raise KernelOptError("a kernel on tensor cores can't also group its reduction")
            axis = self._pick(opt.axis, (AxisType.REDUCE,), opt.op.name)
            amount = self._amount(axis, opt.arg)
            self._check_threads(amount)
            self.split_axis(axis, amount, AxisType.GROUP_REDUCE, top=opt.op is OptOps.GROUPTOP)
            self._check_shared()
            return
        raise KernelOptError(f"unknown opt {opt!r}")

    # *** limits ***

    def _check_upcast(self, amount: int) -> None:
        have = self.lanes(AxisType.UPCAST, AxisType.UNROLL)
        if self.tensor_core is not None:
            have *= max(self.tensor_core.elements_per_thread)
        if have * amount > self.renderer.max_upcast:
            raise KernelOptError(
                f"upcasting by {amount} gives {have * amount} elements per thread, over the renderer's register "
                f"budget (max_upcast={self.renderer.max_upcast})"
            )

    def _check_locals(self, what: str) -> None:
        if not self.renderer.has_local:
            raise KernelOptError(f"{what} needs local dimensions, which {type(self.renderer).__name__} does not have")
        if not self.use_locals:
            raise KernelOptError(f"{what} after NOLOCALS")

    def workgroup_threads(self) -> int:
        """Threads of one workgroup: the LOCAL and GROUP_REDUCE axes, and the tensor core's threads."""
        n = self.lanes(AxisType.LOCAL, AxisType.GROUP_REDUCE)
        return n * (self.tensor_core.threads if self.tensor_core is not None else 1)

    def _check_threads(self, amount: int) -> None:
        threads = self.workgroup_threads() * amount
        if threads > self.renderer.max_workgroup_threads:
            raise KernelOptError(
                f"{threads} threads per workgroup is over the renderer's max_workgroup_threads "
                f"({self.renderer.max_workgroup_threads})"
            )
        local_max = self.renderer.local_max
        if local_max is not None and amount > max(local_max):
            raise KernelOptError(f"a local dimension of {amount} is over the renderer's local_max {local_max}")

    def warp_split(self) -> tuple[int, int] | None:
        """How a grouped reduction of G threads is combined on a renderer with warp shuffles: `(lanes, warps)`,
        lanes x warps = G. First a butterfly of shuffles over `lanes` threads of one warp (log2(lanes) steps), then,
        when `warps` > 1, one partial result per warp through shared memory. None (shared memory only) when the
        renderer has no shuffles or G neither is a multiple of its warp width nor divides it.

        Threads are numbered with the GROUP_REDUCE axes innermost (lidx0), so a warp holds whole groups (G <= warp)
        or consecutive threads of one group (G a multiple of the warp)."""
        width, group = warp_size(self.renderer), self.lanes(AxisType.GROUP_REDUCE)
        if width == 0 or group < 2 or not self.axes(AxisType.GROUP_REDUCE):
            return None
        if group % width == 0:
            return width, group // width
        if width % group == 0:
            return group, 1
        return None

    def shared_bytes(self) -> int:
        """Bytes of shared memory the grouped reductions need: one slot per output lane, per thread (per warp when
        warps shuffle first), per reduction."""
        if not self.axes(AxisType.GROUP_REDUCE):
            return 0
        per_thread = self.lanes(AxisType.UPCAST)
        slots = self.workgroup_threads()
        if (split := self.warp_split()) is not None:
            slots = 0 if split[1] == 1 else slots // split[0]
        return sum(slots * per_thread * r.dtype.itemsize for r in self.reduceops)

    def _check_shared(self) -> None:
        if (need := self.shared_bytes()) > self.renderer.shared_max:
            raise KernelOptError(
                f"the grouped reduction needs {need} bytes of shared memory, over the renderer's shared_max "
                f"({self.renderer.shared_max})"
            )

    def _padto(self, opt: Opt) -> None:
        axis = self._pick(opt.axis, (AxisType.GLOBAL, AxisType.REDUCE), "PADTO")
        size = self.full_shape[axis]
        if not _is_int(size):
            raise KernelOptError("can't pad an axis of symbolic size")
        if not isinstance(opt.arg, int) or isinstance(opt.arg, bool) or opt.arg < 2:
            raise KernelOptError(f"PADTO needs an amount of at least 2, got {opt.arg!r}")
        to = -(-size // opt.arg) * opt.arg  # type: ignore[operator]
        if to == size:
            raise KernelOptError(f"axis of size {size} is already a multiple of {opt.arg}")
        if to > 2 * size:  # type: ignore[operator]
            raise KernelOptError(f"padding {size} to {to} would more than double the work on that axis")
        if self.axis_types[axis] is AxisType.REDUCE:
            try:
                check_reduce_padding(self)
            except KernelOptError:
                # the padding can't be left to read as zeros: lowering replaces it by each reduction's identity
                if self.tensor_core is not None:
                    raise
                if self.reduce_mask is None:
                    self.reduce_mask = UOp(Ops.VIEW, dtypes.bool, arg=ShapeTracker.from_shape(self.full_shape))
                    self.views[self.reduce_mask] = self.reduce_mask.arg
        self.pad_axis(axis, to)


def _widened(st: ShapeTracker, axis: int, size: sint, to: int) -> ShapeTracker | None:
    """`st`, one view of stride 0 along `axis` (of `size`), with that axis `to` long and unmasked along it; None
    for any other tracker."""
    if len(st.views) != 1 or st.shape[axis] != size or st.views[0].strides[axis] != 0:
        return None
    v = st.views[0]
    mask = v.mask
    if mask is not None:
        if mask[axis] != (0, size):
            return None
        mask = tuple((0, to) if a == axis else m for a, m in enumerate(mask))
    shape = tuple(to if a == axis else s for a, s in enumerate(v.shape))
    return ShapeTracker((View.create(shape, v.strides, v.offset, mask),))


def check_reduce_padding(k: Kernel) -> None:
    """Raise KernelOptError unless padding a reduce axis leaves every reduction's result unchanged: the padding
    reads 0, so each reduction must be a sum of an expression that is 0 when its inputs are."""
    for r in k.reduceops:
        if r.arg[0] is not Ops.ADD:
            raise KernelOptError(f"can't pad the axis of a {r.arg[0].name} reduction: padded zeros would change it")
        bad = {u.op for u in r.src[0].toposort} - _ZERO_PRESERVING
        if bad:
            raise KernelOptError(
                f"can't pad a reduce axis under {sorted(o.name for o in bad)}: they don't map zeros to zero"
            )
