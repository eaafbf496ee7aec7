"""The OpenCL C renderer: every op-suite kernel is valid OpenCL C 1.2 (checked with clang, with and without
cl_khr_fp16), and vector loads and stores (vloadN/vstoreN) — global and local memory, gated, halves and bfloat16
held as bits, bools as uchar vectors — compute what numpy computes on the OpenCL platform of this machine (PoCL in
CI), including a kernel whose aligned float4 loads PoCL's LLVM could not compile."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from lazygrad_amd import plugin
from lazygrad_amd.opencl_renderer import OpenCLRenderer
from lazygrad_codegen import Opt, OptOps, get_program
from lazygrad_uop.dtype import DType, dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

lazygrad = pytest.importorskip("lazygrad", reason="builds kernels from Tensor graphs: needs the lazygrad frontend")
Tensor = lazygrad.Tensor


# What the renderer's output needs beyond OpenCL C 1.2's core: the half-precision vector loads and stores, which
# OpenCL C declares without cl_khr_fp16 but clang's default header declares that way only from clang 15 on.
_PROBE = """__kernel void probe(__global half *h, __global float *o) {
  float4 v = vload_half4(0, h); vstore_half4(v, 1, h); o[0] = vload_half(0, h) + v.x; vstore_half(v.y, 0, h);
}
"""


def opencl_c_check(ext: str) -> list[str] | None:
    """The clang command that syntax-checks OpenCL C 1.2 with extension setting `ext` (e.g. "-cl_khr_fp16") and
    declares the builtins the renderer uses: the first clang on PATH whose header has them, None if none does."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.cl"
        probe.write_text(_PROBE)
        for name in ("clang", *(f"clang-{v}" for v in range(20, 13, -1))):
            if shutil.which(name) is None:
                continue
            cmd = [name, "-x", "cl", "-cl-std=CL1.2", "-Xclang", "-finclude-default-header", "-fsyntax-only"]
            cmd += ["-Xclang", f"-cl-ext={ext}", "-Werror"]
            if subprocess.run([*cmd, str(probe)], capture_output=True).returncode == 0:
                return cmd
    return None


# *** every op-suite kernel is OpenCL C ***


