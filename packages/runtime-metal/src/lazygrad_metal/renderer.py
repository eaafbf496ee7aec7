"""`MetalRenderer`: linear UOps -> Metal Shading Language (MSL), the C++14-based language of Apple GPUs.

A kernel is one `kernel void name(...)` function. Buffers are `device T*` parameters bound at `[[buffer(i)]]`, in
parameter order; symbolic variables follow as `constant int&` (set with `setBytes`); the hardware indices come from
`[[threadgroup_position_in_grid]]` (gidx) and `[[thread_position_in_threadgroup]]` (lidx), matching a launch with
`dispatchThreadgroups:threadsPerThreadgroup:` of `global_size` groups of `local_size` threads.

Beyond the C-style base, MSL differs in: type names (`char`, `uchar`, `long`, `half`, `bfloat`; no `double`), math
functions overloaded by type (`exp2(x)`, not `exp2f(x)`), bit casts through `as_type<T>`, threadgroup memory
(`threadgroup T buf[n]`) and `threadgroup_barrier`, vectors (`float4(...)`), SIMD groups of 32 threads
(`warp_size`, `SHUFFLE_XOR` as `simd_shuffle_xor`), and the simdgroup_matrix 8x8 multiply-accumulate that a WMMA UOp
becomes. bfloat has no arithmetic of its own worth trusting across Metal
versions, so every op on bfloat is computed in float and rounded back. The walk over the linear program is the
base class's (`CStyleLanguage.render`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from lazygrad_codegen.cstyle import GPU_TYPE_NAMES, OVERLOADED_MATH, CStyleLanguage
from lazygrad_metal.tensor_cores import SIMDGROUP_LAYOUT
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

if TYPE_CHECKING:
    from lazygrad_uop.device import TensorCore

# Limits of every Apple GPU that runs Metal 3 (Apple7 family and later): 1024 threads per threadgroup, 32 KiB of
# threadgroup memory, 32 threads per SIMD group. Grids are counted in uint, but indices are rendered as int.
MAX_THREADS_PER_THREADGROUP = 1024
THREADGROUP_MEMORY_BYTES = 32768
SIMD_WIDTH = 32
# the types simd_shuffle_xor has overloads for
_SHUFFLE_TYPES = frozenset(
    {dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.float16}
    | {dtypes.float32}
)


# GPU cores of Apple silicon by the name Metal gives the device: the largest configuration of each chip (binned parts
# have a few fewer, which sizes split reductions about as well)
APPLE_GPU_CORES: dict[str, int] = {
    "Apple M1": 8,
    "Apple M1 Pro": 16,
    "Apple M1 Max": 32,
    "Apple M1 Ultra": 64,
    "Apple M2": 10,
    "Apple M2 Pro": 19,
    "Apple M2 Max": 38,
    "Apple M2 Ultra": 76,
    "Apple M3": 10,
    "Apple M3 Pro": 18,
    "Apple M3 Max": 40,
    "Apple M3 Ultra": 80,
    "Apple M4": 10,
    "Apple M4 Pro": 20,
    "Apple M4 Max": 40,
}
# the cores of a GPU missing from the table: a base Apple silicon chip's
DEFAULT_GPU_CORES = 10


def gpu_cores(name: str) -> int:
    """The GPU cores of the Apple GPU Metal calls `name` (`APPLE_GPU_CORES`), or `DEFAULT_GPU_CORES` for one it
    doesn't list."""
    return APPLE_GPU_CORES.get(name.strip(), DEFAULT_GPU_CORES)


