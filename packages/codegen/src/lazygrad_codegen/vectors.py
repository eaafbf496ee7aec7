"""Vector values: building them, folding lane selections, cutting wide vectors to the renderer's width, and turning
runs of scalar loads and stores of neighbouring elements into vector loads and stores.

Lowering computes a kernel's upcast and unrolled axes as vectors with one lane per element, however many lanes that
takes (`VECTORIZE` of scalars, `GEP` to select lanes: `GEP(x, (2, 3))` is the 2-lane vector of lanes 2 and 3 of x).
A renderer then gets vectors no wider than its `vector_width` (scalars when it is 1):

- `split_rules` cut every wider ALU op, cast and accumulator into chunks of that width. A cut op is a `VECTORIZE` of
  its chunks while the cut runs (a consumer that takes a chunk reads the chunk itself, `gep`), and `expand_chunks`
  writes what still reads it whole as a `VECTORIZE` of `GEP`s of the chunks afterwards (the form renderers take);
- `group_memory` replaces scalar loads of neighbouring elements of one buffer by one vector load (and its lanes),
  and scalar stores of neighbouring elements by one vector store, in the widths the renderer allows.

A vector LOAD or STORE through `INDEX(buf, i)` reads or writes the elements i, i+1, ..., i+n-1 of `buf`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from lazygrad_uop.device import Renderer
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.pattern import PatternMatcher, UPat, mark_fixed_points
from lazygrad_uop.uop import UOp

# *** building vectors ***


def gep(x: UOp, lanes: Sequence[int]) -> UOp:
    """The lanes `lanes` of `x` (a scalar when there is one lane), folding what can be folded right away."""
    lanes = tuple(lanes)
    if x.dtype.count == 1:
        if any(lane != 0 for lane in lanes):
            raise ValueError(f"lanes {lanes} of a scalar")
        return x if len(lanes) == 1 else vectorize([x] * len(lanes))
    if len(lanes) == x.dtype.count and lanes == tuple(range(x.dtype.count)):
        return x
    if x.op is Ops.VECTORIZE:
        if x.src[0].dtype.count > 1:
            return _cat_lanes(x, lanes)
        return vectorize([x.src[lane] for lane in lanes])
    if x.op is Ops.GEP:
        return gep(x.src[0], [x.arg[lane] for lane in lanes])
    dtype = x.dtype.scalar() if len(lanes) == 1 else x.dtype.scalar().vec(len(lanes))
    return UOp(Ops.GEP, dtype, (x,), lanes)


def vectorize(srcs: Sequence[UOp]) -> UOp:
    """The vector of the scalars `srcs` (the scalar itself when there is one); lanes picked from one vector become a
    GEP of it."""
    srcs = tuple(srcs)
    if len(srcs) == 1:
        return srcs[0]
    first = srcs[0]
    if first.op is Ops.GEP and len(first.arg) == 1:
        # single lanes all of one vector (nodes are interned: the same vector is the same object)
        inner = first.src[0]
        for s in srcs:
            if s.op is not Ops.GEP or len(s.arg) != 1 or s.src[0] is not inner:
                break
        else:
            return gep(inner, [s.arg[0] for s in srcs])
    return UOp(Ops.VECTORIZE, first.dtype.vec(len(srcs)), srcs)


def concat(parts: Sequence[UOp]) -> UOp:
    """The vector of all lanes of `parts`, in order."""
    if len(parts) > 1 and all(p.dtype.count > 1 and p.op is not Ops.VECTORIZE and p.op is not Ops.GEP for p in parts):
        # vectors computed elsewhere (the chunks of a cut ALU op): their lanes are GEPs of them, which `gep` and
        # `vectorize` would build one by one; made directly (several parts: nothing folds)
        if len(set(parts)) > 1:
            srcs = tuple(lane for p in parts for lane in p.lanes())
            return UOp(Ops.VECTORIZE, parts[0].dtype.scalar().vec(len(srcs)), srcs)
    return vectorize([gep(p, (j,)) for p in parts for j in range(p.dtype.count)])


def _cat_lanes(x: UOp, lanes: tuple[int, ...]) -> UOp:
    """`gep` of a chunked vector (`_cat`): lanes within one chunk are a GEP of that chunk."""
    where: list[tuple[UOp, int]] = []
    for lane in lanes:
        for part in x.src:
            n = part.dtype.count
            if lane < n:
                where.append((part, lane))
                break
            lane -= n
    part = where[0][0]
    if all(p is part for p, _ in where):
        return gep(part, [j for _, j in where])
    return vectorize([gep(p, (j,)) for p, j in where])


def _cat(parts: list[UOp]) -> UOp:
    """The vector of all lanes of `parts` (vectors computed elsewhere: the chunks of a cut op), held as a VECTORIZE of
    the chunks themselves while vectors are cut, where lanes are taken chunk by chunk (`gep`); `expand_chunks` makes
    it a VECTORIZE of the lanes afterwards, as `concat` builds it, where anything still reads it whole."""
    if len(parts) > 1 and len(set(parts)) > 1:
        return UOp(Ops.VECTORIZE, parts[0].dtype.scalar().vec(sum(p.dtype.count for p in parts)), tuple(parts))
    return concat(parts)


def _expand_chunks(v: UOp) -> UOp | None:
    return concat(v.src) if v.src[0].dtype.count > 1 else None


expand_chunks = PatternMatcher([(UPat(Ops.VECTORIZE, name="v"), _expand_chunks)])
"""The rule that turns the cut's chunked vectors into VECTORIZEs of lanes; for the simplification after the cut."""


