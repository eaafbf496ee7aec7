"""The C-style renderer family: `CStyleLanguage`, the base that C, OpenCL, CUDA and Metal renderers specialise, and
`CRenderer` for plain C (C99 with the GCC/Clang `_Float16` and `__bf16` extensions).

`CStyleLanguage.render` is the one walk over a linear program that every dialect shares: one statement a line, loops
as `for` statements and `IF` as `if` blocks, accumulators as local variables, local memory declared at the top of the
body, and values used once inlined into their user. A dialect says only how it differs from C, each a class attribute
or a method to override:

- the kernel: `kernel_prefix` (`__kernel`, `extern "C" __global__`), `launch_attributes` (its work-group size),
  parameters (`buffer_prefix`/`buffer_suffix`, `arg_int_prefix`, `render_param`, `extra_params`), the lines before
  it (`prelude`, `render_prelude`, `render_helpers`) and the assembly of all of it (`render_kernel`);
- hardware indices (`code_for_workitem`, `render_workitem`), local memory (`smem_prefix`, `local_pointer_prefix`,
  `render_local_memory`) and `barrier`;
- types (`type_map`, `render_dtype`, `render_vector_type`), constants, casts and bitcasts (`render_const`,
  `render_cast`, `render_bitcast`), the expression of each op (`code_for_op`, `render_alu`: math function names,
  half and bfloat16 computed in float);
- vectors (`render_vectorize`, `render_gep`) and memory (`render_memory`, `render_load`, `render_store`);
- tensor cores: `render_wmma` gives the name and definition of the function a `WMMA` calls;
- warps: `warp_size` and `render_shuffle_xor`, the expression of a `SHUFFLE_XOR` (always a statement of its own).

Vector loads and stores read and write consecutive elements through a pointer cast to the vector type, in the
buffer's address space (`*((device float4*)(data0+i))` in Metal; OpenCL overrides `render_load`/`render_store` with
`vload4`/`vstore4`); codegen only emits them where the renderer allows (`supports_float4`: aligned 2 and 4 element
vectors; `vector_width`: any width up to it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

from lazygrad_codegen.vectors import register_array
from lazygrad_uop.device import Renderer
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.uop import UOp

Workgroup = tuple[int, int, int]


def kernel_function_name(uops: list[UOp]) -> str:
    """The function name codegen put on the final SINK of a linear program ("kernel" when there is none)."""
    if uops and uops[-1].op is Ops.SINK and isinstance(uops[-1].arg, str):
        return uops[-1].arg
    return "kernel"


def workgroup_size(uops: list[UOp]) -> Workgroup | None:
    """The work-group size a linear program's `lidx` indices give it, None when it has none."""
    local = {int(u.arg[0][-1]): int(u.arg[1]) for u in uops if u.op is Ops.SPECIAL and u.arg[0][0] == "l"}
    return (local.get(0, 1), local.get(1, 1), local.get(2, 1)) if local else None


# the scalar type names OpenCL C and Metal share (CUDA names its built-in vector types after most of them)
GPU_TYPE_NAMES: dict[DType, str] = {
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
    dtypes.float32: "float",
    dtypes.float64: "double",
}


def _infix(sym: str) -> Callable[..., str]:
    return lambda a, b, dtype: f"({a}{sym}{b})"


def _max(a: str, b: str, dtype: DType) -> str:
    if dtypes.is_float(dtype):
        # NaN in either operand gives NaN, as numpy's maximum does
        return f"((({a})!=({a})||({a})>({b}))?({a}):({b}))"
    return f"(({a})>({b})?({a}):({b}))"


def _libm(fn: str) -> Callable[..., str]:
    return lambda a, dtype: f"{fn}({a})" if dtype.scalar() == dtypes.float64 else f"{fn}f({a})"


def _overloaded(fn: str) -> Callable[..., str]:
    return lambda a, dtype: f"{fn}({a})"


# math functions by one name for every float type, as OpenCL C and Metal overload them (C's float versions are
# `exp2f`, ...)
OVERLOADED_MATH: dict[Ops, Callable[..., str]] = {
    op: _overloaded(op.name.lower()) for op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC)
}