class MetalRenderer(CStyleLanguage):
    """Metal Shading Language for Apple GPUs. `tensor_cores` are the simdgroup_matrix descriptions this target
    offers (none by default: the METAL device passes them when the GPU supports simdgroup matrices)."""

    device: ClassVar[str] = "METAL"
    suffix: ClassVar[str] = "METAL"
    has_local: bool = True
    has_shared: bool = True
    supports_float4: bool = True
    global_max: tuple[int, ...] | None = (2**31 - 1, 2**31 - 1, 2**31 - 1)
    local_max: tuple[int, ...] | None = (
        MAX_THREADS_PER_THREADGROUP,
        MAX_THREADS_PER_THREADGROUP,
        MAX_THREADS_PER_THREADGROUP,
    )
    shared_max: int = THREADGROUP_MEMORY_BYTES
    max_workgroup_threads: int = MAX_THREADS_PER_THREADGROUP
    # scalar arithmetic; float2/float4 only for loads and stores (each thread of an Apple GPU is scalar)
    vector_width: int = 1

    kernel_prefix: ClassVar[str] = "kernel "
    buffer_prefix: ClassVar[str] = "device "
    arg_int_prefix: ClassVar[str] = "constant int&"
    # the hardware indices are parameters too, after the buffers and variables
    extra_params: ClassVar[tuple[str, ...]] = (
        "uint3 gid [[threadgroup_position_in_grid]]",
        "uint3 lid [[thread_position_in_threadgroup]]",
    )
    # threadgroup memory: its declarations, and the vector pointers cast from it
    smem_prefix: ClassVar[str] = "threadgroup "
    local_pointer_prefix: ClassVar[str] = "threadgroup "
    prelude: ClassVar[tuple[str, ...]] = ("#include <metal_stdlib>", "using namespace metal;")
    code_for_workitem: ClassVar[dict[str, Callable[[int], str]]] = {
        "g": lambda d: f"gid.{'xyz'[d]}",
        "l": lambda d: f"lid.{'xyz'[d]}",
    }
    # no double: Apple GPUs have no 64-bit floats
    type_map: ClassVar[dict[DType, str]] = {
        **{dt: name for dt, name in GPU_TYPE_NAMES.items() if dt != dtypes.float64},
        dtypes.bfloat16: "bfloat",
    }
    int64_suffix: ClassVar[str] = "l"
    # Metal's math functions are overloaded for half and float (no f-suffixed names)
    code_for_op: ClassVar[dict[Ops, Callable[..., str]]] = {**CStyleLanguage.code_for_op, **OVERLOADED_MATH}
    # the memory fence a BARRIER UOp renders to: threadgroup memory is all a kernel shares between its threads
    barrier: ClassVar[str] = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    warp_size: int = SIMD_WIDTH

    # GPU cores, which size split reductions (a MetalDevice sets its own GPU's, `gpu_cores`)
    compute_units: int = DEFAULT_GPU_CORES

    def __init__(
        self, tensor_cores: tuple[TensorCore, ...] = (), target: str | None = None, compute_units: int | None = None
    ) -> None:
        self.tensor_cores = tuple(tensor_cores)
        if compute_units is not None:
            self.compute_units = compute_units
        # the Apple GPU family ("apple7") whose registered tensor cores the registry hands this renderer
        self.target = target

    def tensor_core_targets(self) -> tuple[str, ...]:
        """The GPU family this renderer targets (none: no tensor cores are handed over)."""
        return (self.target,) if self.target is not None else ()

    def tensor_core_problem(self, tc: TensorCore, target: str) -> str | None:
        """None for an 8x8x8 simdgroup matrix of half, bfloat or float run by a 32-thread SIMD group with the
        simdgroup_matrix register layout (`lazygrad_metal.tensor_cores.SIMDGROUP_LAYOUT`), else why not."""
        floats = (dtypes.float16, dtypes.bfloat16, dtypes.float32)
        if tc.dims != (8, 8, 8) or tc.threads != SIMD_WIDTH or tc.elements_per_thread != (2, 2, 2):
            return f"Metal's simdgroup matrices are 8x8x8 over {SIMD_WIDTH} threads of 2 elements each, not {tc}"
        if tc.dtype_in not in floats or tc.dtype_out not in floats:
            return f"Metal's simdgroup matrices hold half, bfloat or float, not {tc.dtype_in} -> {tc.dtype_out}"
        if _as_tuples(tc.swizzle) != SIMDGROUP_LAYOUT:
            return f"the layout {tc.swizzle} is not simdgroup_matrix's {SIMDGROUP_LAYOUT}"
        return None

    # *** types, constants, casts ***

    def render_dtype(self, dtype: DType) -> str:
        """The MSL type name of `dtype`: scalars, vectors of 2 to 4 lanes, pointers (without address space)."""
        if isinstance(dtype, PtrDType):
            return f"{self.render_dtype(dtype.base)}*"
        scalar = dtype.scalar()
        if scalar not in self.type_map:
            hint = " (Apple GPUs have no 64-bit floats; cast to float32)" if scalar == dtypes.float64 else ""
            raise NotImplementedError(f"Metal has no type for {dtype}{hint}")
        if dtype.count == 1:
            return self.type_map[scalar]
        if dtype.count not in (2, 3, 4):
            raise NotImplementedError(f"Metal has no vector type of {dtype.count} x {scalar}")
        return f"{self.type_map[scalar]}{dtype.count}"

    def render_const(self, value: float | int | bool, dtype: DType) -> str:
        """A literal of `dtype`: bools as `true`/`false`."""
        if dtype == dtypes.bool:
            return "true" if value else "false"
        if dtype == dtypes.float64:
            self.render_dtype(dtype)  # raises: no doubles on Apple GPUs
        return super().render_const(value, dtype)

    def render_cast(self, x: str, src: DType, dest: DType) -> str:
        """`x` converted from `src` to `dest`; conversions between bfloat and anything but float go through float,
        the only conversion every Metal version defines for bfloat."""
        if src != dest and dtypes.bfloat16 in (src.scalar(), dest.scalar()):
            if dtypes.float32 not in (src.scalar(), dest.scalar()):
                x = f"(({self.render_dtype(dtypes.float32.vec(src.count))})({x}))"
        return f"(({self.render_dtype(dest)})({x}))"

    def render_bitcast(self, x: str, src: DType, dest: DType) -> str:
        """The bits of `x` reinterpreted as `dest` (same size)."""
        return f"as_type<{self.render_dtype(dest)}>({x})"

    def render_alu(self, op: Ops, dtype: DType, operands: list[str], src_dtypes: list[DType]) -> str:
        """The expression of `op`; with bfloat operands, computed in float and rounded back to bfloat."""
        if dtype.count > 1 or any(d.count > 1 for d in src_dtypes):
            # Apple GPUs are scalar per thread: codegen gives this renderer (vector_width 1) vectors only to load,
            # store and pass to WMMA, so C's ternary and comparisons never meet Metal's vector booleans
            raise NotImplementedError(f"MetalRenderer computes lane by lane; {op} on {dtype} vectors is not rendered")
        if dtypes.bfloat16 in src_dtypes:
            bf16, f32 = dtypes.bfloat16, dtypes.float32
            in_float = [self.render_cast(o, d, f32) if d == bf16 else o for o, d in zip(operands, src_dtypes)]
            result = f32 if dtype == bf16 else dtype
            expr = super().render_alu(op, result, in_float, [f32 if d == bf16 else d for d in src_dtypes])
            return self.render_cast(expr, f32, bf16) if dtype == bf16 else expr
        return super().render_alu(op, dtype, operands, src_dtypes)

    # *** memory, tensor cores, the kernel ***

    def render_memory(self, ptr: str, dtype: DType, index: UOp) -> str:
        """The lvalue at `ptr`; 3-lane vectors are as big as 4-lane ones in Metal, so memory of exactly 3 elements
        is read and written through the packed type."""
        if dtype.count == 3:
            return f"(*(({self.address_space(index)}packed_{self.render_dtype(dtype)}*){ptr}))"
        return super().render_memory(ptr, dtype, index)

    def render_shuffle_xor(self, x: str, offset: int, dtype: DType) -> str:
        """`simd_shuffle_xor`. Types it has no overload for travel as what it has: bool as uchar, 64-bit integers and
        bfloat as the unsigned integers of their size, bit for bit."""
        if dtype in _SHUFFLE_TYPES:
            return f"simd_shuffle_xor({x}, {offset})"
        if dtype == dtypes.bool:
            return f"(simd_shuffle_xor((uchar)({x}), {offset}) != 0)"
        carrier = {2: "ushort", 8: "uint2"}[dtype.itemsize]
        return f"as_type<{self.render_dtype(dtype)}>(simd_shuffle_xor(as_type<{carrier}>({x}), {offset}))"

    def render_wmma(self, wmma: UOp) -> tuple[str, str]:
        """The name and definition of the helper a WMMA UOp calls: it puts each thread's elements of A, B and C
        into simdgroup matrices, runs `simdgroup_multiply_accumulate`, and returns the thread's elements of the
        result in the same order. The layout (which elements are a thread's, in which register order) is the tensor
        core description's, which codegen applied; its arg starts (name, dims (N, M, K), dtype_in, dtype_out, ...)."""
        name, dims, dtype_in, dtype_out = wmma.arg[0], tuple(wmma.arg[1]), wmma.arg[2], wmma.arg[3]
        if dims != (8, 8, 8):
            raise NotImplementedError(f"Metal's simdgroup matrices are 8x8x8, a WMMA of dims {dims} can't run")
        if dtype_in.scalar() not in (dtypes.float16, dtypes.bfloat16, dtypes.float32):
            raise NotImplementedError(f"Metal's simdgroup matrices hold half, bfloat or float, not {dtype_in}")
        fname = "__" + "".join(c if c.isalnum() else "_" for c in str(name))
        a, b, c = (s.dtype for s in wmma.src)
        mat_in, mat_out = (f"simdgroup_{self.type_map[d.scalar()]}8x8" for d in (dtype_in, dtype_out))
        out = self.render_dtype(wmma.dtype)
        lines = [
            f"{out} {fname}({self.render_dtype(a)} a, {self.render_dtype(b)} b, {self.render_dtype(c)} c) {{",
            f"  {mat_in} mat_a, mat_b;",
            f"  {mat_out} mat_c;",
        ]
        for mat, var, dt in (("mat_a", "a", a), ("mat_b", "b", b), ("mat_c", "c", c)):
            lines += [f"  {mat}.thread_elements()[{k}] = {var}[{k}];" for k in range(dt.count)]
        lines.append("  simdgroup_multiply_accumulate(mat_c, mat_a, mat_b, mat_c);")
        lanes = ", ".join(f"mat_c.thread_elements()[{k}]" for k in range(wmma.dtype.count))
        lines += [f"  return {out}({lanes});", "}"]
        return fname, "\n".join(lines)

    def render_param(self, position: int, name: str, dtype: DType) -> str:
        """Buffers and variables bind at `[[buffer(i)]]`, in parameter order."""
        return f"{super().render_param(position, name, dtype)} [[buffer({position})]]"

    def render_prelude(self, uops: list[UOp]) -> list[str]:
        """The Metal standard library, and the simdgroup matrices' own header when the kernel uses them."""
        wmma = any(u.op is Ops.WMMA for u in uops)
        return [*self.prelude, *(["#include <metal_simdgroup_matrix>"] if wmma else [])]


def _as_tuples(x: object) -> object:
    return tuple(_as_tuples(v) for v in x) if isinstance(x, (tuple, list)) else x