def vec(dtype: DType, count: int) -> DType:
    """`dtype` with `count` lanes (the scalar for 1)."""
    return dtype if count == 1 else dtype.vec(count)


# *** folding ***


def _fold_gep(x: UOp, g: UOp) -> UOp | None:
    # lanes of a vector that is neither built nor picked from another, short of all of them, are as `gep` makes them:
    # answered without building the node again (the cut vectors hold hundreds of thousands of these)
    if x.op is not Ops.VECTORIZE and x.op is not Ops.GEP and x.dtype.count > 1 and len(g.arg) < x.dtype.count:
        return None
    new = gep(x, g.arg)
    return None if new is g else new


def _fold_vectorize(v: UOp) -> UOp | None:
    # only one lane, or lanes all picked singly from one vector, fold (`vectorize`): the common case is neither
    first = v.src[0]
    if len(v.src) > 1 and (first.op is not Ops.GEP or len(first.arg) != 1):
        return None
    new = vectorize(v.src)
    return None if new is v else new


vector_rules = PatternMatcher(
    [
        (UPat(Ops.GEP, src=(UPat.var("x"),), name="g"), _fold_gep),
        (UPat(Ops.VECTORIZE, name="v"), _fold_vectorize),
    ]
)


# *** cutting to the renderer's width ***


REGISTER_ARRAY = "registers"
"""The mark, in a DEFINE_ACC's arg after its number, of an accumulator that WGMMAs accumulate into in place across
the steps of a loop (their results left in flight from one step to the next): it is not cut into vectors, and a
C-style renderer declares it as one array."""


def register_array(u: UOp) -> bool:
    """Whether `u` is an accumulator marked `REGISTER_ARRAY`."""
    return u.op is Ops.DEFINE_ACC and REGISTER_ARRAY in u.arg[1:]


def _chunks(n: int, width: int) -> list[tuple[int, ...]]:
    return [tuple(range(s, min(s + width, n))) for s in range(0, n, width)]


