"""Kernel ASTs compiled by lazygrad_codegen for the PYTHON device and run end to end, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad_python import PythonCompiler, PythonProgram, PythonRenderer
from lazygrad_uop import Ops, UOp, dtypes
from lazygrad_uop.dtype import to_numpy_dtype
from lazygrad_uop.registry import Device

codegen = pytest.importorskip("lazygrad_codegen")
views = pytest.importorskip("lazygrad_uop.views")
if not hasattr(codegen, "get_program"):
    pytest.skip("lazygrad_codegen has no get_program yet", allow_module_level=True)
from lazygrad_codegen.kernel_ast import load, sink, st, store  # noqa: E402 - after the skip above

RNG = np.random.default_rng(3)


def run_ast(ast: UOp, inputs: dict[int, np.ndarray], vals: tuple[int, ...] = ()) -> dict[int, np.ndarray]:
    """Compile `ast` for PYTHON, run it on `inputs` (by slot; outputs are allocated) and return every buffer."""
    spec = codegen.get_program(ast, PythonRenderer())
    prg = PythonProgram(Device["PYTHON"], spec.name, PythonCompiler().compile(spec.src))
    defs = {u.arg: u.dtype for u in spec.uops if u.op is Ops.DEFINE_GLOBAL}
    arrays = {
        slot: inputs[slot] if slot in inputs else np.zeros(dt.size, to_numpy_dtype(dt.base))
        for slot, dt in sorted(defs.items())
    }
    mems = {slot: memoryview(bytearray(np.ascontiguousarray(a).tobytes())) for slot, a in arrays.items()}
    prg(*mems.values(), global_size=spec.global_size, local_size=spec.local_size, vals=vals)
    return {slot: np.frombuffer(bytes(m), arrays[slot].dtype) for slot, m in mems.items()}


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_elementwise_broadcast() -> None:
    a, b = f32(4, 1), f32(1, 6)
    x = load(1, dtypes.float32, st(4, 1).expand((4, 6)))
    y = load(2, dtypes.float32, st(1, 6).expand((4, 6)))
    half = UOp(Ops.CONST, dtypes.float32, (UOp(Ops.VIEW, arg=st(4, 6)),), 0.5)
    out = run_ast(sink(store(0, x * y + half, st(4, 6))), {1: a, 2: b})[0]
    np.testing.assert_array_equal(out.reshape(4, 6), a * b + np.float32(0.5))


def test_padded_flipped_permuted() -> None:
    a = f32(3, 5)
    view = st(3, 5).permute((1, 0)).flip((True, False)).pad(((2, 3), (1, 0)))
    out = run_ast(sink(store(0, load(1, dtypes.float32, view, size=15), st(10, 4))), {1: a})[0]
    np.testing.assert_array_equal(out.reshape(10, 4), np.pad(a.T[::-1], ((2, 3), (1, 0))))


@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX, Ops.MUL], ids=str)
def test_reduce(op: Ops) -> None:
    a = f32(5, 7) * 0.5 + 1
    if op is Ops.MAX:
        a[2, 3] = np.nan
    red = UOp(Ops.REDUCE_AXIS, dtypes.float32, (load(1, dtypes.float32, st(5, 7)),), (op, (0,)))
    out = run_ast(sink(store(0, red, st(1, 7))), {1: a})[0]
    ref = {Ops.ADD: np.sum, Ops.MAX: np.max, Ops.MUL: np.prod}[op](a, axis=0)
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_matmul_with_two_stores() -> None:
    m, k, n = 4, 9, 3
    a, b = f32(m, k), f32(k, n)
    sa = st(m, 1, k).expand((m, n, k))
    sb = st(k, n).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
    prod = load(1, dtypes.float32, sa, size=m * k) * load(2, dtypes.float32, sb, size=k * n)
    acc = UOp(Ops.REDUCE_AXIS, dtypes.float32, (prod,), (Ops.ADD, (2,)))
    outs = run_ast(sink(store(0, acc, st(m, n, 1)), store(3, acc.maximum(0.0), st(m, n, 1))), {1: a, 2: b})
    np.testing.assert_allclose(outs[0].reshape(m, n), a @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[3].reshape(m, n), np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)


def test_integer_semantics_and_casts() -> None:
    a = RNG.integers(-100, 100, 20).astype(np.int32)
    b = (RNG.integers(1, 9, 20) * RNG.choice([-1, 1], 20)).astype(np.int32)
    view = st(20)
    x, y = load(1, dtypes.int32, view), load(2, dtypes.int32, view)
    small = x.cast(dtypes.uint8)
    outs = run_ast(
        sink(
            store(0, x.alu(Ops.IDIV, y), view),
            store(3, x.alu(Ops.MOD, y), view),
            store(4, (small + small).cast(dtypes.int32), view),
            store(5, x.cast(dtypes.float16).bitcast(dtypes.int16), view),
        ),
        {1: a, 2: b},
    )
    np.testing.assert_array_equal(outs[0], np.trunc(a / b).astype(np.int32))
    np.testing.assert_array_equal(outs[3], np.fmod(a, b))
    np.testing.assert_array_equal(outs[4], (a.astype(np.uint8) + a.astype(np.uint8)).astype(np.int32))
    np.testing.assert_array_equal(outs[5], a.astype(np.float16).view(np.int16))


def test_unary_math() -> None:
    a = np.abs(f32(12)) + 0.25
    view = st(12)
    x = load(1, dtypes.float32, view)
    ops = [Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC]
    outs = run_ast(sink(*(store(i + 2, x.alu(op), view) for i, op in enumerate(ops))), {1: a})
    for i, ref in enumerate([np.exp2(a), np.log2(a), np.sin(a), np.sqrt(a), 1 / a, np.trunc(a)]):
        np.testing.assert_allclose(outs[i + 2], ref, rtol=1e-6, err_msg=str(ops[i]))


def test_symbolic_variable() -> None:
    n = UOp.variable("n", 1, 32)
    view = st(n)
    a = f32(32)
    out = run_ast(sink(store(0, load(1, dtypes.float32, view, size=32) + 1.0, view, size=32)), {1: a}, vals=(7,))[0]
    np.testing.assert_array_equal(out[:7], a[:7] + np.float32(1))
    np.testing.assert_array_equal(out[7:], 0)


@pytest.mark.parametrize(
    "dtype, lanes", [(dtypes.float16, 8), (dtypes.int8, 16), (dtypes.uint8, 16), (dtypes.float32, 4)], ids=str
)
@pytest.mark.parametrize("n", [4096, 4128])  # 4128: whole vectors, not whole workgroups (the last one masked)
def test_elementwise_on_a_gpu_target_moves_16_bytes_per_access(dtype, lanes: int, n: int) -> None:
    from lazygrad_python.device import GPUTarget

    renderer = PythonRenderer(GPUTarget(name="WIDE"))
    a = (RNG.standard_normal(n) * 20).astype(to_numpy_dtype(dtype))
    b = (RNG.standard_normal(n) * 20).astype(to_numpy_dtype(dtype))
    ast = sink(store(0, load(1, dtype, st(n)) + load(2, dtype, st(n)), st(n)))
    spec = codegen.get_program(ast, renderer)
    widths = {u.dtype.count for u in spec.uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_GLOBAL}
    assert widths == {lanes}, "every load of the inputs is one 16-byte vector"
    stores = {u.src[1].dtype.count for u in spec.uops if u.op is Ops.STORE}
    assert stores == {lanes}
    assert 128 <= spec.local_size[0] <= 512
    prg = PythonProgram(Device["PYTHON"], spec.name, PythonCompiler().compile(spec.src))
    mems = [memoryview(bytearray(x.tobytes())) for x in (np.zeros_like(a), a, b)]
    prg(*mems, global_size=spec.global_size, local_size=spec.local_size, vals=())
    with np.errstate(over="ignore"):
        want = a + b
    np.testing.assert_array_equal(np.frombuffer(bytes(mems[0]), a.dtype), want)