@pytest.mark.parametrize("half_native", [False, True], ids=["half_as_bits", "cl_khr_fp16"])
def test_every_op_suite_kernel_is_opencl_c(half_native: bool, tmp_path: Path) -> None:
    from lazygrad_testkit.kernel_graphs import kernel_graphs

    ext = "+cl_khr_fp16" if half_native else "-cl_khr_fp16"
    if (check := opencl_c_check(ext)) is None:
        pytest.skip(
            f"no clang on PATH declares vload_half4/vstore_half4 for OpenCL C 1.2 with {ext} (clang 14's default "
            "header declares them only with cl_khr_fp16; clang 15 and later have them); install clang-15 or newer"
        )
    renderer = OpenCLRenderer(half_native=half_native)
    sources: dict[str, str] = {}
    for _, build in kernel_graphs():
        for si in build().schedule():
            if si.ast.op is Ops.SINK:
                spec = get_program(si.ast, renderer)
                sources.setdefault(spec.name, spec.src)
    assert len(sources) > 150, f"expected the op suite's variety of kernels, got {len(sources)}"
    assert any("float4" in src for src in sources.values()), "no kernel used vector loads or stores"
    # one translation unit per prelude (the helpers are defined once in each), kernels after it
    units: dict[str, list[str]] = {}
    for src in sources.values():
        at = src.index("__kernel ")
        units.setdefault(src[:at], []).append(src[at:])
    for n, (prelude, kernels) in enumerate(units.items()):
        path = tmp_path / f"unit{n}.cl"
        path.write_text(prelude + "\n".join(kernels))
        proc = subprocess.run([*check, str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{proc.stderr}\n{path.read_text()}"


# *** vectors on the device, against numpy ***

needs_cl = pytest.mark.skipif(plugin.cl_usable() is not None, reason=f"no usable OpenCL device: {plugin.cl_usable()}")


def _host(dtype: DType) -> np.dtype:
    # numpy has no bfloat16: its buffers are read back as their bits
    return np.dtype(np.uint16) if dtype == dtypes.bfloat16 else np.dtype(to_numpy_dtype(dtype))


def run_with_opts(out: Tensor, opts: list[Opt]) -> tuple[str, np.ndarray]:
    """Run the one kernel that computes `out` (whose inputs are realized) on CL with `opts`: its source and result."""
    from lazygrad_uop.registry import Device

    dev = Device["CL"]
    (si,) = [si for si in out.schedule() if si.ast.op is Ops.SINK]
    spec = get_program(si.ast, dev.renderer, opts)
    prg = dev.load_program(spec.name, dev.compiler.compile(spec.src))
    for b in si.bufs:
        if not b.is_allocated:
            b.allocate()
    prg(*[si.bufs[s].handle for s in spec.globals], global_size=spec.global_size, local_size=spec.local_size)
    result = np.empty(out.shape, _host(out.dtype))
    si.bufs[0].copyout(memoryview(result).cast("B"))
    return spec.src, result


def _cl(x: np.ndarray, dtype: DType | None = None) -> Tensor:
    t = Tensor(x, device="CL")
    return (t if dtype is None else t.cast(dtype)).realize()


def _bf16(x: np.ndarray) -> np.ndarray:
    """bfloat16 bits of float32 `x`, rounded to nearest even (finite values), with numpy integer math."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


RNG = np.random.default_rng(7)
X = RNG.standard_normal((8, 64)).astype(np.float32)
GROUPED = [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.GROUPTOP, 0, 16)]


@needs_cl
def test_grouped_sum_stores_float4s_into_local_memory() -> None:
    src, got = run_with_opts(_cl(X).sum(axis=1), GROUPED)
    assert "__local float temp0[64];" in src and "float4 val4 = vload4(0, (temp0+" in src
    assert ", 0, (temp0+" in src and ", 0, (data0+" in src and src.count("vstore4(") == 2
    np.testing.assert_allclose(got, X.sum(axis=1), rtol=1e-5)


@needs_cl
def test_gated_vector_loads_of_padding() -> None:
    src, got = run_with_opts(_cl(X).pad(((0, 0), (4, 4))) + 1, [Opt(OptOps.UPCAST, 1, 4)])
    assert "?vload4(0, (data1+" in src
    np.testing.assert_array_equal(got, np.pad(X, ((0, 0), (4, 4))) + 1)


@needs_cl
def test_two_lane_vectors() -> None:
    src, got = run_with_opts(_cl(X) * 3, [Opt(OptOps.UPCAST, 0, 2)])
    assert "float2 val0 = vload2(0, (data1+" in src
    np.testing.assert_array_equal(got, X * np.float32(3))


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64, dtypes.float64], ids=str)
@needs_cl
def test_vectors_of_every_width_of_scalar(dtype: DType) -> None:
    x = (X * 40).astype(to_numpy_dtype(dtype))
    src, got = run_with_opts(_cl(x) + _cl(x), [Opt(OptOps.UPCAST, 0, 4)])
    assert f"{OpenCLRenderer().render_dtype(dtype.vec(4))} val0 = vload4(0, " in src and "vstore4(" in src
    np.testing.assert_array_equal(got, x + x)


@needs_cl
def test_half_vectors_held_as_bits_round_like_numpy() -> None:
    h = X.astype(np.float16)
    src, got = run_with_opts(_cl(h) * _cl(h) + 1, [Opt(OptOps.UPCAST, 0, 4)])
    from lazygrad_uop.registry import Device

    if Device["CL"].renderer.half_native:
        assert "half4 val0 = vload4(0, (data1+" in src
    else:
        assert "vload_half4(0, (__global half*)" in src and "vstore_half4(" in src
    np.testing.assert_array_equal(got, h * h + np.float16(1))
    src, got = run_with_opts(_cl(h).sum(axis=1), GROUPED)
    np.testing.assert_allclose(got, h.astype(np.float32).sum(axis=1).astype(np.float16), rtol=2e-3)


@needs_cl
def test_bfloat16_vectors_held_as_bits() -> None:
    bits = _bf16(X)
    as_float = (bits.astype(np.uint32) << 16).view(np.float32)
    src, got = run_with_opts(_cl(X, dtypes.bfloat16) * 2, [Opt(OptOps.UPCAST, 0, 4)])
    assert "vload4(" in src and "vstore4(lg_bf16_bits4(" in src
    np.testing.assert_array_equal(got, _bf16(as_float * 2))


@needs_cl
def test_bool_vectors_are_uchar_vectors() -> None:
    a, b = X > 0, X < 0.5
    src, got = run_with_opts(_cl(a) != _cl(b), [Opt(OptOps.UPCAST, 0, 4)])
    assert "uchar4 val0 = vload4(0, " in src
    np.testing.assert_array_equal(got, a != b)


def _ordered(*uops: UOp) -> list[UOp]:
    """A linear program of `uops` in order, each preceded by its sources not placed yet."""
    out: dict[UOp, None] = {}

    def place(u: UOp) -> None:
        if u not in out:
            for s in u.src:
                place(s)
            out[u] = None

    for u in uops:
        place(u)
    return list(out)


@needs_cl
def test_bool_vectors_in_local_memory() -> None:
    """A hand-built program: each of 4 threads stores 4 bools into local memory as one vector, and after a barrier
    reads its neighbour's 4 and stores them."""
    from lazygrad_uop.registry import Device

    out, x = UOp(Ops.DEFINE_GLOBAL, dtypes.bool.ptr(16), arg=0), UOp(Ops.DEFINE_GLOBAL, dtypes.bool.ptr(16), arg=1)
    temp = UOp(Ops.DEFINE_LOCAL, dtypes.bool.ptr(16, local=True), arg="temp0")
    lid = UOp(Ops.SPECIAL, dtypes.int32, arg=("lidx0", 4))
    base = lid * 4
    index = lambda buf, i: UOp(Ops.INDEX, buf.dtype, (buf, i))  # noqa: E731
    v = UOp(Ops.LOAD, dtypes.bool.vec(4), (index(x, base),))
    lanes = [UOp(Ops.GEP, dtypes.bool, (v,), (k,)) for k in range(4)]
    flipped = UOp(Ops.VECTORIZE, dtypes.bool.vec(4), tuple(UOp(Ops.NEG, dtypes.bool, (lane,)) for lane in lanes))
    barrier = UOp(Ops.BARRIER, dtypes.void, (UOp(Ops.STORE, dtypes.void, (index(temp, base), flipped)),))
    neighbour = ((lid + 1) % 4) * 4
    back = UOp(Ops.LOAD, dtypes.bool.vec(4), (index(temp, neighbour), barrier))
    result = UOp(Ops.STORE, dtypes.void, (index(out, base), back))
    uops = _ordered(out, x, lid, temp, result, UOp(Ops.SINK, dtypes.void, arg="bool_local"))
    src = OpenCLRenderer().render(uops)
    assert "__local uchar temp0[16];" in src and ", 0, (temp0+" in src
    dev = Device["CL"]
    prg = dev.load_program("bool_local", dev.compiler.compile(src))
    a = RNG.standard_normal(16) > 0
    bufs = [dev.allocator.alloc(16), dev.allocator.alloc(16)]
    dev.allocator.copyin(bufs[1], memoryview(a.astype(np.uint8)))
    prg(*bufs, global_size=(1, 1, 1), local_size=(4, 1, 1))
    got = np.empty(16, np.uint8)
    dev.allocator.copyout(memoryview(got), bufs[0])
    np.testing.assert_array_equal(got, np.roll(~a, -4).astype(np.uint8))


@needs_cl
def test_three_element_vectors_use_vload3() -> None:
    """A 3-element vector type is as big as a 4-element one: a hand-built program reads and writes exactly 3 ints a
    thread with vload3/vstore3, so neighbouring threads' elements are not overwritten."""
    from lazygrad_uop.registry import Device

    out, x = UOp(Ops.DEFINE_GLOBAL, dtypes.int32.ptr(12), arg=0), UOp(Ops.DEFINE_GLOBAL, dtypes.int32.ptr(12), arg=1)
    gid = UOp(Ops.SPECIAL, dtypes.int32, arg=("gidx0", 4))
    v = UOp(Ops.LOAD, dtypes.int32.vec(3), (UOp(Ops.INDEX, x.dtype, (x, gid * 3)),))
    doubled = UOp(Ops.VECTORIZE, v.dtype, tuple(UOp(Ops.GEP, dtypes.int32, (v,), (k,)) * 2 for k in range(3)))
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, gid * 3)), doubled))
    src = OpenCLRenderer().render(_ordered(out, x, gid, st, UOp(Ops.SINK, dtypes.void, arg="vec3")))
    assert "vload3(0, " in src and "vstore3(" in src
    dev = Device["CL"]
    prg = dev.load_program("vec3", dev.compiler.compile(src))
    a = np.arange(12, dtype=np.int32)
    bufs = [dev.allocator.alloc(48), dev.allocator.alloc(48)]
    dev.allocator.copyin(bufs[1], memoryview(a).cast("B"))
    prg(*bufs, global_size=(4, 1, 1))
    got = np.empty(12, np.int32)
    dev.allocator.copyout(memoryview(got).cast("B"), bufs[0])
    np.testing.assert_array_equal(got, a * 2)


@needs_cl
def test_cummax_indices_compile_and_match_numpy() -> None:
    # with float4/int4 loads through pointer casts, PoCL's LLVM aborted selecting AVX-512 code for the index kernel
    y = np.random.default_rng(10).standard_normal(6).astype(np.float32)
    values, indices = Tensor(y, device="CL").cummax(0)
    np.testing.assert_array_equal(values.numpy(), np.maximum.accumulate(y))
    np.testing.assert_array_equal(indices.numpy(), [int(np.argmax(y[: i + 1])) for i in range(len(y))])