def _split_alu(ctx: int, x: UOp) -> UOp | None:
    width = ctx
    count = max(x.dtype.count, *(s.dtype.count for s in x.src)) if x.src else x.dtype.count
    if count <= width:
        return None
    parts = []
    for lanes in _chunks(count, width):
        dtype = vec(x.dtype.scalar(), len(lanes))
        parts.append(UOp(x.op, dtype, tuple(gep(s, lanes) for s in x.src), x.arg))
    out = _cat(parts)
    # x's sources are rewritten already (the cut runs bottom-up), so the chunks, and the lanes `concat` picks from
    # them when it builds the vector, all made by the constructors the folding rules apply, are final: the rewrite
    # needn't walk them to find that out
    mark_fixed_points(_split, width, (*parts, *out.src, out) if out.op is Ops.VECTORIZE else parts)
    return out


def _split_acc(ctx: int, acc: UOp) -> UOp | None:
    width = ctx
    # an accumulator a tensor core keeps in its registers across steps (`REGISTER_ARRAY`) stays one
    if acc.dtype.count <= width or register_array(acc):
        return None
    init, ranges = acc.src[0], acc.src[1:]
    parts = [
        UOp(Ops.DEFINE_ACC, vec(acc.dtype.scalar(), len(lanes)), (gep(init, lanes), *ranges), (*acc.arg, c))
        for c, lanes in enumerate(_chunks(acc.dtype.count, width))
    ]
    return concat(parts)


def _split_assign(ctx: int, target: UOp, value: UOp) -> UOp | None:
    # target is an accumulator cut into chunks by _split_acc: a VECTORIZE of GEPs of the chunk accumulators
    if target.op is not Ops.VECTORIZE:
        return None
    # each lane of the target: (chunk accumulator, lane in it); a scalar chunk is its own lane 0
    parts: list[tuple[UOp, int]] = []
    for s in target.src:
        if s.op is Ops.DEFINE_ACC and s.dtype.count == 1:
            parts.append((s, 0))
        elif s.op is Ops.GEP and s.src[0].op is Ops.DEFINE_ACC:
            parts.append((s.src[0], s.arg[0]))
        else:
            return None
    positions: dict[UOp, list[int]] = {}
    for pos, (acc, _) in enumerate(parts):
        positions.setdefault(acc, []).append(pos)
    assigned = {acc: UOp(Ops.ASSIGN, acc.dtype, (acc, gep(value, pos))) for acc, pos in positions.items()}
    return vectorize([gep(assigned[acc], (lane,)) for acc, lane in parts])


_split = (
    PatternMatcher(
        [
            (UPat(tuple(GroupOp.ALU | {Ops.CAST, Ops.BITCAST}), name="x"), _split_alu),
            (UPat(Ops.DEFINE_ACC, name="acc"), _split_acc),
            (UPat(Ops.ASSIGN, src=(UPat.var("target"), UPat.var("value"))), _split_assign),
        ]
    )
    + vector_rules
)


def split_rules(width: int) -> tuple[PatternMatcher, int]:
    """Rules (with the lane folding rules) and their context that cut vectors wider than `width` lanes into chunks
    of `width`."""
    return _split, width


# *** grouping memory accesses ***


# the widest load or store a GPU thread issues: 128 bits
VECTOR_BYTES = 16


def memory_widths(renderer: Renderer, itemsize: int = 4) -> tuple[tuple[int, ...], bool]:
    """The vector widths the renderer loads and stores elements of `itemsize` bytes in (widest first) and whether the
    element index must be a multiple of the width: unaligned vectors up to `vector_width`, else aligned float2/float4
    if `supports_float4`, and up to 16 bytes of narrower elements (8 halves, 16 chars) if `wide_vectors`."""
    if renderer.vector_width > 1:
        widths, w = [], 1
        while w * 2 <= renderer.vector_width:
            w *= 2
            widths.append(w)
        return tuple(reversed(widths)), False
    if renderer.supports_float4:
        wide = VECTOR_BYTES // itemsize if renderer.wide_vectors else 4
        return tuple(w for w in (16, 8, 4, 2) if w <= max(wide, 4)), True
    return (), False


