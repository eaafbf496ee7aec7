"""Helpers for the CUDA tests: compiling for sm_80 and sm_90 with NVRTC and assembling the PTX with ptxas (both
available without a GPU), and hand-built linear programs with their references."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

from lazygrad_cuda.compiler import NVRTCOutput, nvrtc_compile, nvrtc_version
from lazygrad_cuda.renderer import MMA_M16N8K8_LAYOUT, MMA_M16N8K8_TF32_LAYOUT, MMA_M16N8K16_LAYOUT
from lazygrad_testkit.dtypes import SCALARS  # noqa: F401 - the scalar types the tests import from here
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

ARCHS = ("sm_80", "sm_90")


@functools.cache
def has_nvrtc() -> bool:
    """Whether NVRTC loads here (cuda-bindings and the nvidia-cuda-nvrtc library)."""
    try:
        nvrtc_version()
    except Exception:  # noqa: BLE001 - any failure means no usable NVRTC here
        return False
    return True


@functools.cache
def ptxas() -> tuple[str | None, str]:
    """The ptxas to check PTX with, or None and why there is none. It must be at least NVRTC's release, or it
    can't read the PTX ISA version NVRTC writes."""
    path: str | None = None
    try:
        from cuda.pathfinder import find_nvidia_binary_utility

        path = find_nvidia_binary_utility("ptxas")
    except Exception:  # noqa: BLE001 - pathfinder is one of two ways to find it
        path = None
    path = path or shutil.which("ptxas")
    if path is None:
        return None, "ptxas is not installed (`pip install nvidia-cuda-nvcc`, or a CUDA toolkit on PATH)"
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    release = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if release < nvrtc_version():
        return None, f"{path} is CUDA {release}, older than NVRTC {nvrtc_version()}: it can't read that PTX"
    return path, ""


