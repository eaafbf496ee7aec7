"""Helpers for the PYTHON device's tests: build linear programs from UOps and run them on numpy arrays."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lazygrad_python import PythonCompiler, PythonProgram, PythonRenderer
from lazygrad_uop import DType, Ops, UOp, dtypes
from lazygrad_uop.registry import Device


def program(*anchors: UOp) -> list[UOp]:
    """A linear program: each anchor in order, each preceded by those of its sources not placed yet. A DEFINE_ACC's
    RANGEs are not placed for it, so an accumulator anchored before its loop is declared before the loop."""
    out: list[UOp] = []
    placed: set[UOp] = set()

    def place(u: UOp) -> None:
        stack: list[tuple[UOp, bool]] = [(u, False)]
        while stack:
            node, ready = stack.pop()
            if node in placed:
                continue
            if ready:
                placed.add(node)
                out.append(node)
                continue
            stack.append((node, True))
            deps = node.src[:1] if node.op is Ops.DEFINE_ACC else node.src
            stack.extend((s, False) for s in reversed(deps) if s not in placed)

    for a in anchors:
        place(a)
    return out


def glob(slot: int, dtype: DType, size: int) -> UOp:
    """DEFINE_GLOBAL of `size` elements of `dtype` at parameter `slot`."""
    return UOp(Ops.DEFINE_GLOBAL, dtype.ptr(size), arg=slot)


def index(buf: UOp, idx: UOp, valid: UOp | None = None) -> UOp:
    """INDEX of element `idx` of `buf`, optionally with a valid bool."""
    return UOp(Ops.INDEX, buf.dtype, (buf, idx) if valid is None else (buf, idx, valid))


def load(buf: UOp, idx: UOp, dtype: DType | None = None, alt: UOp | None = None, gate: UOp | None = None) -> UOp:
    """LOAD from `buf[idx]`, gated (returning `alt` where `gate` is false) when both are given."""
    dt = dtype if dtype is not None else buf.dtype.base
    src = (index(buf, idx),) if gate is None else (index(buf, idx), alt, gate)
    return UOp(Ops.LOAD, dt, src)


def store(buf: UOp, idx: UOp, value: UOp, gate: UOp | None = None) -> UOp:
    """STORE of `value` to `buf[idx]`, only where `gate` is true when one is given."""
    return UOp(Ops.STORE, dtypes.void, (index(buf, idx), value) if gate is None else (index(buf, idx), value, gate))


def rng(end: int | UOp, axis: int = 0) -> UOp:
    """RANGE from 0 to end-1."""
    return UOp.range(end, axis)


def end(r: UOp) -> UOp:
    """END of the loop `r`."""
    return UOp(Ops.END, dtypes.void, (r,))


def const(dtype: DType, value: object) -> UOp:
    """A CONST of `dtype` (the arg is taken as given, not converted)."""
    return UOp(Ops.CONST, dtype, arg=value)


def compile_program(uops: list[UOp], name: str = "test") -> PythonProgram:
    """Render, compile and load `uops` as the PYTHON device does."""
    return PythonProgram(Device["PYTHON"], name, PythonCompiler().compile(PythonRenderer().render(uops)))


def run(
    uops: list[UOp] | PythonProgram,
    *arrays: np.ndarray,
    global_size: Sequence[int] = (1, 1, 1),
    local_size: Sequence[int] = (1, 1, 1),
    vals: Sequence[int] = (),
) -> list[np.ndarray]:
    """Run a program on copies of `arrays` (one per DEFINE_GLOBAL, in slot order) and return the arrays after it."""
    prg = uops if isinstance(uops, PythonProgram) else compile_program(uops)
    mems = [memoryview(bytearray(np.ascontiguousarray(a).tobytes())) for a in arrays]
    prg(*mems, global_size=tuple(global_size), local_size=tuple(local_size), vals=tuple(vals))
    return [np.frombuffer(bytes(m), dtype=a.dtype).reshape(a.shape).copy() for m, a in zip(mems, arrays, strict=True)]


def elementwise(op: Ops, dtype: DType, src_dtypes: Sequence[DType], n: int) -> list[UOp]:
    """out[i] = op(in0[i], in1[i], ...) over n elements; output slot 0, inputs slots 1.. ."""
    ins = [glob(k + 1, dt, n) for k, dt in enumerate(src_dtypes)]
    out = glob(0, dtype, n)
    r = rng(n)
    value = UOp(op, dtype, tuple(load(b, r) for b in ins))
    return program(r, store(out, r, value), end(r))


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (half to even), as float32: the reference for bfloat16 results."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out)


def mantissa_reference(x: np.ndarray, bits: int = 10) -> np.ndarray:
    """float32 `x` rounded to `bits` explicit mantissa bits (10: TF32), to nearest with ties away from zero, as
    `cvt.rna.tf32.f32` does: of the two float32 neighbours with only those bits (the dropped bits cleared, toward zero,
    and the next one away from zero, which may be the next binade or inf), the nearer one in float64, the one away
    from zero on a tie. inf and nan stay as they are."""
    x = np.asarray(x, np.float32)
    drop = 23 - bits
    toward = x.view(np.uint32) & np.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
    away = toward + np.uint32(1 << drop)
    with np.errstate(invalid="ignore"):  # the neighbours of inf and nan are computed, then not used
        low, high = toward.view(np.float32).astype(np.float64), away.view(np.float32).astype(np.float64)
        # past the largest finite value the next one is inf, at 2**128 on the real line
        high_at = np.where(np.isinf(high), np.copysign(2.0**128, high), high)
        xd = x.astype(np.float64)
        rounded = np.where(np.abs(high_at - xd) <= np.abs(xd - low), high, low).astype(np.float32)
    return np.where(np.isfinite(x), rounded, x)
