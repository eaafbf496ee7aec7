"""`MetalRenderer`: linear UOps -> Metal Shading Language (MSL), the C++14-based language of Apple GPUs.

A kernel is one `kernel void name(...)` function. Buffers are `device T*` parameters bound at `[[buffer(i)]]`, in
parameter order; symbolic variables follow as `constant int&` (set with `setBytes`); the hardware indices come from
`[[threadgroup_position_in_grid]]` (gidx) and `[[thread_position_in_threadgroup]]` (lidx), matching a launch with
`dispatchThreadgroups:threadsPerThreadgroup:` of `global_size` groups of `local_size` threads.

Beyond the C-style base, MSL differs in: type names (`char`, `uchar`, `long`, `half`, `bfloat`; no `double`), math
functions overloaded by type (`exp2(x)`, not `exp2f(x)`), bit casts through `as_type<T>`, threadgroup memory
(`threadgroup T buf[n]`) and `threadgroup_barrier`, vectors (`float4(...)`), and the simdgroup_matrix 8x8
multiply-accumulate that a WMMA UOp becomes. bfloat has no arithmetic of its own worth trusting across Metal
versions, so every op on bfloat is computed in float and rounded back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from lazygrad_codegen.cstyle import CStyleLanguage, kernel_function_name
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.uop import UOp

if TYPE_CHECKING:
    from lazygrad_uop.device import TensorCore

# Limits of every Apple GPU that runs Metal 3 (Apple7 family and later): 1024 threads per threadgroup, 32 KiB of
# threadgroup memory, 32 threads per SIMD group. Grids are counted in uint, but indices are rendered as int.
MAX_THREADS_PER_THREADGROUP = 1024
THREADGROUP_MEMORY_BYTES = 32768
SIMD_WIDTH = 32


def _metal_math(fn: str) -> Callable[..., str]:
    # Metal's math functions are overloaded for half and float (no f-suffixed names)
    return lambda a, dtype: f"{fn}({a})"


class MetalRenderer(CStyleLanguage):
    """Metal Shading Language for Apple GPUs. `tensor_cores` are the simdgroup_matrix descriptions this target
    offers (none by default: the METAL device passes them when the GPU supports simdgroup matrices)."""

    device: ClassVar[str] = "METAL"
    suffix: ClassVar[str] = "METAL"
    has_local: ClassVar[bool] = True
    has_shared: ClassVar[bool] = True
    supports_float4: ClassVar[bool] = True
    global_max: ClassVar[tuple[int, ...] | None] = (2**31 - 1, 2**31 - 1, 2**31 - 1)
    local_max: ClassVar[tuple[int, ...] | None] = (
        MAX_THREADS_PER_THREADGROUP,
        MAX_THREADS_PER_THREADGROUP,
        MAX_THREADS_PER_THREADGROUP,
    )
    shared_max: ClassVar[int] = THREADGROUP_MEMORY_BYTES
    max_workgroup_threads: ClassVar[int] = MAX_THREADS_PER_THREADGROUP
    # scalar arithmetic; float2/float4 only for loads and stores (each thread of an Apple GPU is scalar)
    vector_width: ClassVar[int] = 1

    kernel_prefix: ClassVar[str] = "kernel "
    buffer_prefix: ClassVar[str] = "device "
    arg_int_prefix: ClassVar[str] = "constant int&"
    prelude: ClassVar[tuple[str, ...]] = ("#include <metal_stdlib>", "using namespace metal;")
    code_for_workitem: ClassVar[dict[str, Callable[[int], str]]] = {
        "g": lambda d: f"gid.{'xyz'[d]}",
        "l": lambda d: f"lid.{'xyz'[d]}",
    }
    type_map: ClassVar[dict[DType, str]] = {
        dtypes.bool: "bool",
        dtypes.int8: "char",
        dtypes.uint8: "uchar",
        dtypes.int16: "short",
        dtypes.uint16: "ushort",
        dtypes.int32: "int",
        dtypes.uint32: "uint",
        dtypes.int64: "long",
        dtypes.uint64: "ulong",
        dtypes.float16: "half",
        dtypes.bfloat16: "bfloat",
        dtypes.float32: "float",
    }
    code_for_op: ClassVar[dict[Ops, Callable[..., str]]] = {
        **CStyleLanguage.code_for_op,
        Ops.EXP2: _metal_math("exp2"),
        Ops.LOG2: _metal_math("log2"),
        Ops.SIN: _metal_math("sin"),
        Ops.SQRT: _metal_math("sqrt"),
        Ops.TRUNC: _metal_math("trunc"),
    }
    # the memory fence a BARRIER UOp renders to: threadgroup memory is all a kernel shares between its threads
    barrier: ClassVar[str] = "threadgroup_barrier(mem_flags::mem_threadgroup);"

    def __init__(self, tensor_cores: tuple[TensorCore, ...] = ()) -> None:
        self.tensor_cores = tuple(tensor_cores)

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
        """A literal of `dtype`: 64-bit integers as `long`/`ulong` literals, vectors as every lane the same."""
        if dtype.count > 1:
            return f"{self.render_dtype(dtype)}({self.render_const(value, dtype.scalar())})"
        if dtype == dtypes.bool:
            return "true" if value else "false"
        if dtype == dtypes.int64:
            v = int(value)
            return "(-9223372036854775807l-1)" if v == -(2**63) else (f"({v}l)" if v < 0 else f"{v}l")
        if dtype == dtypes.uint64:
            return f"{int(value)}ul"
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

    # *** pieces only Metal has ***

    def address_space(self, buf: UOp) -> str:
        """The address space of the memory a DEFINE_GLOBAL or DEFINE_LOCAL names."""
        return "threadgroup" if buf.op is Ops.DEFINE_LOCAL else "device"

    def render_wmma_function(self, u: UOp) -> tuple[str, str]:
        """The name and definition of the helper a WMMA UOp calls: it puts each thread's elements of A, B and C
        into simdgroup matrices, runs `simdgroup_multiply_accumulate`, and returns the thread's elements of the
        result in the same order. The layout (which elements are a thread's, in which register order) is the tensor
        core description's, which codegen applied; `u.arg` starts (name, dims (N, M, K), dtype_in, dtype_out, ...)."""
        name, dims, dtype_in, dtype_out = u.arg[0], tuple(u.arg[1]), u.arg[2], u.arg[3]
        if dims != (8, 8, 8):
            raise NotImplementedError(f"Metal's simdgroup matrices are 8x8x8, a WMMA of dims {dims} can't run")
        if dtype_in.scalar() not in (dtypes.float16, dtypes.bfloat16, dtypes.float32):
            raise NotImplementedError(f"Metal's simdgroup matrices hold half, bfloat or float, not {dtype_in}")
        fname = "__" + "".join(c if c.isalnum() else "_" for c in str(name))
        a, b, c = (s.dtype for s in u.src)
        mat_in, mat_out = (f"simdgroup_{self.type_map[d.scalar()]}8x8" for d in (dtype_in, dtype_out))
        out = self.render_dtype(u.dtype)
        lines = [
            f"{out} {fname}({self.render_dtype(a)} a, {self.render_dtype(b)} b, {self.render_dtype(c)} c) {{",
            f"  {mat_in} mat_a, mat_b;",
            f"  {mat_out} mat_c;",
        ]
        for mat, var, dt in (("mat_a", "a", a), ("mat_b", "b", b), ("mat_c", "c", c)):
            lines += [f"  {mat}.thread_elements()[{k}] = {var}[{k}];" for k in range(dt.count)]
        lines.append("  simdgroup_multiply_accumulate(mat_c, mat_a, mat_b, mat_c);")
        lanes = ", ".join(f"mat_c.thread_elements()[{k}]" for k in range(u.dtype.count))
        lines += [f"  return {out}({lanes});", "}"]
        return fname, "\n".join(lines)

    def render_kernel(self, name: str, body: list[str], params: list[tuple[str, DType]]) -> str:
        """The whole source: prelude, the kernel with its buffers at `[[buffer(i)]]` in parameter order, its
        variables after them, and the hardware indices last."""
        args = []
        for i, (pname, dtype) in enumerate(params):
            if isinstance(dtype, PtrDType):
                args.append(f"{self.buffer_prefix}{self.render_dtype(dtype)} {pname} [[buffer({i})]]")
            else:
                args.append(f"{self.arg_int_prefix} {pname} [[buffer({i})]]")
        args += ["uint3 gid [[threadgroup_position_in_grid]]", "uint3 lid [[thread_position_in_threadgroup]]"]
        head = f"{self.kernel_prefix}void {name}({', '.join(args)}) {{"
        return "\n".join([*self.prelude, head, *body, "}", ""])

    # *** the walk ***

    def render(self, uops: list[UOp]) -> str:
        """MSL source of the linear program `uops`.

        The walk is the C-style one (one statement a line, single-use values inlined into their user) extended
        with the ops the base does not render yet: threadgroup memory and barriers, IF blocks, vectors, and WMMA.
        """
        users: dict[UOp, list[UOp]] = {u: [] for u in uops}
        depth_at: dict[UOp, int] = {}
        depth = 0
        for u in uops:
            if u.op in GroupOp.BlockEnd:
                depth -= 1
            depth_at[u] = depth
            if u.op in GroupOp.Block:
                depth += 1
            for s in u.src:
                if s in users:
                    users[s].append(u)

        def inline(u: UOp) -> bool:
            us = users[u]
            if len(us) != 1 or depth_at[us[0]] != depth_at[u] or us[0].op in GroupOp.Block:
                return False
            # a value read from an accumulator must be read where it stands, unless it is what gets assigned back
            return us[0].op is Ops.ASSIGN or not any(s.op is Ops.DEFINE_ACC for s in u.src)

        r: dict[UOp, str] = {}
        params: list[tuple[str, DType]] = []
        shared: list[str] = []
        helpers: dict[str, str] = {}
        lines: list[str] = []
        counter: dict[str, int] = {}
        indent = 1

        def fresh(prefix: str) -> str:
            counter[prefix] = counter.get(prefix, 0) + 1
            return f"{prefix}{counter[prefix] - 1}"

        def line(text: str) -> None:
            lines.append("  " * indent + text)

        def value(u: UOp, expr: str, prefix: str) -> None:
            if inline(u):
                r[u] = expr
            else:
                r[u] = fresh(prefix)
                line(f"{self.render_dtype(u.dtype)} {r[u]} = {expr};")

        def memory(ptr: UOp, dtype: DType) -> str:
            # a vector load or store through a scalar pointer reinterprets the address as a vector pointer; 3-lane
            # vectors are as big as 4-lane ones in Metal, so theirs is the packed type of exactly 3 elements
            buf = ptr.src[0]
            if dtype.count > 1 and isinstance(buf.dtype, PtrDType) and buf.dtype.base.count == 1:
                vec = self.render_dtype(dtype)
                return f"(*(({self.address_space(buf)} {'packed_' if dtype.count == 3 else ''}{vec}*){r[ptr]}))"
            return f"(*{r[ptr]})"

        for u in uops:
            op, src = u.op, u.src
            if op in (Ops.SINK, Ops.NOOP):
                continue
            if op is Ops.DEFINE_GLOBAL:
                r[u] = f"data{u.arg}"
                params.append((r[u], u.dtype))
            elif op is Ops.DEFINE_VAR:
                r[u] = u.arg[0]
                params.append((r[u], u.dtype))
            elif op is Ops.DEFINE_LOCAL:
                # threadgroup memory must be declared at kernel scope: hoisted to the top of the body
                if not isinstance(u.dtype, PtrDType) or u.dtype.size <= 0:
                    raise ValueError(f"DEFINE_LOCAL {u.arg!r} needs a pointer dtype of known size, got {u.dtype!r}")
                r[u] = str(u.arg)
                shared.append(f"  threadgroup {self.render_dtype(u.dtype.base)} {r[u]}[{u.dtype.size}];")
            elif op is Ops.CONST:
                r[u] = self.render_const(u.arg, u.dtype)
            elif op is Ops.VCONST:
                lanes = ", ".join(self.render_const(v, u.dtype.scalar()) for v in u.arg)
                r[u] = f"{self.render_dtype(u.dtype)}({lanes})"
            elif op is Ops.SPECIAL:
                name, size = u.arg
                r[u] = name
                line(f"int {name} = {self.render_workitem(name[0], int(name[-1]))}; /* {size} */")
            elif op is Ops.RANGE:
                r[u] = f"ridx{u.arg}"
                line(f"for (int {r[u]} = 0; {r[u]} < {r[src[0]]}; {r[u]}++) {{")
                indent += 1
            elif op is Ops.IF:
                line(f"if ({r[src[0]]}) {{")
                indent += 1
            elif op in GroupOp.BlockEnd:
                indent -= 1
                line("}")
            elif op is Ops.BARRIER:
                line(self.barrier)
            elif op is Ops.DEFINE_ACC:
                r[u] = f"acc{u.arg[0]}"
                line(f"{self.render_dtype(u.dtype)} {r[u]} = {r[src[0]]};")
            elif op is Ops.ASSIGN:
                r[u] = r[src[0]]
                line(f"{r[u]} = {r[src[1]]};")
            elif op is Ops.INDEX:
                r[u] = f"({r[src[0]]}+{r[src[1]]})"
            elif op is Ops.LOAD:
                # a LOAD whose second source is a BARRIER reads after that barrier: the walk already placed it
                read = memory(src[0], u.dtype)
                r[u] = fresh("val")
                if len(src) == 3:
                    read = f"({r[src[2]]}?{read}:{r[src[1]]})"
                line(f"{self.render_dtype(u.dtype)} {r[u]} = {read};")
            elif op is Ops.STORE:
                store = f"{memory(src[0], src[1].dtype)} = {r[src[1]]};"
                line(store if len(src) == 2 else f"if ({r[src[2]]}) {store}")
            elif op is Ops.VECTORIZE:
                if all(s is src[0] for s in src):
                    value(u, f"{self.render_dtype(u.dtype)}({r[src[0]]})", "vec")
                else:
                    value(u, f"{self.render_dtype(u.dtype)}({', '.join(r[s] for s in src)})", "vec")
            elif op is Ops.GEP:
                lanes = u.arg if isinstance(u.arg, tuple) else (u.arg,)
                if src[0].dtype.count == 1:
                    expr = r[src[0]] if len(lanes) == 1 else f"{self.render_dtype(u.dtype)}({r[src[0]]})"
                elif len(lanes) == 1:
                    expr = f"{r[src[0]]}.{'xyzw'[lanes[0]]}"
                else:
                    picked = ", ".join(f"{r[src[0]]}.{'xyzw'[k]}" for k in lanes)
                    expr = f"{self.render_dtype(u.dtype)}({picked})"
                value(u, expr, "gep")
            elif op is Ops.WMMA:
                fname, definition = self.render_wmma_function(u)
                helpers[fname] = definition
                r[u] = fresh("wmma")
                line(f"{self.render_dtype(u.dtype)} {r[u]} = {fname}({', '.join(r[s] for s in src)});")
            elif op in GroupOp.ALU or op in (Ops.CAST, Ops.BITCAST):
                if op is Ops.CAST:
                    expr = self.render_cast(r[src[0]], src[0].dtype, u.dtype)
                elif op is Ops.BITCAST:
                    expr = self.render_bitcast(r[src[0]], src[0].dtype, u.dtype)
                else:
                    expr = self.render_alu(op, u.dtype, [r[s] for s in src], [s.dtype for s in src])
                value(u, expr, "cast" if op in (Ops.CAST, Ops.BITCAST) else "alu")
            else:
                raise NotImplementedError(f"{type(self).__name__} can't render {op}")
        src_text = self.render_kernel(kernel_function_name(uops), shared + lines, params)
        if not helpers:
            return src_text
        # the helpers go between the prelude and the kernel; simdgroup matrices have their own header
        head = "\n".join([*self.prelude, "#include <metal_simdgroup_matrix>", *helpers.values()])
        return head + src_text[len("\n".join(self.prelude)) :]