def assemble(ptx: bytes, arch: str, workdir: Path, name: str) -> None:
    """Run ptxas on `ptx` for `arch` and fail the test with its diagnostics if it rejects it."""
    path, _why = ptxas()
    assert path is not None
    src = workdir / f"{name}_{arch}.ptx"
    src.write_bytes(ptx.rstrip(b"\0"))
    proc = subprocess.run(
        [path, f"-arch={arch}", str(src), "-o", str(workdir / f"{name}_{arch}.cubin")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"ptxas -arch={arch} rejected the PTX of {name}:\n{proc.stderr}"


def compile_everywhere(src: str, name: str, workdir: Path) -> dict[str, NVRTCOutput]:
    """Compile `src` with NVRTC for sm_80 and sm_90 (cubin and PTX) and, where ptxas is installed, assemble the
    PTX of each with it."""
    outs = {arch: nvrtc_compile(src, arch, name) for arch in ARCHS}
    for arch, out in outs.items():
        assert out.cubin is not None and out.cubin[:4] == b"\x7fELF", f"NVRTC gave no cubin for {arch}"
        if ptxas()[0] is not None:
            assemble(out.ptx, arch, workdir, name)
    return outs


# *** hand-built linear programs ***


def glob(slot: int, dtype: DType, size: int) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, dtype.ptr(size), arg=slot)


def const(value: int | float, dtype: DType = dtypes.int32) -> UOp:
    return UOp.const(dtype, value)


def index(buf: UOp, idx: UOp) -> UOp:
    return UOp(Ops.INDEX, buf.dtype, (buf, idx))


def load(buf: UOp, idx: UOp, dtype: DType | None = None, *extra: UOp) -> UOp:
    return UOp(Ops.LOAD, dtype or buf.dtype.base, (index(buf, idx), *extra))


def store(buf: UOp, idx: UOp, value: UOp, *gate: UOp) -> UOp:
    return UOp(Ops.STORE, dtypes.void, (index(buf, idx), value, *gate))


def special(name: str, size: int) -> UOp:
    return UOp(Ops.SPECIAL, dtypes.int32, (), (name, size))


def linear(name: str, *roots: UOp) -> list[UOp]:
    """The linear program of `roots` (STOREs, and the ENDIF/BARRIER statements they need), in dependency order,
    parameters first, with a SINK naming the kernel."""
    seen: dict[UOp, None] = {}

    def visit(u: UOp) -> None:
        if u in seen:
            return
        for s in u.src:
            visit(s)
        seen[u] = None

    for r in roots:
        visit(r)
    params = sorted((u for u in seen if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
    body = [u for u in seen if u.op is not Ops.DEFINE_GLOBAL]
    return [*params, *body, UOp(Ops.SINK, dtypes.void, (), name)]


def shared_vector_program() -> list[UOp]:
    """16 threads in one block: each loads a float4 from data1 into shared memory, waits at a barrier, reads its
    mirror thread's float4 back, adds it to its own lane-wise, and threads below 8 store the sum's lanes reversed
    (a GEP of a vector) to data0; data2[t] gets lane 1 of the sum cast to half, as a half2 with lane 0 = -1.
    Reference: `shared_vector_reference`."""
    out, src, halves = glob(0, dtypes.float32, 64), glob(1, dtypes.float32, 64), glob(2, dtypes.float16, 32)
    smem = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(64, local=True), (), "smem")
    t = special("lidx0", 16)
    mine = load(src, t * 4, dtypes.float32.vec(4))
    staged = store(smem, t * 4, mine)
    barrier = UOp(Ops.BARRIER, dtypes.void, (staged,))
    mirror = load(smem, (const(15) - t) * 4, dtypes.float32.vec(4), barrier)
    total = mine + mirror
    reversed_ = UOp(Ops.GEP, dtypes.float32.vec(4), (total,), (3, 2, 1, 0))
    gate = t < 8
    out_idx = index(out, t * 4)
    lane1 = UOp(Ops.GEP, dtypes.float32, (total,), (1,))
    pair = UOp(Ops.VECTORIZE, dtypes.float16.vec(2), (const(-1.0, dtypes.float16), lane1.cast(dtypes.float16)))
    head = linear("shared_vec", store(halves, t * 2, pair), reversed_, out_idx, gate)
    if_ = UOp(Ops.IF, dtypes.void, (gate,))
    gated = [if_, UOp(Ops.STORE, dtypes.void, (out_idx, reversed_)), UOp(Ops.ENDIF, dtypes.void, (if_,))]
    return [*head[:-1], *gated, head[-1]]


def shared_vector_reference(src: list[float]) -> tuple[list[float], list[float]]:
    """What `shared_vector_program` writes to data0 (threads 0-7 only, the rest stays 0) and data2."""
    out, halves = [0.0] * 64, [0.0] * 32
    for t in range(16):
        total = [src[4 * t + k] + src[4 * (15 - t) + k] for k in range(4)]
        if t < 8:
            out[4 * t : 4 * t + 4] = total[::-1]
        halves[2 * t : 2 * t + 2] = [-1.0, total[1]]
    return out, halves


def ptx_fragment(operand: str, lane: int, register: int) -> tuple[int, int]:
    """The PTX ISA's mma.m16n8k16 fragment layout: the (row, column) of the element of A (16x16), B (16x8) or C
    (16x8) that thread `lane` holds in `register`."""
    g, tig = lane // 4, lane % 4
    if operand == "A":
        return g + 8 * ((register >> 1) & 1), tig * 2 + (register & 1) + 8 * (register >> 2)
    if operand == "B":
        return tig * 2 + (register & 1) + 8 * (register >> 1), g
    return g + 8 * (register >> 1), tig * 2 + (register & 1)


def ptx_tf32_fragment(operand: str, lane: int, register: int) -> tuple[int, int]:
    """The PTX ISA's mma.m16n8k8 fragment layout for .tf32 inputs: the (row, column) of the element of A (16x8), B
    (8x8) or C (16x8) that thread `lane` holds in `register` (one 32-bit element per register)."""
    g, tig = lane // 4, lane % 4
    if operand == "A":
        return g + 8 * (register & 1), tig + 4 * (register >> 1)
    if operand == "B":
        return tig + 4 * register, g
    return g + 8 * (register >> 1), tig * 2 + (register & 1)


def tf32_mma_program() -> list[UOp]:
    """One warp computing D = A @ B (A 16x8 float row-major in data1, B 8x8 in data2, D 16x8 in data0) with one WMMA
    on TF32 (mma.m16n8k8 .tf32, inputs rounded to 10 mantissa bits), each thread loading and storing the fragment
    elements the PTX ISA assigns it (`ptx_tf32_fragment`)."""
    d, a, b = glob(0, dtypes.float32, 128), glob(1, dtypes.float32, 128), glob(2, dtypes.float32, 64)
    lane = special("lidx0", 32)
    g, tig = lane // 4, lane % 4
    # the formulas of ptx_tf32_fragment, on the thread index
    a_lanes = [load(a, (g + 8 * (i & 1)) * 8 + tig + 4 * (i >> 1)) for i in range(4)]
    b_lanes = [load(b, (tig + 4 * i) * 8 + g) for i in range(2)]
    va = UOp(Ops.VECTORIZE, dtypes.float32.vec(4), tuple(a_lanes))
    vb = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), tuple(b_lanes))
    vc = UOp(Ops.VCONST, dtypes.float32.vec(4), (), (0.0, 0.0, 0.0, 0.0))
    arg = ("WMMA_8_16_8_float_m10_float", (8, 16, 8), dtypes.float32, dtypes.float32, 32, (4, 2, 4))
    acc = UOp(Ops.WMMA, dtypes.float32.vec(4), (va, vb, vc), (*arg, MMA_M16N8K8_TF32_LAYOUT, 10))
    stores = [
        store(d, (g + 8 * (i >> 1)) * 8 + tig * 2 + (i & 1), UOp(Ops.GEP, dtypes.float32, (acc,), (i,)))
        for i in range(4)
    ]
    return linear("mma_tf32", *stores)


