"""Vectors: the lane helpers, cutting wide vectors to the renderer's width, merging neighbouring loads and stores into
vector ones (unaligned on LLVM, aligned float4 on GPU-style renderers), and the LLVM renderer's vector IR, run on the
CPU for every dtype against the unoptimised (scalar) kernel."""

from __future__ import annotations

import random
from typing import ClassVar

import numpy as np
import pytest
from codegen_cases import (
    all_cases,
    check,
    column_sum,
    cpu_device,
    elementwise,
    load,
    matmul,
    random_opts,
    row_reduce,
    run_device,
    sink,
    st,
    store,
    transpose_pad,
)
from hypothesis import given, settings
from hypothesis import strategies as hst

from lazygrad_codegen import CRenderer, Kernel, LLVMRenderer, Opt, OptOps, get_program, vectors
from lazygrad_codegen.division import guard_divisions
from lazygrad_codegen.lowerer import lower
from lazygrad_codegen.program import _simplify_rules
from lazygrad_codegen.vectors import (
    concat,
    gep,
    group_memory,
    grouped_loads,
    lane_loads,
    memory_widths,
    split_rules,
    vectorize,
)
from lazygrad_uop.config import Context
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.pattern import graph_rewrite
from lazygrad_uop.uop import UOp


class Narrow(LLVMRenderer):
    device = "TESTLLVM"
    vector_width = 4


class Float4(CRenderer):
    """Scalar arithmetic, aligned float4 loads and stores (as GPU dialects have)."""

    device = "TESTGPU"
    supports_float4 = True


def test_lane_helpers_fold() -> None:
    a, b, c = (UOp.variable(n, 0, 9) for n in "abc")
    v = vectorize([a, b, c])
    assert v.dtype == dtypes.int32.vec(3)
    assert gep(v, (1,)) is b and gep(v, (2, 0)).src == (c, a)
    assert gep(v, (0, 1, 2)) is v  # all lanes in order: the vector itself
    assert vectorize([gep(v, (0,)), gep(v, (1,)), gep(v, (2,))]) is v
    assert gep(gep(v, (2, 1)), (0,)) is c
    assert vectorize([a]) is a and gep(a, (0,)) is a
    assert concat([v, a]).src == (a, b, c, a)
    with pytest.raises(ValueError, match="lanes"):
        gep(a, (1,))


def _vector_ops(spec) -> list[UOp]:
    return [u for u in spec.uops if u.dtype.count > 1 and u.op not in (Ops.VECTORIZE, Ops.GEP)]


def test_vectors_are_cut_to_the_renderer_width() -> None:
    case = matmul(8, 32, 16)
    opts = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 2)]
    narrow = get_program(case.ast, Narrow(), opts)
    assert max(u.dtype.count for u in _vector_ops(narrow)) == 4
    assert any(u.op is Ops.LOAD and u.dtype.count == 4 for u in narrow.uops)
    scalar = get_program(case.ast, CRenderer(), opts)
    assert all(u.dtype.count == 1 for u in scalar.uops)
    accs = [u for u in scalar.uops if u.op is Ops.DEFINE_ACC]
    assert len(accs) == 32 and sorted(a.arg for a in accs) == [(i,) for i in range(32)]


def test_llvm_ir_has_vector_loads_stores_and_fused_accumulation() -> None:
    src = get_program(matmul(8, 32, 16).ast, LLVMRenderer(), [Opt(OptOps.UPCAST, 1, 16)]).src
    assert "load <8 x float>" in src and "store <8 x float>" in src
    assert "alloca <8 x float>" in src  # the accumulator is a vector
    assert "fmul reassoc contract <8 x float>" in src and "fadd reassoc contract <8 x float>" in src
    assert "shufflevector" in src  # A's element broadcast to every lane


def test_unaligned_vector_memory_on_llvm_aligned_float4_elsewhere() -> None:
    n = 64
    # a view starting 3 elements into the buffer: neighbouring, but not aligned to 4
    shifted = sink(store(0, load(1, dtypes.float32, st(n + 3).shrink(((3, n + 3),))), st(n)))
    opts = [Opt(OptOps.UPCAST, 0, 4)]
    llvm_loads = [u for u in get_program(shifted, Narrow(), opts).uops if u.op is Ops.LOAD]
    assert {u.dtype.count for u in llvm_loads} == {4}
    f4 = get_program(shifted, Float4(), opts)
    # misaligned by 3: a scalar, an aligned pair, a scalar; never a float4
    assert sorted(u.dtype.count for u in f4.uops if u.op is Ops.LOAD) == [1, 1, 2]
    assert {u.src[1].dtype.count for u in f4.uops if u.op is Ops.STORE} == {4}  # the output is aligned
    assert "float4" in f4.src
    assert memory_widths(CRenderer()) == ((), False)
    assert memory_widths(Float4()) == ((4, 2), True)
    assert memory_widths(Narrow()) == ((4, 2), False)


