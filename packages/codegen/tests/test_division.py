"""Integer IDIV/MOD never trap (`lazygrad_codegen.division`): a zero divisor gives 0 and MIN / -1 wraps, the same on
the C renderer (compiled with cc), the CPU device (LLVM IR) and the PYTHON interpreter; divisions the bounds prove
safe are left unguarded. The reference is Python integers with C's truncating semantics."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_c import run_c
from codegen_cases import cpu_device, run_device, run_python

from lazygrad_codegen import CRenderer, Opt, OptOps, get_program
from lazygrad_codegen.kernel_ast import const, load, sink, st, store
from lazygrad_uop.dtype import DType, dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops

DTYPES = [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint32]


def _wrap(v: int, dt: DType) -> int:
    return int(np.array(v).astype(np.int64).astype(to_numpy_dtype(dt)).item()) if -(2**63) <= v < 2**63 else v


def _c_divmod(a: int, b: int, dt: DType) -> tuple[int, int]:
    """C's truncating quotient and remainder, with lazygrad's definitions where C has none."""
    if b == 0:
        return 0, 0
    q = abs(a) // abs(b)
    q = q if (a < 0) == (b < 0) else -q
    bits = 8 * dt.itemsize
    q = (q + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1) if not dtypes.is_unsigned(dt) else q % 2**bits
    return q, a - b * q if b != -1 else 0


def _operands(dt: DType) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    values = sorted(v for v in {lo, lo + 1, -7, -1, 0, 1, 3, 7, hi - 1, hi} if lo <= v <= hi)
    rng = np.random.default_rng(3)
    extra = rng.integers(lo, hi, 16, endpoint=True, dtype=np.int64).tolist()
    pairs = [(a, b) for a in values + extra[:8] for b in values + extra[8:]]
    npdt = to_numpy_dtype(dt)
    return np.array([p[0] for p in pairs], npdt), np.array([p[1] for p in pairs], npdt)


def _case(dt: DType):
    a, b = _operands(dt)
    n = a.size
    x, y = load(1, dt, st(n)), load(2, dt, st(n))
    ast = sink(store(0, x // y, st(n)), store(3, x % y, st(n)))
    ref = [_c_divmod(int(p), int(q), dt) for p, q in zip(a.tolist(), b.tolist(), strict=True)]
    npdt = to_numpy_dtype(dt)
    q_ref = np.array([_wrap(r[0], dt) for r in ref], npdt)
    r_ref = np.array([_wrap(r[1], dt) for r in ref], npdt)
    return ast, {1: a, 2: b}, q_ref, r_ref


@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("where", ["c", "cpu", "python"])
def test_division_defined_everywhere(dt: DType, where: str, tmp_path) -> None:
    ast, inputs, q_ref, r_ref = _case(dt)
    # an upcast makes the division a vector op on renderers with vectors
    opts = [Opt(OptOps.UPCAST, 0, 4)] if inputs[1].size % 4 == 0 else []
    if where == "c":
        out = run_c(tmp_path, ast, CRenderer(), inputs, opts=opts)[0]
    elif where == "cpu":
        out = run_device(ast, cpu_device(), opts, inputs)[0]
    else:
        py = pytest.importorskip("lazygrad_python")
        out = run_python(ast, py.PythonRenderer(), opts, inputs)[0]
    np.testing.assert_array_equal(out[0], q_ref)
    np.testing.assert_array_equal(out[3], r_ref)


def _ops(ast) -> set[Ops]:
    py = pytest.importorskip("lazygrad_python")
    return {u.op for u in get_program(ast, py.PythonRenderer()).uops}


def test_nonzero_constant_divisor_is_not_guarded() -> None:
    n = 16
    x = load(1, dtypes.int32, st(n))
    ast = sink(store(0, x // const(7, dtypes.int32, st(n)) + x % const(-3, dtypes.int32, st(n)), st(n)))
    ops = _ops(ast)
    assert Ops.IDIV in ops and Ops.MOD in ops
    assert Ops.WHERE not in ops and Ops.CMPNE not in ops


def test_unknown_divisor_is_guarded() -> None:
    n = 16
    x, y = load(1, dtypes.int32, st(n)), load(2, dtypes.int32, st(n))
    assert Ops.WHERE in _ops(sink(store(0, x // y, st(n))))