class CStyleLanguage(Renderer):
    """The common part of C-like languages: walks a linear program and writes one statement per line, with loops as
    `for` statements, accumulators as local variables, and values used once inlined into their user."""

    kernel_prefix: ClassVar[str] = ""
    # written before and after a buffer parameter's pointer type, and before the pointer type when a buffer is cast
    # to a vector pointer, e.g. "__global " (OpenCL), "device " (Metal) or " restrict"
    buffer_prefix: ClassVar[str] = ""
    buffer_suffix: ClassVar[str] = ""
    arg_int_prefix: ClassVar[str] = "const int"
    # parameters after the kernel's buffers and variables, e.g. Metal's hardware indices
    extra_params: ClassVar[tuple[str, ...]] = ()
    # lines before the kernel: includes, helper definitions
    prelude: ClassVar[tuple[str, ...]] = ()
    # the suffix of a 64-bit integer literal ("ll" in C, "l" where long is 64 bits: OpenCL, Metal)
    int64_suffix: ClassVar[str] = "ll"
    infinity: ClassVar[str] = "INFINITY"
    nan: ClassVar[str] = "NAN"
    # "g" and "l": the expression of global (work-group) and local index dimension d
    code_for_workitem: ClassVar[dict[str, Callable[[int], str]]] = {}
    # written before the declaration of a local (workgroup-shared) buffer, e.g. "__shared__ ", and before the pointer
    # type when a local buffer is cast to a vector pointer (OpenCL "__local ", Metal "threadgroup ", CUDA "")
    smem_prefix: ClassVar[str] = ""
    local_pointer_prefix: ClassVar[str] = ""
    # the statement that waits for every thread of a workgroup, e.g. "__syncthreads();" ("" where there is none)
    barrier: ClassVar[str] = ""
    # the line before a loop whose body holds a barrier (a staged tile's main loop), e.g. "#pragma unroll 1" ("": none)
    barrier_loop_pragma: ClassVar[str] = ""
    # C-like renderers inline an expression used once into its user, unless it is longer than this (some ops repeat
    # an operand, so nesting them would grow the text exponentially)
    max_inline_length: ClassVar[int] = 200
    type_map: ClassVar[dict[DType, str]] = {
        dtypes.bool: "bool",
        dtypes.int8: "signed char",
        dtypes.uint8: "unsigned char",
        dtypes.int16: "short",
        dtypes.uint16: "unsigned short",
        dtypes.int32: "int",
        dtypes.uint32: "unsigned int",
        dtypes.int64: "long long",
        dtypes.uint64: "unsigned long long",
        dtypes.float16: "half",
        dtypes.bfloat16: "__bf16",
        dtypes.float32: "float",
        dtypes.float64: "double",
    }
    code_for_op: ClassVar[dict[Ops, Callable[..., str]]] = {
        Ops.ADD: _infix("+"),
        Ops.MUL: _infix("*"),
        Ops.IDIV: _infix("/"),
        Ops.MOD: _infix("%"),
        Ops.CMPLT: _infix("<"),
        Ops.CMPNE: _infix("!="),
        Ops.AND: _infix("&"),
        Ops.OR: _infix("|"),
        Ops.XOR: _infix("^"),
        Ops.SHL: _infix("<<"),
        Ops.SHR: _infix(">>"),
        Ops.MAX: _max,
        Ops.NEG: lambda a, dtype: f"(!{a})" if dtypes.is_bool(dtype) else f"(-{a})",
        Ops.RECIP: lambda a, dtype: f"(1/{a})",
        Ops.WHERE: lambda c, a, b, dtype: f"({c}?{a}:{b})",
        Ops.MULACC: lambda a, b, c, dtype: f"(({a}*{b})+{c})",
        Ops.EXP2: _libm("exp2"),
        Ops.LOG2: _libm("log2"),
        Ops.SIN: _libm("sin"),
        Ops.SQRT: _libm("sqrt"),
        Ops.TRUNC: _libm("trunc"),
    }
    # dtypes whose math functions are computed in float32 and rounded back (the C library has none for them)
    math_in_float: ClassVar[frozenset[DType]] = frozenset({dtypes.float16, dtypes.bfloat16})
    # dtypes that C arithmetic promotes to int or float: each result is cast back so it wraps or rounds as the type
    narrow_types: ClassVar[frozenset[DType]] = frozenset(
        {dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.float16, dtypes.bfloat16}
    )

    # *** types, constants, conversions ***

    def render_dtype(self, dtype: DType) -> str:
        """The type name of `dtype` (a pointer type for buffers, `render_vector_type` for vectors)."""
        if isinstance(dtype, PtrDType):
            return f"{self.render_dtype(dtype.base)}*"
        if dtype.scalar() not in self.type_map:
            raise NotImplementedError(f"{type(self).__name__} has no type for {dtype}")
        if dtype.count > 1:
            return self.render_vector_type(dtype)
        return self.type_map[dtype.scalar()]

    def render_vector_type(self, dtype: DType) -> str:
        """The type name of vector `dtype`: the scalar's name and the lane count (`float4`), as CUDA, OpenCL and
        Metal name theirs. Plain C has none."""
        if self.supports_float4 or self.vector_width > 1:
            return f"{self.type_map[dtype.scalar()].replace(' ', '')}{dtype.count}"
        raise NotImplementedError(f"{type(self).__name__} can't render vector type {dtype}")

    def render_const(self, value: float | int | bool, dtype: DType) -> str:
        """A literal of `dtype` (a vector of `dtype` with `value` in every lane)."""
        if dtype.count > 1:
            return self.render_vectorize(dtype, [self.render_const(value, dtype.scalar())] * dtype.count)
        if dtypes.is_bool(dtype):
            return "1" if value else "0"
        if dtypes.is_float(dtype):
            if math.isnan(value):
                text = self.nan
            elif math.isinf(value):
                text = self.infinity if value > 0 else f"(-{self.infinity})"
            else:
                text = repr(float(value)) + ("" if dtype == dtypes.float64 else "f")
            return text if dtype == dtypes.float32 else self.render_cast(text, dtypes.float32, dtype)
        v = int(value)
        if dtype == dtypes.int32:
            return "(-2147483647-1)" if v == -(2**31) else (f"({v})" if v < 0 else str(v))
        if dtype == dtypes.int64:
            ll = self.int64_suffix
            return f"(-9223372036854775807{ll}-1)" if v == -(2**63) else (f"({v}{ll})" if v < 0 else f"{v}{ll}")
        if dtype == dtypes.uint32:
            return f"{v}u"
        if dtype == dtypes.uint64:
            return f"{v}u{self.int64_suffix}"
        return self.render_cast(str(v), dtypes.int32, dtype)

    def render_cast(self, x: str, src: DType, dest: DType) -> str:
        """`x` of type `src` converted to `dest` (floats to ints truncate, anything to bool is `!= 0`)."""
        return f"(({self.render_dtype(dest)})({x}))"

    def render_bitcast(self, x: str, src: DType, dest: DType) -> str:
        """The bits of `x` reinterpreted as `dest` (a union is the C99 way to pun types)."""
        return f"((union {{ {self.render_dtype(src)} a; {self.render_dtype(dest)} b; }}){{.a = {x}}}).b"

    # *** vectors, memory, tensor cores ***

    def render_vectorize(self, dtype: DType, parts: list[str]) -> str:
        """A vector of `dtype` built from the scalar expressions `parts`."""
        return f"{self.render_dtype(dtype)}({','.join(parts)})"

    def render_gep(self, x: str, lane: int, dtype: DType) -> str:
        """Lane `lane` of the vector expression `x` of `dtype`."""
        return f"{x}.{'xyzw'[lane]}" if dtype.count <= 4 else f"{x}[{lane}]"

    def address_space(self, index: UOp) -> str:
        """The address-space qualifier of the memory an INDEX points into, written before a pointer type."""
        return self.local_pointer_prefix if index.src[0].op is Ops.DEFINE_LOCAL else self.buffer_prefix

    def render_memory(self, ptr: str, dtype: DType, index: UOp) -> str:
        """The lvalue of the element (or vector of consecutive elements) of `dtype` at pointer expression `ptr`, the
        address `index` computes."""
        if dtype.count == 1:
            return f"(*{ptr})"
        return f"(*(({self.address_space(index)}{self.render_dtype(dtype)}*){ptr}))"

    def render_load(self, ptr: str, dtype: DType, index: UOp) -> str:
        """The expression that reads `dtype` at `ptr` (see `render_memory`)."""
        return self.render_memory(ptr, dtype, index)

    def render_store(self, ptr: str, value: str, dtype: DType, index: UOp) -> str:
        """The statement that writes `value` of `dtype` at `ptr` (see `render_memory`)."""
        return f"{self.render_memory(ptr, dtype, index)} = {value};"

    def render_wmma(self, wmma: UOp) -> tuple[str, str]:
        """The name and the definition of the function a tensor-core instruction (`WMMA`, see
        `lazygrad_codegen.tensor_cores`) calls: it takes the operand vectors A, B and C and returns the result's
        vector. Dialects with tensor cores implement it; the definition goes before the kernel once per name."""
        raise NotImplementedError(f"{type(self).__name__} has no tensor cores (can't render {wmma.arg[0]})")

    def render_barrier(self) -> str:
        """The statement of a workgroup barrier (`BARRIER`)."""
        return self.barrier

    def render_wgmma(self, name: str, wgmma: UOp, a: str, b: str, c: list[str] | None, first: bool) -> list[str]:
        """The statements that issue a tensor-core instruction that reads A and B from local memory itself
        (`WGMMA`): the result goes to `name`, a register array; `a` and `b` are the addresses of the operands'
        origins; `c` the expressions of C's lanes, copied into a new array `name`, or None where C is the array
        `name` itself (the result of the previous instruction of a chain, or an accumulator kept in registers,
        accumulated in place); `first` says whether it starts its chain. Its result is read after
        `render_wgmma_wait`. Dialects with such tensor cores implement it."""
        raise NotImplementedError(f"{type(self).__name__} has no tensor cores that read local memory (WGMMA)")

    def render_wgmma_wait(self, arrays: list[tuple[str, int]], in_flight: int = 0, commit: bool = True) -> list[str]:
        """The statements that make the WGMMAs issued since the last wait one group (unless not `commit`) and wait
        until at most `in_flight` groups are running, naming the arrays (name, registers) they write: written before
        the first read of a result, before a barrier, and at the end of a loop (there leaving the step's group
        running where the WGMMAs say so, and waiting for it after the loop)."""
        raise NotImplementedError(f"{type(self).__name__} has no tensor cores that read local memory (WGMMA)")

    def render_register_array(self, name: str, dtype: DType, init: list[str]) -> str:
        """The declaration of accumulator `name`, a vector of `dtype` kept as one array of registers
        (`vectors.REGISTER_ARRAY`), with its lanes' initial values `init`."""
        raise NotImplementedError(f"{type(self).__name__} has no register arrays")

    def render_shuffle_xor(self, x: str, offset: int, dtype: DType) -> str:
        """The value of scalar expression `x` of `dtype` in the thread of this one's warp whose lane is this
        thread's lane XOR `offset` (`SHUFFLE_XOR`); dialects that declare a `warp_size` implement it."""
        raise NotImplementedError(f"{type(self).__name__} has no warp shuffles (its warp_size is {self.warp_size})")

    # *** the kernel ***

    def render_workitem(self, kind: str, dim: int, workgroup: Workgroup | None) -> str:
        """The expression of hardware index `kind` ("g" global, "l" local) in dimension `dim`; `workgroup` is the
        kernel's work-group size (`workgroup_size`)."""
        if kind not in self.code_for_workitem:
            raise NotImplementedError(f"{type(self).__name__} has no hardware indices of kind {kind!r}")
        return self.code_for_workitem[kind](dim)

    def render_param(self, position: int, name: str, dtype: DType) -> str:
        """The kernel's parameter at `position`: a buffer (pointer `dtype`) or an int variable."""
        if isinstance(dtype, PtrDType):
            return f"{self.buffer_prefix}{self.render_dtype(dtype)}{self.buffer_suffix} {name}"
        return f"{self.arg_int_prefix} {name}"

    def launch_attributes(self, workgroup: Workgroup | None) -> str:
        """Text between `kernel_prefix` and the return type that tells the compiler the kernel's work-group size."""
        return ""

    def render_prelude(self, uops: list[UOp]) -> list[str]:
        """The lines before the helper functions and the kernel: includes, extension pragmas, type definitions."""
        return list(self.prelude)

    def render_helpers(self, uops: list[UOp]) -> list[str]:
        """The definitions of the functions the kernel calls, each once: one per tensor-core instruction."""
        helpers: dict[str, str] = {}
        for u in uops:
            if u.op is Ops.WMMA:
                name, definition = self.render_wmma(u)
                helpers.setdefault(name, definition)
        return list(helpers.values())

    def render_async_copy(self, dst: str, src: str, valid: str | None, nbytes: int) -> str:
        """The statement that starts copying `nbytes` from global address `src` to local address `dst` (zeros where
        `valid`, when given, is false); only for a dialect with `has_async_copy`."""
        raise NotImplementedError(f"{type(self).__name__} has no asynchronous copies (has_async_copy is False)")

    def render_async_wait(self, in_flight: int = 0) -> str:
        """The statement that makes this thread's asynchronous copies since the last wait one group and waits for all
        but the latest `in_flight` groups."""
        raise NotImplementedError(f"{type(self).__name__} has no asynchronous copies (has_async_copy is False)")

    def render_tma(self, u: UOp, srcs: list[str]) -> list[str]:
        """The statements of `u`, one of the tensor memory accelerator's ops (`TMA_LOAD`, `MBARRIER_INIT`,
        `MBARRIER_EXPECT`, `MBARRIER_WAIT`), whose sources render as `srcs` (ordering deps as ""); only for a dialect
        with `has_tma`."""
        raise NotImplementedError(f"{type(self).__name__} has no tensor memory accelerator (has_tma is False)")

    def render_ldmatrix(self, name: str, dtype: DType, address: str, matrices: int, trans: bool) -> str:
        """The statement that declares `name` of `dtype` and loads `matrices` 8x8 matrices into it from the row
        addresses in local memory that the warp's threads give (`Ops.LDMATRIX`); only for a dialect with
        `has_ldmatrix`."""
        raise NotImplementedError(f"{type(self).__name__} has no ldmatrix (has_ldmatrix is False)")

    def render_local_memory(self, buffers: list[tuple[str, DType, int]]) -> list[str]:
        """The body lines that declare the kernel's local memory: one array per buffer (name, element dtype,
        elements), in the order of its DEFINE_LOCALs."""
        return [f"  {self.smem_prefix}{self.render_dtype(dt)} {name}[{size}];" for name, dt, size in buffers]

    def render_kernel(self, name: str, body: list[str], params: list[tuple[str, DType]], uops: list[UOp]) -> str:
        """The whole source: prelude and helpers, the signature with `params` (name, dtype) in order, and the body
        lines of the linear program `uops`."""
        args = [self.render_param(i, pname, dtype) for i, (pname, dtype) in enumerate(params)]
        attributes = self.launch_attributes(workgroup_size(uops))
        head = f"{self.kernel_prefix}{attributes}void {name}({', '.join([*args, *self.extra_params])}) {{"
        return "\n".join([*self.render_prelude(uops), *self.render_helpers(uops), head, *body, "}", ""])

    # *** the walk ***

    def render_alu(self, op: Ops, dtype: DType, operands: list[str], src_dtypes: list[DType]) -> str:
        """The expression of ALU op `op` with result type `dtype` on `operands`."""
        if op not in self.code_for_op:
            raise NotImplementedError(f"{type(self).__name__} can't render {op}")
        scalar = dtype.scalar()
        if op in GroupOp.Unary and op not in (Ops.NEG, Ops.RECIP) and scalar in self.math_in_float:
            inner = self.code_for_op[op](self.render_cast(operands[0], scalar, dtypes.float32), dtypes.float32)
            return self.render_cast(inner, dtypes.float32, scalar)
        # comparisons compute in the operands' type; everything else in the result type
        compute = src_dtypes[0] if op in GroupOp.Comparison else dtype
        expr = self.code_for_op[op](*operands, compute)
        if op not in GroupOp.Comparison and scalar in self.narrow_types:
            expr = self.render_cast(expr, scalar, scalar)
        return expr

    def render(self, uops: list[UOp]) -> str:
        """C-like source of the linear program `uops`."""
        users: dict[UOp, list[UOp]] = {u: [] for u in uops}
        depth_at: dict[UOp, int] = {}
        depth = 0
        blocks: list[UOp] = []
        barrier_loops: set[UOp] = set()
        for u in uops:
            if u.op in GroupOp.BlockEnd:
                depth -= 1
                blocks.pop()
            depth_at[u] = depth
            if u.op in GroupOp.Block:
                depth += 1
                blocks.append(u)
            if u.op is Ops.BARRIER:
                barrier_loops.update(b for b in blocks if b.op is Ops.RANGE)
            for s in u.src:
                if s in users:
                    users[s].append(u)

        def inline(u: UOp, expr: str) -> bool:
            us = users[u]
            if len(us) != 1 or depth_at[us[0]] != depth_at[u] or us[0].op in GroupOp.Block:
                return False
            if len(expr) > self.max_inline_length:
                return False
            # a vector expression is written into a statement whole, never into one that reads it lane by lane
            if u.dtype.count > 1 and us[0].op not in (Ops.STORE, Ops.ASSIGN, Ops.WMMA, Ops.WGMMA):
                return False
            # a value read from an accumulator must be read where it stands, unless it is what gets assigned back
            return us[0].op is Ops.ASSIGN or not any(s.op is Ops.DEFINE_ACC for s in u.src)

        r: dict[UOp, str] = {}
        params: list[tuple[str, DType]] = []
        shared: list[tuple[str, DType, int]] = []
        lines: list[str] = []
        counter: dict[str, int] = {}
        indent = 1

        def fresh(prefix: str) -> str:
            counter[prefix] = counter.get(prefix, 0) + 1
            return f"{prefix}{counter[prefix] - 1}"

        def line(text: str) -> None:
            lines.append("  " * indent + text)

        # the arrays of WGMMA chains issued and not yet waited for (name: registers), and whether their group may
        # stay running at the end of the loop step (the WGMMA's eighth arg entry)
        pending: dict[str, int] = {}
        running = 0

        def wait() -> None:
            if pending:
                for text in self.render_wgmma_wait(list(pending.items())):
                    line(text)
                pending.clear()

        def value(u: UOp, expr: str, prefix: str) -> None:
            if inline(u, expr):
                r[u] = expr
            else:
                r[u] = fresh(prefix)
                line(f"{self.render_dtype(u.dtype)} {r[u]} = {expr};")

        workgroup = workgroup_size(uops)
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
                if not isinstance(u.dtype, PtrDType) or u.dtype.size <= 0:
                    raise ValueError(f"DEFINE_LOCAL {u.arg!r} needs a pointer dtype of known size, got {u.dtype!r}")
                r[u] = u.arg if isinstance(u.arg, str) and u.arg.isidentifier() else f"temp{u.arg}"
                # local memory is declared at kernel scope (OpenCL and Metal require it): first in the body
                shared.append((r[u], u.dtype.base, u.dtype.size))
            elif op is Ops.CONST:
                r[u] = self.render_const(u.arg, u.dtype)
            elif op is Ops.VCONST:
                r[u] = self.render_vectorize(u.dtype, [self.render_const(v, u.dtype.scalar()) for v in u.arg])
            elif op is Ops.SPECIAL:
                name, size = u.arg
                r[u] = name
                line(f"int {name} = {self.render_workitem(name[0], int(name[-1]), workgroup)}; /* {size} */")
            elif op is Ops.RANGE:
                r[u] = f"ridx{u.arg}"
                if u in barrier_loops and self.barrier_loop_pragma:
                    line(self.barrier_loop_pragma)
                line(f"for ({self.render_dtype(u.dtype)} {r[u]} = 0; {r[u]} < {r[src[0]]}; {r[u]}++) {{")
                indent += 1
            elif op is Ops.IF:
                line(f"if ({r[src[0]]}) {{")
                indent += 1
            elif op in GroupOp.BlockEnd:
                # a loop's step may leave its group running into the next (the one before it is then done), and
                # waits for it after the loop
                runs_on = bool(pending and running and op is Ops.END)
                if runs_on:
                    for text in self.render_wgmma_wait(list(pending.items()), running):
                        line(text)
                else:
                    wait()
                indent -= 1
                line("}")
                if runs_on:
                    for text in self.render_wgmma_wait(list(pending.items()), 0, commit=False):
                        line(text)
                    pending.clear()
            elif op is Ops.BARRIER:
                wait()
                if not self.barrier:
                    raise NotImplementedError(f"{type(self).__name__} has no workgroup barrier")
                line(self.render_barrier())
            elif op is Ops.ASYNC_COPY:
                valid = r[src[1].src[2]] if len(src[1].src) == 3 else None
                line(self.render_async_copy(r[src[0]], r[src[1]], valid, u.arg * src[1].dtype.base.itemsize))
            elif op is Ops.ASYNC_WAIT:
                line(self.render_async_wait(int(u.arg or 0)))
            elif op in (Ops.MBARRIER_INIT, Ops.MBARRIER_EXPECT, Ops.MBARRIER_WAIT, Ops.TMA_LOAD):
                for text in self.render_tma(u, [r.get(s, "") for s in src]):
                    line(text)
            elif op is Ops.LDMATRIX:
                r[u] = fresh("frag")
                line(self.render_ldmatrix(r[u], u.dtype, r[src[0]], *u.arg))
            elif register_array(u):
                r[u] = f"acc{u.arg[0]}"
                init = src[0]
                lanes_ = [r[s] for s in init.src] if init.op is Ops.VECTORIZE else [r[init]] * u.dtype.count
                line(self.render_register_array(r[u], u.dtype, lanes_))
            elif op is Ops.DEFINE_ACC:
                r[u] = f"acc{u.arg[0]}"
                line(f"{self.render_dtype(u.dtype)} {r[u]} = {r[src[0]]};")
            elif op is Ops.ASSIGN:
                r[u] = r[src[0]]
                if r[src[1]] != r[u]:  # (a WGMMA accumulates into its register array in place)
                    line(f"{r[u]} = {r[src[1]]};")
            elif op is Ops.INDEX:
                r[u] = f"({r[src[0]]}+{r[src[1]]})"
            elif op is Ops.LOAD:
                read = self.render_load(r[src[0]], u.dtype, src[0])
                # (INDEX), (INDEX, alternative, gate), or (INDEX, BARRIER) for local memory read after a barrier
                if len(src) == 3:
                    read = f"({r[src[2]]}?{read}:{r[src[1]]})"
                r[u] = fresh("val")
                line(f"{self.render_dtype(u.dtype)} {r[u]} = {read};")
            elif op is Ops.STORE:
                store = self.render_store(r[src[0]], r[src[1]], src[1].dtype, src[0])
                line(store if len(src) == 2 else f"if ({r[src[2]]}) {store}")
            elif op is Ops.VECTORIZE and users[u] and all(_lanes_only(x, u) for x in users[u]):
                r[u] = ""  # the C of a WGMMA chain's first instruction, the initial value of a register array: their
                # lanes are copied into the array
            elif op is Ops.VECTORIZE:
                value(u, self.render_vectorize(u.dtype, [r[s] for s in src]), "vec")
            elif op is Ops.GEP:
                if src[0].op is Ops.WGMMA and r[src[0]] in pending:
                    wait()
                lanes = u.arg if isinstance(u.arg, tuple) else (u.arg,)
                if src[0].dtype.count == 1:  # lanes of a scalar: the scalar itself
                    picked = [r[src[0]]] * len(lanes)
                else:
                    picked = [self.render_gep(r[src[0]], lane, src[0].dtype) for lane in lanes]
                value(u, picked[0] if len(picked) == 1 else self.render_vectorize(u.dtype, picked), "gep")
            elif op is Ops.SHUFFLE_XOR:
                # a statement of its own, never inlined: a ternary (a MAX, a WHERE) would run it in some threads only
                r[u] = fresh("shfl")
                line(f"{self.render_dtype(u.dtype)} {r[u]} = {self.render_shuffle_xor(r[src[0]], u.arg, u.dtype)};")
            elif op is Ops.WMMA:
                fn, _ = self.render_wmma(u)
                r[u] = fresh("wmma")
                line(f"{self.render_dtype(u.dtype)} {r[u]} = {fn}({', '.join(r[s] for s in src)});")
            elif op is Ops.WGMMA:
                c = src[2]
                lanes: list[str] | None = None
                if (c.op is Ops.WGMMA and users[c] == [u]) or register_array(c):
                    r[u] = r[c]  # accumulated in place, in the array of the instruction before it or the accumulator
                else:
                    r[u] = fresh("wg")
                    parts = c.src if c.op is Ops.VECTORIZE else (c,)
                    lanes = [
                        r[p] if p.dtype.count == 1 else self.render_gep(r[p], lane, p.dtype)
                        for p in parts
                        for lane in range(p.dtype.count)
                    ]
                chained = len(users[u]) == 1 and users[u][0].op is Ops.WGMMA and users[u][0].src[2] is u
                first = c.op is not Ops.WGMMA
                for text in self.render_wgmma(r[u], u, r[src[0]], r[src[1]], lanes, first):
                    line(text)
                if not chained:
                    pending[r[u]] = u.dtype.count
                    running = u.arg[7] if len(u.arg) > 7 else 0
            elif op is Ops.CAST:
                value(u, self.render_cast(r[src[0]], src[0].dtype, u.dtype), "cast")
            elif op is Ops.BITCAST:
                value(u, self.render_bitcast(r[src[0]], src[0].dtype, u.dtype), "cast")
            elif op in GroupOp.ALU:
                value(u, self.render_alu(op, u.dtype, [r[s] for s in src], [s.dtype for s in src]), "alu")
            else:
                raise NotImplementedError(f"{type(self).__name__} can't render {op} yet")
        wait()
        return self.render_kernel(kernel_function_name(uops), self.render_local_memory(shared) + lines, params, uops)


def _lanes_only(user: UOp, u: UOp) -> bool:
    """Whether `user` reads vector `u` only lane by lane, never as a value of its own: the C of a WGMMA, or the
    initial value of a register array."""
    if user.op is Ops.WGMMA:
        return user.src[2] is u
    return register_array(user) and user.src[0] is u


class CRenderer(CStyleLanguage):
    """Plain C for the host: one function `void name(T* data0, ..., const int var)` that runs every loop itself."""

    device = "CPU"
    suffix = "C"
    supports_float4 = False
    has_local = False
    has_shared = False
    prelude = ("#include <math.h>", "#include <stdbool.h>")
    type_map: ClassVar[dict[DType, str]] = {**CStyleLanguage.type_map, dtypes.float16: "_Float16"}

    def render_dtype(self, dtype: DType) -> str:
        """C type name; fp8 types have none."""
        if dtype.scalar() in (dtypes.fp8e4m3, dtypes.fp8e5m2):
            raise NotImplementedError(f"the C renderer has no type for {dtype} yet")
        return super().render_dtype(dtype)