def split_offset(idx: UOp) -> tuple[UOp | None, int]:
    """An index as (base, constant offset): `base + c` gives (base, c), constants added on top of each other summed
    (`(base + c1) + c2` gives (base, c1 + c2)), a constant (None, c). A 64-bit index whose last term is a widened
    32-bit sum with a constant, `a + cast(b + c)`, gives (`a + cast(b)`, c) where `b + c` can't overflow: a kernel
    indexing in 64 bits computes a lane's offset within its tile in 32 (a padded matmul's stores)."""
    if idx.op is Ops.CONST:
        return None, idx.arg
    if idx.op is Ops.ADD and idx.src[1].op is Ops.CONST:
        base, offset = split_offset(idx.src[0])
        return base, offset + idx.src[1].arg
    if idx.op is Ops.ADD and (widened := _widened_offset(idx.src[1])) is not None:
        return idx.replace(src=(idx.src[0], widened[0])), widened[1]
    return idx, 0


def _widened_offset(u: UOp) -> tuple[UOp, int] | None:
    """`cast(b + c)` (an integer widened) as (`cast(b)`, c) where neither `b` nor `b + c` leaves the narrower type."""
    if u.op is not Ops.CAST or not dtypes.is_int(u.dtype) or u.src[0].op is not Ops.ADD:
        return None
    inner = u.src[0]
    if not dtypes.is_int(inner.dtype) or inner.dtype.itemsize > u.dtype.itemsize or inner.src[1].op is not Ops.CONST:
        return None
    b, c = inner.src[0], inner.src[1].arg
    lo, hi = dtypes.min(inner.dtype), dtypes.max(inner.dtype)
    if not (lo <= b.vmin and b.vmax <= hi and lo <= b.vmin + c and b.vmax + c <= hi):
        return None
    return u.replace(src=(b,)), c


def _divides(u: UOp | None, n: int) -> bool:
    """Whether the integer expression `u` is a multiple of `n` for every value of its variables."""
    if u is None:
        return True
    if u.op is Ops.CONST:
        return u.arg % n == 0
    if u.op is Ops.CAST and dtypes.is_int(u.dtype) and dtypes.is_int(u.src[0].dtype):
        # a widened integer (split_offset's bases) keeps its value, so its factors
        return u.src[0].dtype.itemsize <= u.dtype.itemsize and _divides(u.src[0], n)
    if u.op is Ops.ADD:
        return all(_divides(s, n) for s in u.src)
    if u.op is Ops.MUL:
        return any(_divides(s, n) for s in u.src if s.op is Ops.CONST) or any(
            s.op is Ops.CONST and s.arg % n == 0 for s in u.src
        )
    return False


def _runs(offsets: list[int], widths: tuple[int, ...], aligned: bool, base: UOp | None, limit: int) -> list[list[int]]:
    """Cut sorted distinct offsets into runs of consecutive offsets, each one of the allowed widths (or single)."""
    out: list[list[int]] = []
    i = 0
    while i < len(offsets):
        j = i
        while j + 1 < len(offsets) and offsets[j + 1] == offsets[j] + 1:
            j += 1
        while i <= j:
            n = j - i + 1
            for w in widths:
                if w <= n and w <= limit and (not aligned or (offsets[i] % w == 0 and _divides(base, w))):
                    out.append(offsets[i : i + w])
                    i += w
                    break
            else:
                out.append([offsets[i]])
                i += 1
    return out


def _offset_index(dtype: DType, base: UOp | None, offset: int) -> UOp:
    return UOp.const(dtype, offset) if base is None else (base if offset == 0 else base + offset)


def _index_with(idx_node: UOp, base: UOp | None, offset: int) -> UOp:
    new_idx = _offset_index(idx_node.src[1].dtype, base, offset)
    return idx_node.replace(src=(idx_node.src[0], new_idx, *idx_node.src[2:]))


def _buffer_limit(buf: UOp) -> int:
    dt = buf.dtype
    return dt.size if isinstance(dt, PtrDType) and dt.size >= 0 else 1 << 30