def mma_program(dtype_in: DType, k: int = 16) -> list[UOp]:
    """One warp computing D = A @ B (A 16xk row-major in data1, B kx8 row-major in data2, D 16x8 float in data0)
    with one WMMA (mma.m16n8k16 or m16n8k8), each thread loading and storing the fragment elements the PTX ISA
    assigns it (`ptx_fragment`)."""
    d, a, b = glob(0, dtypes.float32, 128), glob(1, dtype_in, 16 * k), glob(2, dtype_in, 8 * k)
    lane = special("lidx0", 32)
    g, tig = lane // 4, lane % 4
    # the formulas of ptx_fragment, on the thread index
    a_lanes = [load(a, (g + 8 * ((i >> 1) & 1)) * k + tig * 2 + (i & 1) + 8 * (i >> 2)) for i in range(k // 2)]
    b_lanes = [load(b, (tig * 2 + (i & 1) + 8 * (i >> 1)) * 8 + g) for i in range(k // 4)]
    va = UOp(Ops.VECTORIZE, dtype_in.vec(k // 2), tuple(a_lanes))
    vb = UOp(Ops.VECTORIZE, dtype_in.vec(k // 4), tuple(b_lanes))
    vc = UOp(Ops.VCONST, dtypes.float32.vec(4), (), (0.0, 0.0, 0.0, 0.0))
    layout = MMA_M16N8K16_LAYOUT if k == 16 else MMA_M16N8K8_LAYOUT
    arg = (
        f"WMMA_8_16_{k}_{dtype_in.name}_float",
        (8, 16, k),
        dtype_in,
        dtypes.float32,
        32,
        (k // 2, k // 4, 4),
        layout,
    )
    acc = UOp(Ops.WMMA, dtypes.float32.vec(4), (va, vb, vc), arg)
    stores = [
        store(d, (g + 8 * (i >> 1)) * 8 + tig * 2 + (i & 1), UOp(Ops.GEP, dtypes.float32, (acc,), (i,)))
        for i in range(4)
    ]
    return linear(f"mma_k{k}_{dtype_in.name.strip('_')}", *stores)
