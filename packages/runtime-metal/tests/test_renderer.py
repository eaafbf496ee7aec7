"""The MSL renderer on linear programs built by hand, for what the op suite's kernels don't use yet (threadgroup
memory and barriers, IF blocks, vectors, WMMA, variables) and for Metal's types: each program's MSL is checked
against Metal's declarations, and where the PYTHON interpreter can run it, its results against numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from msl_check import check_msl, cxx

from lazygrad_metal.renderer import MAX_THREADS_PER_THREADGROUP, SIMD_WIDTH, THREADGROUP_MEMORY_BYTES, MetalRenderer
from lazygrad_uop.device import TensorCore
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.uop import UOp


@pytest.fixture
def msl(tmp_path: Path):
    """Checks MSL sources with the C++ compiler (skips where there is none)."""
    if cxx() is None:
        pytest.skip("no C++ compiler (c++) on PATH to check the MSL with")
    return lambda *sources: check_msl(list(sources), tmp_path)


def run_python(uops: list[UOp], *arrays: np.ndarray, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=()) -> list:
    """Run `uops` on the PYTHON interpreter over copies of `arrays` (slot order) and return them afterwards."""
    lp = pytest.importorskip("lazygrad_python", reason="running linear programs needs lazygrad-runtime-python")
    prg = lp.PythonProgram(Device["PYTHON"], "kernel", lp.PythonCompiler().compile(lp.PythonRenderer().render(uops)))
    mems = [memoryview(bytearray(np.ascontiguousarray(a).tobytes())) for a in arrays]
    prg(*mems, global_size=global_size, local_size=local_size, vals=tuple(vals))
    return [np.frombuffer(bytes(m), a.dtype).reshape(a.shape) for m, a in zip(mems, arrays)]


def glob(slot: int, dtype: DType, size: int) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, dtype.ptr(size), arg=slot)


def const(dtype: DType, value: object) -> UOp:
    return UOp(Ops.CONST, dtype, arg=value)


def index(buf: UOp, idx: UOp) -> UOp:
    return UOp(Ops.INDEX, buf.dtype, (buf, idx))


def load(buf: UOp, idx: UOp, dtype: DType | None = None, *extra: UOp) -> UOp:
    return UOp(Ops.LOAD, dtype or buf.dtype.base, (index(buf, idx), *extra))


def store(buf: UOp, idx: UOp, value: UOp) -> UOp:
    return UOp(Ops.STORE, dtypes.void, (index(buf, idx), value))


def end(u: UOp) -> UOp:
    return UOp(Ops.END if u.op is Ops.RANGE else Ops.ENDIF, dtypes.void, (u,))


def sink(name: str) -> UOp:
    return UOp(Ops.SINK, dtypes.void, arg=name)


def ordered(*uops: UOp) -> list[UOp]:
    """The given uops in order, each preceded by the sources not placed yet (a DEFINE_ACC's RANGEs excepted)."""
    out: list[UOp] = []

    def place(u: UOp) -> None:
        if u in out:
            return
        for s in u.src[:1] if u.op is Ops.DEFINE_ACC else u.src:
            place(s)
        out.append(u)

    for u in uops:
        place(u)
    return out


# *** limits and types ***


def test_limits_are_apple_gpus() -> None:
    r = MetalRenderer()
    assert (r.device, r.has_local, r.has_shared, r.supports_float4) == ("METAL", True, True, True)
    assert r.local_max == (MAX_THREADS_PER_THREADGROUP,) * 3 == (1024, 1024, 1024)
    assert r.shared_max == THREADGROUP_MEMORY_BYTES == 32768 and SIMD_WIDTH == 32
    assert r.tensor_cores == ()


def test_tensor_cores_are_given_per_renderer() -> None:
    tc = TensorCore((8, 8, 8), 32, (2, 2, 2), dtypes.float16, dtypes.float32, ("u0",))
    assert MetalRenderer((tc,)).tensor_cores == (tc,)
    assert MetalRenderer().tensor_cores == ()


@pytest.mark.parametrize(
    ("dtype", "name"),
    [
        (dtypes.bool, "bool"),
        (dtypes.int8, "char"),
        (dtypes.uint8, "uchar"),
        (dtypes.int16, "short"),
        (dtypes.uint16, "ushort"),
        (dtypes.uint32, "uint"),
        (dtypes.int64, "long"),
        (dtypes.uint64, "ulong"),
        (dtypes.float16, "half"),
        (dtypes.bfloat16, "bfloat"),
        (dtypes.float32.vec(4), "float4"),
        (dtypes.float16.vec(2), "half2"),
    ],
)
def test_type_names(dtype: DType, name: str) -> None:
    assert MetalRenderer().render_dtype(dtype) == name


@pytest.mark.parametrize("dtype", [dtypes.float64, dtypes.fp8e4m3, dtypes.float32.vec(8)], ids=str)
def test_types_metal_lacks_raise(dtype: DType) -> None:
    with pytest.raises(NotImplementedError, match="Metal has no"):
        MetalRenderer().render_dtype(dtype)


def test_float64_kernel_raises_with_a_hint() -> None:
    g0, g1 = glob(0, dtypes.float64, 4), glob(1, dtypes.float64, 4)
    r = UOp.range(4, 0)
    uops = ordered(r, store(g0, r, load(g1, r) + const(dtypes.float64, 1.0)), end(r), sink("f64"))
    with pytest.raises(NotImplementedError, match="no 64-bit floats"):
        MetalRenderer().render(uops)


def test_int64_literals_are_long() -> None:
    r = MetalRenderer()
    assert r.render_const(-(2**63), dtypes.int64) == "(-9223372036854775807l-1)"
    assert r.render_const(2**40, dtypes.int64) == "1099511627776l"
    assert r.render_const(2**64 - 1, dtypes.uint64) == "18446744073709551615ul"


# *** kernels ***


def test_parameters_bind_in_order_and_variables_are_constant_ints(msl) -> None:
    n = UOp.variable("n", 1, 16)
    g0, g1 = glob(0, dtypes.float32, 16), glob(1, dtypes.int32, 16)
    r = UOp.range(n, 0)
    value = load(g1, r).cast(dtypes.float32) * const(dtypes.float32, 0.5)
    uops = ordered(g0, g1, n, r, store(g0, r, value), end(r), sink("with_var"))
    src = MetalRenderer().render(uops)
    assert "device float* data0 [[buffer(0)]]" in src and "device int* data1 [[buffer(1)]]" in src
    assert "constant int& n [[buffer(2)]]" in src
    msl(src)
    a = np.arange(16, dtype=np.int32)
    (out, _) = run_python(uops, np.zeros(16, np.float32), a, vals=(7,))
    np.testing.assert_array_equal(out, np.where(np.arange(16) < 7, a * np.float32(0.5), 0))


def test_threadgroup_memory_barrier_and_if(msl) -> None:
    """A sum of 64 values by one threadgroup of 16 threads: each sums 4 into threadgroup memory, a barrier, then
    thread 0 adds the 16 partial sums."""
    out, x = glob(0, dtypes.float32, 1), glob(1, dtypes.float32, 64)
    temp = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(16, local=True), arg="temp0")
    lid = UOp(Ops.SPECIAL, dtypes.int32, arg=("lidx0", 16))
    r0 = UOp.range(4, 0)
    acc0 = UOp(Ops.DEFINE_ACC, dtypes.float32, (const(dtypes.float32, 0.0), r0), arg=(0,))
    part = UOp(Ops.ASSIGN, dtypes.float32, (acc0, acc0 + load(x, lid * 4 + r0)))
    barrier = UOp(Ops.BARRIER, dtypes.void, (store(temp, lid, part),))
    gate = UOp(Ops.IF, dtypes.void, (lid.alu(Ops.CMPLT, const(dtypes.int32, 1)),))
    r1 = UOp.range(16, 1)
    acc1 = UOp(Ops.DEFINE_ACC, dtypes.float32, (const(dtypes.float32, 0.0), r1), arg=(1,))
    total = UOp(Ops.ASSIGN, dtypes.float32, (acc1, acc1 + load(temp, r1, None, barrier)))
    result = store(out, const(dtypes.int32, 0), total)
    uops = ordered(out, x, temp, lid, acc0, r0, part, end(r0), barrier, gate, acc1, r1, total, end(r1), result)
    uops += [end(gate), sink("group_sum")]
    src = MetalRenderer().render(uops)
    assert "threadgroup float temp0[16];" in src
    assert "threadgroup_barrier(mem_flags::mem_threadgroup);" in src
    assert "int lidx0 = lid.x;" in src
    msl(src)
    a = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    (res, _) = run_python(uops, np.zeros(1, np.float32), a, local_size=(16, 1, 1))
    np.testing.assert_allclose(res, [a.sum()], rtol=1e-5)


