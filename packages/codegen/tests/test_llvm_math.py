"""The CPU's float32 exp2, log2 and sin (`lazygrad_codegen.llvm_math`), compiled for the host with llvmlite and run
over arrays in vectors of 1, 4 and 16 lanes, against numpy in float64: within 2 units in the last place of float32
over the whole range (subnormal and overflowing results included), and the IEEE answers for 0, -0, inf and NaN."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lazygrad_codegen import llvm_math

llvm = pytest.importorskip("llvmlite.binding", reason="compiles the functions for the host: needs llvmlite")

LANES = (1, 4, 16)


def _runner(op: str, n: int) -> str:
    """`void run_<op>_<n>(float* in, float* out, i32 groups)`: out[i] = op(in[i]) over `groups` groups of n."""
    name = llvm_math.function_name(op, n)
    t = "float" if n == 1 else f"<{n} x float>"
    return f"""define void @run_{op}_{n}(ptr %src, ptr %dst, i32 %groups) {{
entry:
  br label %head
head:
  %i = phi i32 [0, %entry], [%next, %body]
  %go = icmp slt i32 %i, %groups
  br i1 %go, label %body, label %done
body:
  %off = mul i32 %i, {n}
  %p = getelementptr float, ptr %src, i32 %off
  %q = getelementptr float, ptr %dst, i32 %off
  %x = load {t}, ptr %p, align 4
  %y = call {t} @{name}({t} %x)
  store {t} %y, ptr %q, align 4
  %next = add i32 %i, 1
  br label %head
done:
  ret void
}}"""


@pytest.fixture(scope="module")
def compiled():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    parts, declares = [], set()
    for op in llvm_math.OPS:
        for n in LANES:
            text, decl = llvm_math.definition(op, n)
            parts += [text, _runner(op, n)]
            declares |= decl
    mod = llvm.parse_assembly("\n".join([*parts, *sorted(declares)]))
    mod.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2
    )
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    fns = {
        (op, n): ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
            engine.get_function_address(f"run_{op}_{n}")
        )
        for op in llvm_math.OPS
        for n in LANES
    }
    return engine, fns


def run(compiled, op: str, n: int, xs: np.ndarray) -> np.ndarray:
    """op over float32 `xs` (padded with ones to whole groups of n lanes)."""
    _, fns = compiled
    groups = -(-len(xs) // n)
    src = np.ones(groups * n, np.float32)
    src[: len(xs)] = xs
    dst = np.empty_like(src)
    fns[(op, n)](src.ctypes.data, dst.ctypes.data, groups)
    return dst[: len(xs)]


REFERENCE = {"exp2": np.exp2, "log2": np.log2, "sin": np.sin}


def ulps(got: np.ndarray, xs: np.ndarray, op: str) -> float:
    """The largest distance of `got` from op(xs) computed in float64, in units of the last place of float32 at the
    correctly rounded result; NaN, infinities and signed zeros must match exactly."""
    with np.errstate(all="ignore"):
        exact = REFERENCE[op](xs.astype(np.float64))
        want = exact.astype(np.float32)
    same = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
    with np.errstate(invalid="ignore"):
        dist = np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(want)).astype(np.float64)
    bad = ~same & ~np.isfinite(dist)
    assert not bad.any(), f"{op}: {xs[bad][:5]} gave {got[bad][:5]}, want {want[bad][:5]}"
    return float(np.max(np.where(same, 0, dist), initial=0))


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0**-149, 2.0**-126, 3.4e38], np.float32)


def _floats(*parts) -> np.ndarray:
    """The float32s of `parts` (NaNs pass through the float64 concatenation)."""
    with np.errstate(invalid="ignore"):
        return np.concatenate(parts).astype(np.float32)


def _every_float(rng: np.random.Generator, count: int, positive: bool = False) -> np.ndarray:
    """Floats of uniformly random bit patterns: every exponent equally often, subnormals, inf and NaN included."""
    bits = rng.integers(0, 2**31 if positive else 2**32, count, dtype=np.uint64).astype(np.uint32)
    return bits.view(np.float32)


@pytest.mark.parametrize("n", LANES)
def test_exp2(compiled, n: int) -> None:
    rng = np.random.default_rng(n)
    xs = _floats(
        rng.uniform(-160, 140, 20000),
        rng.uniform(-1, 1, 20000),
        rng.uniform(-151, -125, 5000),  # subnormal results and their rounding to 0
        rng.uniform(127, 129, 2000),  # the largest results and overflow
        _every_float(rng, 5000),
        SPECIAL,
        [-149.5, -150.0, -126.0, 127.0, 128.0, 127.99999],
    )
    assert ulps(run(compiled, "exp2", n, xs), xs, "exp2") <= 2


@pytest.mark.parametrize("n", LANES)
def test_log2(compiled, n: int) -> None:
    rng = np.random.default_rng(10 + n)
    xs = _floats(
        _every_float(rng, 40000, positive=True),
        rng.uniform(0.5, 2, 20000),  # near 1, where the result is smallest
        1 + rng.uniform(-1e-3, 1e-3, 5000),
        _every_float(rng, 5000),  # negatives: NaN
        SPECIAL,
        -SPECIAL,
    )
    assert ulps(run(compiled, "log2", n, xs), xs, "log2") <= 2


@pytest.mark.parametrize("n", LANES)
def test_sin(compiled, n: int) -> None:
    rng = np.random.default_rng(20 + n)
    xs = _floats(
        rng.uniform(-4, 4, 20000),
        rng.uniform(-1e4, 1e4, 20000),
        rng.uniform(-(2.0**30), 2.0**30, 5000),
        np.pi / 2 * rng.integers(-1000, 1000, 2000),  # near the multiples of pi/2, where r is smallest
        SPECIAL,
        -SPECIAL,
    )
    assert ulps(run(compiled, "sin", n, xs), xs, "sin") <= 1


@pytest.mark.parametrize("n", LANES)
def test_sin_beyond_the_reduction(compiled, n: int) -> None:
    """A vector with any lane past 2**30 calls the library's sin for all of its lanes, which stays exact."""
    rng = np.random.default_rng(30 + n)
    xs = rng.uniform(-4, 4, 64).astype(np.float32)
    xs[::7] = _every_float(rng, len(xs[::7]))
    assert ulps(run(compiled, "sin", n, xs), xs, "sin") <= 1


@settings(max_examples=60, deadline=None)
@given(
    op=st.sampled_from(llvm_math.OPS),
    n=st.sampled_from(LANES),
    xs=st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=40),
)
def test_any_floats(compiled, op: str, n: int, xs: list[float]) -> None:
    arr = np.array(xs, np.float32)
    assert ulps(run(compiled, op, n, arr), arr, op) <= 2


def test_unknown_op() -> None:
    with pytest.raises(ValueError, match="no polynomial function for 'cos'"):
        llvm_math.definition("cos", 4)
