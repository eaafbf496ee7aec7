"""`get_program`: a kernel AST in, a `ProgramSpec` (rendered source, linear UOps, launch sizes, cost estimates) out.

The steps are lowering (`lowerer.lower`), symbolic simplification of the lowered graph, linearization
(`linearizer.linearize`) and rendering with the device's `Renderer`. `DEBUG>=4` prints the source, `DEBUG>=5`
the kernel AST, `DEBUG>=6` the linear UOps.
"""

from __future__ import annotations

import math
import re
import weakref
from dataclasses import dataclass

from lazygrad_codegen.linearizer import linearize
from lazygrad_codegen.lowerer import LoweredKernel, cleanup_rules, lower
from lazygrad_uop.config import DEBUG
from lazygrad_uop.device import Renderer
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.pattern import graph_rewrite
from lazygrad_uop.symbolic import symbolic
from lazygrad_uop.uop import UOp, sint


@dataclass(frozen=True)
class Estimates:
    """What running a kernel costs: `ops` ALU operations on values (index math excluded) times the iterations they
    run, and `mem` bytes moved, counting each buffer's accessed bytes once."""

    ops: sint = 0
    mem: sint = 0


@dataclass(frozen=True)
class ProgramSpec:
    """A kernel ready to compile: its `name` (function name, e.g. `r_64_32` for a reduce over a 64x32 loop nest),
    `src` for the device's compiler, the linear `uops` it was rendered from, the launch sizes, the symbolic variables
    it takes after the buffers (`vars`, in parameter order), the buffer slots it takes (`globals`), stores to
    (`outs`) and loads from (`ins`), and cost `estimates`."""

    name: str
    src: str
    device: str
    uops: list[UOp]
    global_size: tuple[sint, sint, sint] = (1, 1, 1)
    local_size: tuple[int, int, int] = (1, 1, 1)
    vars: tuple[UOp, ...] = ()
    globals: tuple[int, ...] = ()
    outs: tuple[int, ...] = ()
    ins: tuple[int, ...] = ()
    estimates: Estimates = Estimates()

    @property
    def function_name(self) -> str:
        """The name of the function in `src` (the kernel's name)."""
        return self.name


def get_program(ast: UOp, renderer: Renderer) -> ProgramSpec:
    """Compile-ready program for kernel AST `ast` (a SINK of STOREs, see the package README) on `renderer`."""
    if DEBUG >= 5:
        print(ast)
    lowered = lower(ast, renderer)
    sink = graph_rewrite(lowered.sink, symbolic + cleanup_rules, name="simplify lowered kernel")
    name = kernel_name(ast, lowered)
    # the final SINK carries the function name to the renderer
    uops = linearize(sink)
    uops[-1] = uops[-1].replace(arg=name)
    if DEBUG >= 6:
        print_uops(uops)
    src = renderer.render(uops)
    if DEBUG >= 4:
        print(src)
    return ProgramSpec(
        name=name,
        src=src,
        device=renderer.device,
        uops=uops,
        global_size=lowered.global_size,
        local_size=lowered.local_size,
        vars=tuple(u for u in uops if u.op is Ops.DEFINE_VAR),
        globals=tuple(u.arg for u in uops if u.op is Ops.DEFINE_GLOBAL),
        outs=tuple(sorted({u.src[0].arg for u in ast.toposort if u.op is Ops.STORE})),
        ins=tuple(sorted({u.src[0].arg for u in ast.toposort if u.op is Ops.LOAD})),
        estimates=Estimates(_count_ops(uops), _count_mem(ast)),
    )


# *** names ***

# the names handed out so far, and to which kernel: a kernel keeps its name, a different kernel with the same
# loop nest gets an n1, n2 ... suffix
_names_used: dict[str, int] = {}
_name_of: weakref.WeakKeyDictionary[UOp, str] = weakref.WeakKeyDictionary()


def _size_text(s: sint) -> str:
    text = str(s) if isinstance(s, int) else s.render()
    return re.sub(r"\W+", "", text) or "n"


def kernel_name(ast: UOp, lowered: LoweredKernel) -> str:
    """`E_<sizes>` for an elementwise kernel, `r_<sizes>` for one with a reduction: the sizes of its loops or
    hardware dimensions, output axes first, then reduce axes; `n<k>` is appended when another kernel had the name."""
    if (known := _name_of.get(ast)) is not None:
        return known
    shape = lowered.shape
    reduce = set(shape.reduce_axes)
    order = [a for a in range(len(shape.full)) if a not in reduce] + sorted(reduce)
    sizes = [_size_text(shape.full[a]) for a in order if not (isinstance(shape.full[a], int) and shape.full[a] == 1)]
    base = ("r_" if shape.has_reduce else "E_") + ("_".join(sizes) or "1")
    count = _names_used.get(base, 0)
    _names_used[base] = count + 1
    name = base if count == 0 else f"{base}n{count}"
    _name_of[ast] = name
    return name


# *** estimates ***


def _count_ops(uops: list[UOp]) -> sint:
    """ALU ops that compute values (not addresses) times how often they run."""
    value_ops: set[UOp] = set()
    stack = [s for u in uops if u.op in (Ops.STORE, Ops.ASSIGN) for s in u.src[1:2]]
    while stack:
        u = stack.pop()
        if u in value_ops or u.op in (Ops.INDEX, Ops.DEFINE_ACC, Ops.RANGE, Ops.SPECIAL):
            continue
        value_ops.add(u)
        stack.extend(u.src[1:2] if u.op is Ops.LOAD else u.src)
    total: sint = 0
    trips: list[sint] = []
    threads: sint = 1
    for u in uops:
        if u.op is Ops.SPECIAL:
            threads = threads * u.arg[1]
    for u in uops:
        if u.op is Ops.RANGE:
            trips.append(u.src[0].arg if u.src[0].op is Ops.CONST else u.src[0])
        elif u.op is Ops.END:
            trips.pop()
        elif u.op in GroupOp.ALU and u in value_ops:
            total = total + math.prod(trips, start=threads)
    return total


def _count_mem(ast: UOp) -> sint:
    """Bytes of every buffer the kernel touches, each counted once: the part of it its views reach."""
    reach: dict[UOp, int] = {}
    for u in ast.toposort:
        if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is Ops.DEFINE_GLOBAL:
            buf, st = u.src[0], u.src[1].arg
            n = st.real_size()
            if buf.dtype.size >= 0:
                n = min(n, buf.dtype.size)
            reach[buf] = max(reach.get(buf, 0), n)
    return sum(n * buf.dtype.itemsize for buf, n in reach.items())


# *** printing ***


def print_uops(uops: list[UOp]) -> None:
    """Print a linear program, one UOp a line: position, op, dtype, the positions of its sources, and its arg."""
    pos = {u: i for i, u in enumerate(uops)}
    for i, u in enumerate(uops):
        srcs = [str(pos[s]) if s in pos else "--" for s in u.src]
        print(f"{i:4d} {u.op.name:<14s} {u.dtype!r:<32s} [{', '.join(srcs)}] {u.arg!r}")
