"""The CUDA C renderer: codegen's C-style family specialised for NVRTC.

What it adds to `CStyleLanguage`:

- kernels are `extern "C" __global__`, with `__launch_bounds__(threads, 1)` when the kernel has thread (`lidx`)
  indices; `gidx<d>` is `blockIdx`, `lidx<d>` is `threadIdx`, so a launch is `global_size` blocks of `local_size`
  threads;
- half and bfloat16 are `half` and `__nv_bfloat16` from `cuda_fp16.h`/`cuda_bf16.h`, computed in float and rounded
  back after every op (exactly what a native half op gives, and free of the headers' operator overloads);
- vectors (`VECTORIZE`, `GEP`, `VCONST`, vector loads and stores through a cast pointer, lane-wise ALU ops): CUDA's
  built-in `float4`-style types where they exist, small aligned structs (`lg_halfx8`) where they don't;
- shared memory (`DEFINE_LOCAL` as `__shared__` arrays), `BARRIER` as `__syncthreads()`, `IF`/`ENDIF` blocks;
  a kernel whose local memory exceeds the 48 KB a block may declare statically carves its buffers out of one
  `extern __shared__` array instead, and says how many bytes that is in the module's `__constant__`
  `DYNAMIC_SHARED_SYMBOL`, which `CUDAProgram` reads to opt the kernel in to that much and to launch it with it;
- 32-thread warps (`warp_size`): `SHUFFLE_XOR` as `__shfl_xor_sync` over the full warp, so grouped reductions combine
  within warps first;
- `WMMA` as inline PTX `mma.sync.aligned.m16n8k16` or `m16n8k8` (fp16 or bf16 inputs, fp32 accumulate), and
  `m16n8k8` with float32 inputs rounded to TF32 by `cvt.rna.tf32.f32`, see `render_wmma`;
- `THREEFRY` (Threefry-2x32, 20 rounds) as a device function.

The walk over the linear program is the base class's (`CStyleLanguage.render`); this module holds only what CUDA
says differently.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import ClassVar

from lazygrad_codegen.cstyle import GPU_TYPE_NAMES, CStyleLanguage, Workgroup
from lazygrad_codegen.vectors import register_array
from lazygrad_uop.device import TMA_MAX_RANK, TensorCore, TensorMap
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.uop import UOp

_HALFS = frozenset({dtypes.float16, dtypes.bfloat16})
# lane names of every vector type: CUDA's built-in types have x, y, z, w; our structs continue the sequence
LANES = "xyzwabcdefghijkl"
# CUDA's built-in vector types (vector_types.h, built into NVRTC) exist for these scalars with 2, 3 or 4 lanes
_BUILTIN_VECTOR = {
    **{dt: name for dt, name in GPU_TYPE_NAMES.items() if dt not in (dtypes.bool, dtypes.float16)},
    dtypes.int64: "longlong",
    dtypes.uint64: "ulonglong",
}
_STRUCT_NAME = {**_BUILTIN_VECTOR, dtypes.bool: "bool", dtypes.float16: "half", dtypes.bfloat16: "bf16"}

# the input dtypes of the mma.sync the renderer writes, and their PTX type names
_MMA_INPUTS = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}
MMA_M16N8K16_LAYOUT = (
    (("k1", "k2", "m0", "m1", "m2"), ("k0", "m3", "k3")),
    (("k1", "k2", "n0", "n1", "n2"), ("k0", "k3")),
    (("n1", "n2", "m0", "m1", "m2"), ("n0", "m3")),
)
MMA_M16N8K8_LAYOUT = (
    (("k1", "k2", "m0", "m1", "m2"), ("k0", "m3")),
    (("k1", "k2", "n0", "n1", "n2"), ("k0",)),
    (("n1", "n2", "m0", "m1", "m2"), ("n0", "m3")),
)
"""The fragment layouts of mma.sync.m16n8k16 and m16n8k8 (PTX ISA) in `TensorCore.swizzle` notation: lane r of each
operand's vector is the instruction's register r, so a tensor core rendered with one must describe exactly it."""
_MMA_LAYOUTS = {16: MMA_M16N8K16_LAYOUT, 8: MMA_M16N8K8_LAYOUT}
MMA_M16N8K8_TF32_LAYOUT = (
    (("k0", "k1", "m0", "m1", "m2"), ("m3", "k2")),
    (("k0", "k1", "n0", "n1", "n2"), ("k2",)),
    (("n1", "n2", "m0", "m1", "m2"), ("n0", "m3")),
)
"""The fragment layout of mma.sync.m16n8k8 with .tf32 inputs (PTX ISA): one 32-bit element per register."""
# the mantissa bits cvt.rna.tf32.f32 keeps: a float32-input core must declare exactly this rounding
TF32_MANTISSA_BITS = 10
# the oldest architecture with the mma.sync shapes and types the renderer writes (bf16 and m16n8k16 need sm_80)
OLDEST_TENSOR_CORE_ARCH = 80

# shared memory a block may declare statically (`__shared__` arrays); more is dynamic, opted in per kernel
STATIC_SHARED_MAX = 48 * 1024
# the most shared memory one block may opt in to, by compute capability (CUDA C Programming Guide, technical
# specifications per compute capability); architectures not listed get the static limit
OPT_IN_SHARED_MAX = {70: 96, 72: 96, 75: 64, 80: 163, 86: 99, 87: 163, 89: 99, 90: 227, 100: 227, 120: 99}
# the module-scope `__constant__` that holds a kernel's dynamic shared memory bytes
DYNAMIC_SHARED_SYMBOL = "lg_dynamic_shared_bytes"
TENSOR_MAPS_SYMBOL = "lg_tensor_maps"
"""The `__constant__` table of a kernel's tensor maps (`tensor_map_table`), which `CUDAProgram` reads to encode them
at each launch (`compiler.tensor_maps`)."""
TENSOR_MAP_WORDS = 20
"""64-bit words per map in the table: buffer, data type, rank, swizzle bytes, offset bytes, then 5 each of dims,
strides in bytes (the innermost's the element size) and box extents."""
MBARRIER_WAIT_TRIES = 1 << 26
"""Tries of `mbarrier.try_wait` (each may suspend the thread a while) after which a kernel traps, a launch error
the host raises, instead of waiting forever on a phase that can't complete."""
_TENSOR_MAP_TYPE = """struct __align__(64) lg_tensor_map { unsigned long long v[16]; };"""
# every local buffer starts 16 bytes into the dynamic array, as `__align__(16)` places the static ones
_SHARED_ALIGN = 16
# a WGMMA kernel's shared buffers start where the 128-byte swizzle's pattern of 8 lines does
WGMMA_SHARED_ALIGN = 1024
# the 64-bit matrix descriptor of a wgmma operand: start address, leading and stride byte offsets (over 16), and
# the swizzle mode in bits 62-63 (PTX ISA, "Matrix Descriptor Format")
_WGMMA_DESC = """__device__ __forceinline__ unsigned long long lg_wgmma_desc(const void* p, unsigned long long lbo,
    unsigned long long sbo, unsigned long long mode) {
  unsigned long long start = (unsigned long long)(((unsigned)__cvta_generic_to_shared(p)) & 0x3FFFFu) >> 4;
  return start | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (mode << 62);
}"""


def _compute_capability(arch: str) -> int:
    m = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
    if m is None:
        raise ValueError(f"a CUDA architecture is written like 'sm_80' or 'sm_90a', got {arch!r}")
    return int(m.group(1))


def mma_problem(
    name: str,
    dims: tuple[int, ...],
    dtype_in: DType,
    dtype_out: DType,
    threads: int,
    layout: object,
    input_mantissa_bits: int | None = None,
) -> str | None:
    """None if the renderer writes the tensor core with these properties as one mma.sync, else why not."""
    n, m, k = dims
    if dtype_in == dtypes.float32:
        return _tf32_problem(name, dims, dtype_out, threads, layout, input_mantissa_bits)
    if input_mantissa_bits is not None:
        return f"tensor core {name}: the CUDA renderer rounds only float32 inputs (to TF32), not {dtype_in}"
    if (n, m) != (8, 16) or k not in _MMA_LAYOUTS or dtype_in not in _MMA_INPUTS or dtype_out != dtypes.float32:
        return (
            "the CUDA renderer writes mma.sync m16n8k16 and m16n8k8 with fp16/bf16 inputs and fp32 accumulate; "
            f"got dims (N, M, K) {tuple(dims)}, {dtype_in} -> {dtype_out}"
        )
    if threads != 32 or (layout and _as_tuples(layout) != _MMA_LAYOUTS[k]):
        return (
            f"tensor core {name} has {threads} threads and layout {layout}, but mma.sync.m16n8k{k} is run by 32 "
            f"threads holding their operands as {_MMA_LAYOUTS[k]} (PTX ISA fragment layout)"
        )
    return None


WGMMA_ARCH = 90
"""The one compute capability with `wgmma.mma_async` (compiled for sm_90a)."""
WGMMA_N = (64, 128, 256)
"""The N of the m64nNk16 shapes `render_wgmma` writes."""
_WGMMA_SWIZZLE_MODES = {128: 1, 64: 2, 32: 3, 0: 0}


def wgmma_problem(
    name: str, dims: tuple[int, ...], dtype_in: DType, dtype_out: DType, threads: int, layout: object
) -> str | None:
    """None if the renderer writes the tensor core as one wgmma.mma_async m64nNk16 (fp16/bf16 inputs from shared
    memory, fp32 accumulate), else why not."""
    n, m, k = dims
    if (m, k) != (64, 16) or n not in WGMMA_N or dtype_in not in _MMA_INPUTS or dtype_out != dtypes.float32:
        return (
            f"tensor core {name}: the CUDA renderer writes wgmma m64nNk16 for N in {WGMMA_N}, fp16/bf16 inputs and "
            f"fp32 accumulate; got dims (N, M, K) {tuple(dims)}, {dtype_in} -> {dtype_out}"
        )
    from lazygrad_cuda.tensor_cores import wgmma_c_layout

    want = ((), (), wgmma_c_layout(n))
    if threads != 128 or _as_tuples(layout) != want:
        return (
            f"tensor core {name} has {threads} threads and layout {layout}, but wgmma m64n{n}k16 is run by a "
            f"warpgroup of 128 threads holding C as {want[2]} (PTX ISA register fragment layout)"
        )
    return None


def _tf32_problem(
    name: str, dims: tuple[int, ...], dtype_out: DType, threads: int, layout: object, input_mantissa_bits: int | None
) -> str | None:
    """None for mma.sync.m16n8k8 with .tf32 inputs as `render_wmma` writes it, else why not."""
    if tuple(dims) != (8, 16, 8) or dtype_out != dtypes.float32 or threads != 32:
        return (
            f"tensor core {name}: float32 inputs run as mma.sync.m16n8k8 .tf32 (dims (N, M, K) (8, 16, 8), 32 "
            f"threads, fp32 accumulate); got dims {tuple(dims)}, {threads} threads, -> {dtype_out}"
        )
    if input_mantissa_bits != TF32_MANTISSA_BITS:
        return (
            f"tensor core {name}: mma.sync rounds float32 inputs to TF32, so the description must say "
            f"input_mantissa_bits={TF32_MANTISSA_BITS}, not {input_mantissa_bits}"
        )
    if layout and _as_tuples(layout) != MMA_M16N8K8_TF32_LAYOUT:
        return (
            f"tensor core {name} has layout {layout}, but mma.sync.m16n8k8 .tf32 holds its operands as "
            f"{MMA_M16N8K8_TF32_LAYOUT} (PTX ISA fragment layout)"
        )
    return None


# 32-bit registers as CUDA types by their count, and the expression of each register of a value of that type
_REGISTERS = {4: ("uint4", ".x", ".y", ".z", ".w"), 2: ("uint2", ".x", ".y"), 1: ("unsigned int", "")}

_THREEFRY = """__device__ __forceinline__ unsigned int lg_rotl32(unsigned int x, int r) {
  return (x << r) | (x >> (32 - r));
}
__device__ unsigned long long lg_threefry(unsigned long long x, unsigned long long key) {
  const int rot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  unsigned int ks[3] = {(unsigned int)key, (unsigned int)(key >> 32), 0};
  ks[2] = ks[0] ^ ks[1] ^ 0x1BD11BDAu;
  unsigned int x0 = (unsigned int)x + ks[0], x1 = (unsigned int)(x >> 32) + ks[1];
  for (int block = 0; block < 5; block++) {
    for (int i = 0; i < 4; i++) { x0 += x1; x1 = lg_rotl32(x1, rot[4 * (block % 2) + i]) ^ x0; }
    x0 += ks[(block + 1) % 3];
    x1 += ks[(block + 2) % 3] + (unsigned int)(block + 1);
  }
  return ((unsigned long long)x1 << 32) | x0;
}"""


# the types __shfl_xor_sync has overloads for (half and bfloat16 from cuda_fp16.h and cuda_bf16.h)
_SHUFFLE_TYPES = frozenset(
    {dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16}
    | {dtypes.float32, dtypes.float64}
)


def _workitem(kind: str) -> Callable[[int], str]:
    return lambda d: f"(int){kind}.{'xyz'[d]}"


def _fmod(a: str, b: str, dtype: DType) -> str:
    if dtypes.is_float(dtype):
        return f"fmod({a}, {b})" if dtype.scalar() == dtypes.float64 else f"fmodf({a}, {b})"
    return f"({a}%{b})"


class CUDARenderer(CStyleLanguage):
    """CUDA C for one GPU architecture (`arch`, e.g. "sm_90"), using the tensor cores given for it."""

    device = "CUDA"
    suffix = "CUDA"
    supports_float4 = True
    # 16-byte loads and stores of 8 halves or 16 bytes, through the aligned `lg_<T>x<n>` structs
    wide_vectors = True
    has_local = True
    has_shared = True
    # CUDA's limits: grid x up to 2^31-1 blocks, y and z up to 65535; at most 1024 threads per block, z up to 64
    global_max = (2**31 - 1, 65535, 65535)
    local_max = (1024, 1024, 64)
    # shared memory per block: the architecture's opt-in limit (`OPT_IN_SHARED_MAX`), set per instance
    shared_max = STATIC_SHARED_MAX
    # the register budget of upcast and unrolled elements per thread (`Renderer.max_upcast`): twice the default, so a
    # staged tile can take a 64x64 tensor-core tile per warp with a 32-element step, or an 8x8 FMA tile with an
    # 8-element one (202-210 and 119-127 registers on sm_80/sm_90, no spills). On an H100 they ran the 4096^3 matmul at
    # 302 TFLOPS (fp16) and 39.6 (fp32) against 275 and 32.5 within the default budget
    max_upcast = 512
    kernel_prefix = 'extern "C" __global__ '
    # 16-byte aligned, so the float4 loads and stores codegen emits into shared memory are aligned
    smem_prefix = "__shared__ __align__(16) "
    barrier = "__syncthreads();"
    # a staged tile's main loop is not unrolled: its body is a whole step of the workgroup tile already, and ptxas for
    # sm_80 unrolls it in two and hoists the next step's loads, spilling registers of large tiles (a convolution's
    # weight gradient) that fit in one step's worth
    barrier_loop_pragma = "#pragma unroll 1"
    warp_size = 32
    infinity = "__int_as_float(0x7f800000)"
    nan = "__int_as_float(0x7fffffff)"
    code_for_workitem: ClassVar[dict[str, Callable[[int], str]]] = {
        "g": _workitem("blockIdx"),
        "l": _workitem("threadIdx"),
    }
    type_map: ClassVar[dict[DType, str]] = {
        **CStyleLanguage.type_map,
        dtypes.float16: "half",
        dtypes.bfloat16: "__nv_bfloat16",
    }
    code_for_op: ClassVar[dict[Ops, Callable[..., str]]] = {
        **CStyleLanguage.code_for_op,
        Ops.MOD: _fmod,
        Ops.THREEFRY: lambda a, b, dtype: f"lg_threefry({a}, {b})",
    }

    # an H100/H200 has 132 multiprocessors; a CUDADevice sets its own GPU's count
    compute_units = 132

    def __init__(
        self, arch: str = "sm_80", tensor_cores: Sequence[TensorCore] = (), compute_units: int | None = None
    ) -> None:
        cc = _compute_capability(arch)
        self.arch = arch
        self.shared_max = OPT_IN_SHARED_MAX.get(cc, STATIC_SHARED_MAX // 1024) * 1024
        self.tensor_cores = ()
        self.add_tensor_cores(tensor_cores)
        # cp.async exists from Ampere (sm_80) on
        self.has_async_copy = cc >= 80
        # ldmatrix exists from Turing (sm_75) on
        self.has_ldmatrix = cc >= 75
        # the tensor memory accelerator feeds the wgmma of sm_90 (`WGMMA=2`)
        self.has_tma = cc == WGMMA_ARCH
        if compute_units is not None:
            self.compute_units = compute_units

    def tensor_core_targets(self) -> tuple[str, ...]:
        """This architecture and every older one with tensor cores, newest first: a GPU runs the mma instructions
        of the architectures before it, so the descriptions registered for any of them apply."""
        cc = _compute_capability(self.arch)
        return tuple(dict.fromkeys([self.arch, *(f"sm_{c}" for c in range(cc, OLDEST_TENSOR_CORE_ARCH - 1, -1))]))

    def tensor_core_problem(self, tc: TensorCore, target: str) -> str | None:
        """None for the mma.sync shapes `render_wmma` writes, on sm_80 and later, and for the wgmma shapes
        `render_wgmma` writes on sm_90 itself (its `a` features, which later architectures lack), else why not."""
        if _compute_capability(target) < OLDEST_TENSOR_CORE_ARCH:
            return f"the CUDA renderer's mma.sync tensor cores need sm_{OLDEST_TENSOR_CORE_ARCH} or later, not {target}"
        if tc.shared_operands:
            if _compute_capability(target) != WGMMA_ARCH:
                return f"wgmma runs on sm_{WGMMA_ARCH} (compiled as sm_{WGMMA_ARCH}a) only, not {target}"
            return wgmma_problem(str(tc), tc.dims, tc.dtype_in, tc.dtype_out, tc.threads, tc.swizzle)
        return mma_problem(str(tc), tc.dims, tc.dtype_in, tc.dtype_out, tc.threads, tc.swizzle, tc.input_mantissa_bits)

    def add_tensor_cores(self, tensor_cores: Sequence[TensorCore]) -> None:
        """Use `tensor_cores` too, but sm_90's wgmma only on an sm_90 GPU: a later GPU runs the mma.sync of the
        architectures before it, not their `a` features."""
        own = _compute_capability(self.arch) == WGMMA_ARCH
        super().add_tensor_cores([tc for tc in tensor_cores if own or not tc.shared_operands])

    def __repr__(self) -> str:
        return f"CUDARenderer({self.arch!r}, {len(self.tensor_cores)} tensor cores)"

    # *** types, constants, casts ***

    def render_dtype(self, dtype: DType) -> str:
        """The CUDA type of `dtype`: scalar names from `type_map`, `float4`-style built-in vectors, `lg_<T>x<n>`
        structs for the other vectors, `T*` for pointers."""
        if isinstance(dtype, PtrDType):
            return f"{self.render_dtype(dtype.base)}*"
        scalar = dtype.scalar()
        if scalar in (dtypes.fp8e4m3, dtypes.fp8e5m2):
            raise NotImplementedError(f"the CUDA renderer has no type for {dtype} yet")
        if dtype.count == 1:
            return super().render_dtype(dtype)
        if dtype.count in (2, 3, 4) and scalar in _BUILTIN_VECTOR:
            return f"{_BUILTIN_VECTOR[scalar]}{dtype.count}"
        if scalar not in _STRUCT_NAME or dtype.count > len(LANES):
            raise NotImplementedError(f"the CUDA renderer has no vector type for {dtype}")
        return f"lg_{_STRUCT_NAME[scalar]}x{dtype.count}"

    def render_cast(self, x: str, src: DType, dest: DType) -> str:
        """Conversions; half and bfloat16 convert to and from anything but float through float (exact for them),
        and from double directly (one rounding, as numpy does)."""
        s, d = src.scalar(), dest.scalar()
        if isinstance(dest, PtrDType):
            return f"(({self.render_dtype(dest)})({x}))"
        if dest.count > 1:
            lanes = [self.render_cast(_lane(x, i, src), s, d) for i in range(dest.count)]
            return self.render_vectorize(dest, lanes)
        if d in _HALFS and s == dtypes.float64:
            return f"__double2half({x})" if d == dtypes.float16 else f"__double2bfloat16({x})"
        if d in _HALFS and s not in (dtypes.float32, d):
            return super().render_cast(self.render_cast(x, s, dtypes.float32), dtypes.float32, d)
        if s in _HALFS and d not in (dtypes.float32, s):
            return super().render_cast(self.render_cast(x, s, dtypes.float32), dtypes.float32, d)
        return super().render_cast(x, src, dest)

    def render_bitcast(self, x: str, src: DType, dest: DType) -> str:
        """The bits of `x` as `dest` (sizes are equal; `__builtin_bit_cast` is C++20's `std::bit_cast`)."""
        return f"__builtin_bit_cast({self.render_dtype(dest)}, {x})"

    def render_vectorize(self, dtype: DType, parts: list[str]) -> str:
        """A vector value of `dtype` from one expression per lane (brace-initialised: the structs have no
        constructors)."""
        return f"{self.render_dtype(dtype)}{{{', '.join(parts)}}}"

    def render_alu(self, op: Ops, dtype: DType, operands: list[str], src_dtypes: list[DType]) -> str:
        """An ALU op; on vectors lane by lane, on half and bfloat16 in float rounded back to the type."""
        if dtype.count > 1:
            lanes = [
                self.render_alu(
                    op,
                    dtype.scalar(),
                    [_lane(o, i, sd) for o, sd in zip(operands, src_dtypes, strict=True)],
                    [sd.scalar() for sd in src_dtypes],
                )
                for i in range(dtype.count)
            ]
            return self.render_vectorize(dtype, lanes)
        compute = src_dtypes[0] if op in GroupOp.Comparison else dtype
        if compute.scalar() in _HALFS and op is not Ops.WHERE:
            as_float = [
                self.render_cast(o, sd, dtypes.float32) if sd.scalar() in _HALFS else o
                for o, sd in zip(operands, src_dtypes, strict=True)
            ]
            float_srcs = [dtypes.float32 if sd.scalar() in _HALFS else sd for sd in src_dtypes]
            if op in GroupOp.Comparison:
                return super().render_alu(op, dtype, as_float, float_srcs)
            return self.render_cast(super().render_alu(op, dtypes.float32, as_float, float_srcs), dtypes.float32, dtype)
        return super().render_alu(op, dtype, operands, src_dtypes)

    # *** warps ***

    def render_shuffle_xor(self, x: str, offset: int, dtype: DType) -> str:
        """`__shfl_xor_sync` over the whole warp. Types it has no overload for (bool, 8- and 16-bit integers) travel
        as int, which holds their values exactly."""
        if dtype in _SHUFFLE_TYPES:
            return f"__shfl_xor_sync(0xffffffffu, {x}, {offset})"
        moved = f"__shfl_xor_sync(0xffffffffu, {self.render_cast(x, dtype, dtypes.int32)}, {offset})"
        return self.render_cast(moved, dtypes.int32, dtype)

    # *** tensor cores ***

    def render_wmma(self, wmma: UOp) -> tuple[str, str]:
        """The name and definition of the device function for a WMMA UOp, whose arg is (name, dims, dtype_in,
        dtype_out, threads, elements_per_thread, layout) as codegen writes it (`lazygrad_codegen.tensor_cores`).

        One `mma.sync.aligned.m16n8k16` (or `m16n8k8`) `.row.col` by the 32 threads of a warp: dims (N, M, K) =
        (8, 16, 16 or 8), fp16 or bf16 inputs, fp32 accumulator. Each thread passes its A fragment (K/2 values), B
        fragment (K/4) and C fragment (4) as vectors whose lanes are the instruction's registers in order (two 16-bit
        values packed per 32-bit register, the lower lane in the low half), so the tensor core's layout must be
        `MMA_M16N8K16_LAYOUT` (or `MMA_M16N8K8_LAYOUT`). Float32 inputs (arg's eighth entry 10: rounded to TF32) run
        as `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`, each A and B value converted by `cvt.rna.tf32.f32`
        (round to nearest, ties away from zero) first, so that the result does not depend on what the hardware does
        with the low bits; the layout must be `MMA_M16N8K8_TF32_LAYOUT`.
        """
        arg = wmma.arg
        name, dims, dtype_in, dtype_out, threads = arg[:5]
        layout = arg[6] if len(arg) > 6 else ()
        mantissa = arg[7] if len(arg) > 7 else None
        if (why := mma_problem(name, dims, dtype_in, dtype_out, threads, layout, mantissa)) is not None:
            raise NotImplementedError(why)
        fn = "lg_" + re.sub(r"\W", "_", str(name))
        if dtype_in == dtypes.float32:
            return fn, self._render_tf32_mma(fn)
        k = dims[2]
        ptx_in = _MMA_INPUTS[dtype_in]
        a_t, b_t, c_t = (
            self.render_dtype(d) for d in (dtype_in.vec(k // 2), dtype_in.vec(k // 4), dtypes.float32.vec(4))
        )
        (a_regs, *a_lanes), (b_regs, *b_lanes) = _REGISTERS[k // 4], _REGISTERS[k // 8]
        inputs = [f'"r"(ar{lane})' for lane in a_lanes] + [f'"r"(br{lane})' for lane in b_lanes]
        a_ops = ", ".join(f"%{4 + i}" for i in range(len(a_lanes)))
        b_ops = ", ".join(f"%{4 + len(a_lanes) + i}" for i in range(len(b_lanes)))
        body = f"""__device__ __forceinline__ {c_t} {fn}({a_t} a, {b_t} b, {c_t} c) {{
  {a_regs} ar = __builtin_bit_cast({a_regs}, a);
  {b_regs} br = __builtin_bit_cast({b_regs}, b);
  asm("mma.sync.aligned.m16n8k{k}.row.col.f32.{ptx_in}.{ptx_in}.f32 {{%0, %1, %2, %3}}, {{{a_ops}}}, {{{b_ops}}}, "
      "{{%0, %1, %2, %3}};"
      : "+f"(c.x), "+f"(c.y), "+f"(c.z), "+f"(c.w)
      : {", ".join(inputs)});
  return c;
}}"""
        return fn, body

    def render_wgmma(self, name: str, wgmma: UOp, a: str, b: str, c: list[str] | None, first: bool) -> list[str]:
        """One `wgmma.mma_async.sync.aligned.m64nNk16.f32` by the warpgroup, A and B by descriptors built from their
        origins and `SharedMatrix` layouts (K-major, or MN-major with the instruction's transpose flag); C in the float
        array `name`. A chain's first instruction declares the array and copies C's lanes into it (unless it
        accumulates into a register array in place), and fences (`wgmma.fence`: the registers were written by
        ordinary instructions); each instruction then only issues, so that a step's instructions pipeline on the
        tensor cores, committed as one group and waited for by `render_wgmma_wait`. The fences and the waits take the
        arrays' registers as operands, so that the compiler moves no read or write of them across."""
        (n, _m, _k), dtype_in, _dtype_out, _threads, _layout, a_matrix, b_matrix = wgmma.arg[:7]
        regs = n // 2
        operands = ", ".join(f'"+f"({name}[{i}])' for i in range(regs))
        out = []
        if c is not None:
            out.append(f"float {name}[{regs}] = {{{', '.join(c)}}};")
        if first:
            out.append(f'asm volatile("wgmma.fence.sync.aligned;" : {operands} :: "memory");')
        descs = []
        for ptr, (_major, lbo, sbo, swizzle) in ((a, a_matrix), (b, b_matrix)):
            descs.append(f"lg_wgmma_desc({ptr}, {lbo}ull, {sbo}ull, {_WGMMA_SWIZZLE_MODES[swizzle]}ull)")
        ptx_in = _MMA_INPUTS[dtype_in]
        trans_a, trans_b = int(a_matrix[0] == "mn"), int(b_matrix[0] == "mn")
        d = ", ".join(f"%{i}" for i in range(regs))
        out.append(
            f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n'
            f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx_in}.{ptx_in} {{{d}}}, %{regs}, %{regs + 1}, p, 1, 1, "
            f'{trans_a}, {trans_b};\\n}}" : {operands} : "l"({descs[0]}), "l"({descs[1]}), "r"(1));'
        )
        return out

    def render_wgmma_wait(self, arrays: list[tuple[str, int]], in_flight: int = 0, commit: bool = True) -> list[str]:
        """`wgmma.commit_group` and `wgmma.wait_group in_flight`, with the chains' registers as its operands (one asm
        statement per chain, the first waits), so that no read or write of them moves across."""
        out = ['asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");'] if commit else []
        for n, (name, regs) in enumerate(arrays):
            operands = ", ".join(f'"+f"({name}[{i}])' for i in range(regs))
            text = f"wgmma.wait_group.sync.aligned {in_flight};" if n == 0 else ""
            out.append(f'asm volatile("{text}" : {operands} :: "memory");')
        return out

    def render_register_array(self, name: str, dtype: DType, init: list[str]) -> str:
        """`float name[n] = {...};`: a WGMMA's accumulator kept in its registers across the steps of a loop."""
        return f"{self.render_dtype(dtype.scalar())} {name}[{dtype.count}] = {{{', '.join(init)}}};"

    def _render_tf32_mma(self, fn: str) -> str:
        """The device function `fn` of one mma.sync.m16n8k8 with .tf32 inputs: A's 4 and B's 2 floats rounded to TF32
        (`cvt.rna.tf32.f32`, a .b32 register each), then multiplied into C's 4 floats."""
        a_regs = [f"ar{i}" for i in range(4)]
        b_regs = [f"br{i}" for i in range(2)]
        cvts = [
            f'  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"({reg}) : "f"({src}.{LANES[i]}));'
            for src, regs in (("a", a_regs), ("b", b_regs))
            for i, reg in enumerate(regs)
        ]
        inputs = ", ".join(f'"r"({r})' for r in a_regs + b_regs)
        body = f"""__device__ __forceinline__ float4 {fn}(float4 a, float2 b, float4 c) {{
  unsigned int {", ".join(a_regs + b_regs)};
{chr(10).join(cvts)}
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, "
      "{{%0, %1, %2, %3}};"
      : "+f"(c.x), "+f"(c.y), "+f"(c.z), "+f"(c.w)
      : {inputs});
  return c;
}}"""
        return body

    # *** the kernel ***

    def render_async_copy(self, dst: str, src: str, valid: str | None, nbytes: int) -> str:
        """`cp.async` (L2 only, `.cg`, for 16 bytes; `.ca` for 4 and 8) from global `src` to shared `dst`; a source
        size of 0 where `valid` is false fills the destination with zeros and reads nothing."""
        size = str(nbytes) if valid is None else f"({valid}?{nbytes}:0)"
        kind = "cg" if nbytes == 16 else "ca"
        return (
            f'asm volatile("cp.async.{kind}.shared.global [%0], [%1], {nbytes}, %2;" :: '
            f'"r"((unsigned)__cvta_generic_to_shared({dst})), "l"({src}), "r"({size}));'
        )

    def render_async_wait(self, in_flight: int = 0) -> str:
        """Commit the copies started since the last wait as one group and wait for all but the latest `in_flight`
        groups."""
        commit, wait = "cp.async.commit_group;", f"cp.async.wait_group {in_flight};"
        return f'asm volatile("{commit}" ::: "memory"); asm volatile("{wait}" ::: "memory");'

    def render_kernel(self, name: str, body: list[str], params: list[tuple[str, DType]], uops: list[UOp]) -> str:
        """The kernel, ending, where it starts asynchronous copies, with a wait for all of them: a pipeline's last
        steps start copies (zero fills past the end) that no step waits for, and they must land before the block
        exits and its shared memory goes to the next block. A kernel with tensor maps takes them after its other
        parameters, as `__grid_constant__` structs the host encodes at each launch."""
        if any(u.op is Ops.ASYNC_COPY for u in uops):
            body = [*body, '  asm volatile("cp.async.wait_all;" ::: "memory");']
        # (`render` numbered the maps)
        self.extra_params = tuple(f"const __grid_constant__ lg_tensor_map tmap{i}" for i in range(len(self._maps)))
        try:
            return super().render_kernel(name, body, params, uops)
        finally:
            self.extra_params = ()

    def render_tma(self, u: UOp, srcs: list[str]) -> list[str]:
        """PTX of the tensor memory accelerator's ops, each run by the threads whose gate holds: `mbarrier.init`
        (then `fence.mbarrier_init`, so that the copies' completions see it), `mbarrier.arrive.expect_tx`,
        `cp.async.bulk.tensor` of one box from the kernel's tensor-map parameter, counted on the barrier, and a loop
        of `mbarrier.try_wait.parity` that every thread runs (trapping after `MBARRIER_WAIT_TRIES`)."""

        def shared(x: str) -> str:
            return f'"r"((unsigned)__cvta_generic_to_shared({x}))'

        if u.op is Ops.MBARRIER_INIT:
            init = f'asm volatile("mbarrier.init.shared::cta.b64 [%0], {int(u.arg)};" :: {shared(srcs[0])} : "memory");'
            fence = 'asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");'
            return [f"if ({srcs[1]}) {{ {init} {fence} }}"]
        if u.op is Ops.MBARRIER_EXPECT:
            text = f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], {int(u.arg)};"
            return [f'if ({srcs[1]}) asm volatile("{text}" :: {shared(srcs[0])} : "memory");']
        if u.op is Ops.MBARRIER_WAIT:
            text = (
                "{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}"
            )
            # a phase that never completes is a bug (bytes announced that no copy brings): trap rather than hang
            return [
                f'{{ unsigned lg_done, lg_tries = 0; do {{ asm volatile("{text}" : "=r"(lg_done) : '
                f'{shared(srcs[0])}, "r"({srcs[1]}) : "memory"); if (++lg_tries == {MBARRIER_WAIT_TRIES}u) __trap(); '
                "} while (!lg_done); }"
            ]
        tmap: TensorMap = u.arg
        rank = len(tmap.dims)
        which = tensor_maps_of_key(u)
        coords = ", ".join(f"%{i + 2}" for i in range(rank))
        text = (
            f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
            f"[%0], [%1, {{{coords}}}], [%{rank + 2}];"
        )
        operands = ", ".join(
            [shared(srcs[0]), f'"l"((unsigned long long)&tmap{self._maps[which]})']
            + [f'"r"({c})' for c in srcs[4 : 4 + rank]]
            + [shared(srcs[2])]
        )
        return [f'if ({srcs[3]}) asm volatile("{text}" :: {operands} : "memory");']

    def render_ldmatrix(self, name: str, dtype: DType, address: str, matrices: int, trans: bool) -> str:
        """`ldmatrix.sync.aligned.m8n8` of `matrices` 8x8 matrices of 16-bit elements (`.trans` when asked) into
        32-bit registers, which are then the bits of the vector `name`."""
        bits = {1: "unsigned", 2: "uint2", 4: "uint4"}[matrices]
        fields = [f"{name}_r"] if matrices == 1 else [f"{name}_r.{LANES[i]}" for i in range(matrices)]
        regs = ", ".join(f"%{i}" for i in range(matrices))
        outs = ", ".join(f'"=r"({f})' for f in fields)
        kind = f"x{matrices}{'.trans' if trans else ''}"
        vector = self.render_dtype(dtype)
        return (
            f"{bits} {name}_r; "
            f'asm volatile("ldmatrix.sync.aligned.m8n8.{kind}.shared.b16 {{{regs}}}, [%{matrices}];" : {outs} : '
            f'"r"((unsigned)__cvta_generic_to_shared({address}))); '
            f"{vector} {name} = __builtin_bit_cast({vector}, {name}_r);"
        )

    def render_local_memory(self, buffers: list[tuple[str, DType, int]]) -> list[str]:
        """`__shared__` arrays while they fit the static limit; else pointers into one `extern __shared__` array,
        each buffer 16-byte aligned in it (see `dynamic_shared_bytes`). A kernel with WGMMAs always takes the array,
        its start rounded up to 1024 bytes of shared address and each buffer 1024-byte aligned in it."""
        wgmma = self._wgmma
        offsets, total = _shared_layout(buffers, WGMMA_SHARED_ALIGN if wgmma else _SHARED_ALIGN)
        if total <= STATIC_SHARED_MAX and not wgmma:
            return super().render_local_memory(buffers)
        out = [f"  extern __shared__ __align__({_SHARED_ALIGN}) unsigned char lg_shared[];"]
        if wgmma:
            a = WGMMA_SHARED_ALIGN
            out = [
                f"  extern __shared__ __align__({_SHARED_ALIGN}) unsigned char lg_shared_raw[];",
                f"  unsigned char* lg_shared = lg_shared_raw + (({a}u - ((unsigned)__cvta_generic_to_shared"
                f"(lg_shared_raw) & {a - 1}u)) & {a - 1}u);",
            ]
        for (name, dt, _size), offset in zip(buffers, offsets, strict=True):
            t = self.render_dtype(dt)
            out.append(f"  {t}* {name} = ({t}*)(lg_shared + {offset});")
        return out

    def launch_attributes(self, workgroup: Workgroup | None) -> str:
        """`__launch_bounds__` with the threads of a block, when the kernel has thread indices, and a minimum of one
        block per multiprocessor: without it ptxas guesses an occupancy to aim for and may spill a few registers of a
        large register tile (a staged convolution) to reach it."""
        return "" if workgroup is None else f"__launch_bounds__({math.prod(workgroup)}, 1) "

    def render_prelude(self, uops: list[UOp]) -> list[str]:
        """The headers of the 16-bit float types the kernel uses, and a struct for each vector type CUDA lacks."""
        # (a WGMMA's result, and the C it takes, are float arrays, not vector types)
        wide = {u for u in uops if u.op is Ops.WGMMA} | {u.src[2] for u in uops if u.op is Ops.WGMMA}
        wide |= {x for u in uops if register_array(u) for x in (u, u.src[0])}
        wide |= {u for u in uops if u.op is Ops.ASSIGN and u.src[0] in wide}
        dts = {u.dtype for u in uops if u not in wide} | {u.dtype.base for u in uops if isinstance(u.dtype, PtrDType)}
        scalars = {d.scalar() for d in dts if not isinstance(d, PtrDType)}
        out: list[str] = []
        if dynamic := dynamic_shared_bytes(uops):
            out.append(f"__constant__ unsigned int {DYNAMIC_SHARED_SYMBOL} = {dynamic};")
        if table := tensor_map_table(uops):
            words = ", ".join(str(w) for w in table)
            out += [
                _TENSOR_MAP_TYPE,
                f"__constant__ unsigned long long {TENSOR_MAPS_SYMBOL}[{len(table)}] = {{{words}}};",
            ]
        if dtypes.float16 in scalars:
            out.append("#include <cuda_fp16.h>")
        if dtypes.bfloat16 in scalars:
            out.append("#include <cuda_bf16.h>")
        structs = {
            self.render_dtype(d): d
            for d in dts
            if not isinstance(d, PtrDType) and d.count > 1 and self.render_dtype(d).startswith("lg_")
        }
        for u in uops:
            if u.op is Ops.WMMA:  # the helper takes and returns vectors the kernel may never name
                k = u.arg[1][2]
                for d in (u.arg[2].vec(k // 2), u.arg[2].vec(k // 4)):
                    if self.render_dtype(d).startswith("lg_"):  # float4 and float2 (TF32) are CUDA's own
                        structs.setdefault(self.render_dtype(d), d)
        for name, d in sorted(structs.items()):
            nbytes = d.scalar().itemsize * d.count
            align = f"__align__({nbytes}) " if _is_power_of_two(nbytes) and nbytes <= 16 else ""
            out.append(f"struct {align}{name} {{ {self.render_dtype(d.scalar())} {', '.join(LANES[: d.count])}; }};")
        return out

    def render_helpers(self, uops: list[UOp]) -> list[str]:
        """The tensor-core functions, the wgmma descriptor's, and Threefry when the kernel draws random bits."""
        threefry = [_THREEFRY] if any(u.op is Ops.THREEFRY for u in uops) else []
        desc = [_WGMMA_DESC] if any(u.op is Ops.WGMMA for u in uops) else []
        return super().render_helpers(uops) + desc + threefry

    # whether the program being rendered has WGMMAs, whether its barriers fence the generic proxy's writes of shared
    # memory for them, and the number of each of its tensor maps (set by `render` for its own duration)
    _wgmma: bool = False
    _proxy_fence: bool = False
    _maps: dict[tuple[int, TensorMap], int] = {}  # noqa: RUF012

    def render(self, uops: list[UOp]) -> str:
        """CUDA C of `uops`; a kernel with WGMMAs gets its shared memory 1024-byte aligned (the swizzle's pattern
        repeats every 1024 bytes of address) and, unless the tensor memory accelerator fills it, each barrier after a
        `fence.proxy.async` (the wgmma's reads of shared memory are of the async proxy, the copies that filled it of
        the generic one; TMA's are of the async proxy too, and its barrier orders them)."""
        self._wgmma = any(u.op is Ops.WGMMA for u in uops)
        self._maps = {key: i for i, key in enumerate(tensor_maps_of(uops))}
        self._proxy_fence = self._wgmma and not self._maps
        try:
            return super().render(uops)
        finally:
            self._wgmma, self._proxy_fence, self._maps = False, False, {}

    def render_barrier(self) -> str:
        """`__syncthreads()`; in a kernel with WGMMAs fed by the threads' copies after `fence.proxy.async.shared::cta`,
        which orders this thread's writes of shared memory (its copies, landed) before the wgmma's reads of them."""
        if self._proxy_fence:
            return f'asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); {self.barrier}'
        return self.barrier

    def render_gep(self, x: str, lane: int, dtype: DType) -> str:
        """Lane `lane` of vector expression `x`: a field named by `LANES`, an element of a WGMMA's register array
        beyond them."""
        return f"{x}[{lane}]" if dtype.count > len(LANES) else _lane(x, lane, dtype)


def _shared_layout(buffers: list[tuple[str, DType, int]], align: int = _SHARED_ALIGN) -> tuple[list[int], int]:
    """Where each local buffer (name, element dtype, elements) starts in one shared array, each `align`-byte
    aligned, and its total bytes."""
    offsets, end = [], 0
    for _name, dt, size in buffers:
        offsets.append(end)
        end += -(-size * dt.itemsize // align) * align
    return offsets, end


def dynamic_shared_bytes(uops: Sequence[UOp]) -> int:
    """The bytes of dynamic shared memory a kernel of the linear program `uops` is launched with: its local buffers
    laid out in one array when they exceed what a block may declare statically (`STATIC_SHARED_MAX`), else 0; a
    kernel with WGMMAs always, 1024-byte aligned, with 1024 more to round its start up."""
    buffers = [(u.arg, u.dtype.base, u.dtype.size) for u in uops if u.op is Ops.DEFINE_LOCAL]
    if any(u.op is Ops.WGMMA for u in uops):
        return _shared_layout(buffers, WGMMA_SHARED_ALIGN)[1] + WGMMA_SHARED_ALIGN
    total = _shared_layout(buffers)[1]
    return total if total > STATIC_SHARED_MAX else 0


def tensor_maps_of_key(u: UOp) -> tuple[int, TensorMap]:
    """What tells a `TMA_LOAD`'s tensor map apart from a kernel's others: its buffer's slot and the map."""
    return (int(u.src[1].arg), u.arg)


def tensor_maps_of(uops: Sequence[UOp]) -> list[tuple[int, TensorMap]]:
    """The distinct tensor maps the `TMA_LOAD`s of `uops` read (`tensor_maps_of_key`), in the order of their first
    use: the kernel's tensor-map parameters `tmap0`, `tmap1`, ... in that order."""
    return list(dict.fromkeys(tensor_maps_of_key(u) for u in uops if u.op is Ops.TMA_LOAD))


def tensor_map_table(uops: Sequence[UOp]) -> list[int]:
    """The words of the kernel's `TENSOR_MAPS_SYMBOL` table: the number of maps, then `TENSOR_MAP_WORDS` per map
    (`tensor_maps_of`'s order): the index of its buffer among the kernel's buffer parameters, the driver's data type
    (`CUtensorMapDataType`: an unsigned int of the element's size, which copies the bits), rank, swizzle bytes, offset
    bytes, and 5 each of dims, strides in bytes and box extents (innermost first, 1, 0 and 1 past the rank). Empty
    for a kernel without maps."""
    maps = tensor_maps_of(uops)
    if not maps:
        return []
    slots = [int(u.arg) for u in uops if u.op is Ops.DEFINE_GLOBAL]
    out = [len(maps)]
    for slot, m in maps:
        item, pad = m.dtype.itemsize, TMA_MAX_RANK - len(m.dims)
        strides = [s * item for s in m.strides]
        out += [slots.index(slot), _TENSOR_MAP_DATA_TYPES[item], len(m.dims), m.swizzle, m.offset * item]
        out += [*m.dims, *[1] * pad, *strides, *[0] * pad, *m.box, *[1] * pad]
    return out


# the driver's CUtensorMapDataType by element size: UINT8, UINT16, UINT32, UINT64 (a copy moves bits; zeros fill)
_TENSOR_MAP_DATA_TYPES = {1: 0, 2: 1, 4: 2, 8: 4}


def _as_tuples(x: object) -> object:
    return tuple(_as_tuples(v) for v in x) if isinstance(x, (tuple, list)) else x


def _lane(expr: str, i: int, dtype: DType) -> str:
    """Lane `i` of vector expression `expr`, or the scalar itself (broadcast) when `dtype` is not a vector."""
    return f"({expr}).{LANES[i]}" if dtype.count > 1 else expr


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