def group_memory(sink: UOp, renderer: Renderer) -> UOp:
    """Scalar loads and stores of neighbouring elements replaced by vector loads and stores."""
    if not memory_widths(renderer)[0]:
        return sink
    if mapping := grouped_loads(sink.toposort, renderer):
        sink = sink.substitute(mapping)
    return _group_stores(sink, renderer)


def grouped_loads(loads: Iterable[UOp], renderer: Renderer) -> dict[UOp, UOp]:
    """Each scalar load of `loads` (other nodes are passed over) that reads next to others of the same buffer, base
    index, validity and gate, mapped to its lane of one vector load of the run, in the widths the renderer allows."""
    if not memory_widths(renderer)[0]:
        return {}
    # same buffer, same base index, same validity and gate; lanes by constant offset
    keyed = []
    for u in loads:
        if u.op is not Ops.LOAD or u.dtype.count != 1 or u.src[0].op is not Ops.INDEX:
            continue
        index = u.src[0]
        if index.src[0].op not in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL):
            continue
        base, offset = split_offset(index.src[1])
        keyed.append(((index.src[0], base, index.src[2:], u.src[1:], u.dtype), offset, u))
    mapping: dict[UOp, UOp] = {}
    for (_, base, _, extra, dtype), start, run in _load_runs(keyed, renderer):
        wide = _wide_load(_index_with(run[0].src[0], base, start), extra, dtype, len(run))
        for lane, u in enumerate(run):
            mapping[u] = gep(wide, (lane,))
    return mapping


def lane_loads(buf: UOp, dtype: DType, alt: UOp, pairs: Sequence[tuple[UOp, UOp]], renderer: Renderer) -> list[UOp]:
    """The load of `buf` at each (index, valid) of `pairs`, gated by valid with `alt` where invalid: lanes at the same
    element share one scalar load, and runs of neighbouring elements are read by one vector load, each lane a GEP of
    it. The very nodes that scalar loads `LOAD(INDEX(buf, index, valid), alt, valid)` (`scalar_load`) and
    `grouped_loads` give, without building the scalar loads that join a vector load (most of them, in a vectorised
    kernel)."""
    unique = list(dict.fromkeys(pairs))
    got: dict[tuple[UOp, UOp], UOp] = {}
    if (
        len(unique) > 1
        and dtype.count == 1
        and buf.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL)
        and memory_widths(renderer)[0]
    ):
        keyed = []
        for pair in unique:
            base, offset = split_offset(pair[0])
            keyed.append(((buf, base, pair[1]), offset, pair))
        for (_, base, valid), start, run in _load_runs(keyed, renderer, dtype.itemsize):
            gate = () if always_valid(valid) else (valid,)
            index = UOp(Ops.INDEX, buf.dtype, (buf, _offset_index(run[0][0].dtype, base, start), *gate))
            wide = _wide_load(index, (alt, *gate) if gate else (), dtype, len(run))
            for lane, pair in enumerate(run):
                got[pair] = gep(wide, (lane,))
    for pair in unique:
        if pair not in got:
            got[pair] = scalar_load(buf, dtype, alt, *pair)
    return [got[pair] for pair in pairs]


def scalar_load(buf: UOp, dtype: DType, alt: UOp, idx: UOp, valid: UOp) -> UOp:
    """The load of element `idx` of `buf` where `valid`, else `alt`: a gate that is the constant True is no gate (as
    the cleanup after simplification makes it; built so, the simplification need not rebuild what reads it)."""
    if always_valid(valid):
        return UOp(Ops.LOAD, dtype, (UOp(Ops.INDEX, buf.dtype, (buf, idx)),))
    return UOp(Ops.LOAD, dtype, (UOp(Ops.INDEX, buf.dtype, (buf, idx, valid)), alt, valid))


def scalar_store(buf: UOp, idx: UOp, value: UOp, valid: UOp) -> UOp:
    """The store of `value` to element `idx` of `buf` where `valid`: ungated for the constant True, as for loads."""
    if always_valid(valid):
        return UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, idx)), value))
    return UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, idx, valid)), value, valid))


