"""Three things the CPU's renderer does for speed, checked on kernels run on the CPU against numpy:

- exp2, log2 and sin of float32, float16 and bfloat16 vectors are `lazygrad_codegen.llvm_math`'s polynomials, not
  LLVM's intrinsics (a C library call per lane): the same answers as numpy's float64, rounded, within 2 float32
  units in the last place, over the whole range and for 0, inf and NaN;
- a reduction's innermost loop that steps through memory prefetches its vector loads as many iterations ahead as
  it takes to read `CPU_PREFETCH` bytes, and only there;
- vector stores to a buffer of `CPU_STREAM_STORES` bytes or more (half the last-level cache by default) are
  non-temporal where their address is aligned, and plain where it is not, with a fence before the kernel returns."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from lazygrad_codegen import get_program
from lazygrad_cpu.renderer import CPU_PREFETCH, CPURenderer, last_level_cache_bytes
from lazygrad_testkit.dtypes import bf16_bits, bf16_value
from lazygrad_uop.config import Context
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops

RNG = np.random.default_rng(99)
MATH = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin}
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0**-149, 2.0**-126, 3.0e38, -3.0e38, 1e9, 127.9, -149.7]


def _inputs(n: int) -> np.ndarray:
    """float32s across the whole range: uniformly random bit patterns (every exponent, subnormals, inf, NaN),
    moderate values and the special ones."""
    bits = RNG.integers(0, 2**32, n // 2, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):
        return np.concatenate([bits, RNG.uniform(-200, 200, n - n // 2), SPECIAL]).astype(np.float32)


def _same_or_within(got: np.ndarray, exact: np.ndarray, dtype: type, ulps: float) -> None:
    """`got` (of numpy `dtype`) is within `ulps` units of `dtype`'s last place of the float64 `exact`, and equal to
    it rounded where that is not finite."""
    with np.errstate(all="ignore"):
        want = exact.astype(dtype)
        spacing = np.spacing(np.abs(want)).astype(np.float64)
        dist = np.abs(got.astype(np.float64) - exact) / spacing
    exact_match = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
    finite = np.isfinite(want) & np.isfinite(dist)
    bad = ~exact_match & ~(finite & (dist <= ulps))
    assert not bad.any(), f"{np.count_nonzero(bad)} wrong, e.g. got {got[bad][:4]}, want {want[bad][:4]}"


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16], ids=str)
def test_math_is_vector_polynomials(cpu, k, run_with_spec, dtype: DType) -> None:
    x32 = _inputs(4096 - len(SPECIAL))  # whole vectors
    if dtype == dtypes.float16:
        with np.errstate(over="ignore"):
            data = x32.astype(np.float16)
        x64 = data.astype(np.float64)
    elif dtype == dtypes.bfloat16:
        data = bf16_bits(x32)
        x64 = bf16_value(data).astype(np.float64)
    else:
        data, x64 = x32, x32.astype(np.float64)
    st = k.st(len(data))
    x = k.load(1, dtype, st)
    ast = k.sink(*(k.store(i + 2, x.alu(op), st) for i, op in enumerate(MATH)))
    outs, spec = run_with_spec(ast, {1: data})
    for op in MATH:
        name = op.name.lower()
        assert re.search(rf"call <\d+ x float> @lg_{name}_v\d+f32\(", spec.src), f"{op} is not vectorised"
        if op is not Ops.SIN:
            assert f"@llvm.{name}." not in spec.src
    for i, ref in enumerate(MATH.values()):
        with np.errstate(all="ignore"):
            exact = ref(x64)
        got = outs[i + 2]
        if dtype == dtypes.bfloat16:
            # computed in float32 and rounded once more to bfloat16: equal to rounding the float32 result
            _same_or_within(bf16_value(got), exact, np.float32, 2 ** (24 - 8) * 0.5 + 2)
        elif dtype == dtypes.float16:
            _same_or_within(got, exact, np.float16, 1)
        else:
            _same_or_within(got, exact, np.float32, 2)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=hs.integers(1, 70), scale=hs.sampled_from([1.0, 50.0, 1e4]))
def test_math_of_any_length(cpu, k, run_with_spec, n: int, scale: float) -> None:
    """Kernels of every length (vectors and scalars) give numpy's answers, and never call LLVM's intrinsics (but
    sin's, beyond 2**30)."""
    data = (np.random.default_rng(n).standard_normal(n) * scale).astype(np.float32)
    st = k.st(n)
    x = k.load(1, dtypes.float32, st)
    outs, spec = run_with_spec(k.sink(*(k.store(i + 2, x.alu(op), st) for i, op in enumerate(MATH))), {1: data})
    assert "@llvm.exp2" not in spec.src and "@llvm.log2" not in spec.src
    for i, ref in enumerate(MATH.values()):
        with np.errstate(all="ignore"):
            _same_or_within(outs[i + 2], ref(data.astype(np.float64)), np.float32, 2)


def _sum(k, rows: int, n: int):
    """Per row of a (rows, n) float32 input, the sum of its n elements."""
    return k.sink(k.store(0, k.reduce(k.load(1, dtypes.float32, k.st(rows, n)), Ops.ADD, (1,)), k.st(rows, 1)))


def _prefetches(src: str) -> list[int]:
    """The distances in bytes of the prefetches in a CPU kernel's IR."""
    ahead = dict(re.findall(r"(%v\d+) = getelementptr i8, ptr %v\d+, i64 (\d+)", src))
    return [
        int(ahead[p]) for p in re.findall(r"call void @llvm\.prefetch\.p0\(ptr (%v\d+), i32 0, i32 3, i32 1\)", src)
    ]


@pytest.mark.parametrize(("rows", "n", "prefetched"), [(1, 1 << 16, True), (64, 4096, True), (64, 512, False)])
def test_streamed_reductions_prefetch(cpu, k, run_with_spec, rows: int, n: int, prefetched: bool) -> None:
    data = RNG.standard_normal(rows * n).astype(np.float32)
    outs, spec = run_with_spec(_sum(k, rows, n), {1: data})
    np.testing.assert_allclose(outs[0], data.reshape(rows, n).sum(1, dtype=np.float64), rtol=1e-4, atol=1e-3)
    distances = _prefetches(spec.src)
    if not prefetched:
        # a loop that reads less than twice the distance in all would ask mostly for lines it never reads
        assert distances == []
        return
    # every vector load of the loop, the same distance: the setting, rounded up to whole iterations of a stream
    assert len(distances) == len(re.findall(r"load <\d+ x float>, ptr %v\d+, align", spec.src))
    assert len(set(distances)) == 1 and CPU_PREFETCH.value <= distances[0] < CPU_PREFETCH.value + 4 * n


def test_strided_reduction_prefetches_as_many_iterations_ahead(cpu, k, run_with_spec) -> None:
    """A sum down the columns of a wide matrix reads a piece of each row per iteration: it prefetches as many rows
    ahead as it takes to read `CPU_PREFETCH` bytes, whole rows apart."""
    rows, cols = 512, 4096
    view = k.st(rows, cols).permute((1, 0))
    ast = k.sink(k.store(0, k.reduce(k.load(1, dtypes.float32, view), Ops.ADD, (1,)), k.st(cols, 1)))
    data = RNG.standard_normal(rows * cols).astype(np.float32)
    outs, spec = run_with_spec(ast, {1: data})
    np.testing.assert_allclose(outs[0], data.reshape(rows, cols).sum(0, dtype=np.float64), rtol=1e-4, atol=1e-3)
    distances = _prefetches(spec.src)
    lanes = {int(x) for x in re.findall(r"load <(\d+) x float>, ptr %v\d+, align", spec.src)}
    assert distances and len(lanes) == 1
    # the bytes one iteration reads: a prefetch per vector load
    reads = len(distances) * 4 * lanes.pop()
    assert reads < 4 * cols, "each iteration reads part of a row"
    assert set(distances) == {-(-CPU_PREFETCH.value // reads) * 4 * cols}


def test_no_prefetch_when_off_or_outside_reductions(cpu, k) -> None:
    ast = _sum(k, 1, 1 << 16)
    with Context(CPU_PREFETCH=0):
        off = CPURenderer()
    assert off.prefetch_bytes == 0
    assert _prefetches(get_program(ast, off).src) == []
    # an elementwise kernel: its loads are in no reduction
    st = k.st(1 << 16)
    double = k.sink(k.store(0, k.load(1, dtypes.float32, st) * 2, st))
    assert _prefetches(get_program(double, cpu.renderer).src) == []


def _scale_kernel(k, n: int):
    st = k.st(n)
    return k.sink(k.store(0, k.load(1, dtypes.float32, st) * 2 + 1, st))


def _streamed(src: str) -> int:
    return src.count("!nontemporal !0")


def test_large_outputs_stream_past_the_caches(cpu, k) -> None:
    n = 1 << 14
    with Context(CPU_STREAM_STORES=4 * n):
        streaming = CPURenderer()
    assert streaming.stream_bytes == 4 * n
    spec = get_program(_scale_kernel(k, n), streaming)
    assert _streamed(spec.src) > 0 and "fence seq_cst" in spec.src and "!0 = !{i32 1}" in spec.src
    # one byte smaller than the output: the same kernel streams; one byte larger: it doesn't
    with Context(CPU_STREAM_STORES=4 * n + 1):
        assert _streamed(get_program(_scale_kernel(k, n), CPURenderer()).src) == 0
    with Context(CPU_STREAM_STORES=0):
        assert _streamed(get_program(_scale_kernel(k, n), CPURenderer()).src) == 0


@pytest.mark.parametrize("misalign", [0, 4, 60])
def test_streamed_stores_at_any_alignment(cpu, k, misalign: int) -> None:
    """Non-temporal stores need an address aligned to their size: an output that starts anywhere else is written
    by the plain stores beside them, with the same result."""
    n = 1 << 14
    with Context(CPU_STREAM_STORES=4096):
        spec = get_program(_scale_kernel(k, n), CPURenderer())
    assert _streamed(spec.src) > 0
    program = cpu.load_program(spec.name, cpu.compiler.compile(spec.src))
    data = RNG.standard_normal(n).astype(np.float32)
    alloc = cpu.allocator
    src_buf, whole = alloc.alloc(4 * n), alloc.alloc(4 * n + 64)
    alloc.copyin(src_buf, memoryview(data).cast("B"))
    out = alloc._offset(whole, 4 * n, misalign)
    args = {0: out, 1: src_buf}
    program(*[args[slot] for slot in spec.globals], global_size=spec.global_size, local_size=spec.local_size)
    got = np.empty(n, np.float32)
    alloc.copyout(memoryview(got).cast("B"), out)
    np.testing.assert_array_equal(got, data * np.float32(2) + np.float32(1))


def test_stream_threshold_default_is_half_the_last_level_cache() -> None:
    llc = last_level_cache_bytes()
    assert llc >= 1 << 20
    with Context(CPU_STREAM_STORES=-1):
        assert CPURenderer().stream_bytes == llc // 2