def test_vectors(msl) -> None:
    """float4 loads and stores through scalar buffers; lanes picked with GEP, computed one by one (Apple GPUs are
    scalar per thread) and rebuilt with VECTORIZE."""
    out, x = glob(0, dtypes.float32, 16), glob(1, dtypes.float32, 16)
    gid = UOp(Ops.SPECIAL, dtypes.int32, arg=("gidx0", 4))
    v = load(x, gid * 4, dtypes.float32.vec(4))
    pair = UOp(Ops.GEP, dtypes.float32.vec(2), (v,), (3, 0))
    lanes = [UOp(Ops.GEP, dtypes.float32, (v,), (1,)), UOp(Ops.GEP, dtypes.float32, (v,), (0,))]
    lanes += [UOp(Ops.GEP, dtypes.float32, (pair,), (k,)) for k in (0, 1)]
    result = UOp(Ops.VECTORIZE, dtypes.float32.vec(4), tuple(lane + const(dtypes.float32, 1.0) for lane in lanes))
    uops = ordered(out, x, gid, store(out, gid * 4, result), sink("vectors"))
    src = MetalRenderer().render(uops)
    assert "(*((device float4*)(data1+" in src and "(*((device float4*)(data0+" in src and "float4(" in src
    msl(src)
    a = np.arange(16, dtype=np.float32)
    (res, _) = run_python(uops, np.zeros(16, np.float32), a, global_size=(4, 1, 1))
    np.testing.assert_array_equal(res, a.reshape(4, 4)[:, [1, 0, 3, 0]].reshape(-1) + 1)