def test_wide_vectors_move_16_bytes_of_narrow_elements() -> None:
    wide = Float4()
    wide.wide_vectors = True
    # widths of aligned vectors of at most 16 bytes (and float4's 4 lanes for wider elements), widest first
    for itemsize in (1, 2, 4, 8):
        lanes = max(16 // itemsize, 4)
        assert memory_widths(wide, itemsize) == (tuple(w for w in (16, 8, 4, 2) if w <= lanes), True)
    n = 64
    shifted = sink(store(0, load(1, dtypes.float16, st(n + 8).shrink(((8, n + 8),))), st(n)))
    spec = get_program(shifted, wide, [Opt(OptOps.UPCAST, 0, 16)])
    assert {u.dtype.count for u in spec.uops if u.op is Ops.LOAD} == {8}  # 8 halves at a time, aligned at 8
    assert memory_widths(Float4(), 2) == ((4, 2), True), "without wide_vectors, float4's widths"


def test_group_memory_leaves_gapped_and_differently_gated_accesses_alone() -> None:
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(64), arg=1)
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(64), arg=0)
    i = UOp.variable("i", 0, 7) * 8
    gate = UOp.variable("g", 0, 1) < 1

    def ld(off: int, g: UOp | None = None) -> UOp:
        if g is None:
            return UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, buf.dtype, (buf, i + off)),))
        index = UOp(Ops.INDEX, buf.dtype, (buf, i + off, g))
        return UOp(Ops.LOAD, dtypes.float32, (index, UOp.const(dtypes.float32, 0), g))

    values = [ld(0), ld(1), ld(3), ld(4, gate), ld(5, gate)]
    stores = [UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, i + k)), v)) for k, v in enumerate(values)]
    grouped = group_memory(UOp(Ops.SINK, dtypes.void, tuple(stores)), Narrow())
    loads = sorted((u for u in grouped.toposort if u.op is Ops.LOAD), key=lambda u: (u.dtype.count, len(u.src)))
    assert [(u.dtype.count, len(u.src)) for u in loads] == [(1, 1), (2, 1), (2, 3)]
    assert [s.src[1].dtype.count for s in grouped.src] == [4, 1]


@pytest.mark.parametrize(
    "dtype",
    [
        dtypes.bool,
        dtypes.int8,
        dtypes.uint16,
        dtypes.int32,
        dtypes.float16,
        dtypes.bfloat16,
        dtypes.float32,
        dtypes.float64,
    ],
    ids=str,
)
def test_llvm_vectors_of_every_dtype_match_scalar_code(dtype) -> None:
    device = cpu_device()
    n = 64
    x = load(1, dtype, st(n))
    if dtypes.is_bool(dtype):
        value, other = x ^ (x | x.logical_not()), x.cast(dtypes.float32)
    else:
        value = (x + x).maximum(x * x) if not dtypes.is_float(dtype) else (x * x + x).maximum(x.alu(Ops.RECIP))
        other = (x < x * 2).where(x.cast(dtypes.float32), x.cast(dtypes.int8).cast(dtypes.float32))
    ast = sink(store(0, value, st(n)), store(2, other, st(n)))
    raw = np.random.default_rng(1).integers(0, 256, n * dtype.itemsize, dtype=np.uint8)
    if dtypes.is_float(dtype):  # finite values of every float dtype: small bit patterns in the high byte
        raw.reshape(n, dtype.itemsize)[:, -1] &= 0x3F
    if dtypes.is_bool(dtype):
        raw &= 1
    inputs = {1: raw.view(np.uint16 if dtype == dtypes.bfloat16 else _np(dtype))}
    scalar, _ = run_device(ast, device, [], inputs)
    vector, spec = run_device(ast, device, [Opt(OptOps.UPCAST, 0, 16)], inputs)
    assert any(u.dtype.count > 1 for u in spec.uops if u.op is Ops.LOAD)
    for slot in scalar:
        np.testing.assert_array_equal(vector[slot].view(np.uint8), scalar[slot].view(np.uint8))


