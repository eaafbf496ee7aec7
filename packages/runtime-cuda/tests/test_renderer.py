"""The CUDA renderer's output compiles with NVRTC for sm_80 and sm_90 and its PTX assembles with ptxas: every dtype,
every ALU op and cast, vectors, shared memory and barriers, mma.sync tensor cores. (Running these kernels against
numpy needs a GPU: test_gpu.py.)"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from cuda_helpers import (
    SCALARS,
    compile_everywhere,
    const,
    glob,
    linear,
    load,
    mma_program,
    ptx_fragment,
    ptx_tf32_fragment,
    shared_vector_program,
    special,
    store,
    tf32_mma_program,
)

from lazygrad_cuda.renderer import MMA_M16N8K8_LAYOUT, MMA_M16N8K8_TF32_LAYOUT, MMA_M16N8K16_LAYOUT, CUDARenderer
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.uop import UOp

R = CUDARenderer("sm_80")


def test_shared_memory_vectors_barrier_and_if(tmp_path: Path) -> None:
    src = R.render(shared_vector_program())
    for piece in ("__shared__ __align__(16) float smem[64];", "__syncthreads();", "__launch_bounds__(16, 1)", "float4"):
        assert piece in src, src
    compile_everywhere(src, "shared_vec", tmp_path)


@pytest.mark.parametrize("k", [16, 8])
@pytest.mark.parametrize("dtype_in", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_mma_sync(tmp_path: Path, dtype_in: DType, k: int) -> None:
    src = R.render(mma_program(dtype_in, k))
    ptx_type = "f16" if dtype_in == dtypes.float16 else "bf16"
    outs = compile_everywhere(src, f"mma_k{k}_{ptx_type}", tmp_path)
    for out in outs.values():
        assert f"mma.sync.aligned.m16n8k{k}.row.col.f32.{ptx_type}.{ptx_type}.f32" in out.ptx.decode()


def test_wmma_outside_mma_sync_is_refused() -> None:
    arg = ("WMMA_8_8_4_half_float", (8, 8, 4), dtypes.float16, dtypes.float32, 32, (4, 2, 2), ())
    with pytest.raises(NotImplementedError, match="m16n8k16 and m16n8k8"):
        R.render_wmma(UOp(Ops.WMMA, dtypes.float32.vec(2), (), arg))
    transposed = (MMA_M16N8K16_LAYOUT[1], MMA_M16N8K16_LAYOUT[0], MMA_M16N8K16_LAYOUT[2])
    arg = ("WMMA_8_16_16_half_float", (8, 16, 16), dtypes.float16, dtypes.float32, 32, (8, 4, 4), transposed)
    with pytest.raises(NotImplementedError, match="layout"):
        R.render_wmma(UOp(Ops.WMMA, dtypes.float32.vec(4), (), arg))


def test_mma_sync_on_tf32(tmp_path: Path) -> None:
    src = R.render(tf32_mma_program())
    # each of A's 4 and B's 2 floats rounded to nearest, ties away, before the mma
    assert src.count("cvt.rna.tf32.f32") == 6
    for out in compile_everywhere(src, "mma_tf32", tmp_path).values():
        assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in out.ptx.decode()


def test_float32_mma_must_round_to_tf32_in_the_ptx_layout() -> None:
    prog = tf32_mma_program()
    wmma = next(u for u in prog if u.op is Ops.WMMA)
    a, b, c = wmma.src
    unrounded = wmma.arg[:7]
    with pytest.raises(NotImplementedError, match="input_mantissa_bits=10"):
        R.render_wmma(UOp(Ops.WMMA, wmma.dtype, (a, b, c), unrounded))
    with pytest.raises(NotImplementedError, match="input_mantissa_bits=10"):
        R.render_wmma(UOp(Ops.WMMA, wmma.dtype, (a, b, c), (*unrounded, 7)))
    # the fp16 m16n8k8 layout (two elements per register) is not the TF32 one
    with pytest.raises(NotImplementedError, match="layout"):
        R.render_wmma(UOp(Ops.WMMA, wmma.dtype, (a, b, c), (*wmma.arg[:6], MMA_M16N8K8_LAYOUT, 10)))
    # and a rounding is only TF32's, of float32
    half = ("WMMA_8_16_8_half_float", (8, 16, 8), dtypes.float16, dtypes.float32, 32, (4, 2, 4), MMA_M16N8K8_LAYOUT)
    with pytest.raises(NotImplementedError, match="rounds only float32"):
        R.render_wmma(UOp(Ops.WMMA, wmma.dtype, (), (*half, 10)))


def test_the_tf32_core_is_registered_with_the_ptx_layout() -> None:
    from lazygrad_cuda.tensor_cores import TENSOR_CORES

    (tf32,) = [tc for tc in TENSOR_CORES["sm_80"] if tc.dtype_in == dtypes.float32]
    assert tf32.swizzle == MMA_M16N8K8_TF32_LAYOUT and tf32.input_mantissa_bits == 10
    assert R.tensor_core_problem(tf32, "sm_80") is None


def _coordinate(layout: tuple, dim: str, thread: int, register: int) -> int:
    """Coordinate `dim` of the element `thread` holds in `register`, read off a layout as TensorCore defines it."""
    thread_bits, register_bits = layout
    bits = [(thread >> i) & 1 for i in range(len(thread_bits))] + [
        (register >> i) & 1 for i in range(len(register_bits))
    ]
    names = list(thread_bits) + list(register_bits)
    return sum(bit << int(name[1:]) for bit, name in zip(bits, names, strict=True) if name and name[0] == dim)


@pytest.mark.parametrize(
    ("layouts", "fragment"),
    [
        (MMA_M16N8K16_LAYOUT, ptx_fragment),
        (MMA_M16N8K8_LAYOUT, ptx_fragment),
        (MMA_M16N8K8_TF32_LAYOUT, ptx_tf32_fragment),
    ],
    ids=["k16", "k8", "k8-tf32"],
)
@pytest.mark.parametrize("operand", ["A", "B", "C"])
def test_mma_layout_is_the_ptx_fragment_layout(operand: str, layouts: tuple, fragment) -> None:
    layout = layouts["ABC".index(operand)]
    rows, cols = {"A": ("m", "k"), "B": ("k", "n"), "C": ("m", "n")}[operand]
    for lane in range(32):
        for register in range(1 << len(layout[1])):
            got = (_coordinate(layout, rows, lane, register), _coordinate(layout, cols, lane, register))
            assert got == fragment(operand, lane, register), (operand, lane, register)


def test_casts_between_every_pair_of_dtypes(tmp_path: Path) -> None:
    stores = []
    t = special("gidx0", 4)
    for n, (src, dst) in enumerate(itertools.product(SCALARS, SCALARS)):
        x = load(glob(len(SCALARS) ** 2 + SCALARS.index(src), src, 4), t)
        stores.append(store(glob(n, dst, 4), t, x.cast(dst)))
    compile_everywhere(R.render(linear("casts", *stores)), "casts", tmp_path)


def _ops_for(dt: DType) -> list[Ops]:
    if dtypes.is_bool(dt):
        return [Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE, Ops.CMPLT, Ops.MAX, Ops.NEG]
    ops = [Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.NEG, Ops.WHERE, Ops.MULACC]
    if dtypes.is_float(dt):
        return [*ops, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC]
    return [*ops, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR]


@pytest.mark.parametrize("dt", SCALARS, ids=str)
def test_alu_ops_and_constants(tmp_path: Path, dt: DType) -> None:
    t = special("gidx0", 8)
    a, b = load(glob(0, dt, 8), t), load(glob(1, dt, 8), t)
    stores = []
    for n, op in enumerate(_ops_for(dt), start=2):
        if op in GroupOp.Unary:
            value = UOp(op, dt, (a,))
        elif op is Ops.WHERE:
            value = UOp(op, dt, (t < 3, a, b))
        elif op is Ops.MULACC:
            value = UOp(op, dt, (a, b, a))
        elif op in GroupOp.Comparison:
            value = UOp(op, dtypes.bool, (a, b))
        else:
            value = UOp(op, dt, (a, b))
        stores.append(store(glob(n, value.dtype, 8), t, value))
    specials = [0, 1, -1, 100] if not dtypes.is_float(dt) else [0.5, -2.0, float("inf"), float("-inf"), float("nan")]
    for n, v in enumerate(specials, start=100):
        if dtypes.is_bool(dt) or (dtypes.is_unsigned(dt) and not dtypes.is_float(dt) and v < 0):
            v = 1
        stores.append(store(glob(n, dt, 8), t, const(v, dt)))
    compile_everywhere(R.render(linear(f"alu_{dt.name.replace(' ', '_').strip('_')}", *stores)), "alu", tmp_path)


def test_vector_alu_casts_bitcasts_and_constants(tmp_path: Path) -> None:
    t = special("gidx0", 4)
    h = load(glob(0, dtypes.float16, 32), t * 8, dtypes.float16.vec(8))
    hf = h.cast(dtypes.float32.vec(8))
    doubled = UOp(Ops.ADD, dtypes.float32.vec(8), (hf, hf))
    bits = UOp(Ops.BITCAST, dtypes.int32.vec(4), (load(glob(1, dtypes.float32, 16), t * 4, dtypes.float32.vec(4)),))
    vconst = UOp(Ops.VCONST, dtypes.bfloat16.vec(4), (), (1.0, -2.0, 0.5, 3.0))
    stores = [
        store(glob(2, dtypes.float32, 32), t * 8, doubled),
        store(glob(3, dtypes.int32, 16), t * 4, bits),
        store(glob(4, dtypes.bfloat16, 16), t * 4, vconst),
        store(glob(5, dtypes.bool, 16), t * 4, UOp(Ops.CMPLT, dtypes.bool.vec(4), (bits, const(0)))),
    ]
    src = R.render(linear("vectors", *stores))
    assert "struct __align__(16) lg_halfx8 { half x, y, z, w, a, b, c, d; };" in src
    compile_everywhere(src, "vectors", tmp_path)


def test_threefry(tmp_path: Path) -> None:
    t = special("gidx0", 4)
    x = load(glob(1, dtypes.uint64, 4), t)
    value = UOp(Ops.THREEFRY, dtypes.uint64, (x, const(12345, dtypes.uint64)))
    src = R.render(linear("threefry", store(glob(0, dtypes.uint64, 4), t, value)))
    assert "lg_threefry(" in src
    compile_everywhere(src, "threefry", tmp_path)


def test_dtypes_without_a_cuda_type_are_refused() -> None:
    with pytest.raises(NotImplementedError, match="float8"):
        R.render_dtype(dtypes.fp8e4m3)
    with pytest.raises(NotImplementedError, match="vector type"):
        R.render_dtype(dtypes.float32.vec(32))


def test_type_names() -> None:
    assert R.render_dtype(dtypes.float32.vec(4)) == "float4"
    assert R.render_dtype(dtypes.int64.vec(2)) == "longlong2"
    assert R.render_dtype(dtypes.float16.vec(4)) == "lg_halfx4"
    assert R.render_dtype(dtypes.float32.vec(8)) == "lg_floatx8"
    assert R.render_dtype(dtypes.bfloat16.ptr(4)) == "__nv_bfloat16*"
    with pytest.raises(ValueError, match="sm_80"):
        CUDARenderer("ampere")


def test_int64_indices_and_guarded_division_compile(tmp_path: Path) -> None:
    """A loop and offsets past 2^31 (rendered with 64-bit indices) and an integer division by a loaded divisor (with
    the guard that keeps it from trapping) are valid CUDA."""
    from lazygrad_codegen import get_program
    from lazygrad_codegen.kernel_ast import load as ast_load
    from lazygrad_codegen.kernel_ast import reduce, sink, st
    from lazygrad_codegen.kernel_ast import store as ast_store

    n = 2**31 + 6
    x, y = ast_load(1, dtypes.int32, st(n)), ast_load(2, dtypes.int32, st(n))
    ast = sink(ast_store(0, reduce(x // y + x % y, Ops.ADD, (0,)), st(1)))
    spec = get_program(ast, R)
    assert "long long" in spec.src and any(u.op is Ops.WHERE for u in spec.uops)
    compile_everywhere(spec.src, "wide_div", tmp_path)