def test_three_lane_vectors_use_packed_types(msl) -> None:
    out, x = glob(0, dtypes.int32, 12), glob(1, dtypes.int32, 12)
    gid = UOp(Ops.SPECIAL, dtypes.int32, arg=("gidx0", 4))
    v = load(x, gid * 3, dtypes.int32.vec(3))
    doubled = [UOp(Ops.GEP, dtypes.int32, (v,), (k,)) * 2 for k in range(3)]
    uops = ordered(out, x, gid, store(out, gid * 3, UOp(Ops.VECTORIZE, v.dtype, tuple(doubled))), sink("vec3"))
    src = MetalRenderer().render(uops)
    assert "(*((device packed_int3*)(data1+" in src and "(*((device packed_int3*)(data0+" in src
    msl(src)
    a = np.arange(12, dtype=np.int32)
    (res, _) = run_python(uops, np.zeros(12, np.int32), a, global_size=(4, 1, 1))
    np.testing.assert_array_equal(res, a * 2)


def test_vector_arithmetic_is_not_rendered() -> None:
    v = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (const(dtypes.float32, 1.0), const(dtypes.float32, 2.0)))
    with pytest.raises(NotImplementedError, match="lane by lane"):
        MetalRenderer().render(ordered(v + v))


@pytest.mark.parametrize(
    ("dtype_in", "dtype_out"),
    [
        (dtypes.float16, dtypes.float32),
        (dtypes.float32, dtypes.float32),
        (dtypes.float16, dtypes.float16),
        (dtypes.bfloat16, dtypes.float32),
    ],
    ids=str,
)
def test_wmma_renders_simdgroup_multiply_accumulate(msl, dtype_in: DType, dtype_out: DType) -> None:
    """One 8x8x8 multiply-accumulate by a SIMD group: each of 32 threads passes 2 elements of A, B and C."""
    a, b = glob(1, dtype_in, 64), glob(2, dtype_in, 64)
    c = glob(0, dtype_out, 64)
    lid = UOp(Ops.SPECIAL, dtypes.int32, arg=("lidx0", 32))
    two = [lid * 2, lid * 2 + 1]
    va = UOp(Ops.VECTORIZE, dtype_in.vec(2), tuple(load(a, i) for i in two))
    vb = UOp(Ops.VECTORIZE, dtype_in.vec(2), tuple(load(b, i) for i in two))
    vc = UOp(Ops.VECTORIZE, dtype_out.vec(2), tuple(load(c, i) for i in two))
    arg = (f"WMMA_8_8_8_{dtype_in.name}_{dtype_out.name}", (8, 8, 8), dtype_in, dtype_out, "METAL", 32, (), ())
    wmma = UOp(Ops.WMMA, dtype_out.vec(2), (va, vb, vc), arg)
    stores = [store(c, i, UOp(Ops.GEP, dtype_out, (wmma,), (k,))) for k, i in enumerate(two)]
    src = MetalRenderer().render(ordered(c, a, b, lid, *stores, sink("wmma")))
    assert "simdgroup_multiply_accumulate(mat_c, mat_a, mat_b, mat_c);" in src
    mat = {dtypes.float16: "half", dtypes.bfloat16: "bfloat", dtypes.float32: "float"}
    assert f"simdgroup_{mat[dtype_in]}8x8 mat_a, mat_b;" in src and f"simdgroup_{mat[dtype_out]}8x8 mat_c;" in src
    msl(src)