@pytest.mark.parametrize(
    "dtype",
    [dtypes.int8, dtypes.uint16, dtypes.int32, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64],
    ids=str,
)
def test_llvm_strided_lanes_are_one_gather(dtype) -> None:
    # a transposed copy with padding, upcast along the output's contiguous axis: each vector's lanes are strided
    # elements of the input, some of them padding; the CPU renders each vector as one masked gather
    device = cpu_device()
    with Context(CPU_GATHERS=1):
        renderer = type(device.renderer)()
    rows, cols = 5, 16
    view = st(rows, cols).permute((1, 0)).pad(((1, 1), (1, 2)))
    ast = sink(store(0, load(1, dtype, view, size=rows * cols), st(cols + 2, rows + 3)))
    raw = np.random.default_rng(2).integers(0, 256, rows * cols * dtype.itemsize, dtype=np.uint8)
    x = raw.view(np.uint16 if dtype == dtypes.bfloat16 else _np(dtype)).reshape(rows, cols)
    out, spec = run_device(ast, device, [Opt(OptOps.UPCAST, 1, 8)], {1: x}, renderer=renderer)
    assert "@llvm.masked.gather" in spec.src and "load <" not in spec.src
    want = np.pad(x.T, ((1, 1), (1, 2)))
    np.testing.assert_array_equal(out[0].view(np.uint8), want.reshape(-1).view(np.uint8))


def test_llvm_gathers_are_a_setting_and_match_lane_loads() -> None:
    # CPU_GATHERS=1 renders vectors of strided loads as gathers; by default (and with 0) they are loaded lane by
    # lane; both give numpy's numbers
    case = transpose_pad()
    device = cpu_device()
    with Context(CPU_GATHERS=1):
        gathering = type(device.renderer)()
    assert not type(device.renderer)().gathers
    opts = [Opt(OptOps.UPCAST, 1, 8)]
    gathered, spec = run_device(case.ast, device, opts, case.inputs, renderer=gathering)
    lanes, plain = run_device(case.ast, device, opts, case.inputs, renderer=type(device.renderer)())
    assert "@llvm.masked.gather" in spec.src and "@llvm.masked.gather" not in plain.src
    np.testing.assert_array_equal(gathered[0], lanes[0])
    check(case, gathered, str(opts))


def _np(dtype):
    from lazygrad_uop.dtype import to_numpy_dtype

    return to_numpy_dtype(dtype)


@pytest.mark.parametrize(
    ("case", "opts"),
    [
        (matmul(16, 24, 32), [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 0, 8)]),
        (column_sum(), [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 0)]),
    ],
    ids=["matmul", "column_sum"],
)
def test_llvm_regathered_lanes_are_one_shuffle(case, opts) -> None:
    # vectors assembled from lanes of other vectors (a tile transposed between the reduction and the store): one
    # shufflevector each, no extractelement/insertelement per lane, and the numbers numpy gives
    outputs, spec = run_device(case.ast, cpu_device(), opts, case.inputs)
    gathered = [u for u in spec.uops if u.op is Ops.VECTORIZE and all(s.op is Ops.GEP for s in u.src)]
    assert gathered, "the opts should leave vectors built from lanes of other vectors"
    assert "insertelement" not in spec.src and "extractelement" not in spec.src
    check(case, outputs, str(opts))


def test_reductions_keep_a_full_vector_of_partial_sums() -> None:
    # one output, a long contiguous reduction: the accumulator holds a whole vector, summed after the loop
    spec = get_program(row_reduce(Ops.ADD, 1, 256).ast, LLVMRenderer(), [Opt(OptOps.UNROLL, 0, 32)])
    accs = [u for u in spec.uops if u.op is Ops.DEFINE_ACC]
    assert [a.dtype.count for a in accs] == [LLVMRenderer.vector_width] * 4  # four independent chains of adds


def test_elementwise_heuristic_vectorises_on_llvm() -> None:
    spec = get_program(elementwise(256).ast, LLVMRenderer())
    assert spec.opts == (Opt(OptOps.UPCAST, 0, 16),)
    assert "load <8 x float>" in spec.src


def test_c_style_dialects_render_vectors_local_memory_and_barriers() -> None:
    class CudaLike(CRenderer):
        device = "TESTGPU"
        has_local = True
        has_shared = True
        supports_float4 = True
        smem_prefix = "__shared__ "
        barrier = "__syncthreads();"
        code_for_workitem: ClassVar = {"g": lambda d: f"blockIdx.{'xyz'[d]}", "l": lambda d: f"threadIdx.{'xyz'[d]}"}

        def render_vectorize(self, dtype, parts):
            return f"make_{self.render_dtype(dtype)}({','.join(parts)})"

    opts = [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.GROUPTOP, 0, 16)]
    src = get_program(row_reduce(Ops.ADD, 8, 64).ast, CudaLike(), opts).src
    assert "__shared__ float temp0[64];" in src  # 4 partial sums for each of 16 threads
    assert "__syncthreads();" in src
    assert "*((float4*)(temp0+" in src  # the four partial sums of a thread stored as one float4
    assert "threadIdx.x" in src and "if (" in src  # only the first thread of each group stores the result
    with pytest.raises(NotImplementedError, match="no workgroup barrier"):
        get_program(row_reduce(Ops.ADD, 8, 64).ast, type("NoBarrier", (CudaLike,), {"barrier": ""})(), opts)