def always_valid(valid: UOp) -> bool:
    """Whether validity `valid` is the constant True (no gate)."""
    return valid.op is Ops.CONST and valid.arg is True


def _load_runs(
    keyed: Iterable[tuple[tuple, int, Any]], renderer: Renderer, itemsize: int | None = None
) -> Iterator[tuple[tuple, int, list[Any]]]:
    """(key, first offset, items) for each run of two or more items of one key (buffer and base index first, the
    element's dtype last unless `itemsize` gives its size) at consecutive offsets, in the widths the renderer allows;
    the first item at an offset stands for it."""
    groups: dict[tuple, dict[int, Any]] = defaultdict(dict)
    for key, offset, item in keyed:
        groups[key].setdefault(offset, item)
    for key, by_offset in groups.items():
        if len(by_offset) < 2:
            continue
        widths, aligned = memory_widths(renderer, key[-1].itemsize if itemsize is None else itemsize)
        for run in _runs(sorted(by_offset), widths, aligned, key[1], _buffer_limit(key[0])):
            if len(run) > 1:
                yield key, run[0], [by_offset[off] for off in run]


def _wide_load(index: UOp, extra: tuple[UOp, ...], dtype: DType, n: int) -> UOp:
    """The `n`-lane load at `index`; of a gated load (`extra` is alternative and gate) the alternative becomes a
    vector too."""
    if len(extra) == 2:
        alt, gate = extra
        return UOp(Ops.LOAD, dtype.vec(n), (index, vectorize([alt] * n), gate))
    return UOp(Ops.LOAD, dtype.vec(n), (index, *extra))


def _group_stores(sink: UOp, renderer: Renderer) -> UOp:
    # the stores into local memory (sources of a BARRIER) first, then the kernel's outputs (sources of the SINK)
    for kind in (Ops.BARRIER, Ops.SINK):
        mapping = {
            owner: new
            for owner in sink.toposort
            if owner.op is kind and (new := _grouped(owner, renderer)) is not owner
        }
        if mapping:
            sink = sink.substitute(mapping)
    return sink


def _grouped(owner: UOp, renderer: Renderer) -> UOp:
    """`owner` (a SINK or BARRIER) with its scalar stores to neighbouring elements merged into vector stores."""
    new_src = grouped_stores(owner.src, renderer)
    return owner if len(new_src) == len(owner.src) else owner.replace(src=tuple(new_src))


def grouped_stores(stores: Sequence[UOp], renderer: Renderer) -> list[UOp]:
    """`stores` with the scalar stores to neighbouring elements of one buffer, base index, validity and gate merged
    into vector stores in the widths the renderer allows: the runs first, then what isn't a scalar store (or repeats
    an element another one stores); `stores` as they are, in their order, where none merge."""
    if not memory_widths(renderer)[0]:
        return list(stores)
    groups: dict[tuple, dict[int, UOp]] = defaultdict(dict)
    rest: list[UOp] = []
    for s in stores:
        if s.op is Ops.STORE and s.src[1].dtype.count == 1 and s.src[0].op is Ops.INDEX:
            index = s.src[0]
            base, offset = split_offset(index.src[1])
            key = (index.src[0], base, index.src[2:], s.src[2:])
            if offset not in groups[key]:
                groups[key][offset] = s
                continue
        rest.append(s)
    new_src: list[UOp] = []
    merged = False
    for (buf, base, _, gate), by_offset in groups.items():
        widths, aligned = memory_widths(renderer, next(iter(by_offset.values())).src[1].dtype.itemsize)
        for run in _runs(sorted(by_offset), widths, aligned, base, _buffer_limit(buf)):
            first = by_offset[run[0]]
            if len(run) == 1:
                new_src.append(first)
                continue
            value = vectorize([by_offset[off].src[1] for off in run])
            new_src.append(UOp(Ops.STORE, dtypes.void, (_index_with(first.src[0], base, run[0]), value, *gate)))
            merged = True
    if not merged:
        return list(stores)
    new_src.extend(rest)
    return new_src