def test_wmma_of_other_shapes_raises() -> None:
    x = UOp(Ops.VECTORIZE, dtypes.float16.vec(2), (const(dtypes.float16, 1.0),) * 2)
    acc = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (const(dtypes.float32, 1.0),) * 2)
    wmma = UOp(
        Ops.WMMA,
        dtypes.float32.vec(2),
        (x, x, acc),
        ("WMMA_16_16_16", (16, 16, 16), dtypes.float16, dtypes.float32, "METAL", 32, (), ()),
    )
    with pytest.raises(NotImplementedError, match="8x8x8"):
        MetalRenderer().render(ordered(wmma))


def test_bfloat16_math_is_computed_in_float(msl) -> None:
    out, x = glob(0, dtypes.bfloat16, 8), glob(1, dtypes.bfloat16, 8)
    r = UOp.range(8, 0)
    v = load(x, r)
    value = (v * v + v.alu(Ops.SQRT)).maximum(v).cast(dtypes.int8).cast(dtypes.bfloat16)
    uops = ordered(out, x, r, store(out, r, value), end(r), sink("bf16"))
    src = MetalRenderer().render(uops)
    assert "bfloat" in src and "((float)(val0))" in src
    # int8 <-> bfloat converts through float
    assert "((bfloat)(((float)(" in src
    msl(src)


def test_gated_load_and_store(msl) -> None:
    out, x = glob(0, dtypes.int32, 8), glob(1, dtypes.int32, 8)
    r = UOp.range(8, 0)
    inside = r.alu(Ops.CMPLT, const(dtypes.int32, 5))
    value = UOp(Ops.LOAD, dtypes.int32, (index(x, r), const(dtypes.int32, -1), inside))
    st = UOp(Ops.STORE, dtypes.void, (index(out, r), value * 2, r.alu(Ops.CMPNE, const(dtypes.int32, 6))))
    uops = ordered(out, x, r, st, end(r), sink("gated"))
    msl(MetalRenderer().render(uops))
    (res, _) = run_python(uops, np.full(8, 9, np.int32), np.arange(8, dtype=np.int32))
    np.testing.assert_array_equal(res, [0, 2, 4, 6, 8, -2, 9, -2])


def test_float4_stores_into_threadgroup_memory(msl) -> None:
    """A grouped row sum with 4 rows a thread, 64 threads a group (two SIMD groups): the first thread of each SIMD
    group stores its 4 partial sums into threadgroup memory as one float4, through a pointer in the threadgroup address
    space; run with Metal's launch shape, against numpy."""
    lazygrad = pytest.importorskip("lazygrad", reason="builds the kernel from a Tensor graph: needs the frontend")
    from lazygrad_codegen import Opt, OptOps, get_program

    (si,) = lazygrad.Tensor.empty(8, 64, device="PYTHON").sum(axis=1).schedule()
    opts = [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.GROUPTOP, 0, 64)]
    spec = get_program(si.ast, MetalRenderer(), opts)
    assert "(*((threadgroup float4*)(temp0+" in spec.src and "(*((device float4*)(data0+" in spec.src
    msl(spec.src)
    x = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    out, _ = run_python(spec.uops, np.zeros(8, np.float32), x, global_size=spec.global_size, local_size=spec.local_size)
    np.testing.assert_allclose(out, x.sum(axis=1), rtol=1e-5)


def test_int64_indices_and_guarded_division_are_msl(msl) -> None:
    """A loop and offsets past 2^31 (64-bit indices) and an integer division by a loaded divisor (guarded so that it
    can't trap) are valid Metal Shading Language."""
    from lazygrad_codegen import get_program
    from lazygrad_codegen.kernel_ast import load, reduce, sink, st, store

    n = 2**31 + 6
    x, y = load(1, dtypes.int32, st(n)), load(2, dtypes.int32, st(n))
    spec = get_program(sink(store(0, reduce(x // y + x % y, Ops.ADD, (0,)), st(1))), MetalRenderer())
    assert "long" in spec.src and any(u.op is Ops.WHERE for u in spec.uops)
    msl(spec.src)