@pytest.mark.parametrize("renderer", [Narrow(), LLVMRenderer()], ids=["width4", "width8"])
def test_cut_vectors_skips_the_walk_not_the_result(renderer: LLVMRenderer) -> None:
    # the cut marks the chunks it builds as final (`mark_fixed_points`), which only a memo rewrite believes: the same
    # graph cut by the plain rewrite, which walks every node, must come out the very same nodes
    rng = random.Random(16)
    for case in all_cases():
        for opts in ([], *(random_opts(Kernel(case.ast, renderer), rng, rng.randint(1, 4)) for _ in range(3))):
            k = Kernel(case.ast, renderer).apply_opts(list(opts))
            lowered = graph_rewrite(guard_divisions(lower(k, renderer.vector_width).sink), _simplify_rules)
            rules, width = split_rules(renderer.vector_width)
            want = graph_rewrite(lowered, rules, ctx=width)
            assert graph_rewrite(lowered, rules, ctx=width, memo=True) is want, f"{case.name} {opts}"


@settings(max_examples=80, deadline=None)
@given(
    offsets=hst.lists(hst.tuples(hst.integers(-2, 40), hst.integers(0, 2)), min_size=1, max_size=24),
    based=hst.booleans(),
    renderer=hst.sampled_from([Narrow(), LLVMRenderer(), Float4(), CRenderer()]),
    dtype=hst.sampled_from([dtypes.float32, dtypes.float16, dtypes.int8]),
)
def test_lane_loads_are_the_scalar_loads_grouped(offsets, based: bool, renderer, dtype) -> None:
    # the reference: one scalar load per distinct (index, valid), ungated where valid is the constant True (what the
    # cleanup rules leave), then `grouped_loads` over them, as lowering did
    buf = UOp(Ops.DEFINE_GLOBAL, dtype.ptr(64), arg=1)
    base = UOp.variable("i", 0, 3) * 8 if based else None
    gates = [UOp.const(dtypes.bool, True), UOp.variable("g", 0, 1) < 1, UOp.variable("h", 0, 1) < 1]
    pairs = [(UOp.const(dtypes.int32, off) if base is None else base + off, gates[g]) for off, g in offsets]
    alt = UOp.const(dtype, 0)
    made = {
        p: UOp(Ops.LOAD, dtype, (UOp(Ops.INDEX, buf.dtype, (buf, p[0])),))
        if p[1] is gates[0]
        else UOp(Ops.LOAD, dtype, (UOp(Ops.INDEX, buf.dtype, (buf, *p)), alt, p[1]))
        for p in pairs
    }
    grouped = grouped_loads(made.values(), renderer) if len(made) > 1 else {}
    want = [grouped.get(made[p], made[p]) for p in pairs]
    got = lane_loads(buf, dtype, alt, pairs, renderer)
    assert len(got) == len(want) and all(a is b for a, b in zip(got, want))


@settings(max_examples=80, deadline=None)
@given(
    sizes=hst.lists(hst.sampled_from([2, 4, 8]), min_size=1, max_size=4),
    data=hst.data(),
)
def test_chunked_vectors_read_as_their_lanes(sizes: list[int], data: hst.DataObject) -> None:
    # while vectors are cut, a cut op's result is a VECTORIZE of its chunks: every selection of its lanes must be the
    # very node it is of the VECTORIZE of single lanes that `concat` builds, and expanding it must give that vector
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(64), arg=1)
    parts = [
        UOp(Ops.LOAD, dtypes.float32.vec(n), (UOp(Ops.INDEX, buf.dtype, (buf, UOp.const(dtypes.int32, 8 * i))),))
        for i, n in enumerate(sizes)
    ]
    if data.draw(hst.booleans()) and len(parts) > 1:
        parts[-1] = parts[0]  # a chunk repeated
    chunked, want = vectors._cat(parts), concat(parts)
    total = sum(p.dtype.count for p in parts)
    for _ in range(4):
        lanes = data.draw(hst.lists(hst.integers(0, total - 1), min_size=1, max_size=total))
        assert gep(chunked, lanes) is gep(want, lanes)
    assert graph_rewrite(chunked, vectors.expand_chunks) is want
