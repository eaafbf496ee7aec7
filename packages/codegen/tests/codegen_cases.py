"""Kernel ASTs of the kinds codegen meets (elementwise, broadcasts, reductions, matmuls, convolutions, padded and
permuted views, several outputs) with inputs and numpy references, runners for the PYTHON device (plain, or pretending
to be a GPU) and the CPU device, and random opt sequences."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from lazygrad_codegen import Kernel, KernelOptError, Opt, ProgramSpec, get_program
from lazygrad_codegen.kernel_ast import const, load, reduce, sink, st, store
from lazygrad_codegen.search import ACTIONS
from lazygrad_uop.device import Renderer
from lazygrad_uop.dtype import DType, dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker, View

RNG = np.random.default_rng(11)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# *** cases ***


@dataclass
class Case:
    """A kernel AST, its input arrays by slot, and the numpy result of each output slot (flat)."""

    name: str
    ast: UOp
    inputs: dict[int, np.ndarray]
    expected: dict[int, np.ndarray]
    tol: float = 1e-4
    tags: set[str] = field(default_factory=set)


def elementwise(n: int = 96) -> Case:
    a, b = f32(n), f32(n)
    x, y = load(1, dtypes.float32, st(n)), load(2, dtypes.float32, st(n))
    value = (x * y + const(0.5, dtypes.float32, st(n))).maximum(x)
    return Case(f"elementwise_{n}", sink(store(0, value, st(n))), {1: a, 2: b}, {0: np.maximum(a * b + 0.5, a)})


def broadcast_where(rows: int = 6, cols: int = 20) -> Case:
    a, b = f32(rows, 1), f32(1, cols)
    x = load(1, dtypes.float32, st(rows, 1).expand((rows, cols)))
    y = load(2, dtypes.float32, st(1, cols).expand((rows, cols)))
    value = (x < y).where(x - y, y.cast(dtypes.int32).cast(dtypes.float32))
    ref = np.where(a < b, a - b, b.astype(np.int32).astype(np.float32))
    return Case("broadcast_where", sink(store(0, value, st(rows, cols))), {1: a, 2: b}, {0: ref.reshape(-1)})


def transpose_pad(rows: int = 7, cols: int = 12) -> Case:
    a = f32(rows, cols)
    view = st(rows, cols).permute((1, 0)).pad(((2, 2), (0, 1)))
    out = st(cols + 4, rows + 1)
    ref = np.pad(a.T, ((2, 2), (0, 1)))
    return Case(
        "transpose_pad",
        sink(store(0, load(1, dtypes.float32, view, size=a.size) * 2, out)),
        {1: a},
        {0: ref.reshape(-1) * 2},
    )


def row_reduce(op: Ops = Ops.ADD, rows: int = 8, cols: int = 48) -> Case:
    a = f32(rows, cols)
    bias = f32(rows, 1)
    red = reduce(load(1, dtypes.float32, st(rows, cols)), op, (1,))
    value = red + load(2, dtypes.float32, st(rows, 1))
    fn = {Ops.ADD: np.sum, Ops.MAX: np.max, Ops.MUL: np.prod}[op]
    data = a if op is not Ops.MUL else (a * 0.1 + 1).astype(np.float32)
    ref = fn(data, axis=1, keepdims=True) + bias
    return Case(f"row_{op.name.lower()}", sink(store(0, value, st(rows, 1))), {1: data, 2: bias}, {0: ref.reshape(-1)})


def column_sum(rows: int = 40, cols: int = 24) -> Case:
    a = f32(rows, cols)
    red = reduce(load(1, dtypes.float32, st(rows, cols)), Ops.ADD, (0,))
    return Case("column_sum", sink(store(0, red, st(1, cols))), {1: a}, {0: a.sum(0)})


def full_sum_and_max(n: int = 256) -> Case:
    a = f32(n)
    x = load(1, dtypes.float32, st(n))
    stores = (store(0, reduce(x, Ops.ADD, (0,)), st(1)), store(2, reduce(x, Ops.MAX, (0,)), st(1)))
    return Case("sum_and_max", sink(*stores), {1: a}, {0: a.sum(keepdims=True), 2: a.max(keepdims=True)}, tol=1e-4)


def matmul(m: int = 16, n: int = 24, k: int = 32, dtype: DType = dtypes.float32, acc: DType = dtypes.float32) -> Case:
    npdt = to_numpy_dtype(dtype)
    a, b = RNG.standard_normal((m, k)).astype(npdt), RNG.standard_normal((k, n)).astype(npdt)
    x = load(1, dtype, st(m, 1, k).expand((m, n, k)))
    y = load(2, dtype, st(1, k, n).permute((0, 2, 1)).expand((m, n, k)))
    prod = x.cast(acc) * y.cast(acc) if dtype != acc else x * y
    ref = a.astype(np.float64) @ b.astype(np.float64)
    tol = 1e-4 if acc == dtypes.float32 else 2e-2
    return Case(
        f"matmul_{m}x{n}x{k}_{dtype.name}",
        sink(store(0, reduce(prod, Ops.ADD, (2,)), st(m, n, 1))),
        {1: a, 2: b},
        {0: ref.astype(to_numpy_dtype(acc)).reshape(-1)},
        tol=tol,
        tags={"matmul"},
    )


def conv2d(cin: int = 3, cout: int = 4, size: int = 6, kernel: int = 3, pad: int = 1) -> Case:
    x = f32(cin, size, size)
    w = f32(cout, cin, kernel, kernel)
    p = size + 2 * pad
    out = p - kernel + 1
    # sliding windows over the padded input: (cout, oh, ow, cin, kh, kw)
    padded = st(cin, size, size).pad(((0, 0), (pad, pad), (pad, pad)))
    window = padded.reshape((cin * p * p,))
    window = ShapeTracker((*window.views[:-1], View.create((1, out, out, cin, kernel, kernel), (0, p, 1, p * p, p, 1))))
    window = window.expand((cout, out, out, cin, kernel, kernel))
    weight = st(cout, 1, 1, cin, kernel, kernel).expand((cout, out, out, cin, kernel, kernel))
    prod = load(1, dtypes.float32, window, size=x.size) * load(2, dtypes.float32, weight)
    red = reduce(prod, Ops.ADD, (3, 4, 5))
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    ref = np.zeros((cout, out, out), np.float64)
    for i in range(out):
        for j in range(out):
            ref[:, i, j] = np.einsum("chw,ochw->o", xp[:, i : i + kernel, j : j + kernel], w)
    ast = sink(store(0, red, st(cout, out, out, 1, 1, 1)))
    return Case("conv2d", ast, {1: x, 2: w}, {0: ref.reshape(-1)}, tags={"conv"})


def int_ops(n: int = 40) -> Case:
    a = RNG.integers(-50, 50, n).astype(np.int32)
    x = load(1, dtypes.int32, st(n))
    value = (x * 3 + 7) // 4 + (x % 5).maximum(x)
    ref = np.trunc((a * 3 + 7) / 4).astype(np.int32) + np.maximum(np.fmod(a, 5), a)
    return Case("int_ops", sink(store(0, value, st(n))), {1: a}, {0: ref}, tol=0)


def mixed_dtypes(n: int = 64) -> Case:
    a = RNG.standard_normal(n).astype(np.float16)
    x = load(1, dtypes.float16, st(n))
    half = x * x - x
    stores = (store(0, half.cast(dtypes.float32), st(n)), store(2, x < half, st(n)), store(3, half, st(n)))
    ref = (a * a - a).astype(np.float16)
    expected = {0: ref.astype(np.float32), 2: a < ref, 3: ref}
    return Case("mixed_dtypes", sink(*stores), {1: a}, expected, tol=1e-3)


def padded_window_sum(rows: int = 6, cols: int = 10) -> Case:
    """A sum over an axis that is partly padding: the padded elements are masked loads inside the reduction."""
    a = f32(rows, cols)
    view = st(rows, cols).pad(((0, 0), (3, 5)))
    red = reduce(load(1, dtypes.float32, view, size=a.size) * 2, Ops.ADD, (1,))
    return Case("padded_window_sum", sink(store(0, red, st(rows, 1))), {1: a}, {0: a.sum(1) * 2})


def all_cases() -> list[Case]:
    return [
        elementwise(),
        broadcast_where(),
        transpose_pad(),
        row_reduce(Ops.ADD),
        row_reduce(Ops.MAX),
        row_reduce(Ops.MUL),
        column_sum(),
        full_sum_and_max(),
        matmul(),
        matmul(12, 20, 18),
        conv2d(),
        int_ops(),
        mixed_dtypes(),
        padded_window_sum(),
    ]


# *** running ***


def _arrays(ast: UOp, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    defs = {u.arg: u.dtype for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL}
    out = {}
    for slot, dt in sorted(defs.items()):
        npdt = np.uint16 if dt.base == dtypes.bfloat16 else to_numpy_dtype(dt.base)
        out[slot] = np.ascontiguousarray(inputs[slot], npdt).reshape(-1) if slot in inputs else np.zeros(dt.size, npdt)
    return out


def run_python(ast: UOp, renderer: Renderer, opts: list[Opt] | None, inputs: dict[int, np.ndarray]):
    """Compile `ast` with `opts` for a PYTHON renderer and run it; returns (outputs by slot, spec)."""
    py = pytest.importorskip("lazygrad_python")
    spec = get_program(ast, renderer, opts)
    prg = py.PythonProgram(Device["PYTHON"], spec.name, py.PythonCompiler().compile(spec.src))
    arrays = _arrays(ast, inputs)
    mems = {slot: memoryview(bytearray(a.tobytes())) for slot, a in arrays.items()}
    prg(*(mems[s] for s in spec.globals), global_size=spec.global_size, local_size=spec.local_size)
    return {slot: np.frombuffer(bytes(mems[slot]), arrays[slot].dtype) for slot in spec.outs}, spec


def cpu_device() -> Any:
    pytest.importorskip("lazygrad_cpu")
    from lazygrad_uop.registry import Device

    return Device["CPU"]


def run_device(ast: UOp, device: Any, opts: list[Opt] | None, inputs: dict[int, np.ndarray], renderer=None):
    """Compile `ast` for a device (with `renderer`, else the device's) and run it; (outputs by slot, spec)."""
    from lazygrad_uop.device import Buffer

    spec: ProgramSpec = get_program(ast, renderer or device.renderer, opts)
    prg = device.load_program(spec.name, device.compiler.compile(spec.src))
    arrays = _arrays(ast, inputs)
    bufs = {}
    for slot, a in arrays.items():
        b = Buffer(device.device, max(a.size, 1), dtypes.uint8 if a.size == 0 else _dtype_of(ast, slot)).allocate()
        if a.size:
            b.copyin(memoryview(a).cast("B"))
        bufs[slot] = b
    prg(*(bufs[s].handle for s in spec.globals), global_size=spec.global_size, local_size=spec.local_size)
    out = {}
    for slot in spec.outs:
        host = np.empty_like(arrays[slot])
        bufs[slot].copyout(memoryview(host).cast("B"))
        out[slot] = host
    return out, spec


def _dtype_of(ast: UOp, slot: int) -> DType:
    return next(u.dtype.base for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL and u.arg == slot)


def check(case: Case, outputs: dict[int, np.ndarray], what: str) -> None:
    for slot, want in case.expected.items():
        got = outputs[slot].astype(np.float64)
        if case.tol == 0:
            np.testing.assert_array_equal(got, want, err_msg=what)
        else:
            scale = 1 + np.abs(want).max(initial=0)
            np.testing.assert_allclose(got, want, rtol=case.tol, atol=case.tol * scale, err_msg=what)


def random_opts(kernel: Kernel, rng: random.Random, count: int, actions: list[Opt] | None = None) -> list[Opt]:
    """Up to `count` opts picked at random among those valid for `kernel` in turn (applied to a copy)."""
    k = kernel.copy()
    pool = list(actions if actions is not None else ACTIONS)
    for _ in range(count):
        rng.shuffle(pool)
        for opt in pool:
            try:
                k.apply_opt(opt)
            except KernelOptError:
                continue
            break
    return list(k.applied_opts)


Runner = Callable[[UOp, list[Opt] | None, dict[int, np.ndarray]], tuple[dict[int, np.ndarray], ProgramSpec]]
