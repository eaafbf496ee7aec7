"""`get_program`: a kernel AST in, a `ProgramSpec` (rendered source, linear UOps, launch sizes, cost estimates) out.

The steps: choose opts for the kernel (`heuristic.hand_coded_optimizations` by default, `search.beam_search` with
`BEAM=n`, none with `NOOPT=1`; reduce axes of one-hot selections kept whole), lower it (`lowerer.lower`, which reads
a one-hot selection with one load, `selection`), simplify the lowered graph with the symbolic engine, cut
its vectors to the renderer's width and merge neighbouring memory accesses (`vectors`), linearize
(`linearizer.linearize`) and render with the device's `Renderer`. `DEBUG>=3` prints the opts each kernel got,
`DEBUG>=4` the source, `DEBUG>=5` the kernel AST, `DEBUG>=6` the linear UOps.
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from lazygrad_codegen.division import guard_divisions
from lazygrad_codegen.index_width import promote_rules
from lazygrad_codegen.kernel import Kernel, Opt, kernel_shape
from lazygrad_codegen.linearizer import linearize
from lazygrad_codegen.lowerer import cleanup_rules, lower
from lazygrad_codegen.selection import keep_selections_whole
from lazygrad_codegen.vectors import (
    REGISTER_ARRAY,
    expand_chunks,
    group_memory,
    register_array,
    split_rules,
    vector_rules,
)
from lazygrad_uop.config import BEAM, DEBUG, NOOPT
from lazygrad_uop.device import Renderer
from lazygrad_uop.dtype import dtypes
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
    (`outs`) and loads from (`ins`), cost `estimates`, and the `opts` applied to it."""

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
    opts: tuple[Opt, ...] = ()

    @property
    def function_name(self) -> str:
        """The name of the function in `src` (the kernel's name)."""
        return self.name


def optimized_kernel(ast: UOp, renderer: Renderer) -> Kernel:
    """The kernel of `ast` with the opts codegen picks for it: none with NOOPT, a BEAM search with BEAM>=1, else
    the hand-coded heuristics; either way without the opts that would split the reduce axes of one-hot selections,
    which lowering reads with a load instead of a loop (`selection.keep_selections_whole`)."""
    k = Kernel(ast, renderer)
    if NOOPT:
        return k
    if BEAM >= 1:
        from lazygrad_codegen.search import beam_search

        return keep_selections_whole(beam_search(k, BEAM.value))
    from lazygrad_codegen.heuristic import hand_coded_optimizations

    return keep_selections_whole(hand_coded_optimizations(k))


def get_program(ast: UOp, renderer: Renderer, opts: Sequence[Opt] | None = None) -> ProgramSpec:
    """Compile-ready program for kernel AST `ast` (a SINK of STOREs, see the package README) on `renderer`, with
    `opts` applied, or those codegen chooses when `opts` is None."""
    if DEBUG >= 5:
        print(ast)
    # named by the kernel asked for, before the opts rewrite it: the same name whichever process generates it
    name = kernel_name(ast)
    k = optimized_kernel(ast, renderer) if opts is None else Kernel(ast, renderer).apply_opts(list(opts))
    return program_of(k, name)


def _renumber_accumulators(sink: UOp) -> UOp:
    """Give the accumulators the numbers 0, 1, ... in graph order (cutting vectors made several of one), keeping the
    mark of a register array (`REGISTER_ARRAY`)."""
    accs = [u for u in sink.toposort if u.op is Ops.DEFINE_ACC]
    args = [(i, REGISTER_ARRAY) if register_array(a) else (i,) for i, a in enumerate(accs)]
    if [a.arg for a in accs] == args:
        return sink
    return sink.substitute({a: a.replace(arg=arg) for a, arg in zip(accs, args, strict=True)})


# built once: combining matchers inspects every rule function. One matcher for both simplifications, so that the
# second finds what the first left in its memo; the cut's chunked vectors, which only the second meets, become
# VECTORIZEs of lanes there, for the renderers
_simplify_rules = symbolic + vector_rules + cleanup_rules + expand_chunks


def program_of(k: Kernel, name: str | None = None) -> ProgramSpec:
    """The program of kernel `k` as its opts have shaped it, named `name` (default: `kernel_name` of its AST)."""
    renderer = k.renderer
    width = max(1, renderer.vector_width)
    lowered = lower(k, width)
    sink = lowered.sink
    if lowered.index_dtype != dtypes.int32:
        sink = graph_rewrite(sink, promote_rules, name="widen mixed index arithmetic", memo=True)
    sink = guard_divisions(sink)
    sink = graph_rewrite(sink, _simplify_rules, name="simplify lowered kernel", memo=True)
    split, ctx = split_rules(width)
    sink = graph_rewrite(sink, split, ctx=ctx, name="cut vectors", memo=True)
    sink = group_memory(sink, renderer)
    sink = graph_rewrite(sink, _simplify_rules, name="simplify vectorized kernel", memo=True)
    sink = _renumber_accumulators(sink)
    name = name or kernel_name(k.ast)
    if DEBUG >= 3:
        print(f"{name:32s} {k.colored_shape():40s} {k.applied_opts}")
    # the final SINK carries the function name to the renderer
    uops = linearize(sink)
    uops[-1] = uops[-1].replace(arg=name)
    if DEBUG >= 6:
        print_uops(uops)
    src = renderer.render(uops)
    if DEBUG >= 4:
        print(src)
    ast = k.ast
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
        estimates=Estimates(_folded(_count_ops(uops)), _folded(_count_mem(ast))),
        opts=tuple(k.applied_opts),
    )


# *** names ***

# the names handed out so far, and to which kernel: a kernel keeps its name, a different kernel with the same
# loop nest gets an n1, n2 ... suffix
_names_used: dict[str, int] = {}
_name_of: weakref.WeakKeyDictionary[UOp, str] = weakref.WeakKeyDictionary()


def _size_text(s: sint) -> str:
    text = str(s) if isinstance(s, int) else s.render()
    return re.sub(r"\W+", "", text) or "n"


def kernel_name(ast: UOp) -> str:
    """`E_<sizes>` for an elementwise kernel, `r_<sizes>` for one with a reduction: the sizes of its full shape,
    output axes first, then reduce axes, size-1 axes left out; `n<k>` is appended when another kernel had the
    name. A kernel keeps its name whatever opts it gets."""
    if (known := _name_of.get(ast)) is not None:
        return known
    shape = kernel_shape(ast)
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


def _folded(x: sint) -> sint:
    """A symbolic estimate simplified once, here: summed op by op it is a chain of one addition per op (68 in a GPT-2
    decoding step's attention kernel), which a jitted replay evaluated for every launch (~50 us each)."""
    return x.ssimplify() if isinstance(x, UOp) else x


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
            total = total + math.prod(trips, start=threads * max(u.dtype.count, *(s.dtype.count for s in u.src)))
        elif u.op is Ops.WMMA and u in value_ops:
            # one multiply and one add per product of the tile, shared by the threads that run it together
            n, m, k = u.arg[1]
            total = total + math.prod(trips, start=threads * 2 * n * m * k // u.arg[4])
        elif u.op is Ops.WGMMA and u in value_ops:
            n, m, k = u.arg[0]
            total = total + math.prod(trips, start=threads * 2 * n * m * k // u.arg[3])
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
