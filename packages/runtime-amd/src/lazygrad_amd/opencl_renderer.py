"""The OpenCL C renderer: codegen's C-style family specialised for OpenCL 1.2 devices.

What differs from plain C, and why:

- buffers are `__global` pointers and the function is a `__kernel`;
- hardware indices: with work-group dimensions (`lidx` indices) `gidx` is the work-group id and the kernel declares
  its work-group size with `reqd_work_group_size`, so the launcher knows it; without them `gidx` is the global
  work-item id, so the launcher may leave the work-group size to the driver (on PoCL a work-group of one item per
  element is some fifty times slower than the groups it picks);
- `bool` has no defined size in a buffer, so bool buffers hold `uchar`s;
- `half` needs `cl_khr_fp16` to be a value type. Without it (PoCL on most CPUs, some Intel drivers) a half buffer
  holds its 16 bits (`ushort`), values are floats in registers, read and written with the core `vload_half` and
  `vstore_half`, and every half result is rounded to half precision, so results match a device with real halves;
- OpenCL has no bfloat16: it is always stored as 16 bits and computed in float, rounded after each op;
- math functions are OpenCL's overloads (`exp2`, `log2`, `sin`, ...), and doubles need `cl_khr_fp64`;
- local memory (`DEFINE_LOCAL`) is a `__local` array, a `BARRIER` is `barrier(CLK_LOCAL_MEM_FENCE)`.

The base class's walk knows only scalar ops without local memory, so the renderer walks the linear program itself
(`_Writer`), with the base's pieces (`render_alu`, `render_cast`, `render_const`, `render_dtype`) specialised here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import ClassVar

from lazygrad_codegen.cstyle import CStyleLanguage, kernel_function_name
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.uop import UOp

_HALF_HELPERS = (
    # vstore_half and vload_half are core OpenCL 1.2 and round to nearest even; a private ushort holds the bits
    "static inline float lg_half_value(ushort h) { return vload_half(0, (const half*)&h); }",
    "static inline ushort lg_half_bits(float x) { ushort h; vstore_half(x, 0, (half*)&h); return h; }",
    "static inline float lg_half_round(float x) { return lg_half_value(lg_half_bits(x)); }",
)
# doubles round to half directly: through float they would be rounded twice
_HALF_DOUBLE_HELPER = (
    "static inline float lg_half_from_double(double x) { ushort h; vstore_half(x, 0, (half*)&h); "
    "return lg_half_value(h); }"
)
_BF16_HELPERS = (
    "static inline float lg_bf16_value(ushort h) { return as_float(((uint)h) << 16); }",
    # round to nearest even on the upper 16 bits; a NaN stays a quiet NaN
    "static inline ushort lg_bf16_bits(float x) { uint b = as_uint(x); "
    "return isnan(x) ? (ushort)((b >> 16) | 0x40) : (ushort)((b + 0x7fff + ((b >> 16) & 1)) >> 16); }",
    "static inline float lg_bf16_round(float x) { return lg_bf16_value(lg_bf16_bits(x)); }",
)


def _overload(fn: str) -> Callable[..., str]:
    return lambda a, dtype: f"{fn}({a})"


def _bool_or(sym: str) -> Callable[..., str]:
    # on bools a sum is "or" and a product "and": C's + would give 2, which breaks a comparison it is inlined into
    logical = {"+": "|", "*": "&"}[sym]
    return lambda a, b, dtype: f"({a}{logical if dtypes.is_bool(dtype) else sym}{b})"


def _bits_of(value: float | int | bool, dtype: DType) -> int:
    """The 16 storage bits of `value` as `dtype` (half or bfloat16), rounded to nearest even."""
    value = float(value)
    if dtype == dtypes.float16:
        try:
            return struct.unpack("<H", struct.pack("<e", value))[0]
        except OverflowError:
            return 0x7C00 if value > 0 else 0xFC00
    b = struct.unpack("<I", struct.pack("<f", value))[0]
    if value != value:
        return (b >> 16) | 0x40
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


class OpenCLRenderer(CStyleLanguage):
    """OpenCL C for one device. `half_native`: whether the device has `cl_khr_fp16` (otherwise halves are stored as
    16 bits and computed in float); `fp64`: whether it has `cl_khr_fp64`; `local_max`, `shared_max` and
    `max_workgroup_threads`: the device's work-group limits (the defaults are what every OpenCL GPU offers)."""

    device = "CL"
    suffix = "CL"
    supports_float4 = False
    has_local = True
    has_shared = True
    kernel_prefix: ClassVar[str] = "__kernel "
    buffer_prefix: ClassVar[str] = "__global "
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
        dtypes.float32: "float",
        dtypes.float64: "double",
    }
    code_for_op: ClassVar[dict[Ops, Callable[..., str]]] = {
        **CStyleLanguage.code_for_op,
        Ops.ADD: _bool_or("+"),
        Ops.MUL: _bool_or("*"),
        Ops.EXP2: _overload("exp2"),
        Ops.LOG2: _overload("log2"),
        Ops.SIN: _overload("sin"),
        Ops.SQRT: _overload("sqrt"),
        Ops.TRUNC: _overload("trunc"),
    }

    def __init__(
        self,
        half_native: bool = False,
        fp64: bool = True,
        local_max: tuple[int, int, int] | None = None,
        shared_max: int = 32768,
        max_workgroup_threads: int = 256,
    ) -> None:
        self.half_native, self.fp64 = half_native, fp64
        # instance attributes: the limits are the opened device's
        self.local_max = local_max  # type: ignore[misc]
        self.shared_max = shared_max  # type: ignore[misc]
        self.max_workgroup_threads = max_workgroup_threads  # type: ignore[misc]
        # 16-bit float types held as their bits in buffers and as floats in registers
        self.emulated: frozenset[DType] = frozenset(
            {dtypes.bfloat16} if half_native else {dtypes.bfloat16, dtypes.float16}
        )

    # *** types, constants, conversions ***

    def render_dtype(self, dtype: DType) -> str:
        """The OpenCL type name; an emulated 16-bit float is a `float` in registers."""
        if not isinstance(dtype, PtrDType) and dtype.scalar() in self.emulated:
            return "float"
        return super().render_dtype(dtype)

    def render_const(self, value: float | int | bool, dtype: DType) -> str:
        """A literal of `dtype`; 64-bit integers take OpenCL's `l`/`ul` suffixes."""
        if dtype == dtypes.int64:
            v = int(value)
            return "(-9223372036854775807l-1)" if v == -(2**63) else (f"({v}l)" if v < 0 else f"{v}l")
        if dtype == dtypes.uint64:
            return f"{int(value)}ul"
        return super().render_const(value, dtype)

    def render_cast(self, x: str, src: DType, dest: DType) -> str:
        """`x` converted from `src` to `dest`: to bool is `!= 0`, to an emulated 16-bit float rounds the float."""
        s, d = src.scalar(), dest.scalar()
        if dtypes.is_bool(d):
            return f"(({x})!=0)"
        if d in self.emulated:
            if dtypes.is_bool(s):
                return self._round_to(d, f"(({x})?1.0f:0.0f)")
            if s == dtypes.float64 and d == dtypes.float16:
                return f"lg_half_from_double({x})"
            # an int too large for float is far past half's and bfloat16's range, so int -> float -> d is exact
            return self._round_to(d, f"((float)({x}))")
        return f"(({self.render_dtype(d)})({x}))"

    def _round_to(self, dtype: DType, x: str) -> str:
        return f"lg_half_round({x})" if dtype == dtypes.float16 else f"lg_bf16_round({x})"

    def render_bitcast(self, x: str, src: DType, dest: DType) -> str:
        """The bits of `x` as `dest`, with OpenCL's `as_<type>`; emulated 16-bit floats go through their bits."""
        s, d = src.scalar(), dest.scalar()
        if s in self.emulated:
            bits = f"lg_half_bits({x})" if s == dtypes.float16 else f"lg_bf16_bits({x})"
            return bits if d == dtypes.uint16 else f"as_{self.type_map[d]}({bits})"
        if d in self.emulated:
            bits = x if s == dtypes.uint16 else f"as_ushort({x})"
            return f"lg_half_value({bits})" if d == dtypes.float16 else f"lg_bf16_value({bits})"
        if dtypes.is_bool(s) or dtypes.is_bool(d):
            raise NotImplementedError("OpenCL can't bitcast bool: cast it instead")
        return f"as_{self.render_dtype(d)}({x})"

    # *** the kernel ***

    def render(self, uops: list[UOp]) -> str:
        """OpenCL C of the linear program `uops`."""
        return _Writer(self, self._with_storage_types(uops)).source()

    def _storage(self, dtype: DType) -> DType | None:
        """What a buffer of `dtype` holds instead, or None when it holds `dtype` itself."""
        if dtypes.is_bool(dtype):
            return dtypes.uint8
        return dtypes.uint16 if dtype in self.emulated else None

    def _with_storage_types(self, uops: list[UOp]) -> list[UOp]:
        """`uops` with bool buffers as uchar and emulated 16-bit float buffers as ushort: loads convert after
        reading, stores before writing."""
        if not any(u.op is Ops.DEFINE_GLOBAL and self._storage(u.dtype.base) is not None for u in uops):
            return uops
        out: list[UOp] = []
        new: dict[UOp, UOp] = {}

        def convert(x: UOp, dest: DType) -> UOp:
            if x.op is Ops.CONST:
                bits = int(x.arg) if dtypes.is_bool(x.dtype) or dtypes.is_bool(dest) else _bits_of(x.arg, x.dtype)
                c = UOp.const(dest, bits)
            else:
                c = UOp(Ops.CAST if dtypes.is_bool(x.dtype) or dtypes.is_bool(dest) else Ops.BITCAST, dest, (x,))
            out.append(c)
            return c

        for u in uops:
            src = tuple(new.get(s, s) for s in u.src)
            in_global = u.op is Ops.DEFINE_GLOBAL or (u.op is Ops.INDEX and u.src[0].op is Ops.DEFINE_GLOBAL)
            if in_global and (held := self._storage(u.dtype.base)) is not None:
                nu = u.replace(dtype=held.ptr(u.dtype.size), src=src)
            elif u.op is Ops.LOAD and src[0].dtype.base != u.dtype:
                held = src[0].dtype.base
                ld = UOp(Ops.LOAD, held, (src[0], convert(src[1], held), src[2]) if len(src) == 3 else src)
                out.append(ld)
                nu = convert(ld, u.dtype)
                new[u] = nu
                continue
            elif u.op is Ops.STORE and src[0].dtype.base != src[1].dtype:
                nu = UOp(Ops.STORE, u.dtype, (src[0], convert(src[1], src[0].dtype.base), *src[2:]))
            else:
                nu = u if src == u.src else u.replace(src=src)
            new[u] = nu
            out.append(nu)
        return out


class _Writer:
    """One rendering of one linear program: names values, writes statements, and collects what the kernel needs
    before it (extension pragmas, helper functions) and on it (its work-group size)."""

    def __init__(self, renderer: OpenCLRenderer, uops: list[UOp]) -> None:
        self.ren, self.uops = renderer, uops
        self.r: dict[UOp, str] = {}
        self.lines: list[str] = []
        self.params: list[tuple[str, DType]] = []
        self.counter: dict[str, int] = {}
        self.indent = 1
        self.users: dict[UOp, list[UOp]] = {u: [] for u in uops}
        self.depth_at: dict[UOp, int] = {}
        depth = 0
        for u in uops:
            if u.op in GroupOp.BlockEnd:
                depth -= 1
            self.depth_at[u] = depth
            if u.op in GroupOp.Block:
                depth += 1
            for s in u.src:
                if s in self.users:
                    self.users[s].append(u)
        local = {int(u.arg[0][-1]): int(u.arg[1]) for u in uops if u.op is Ops.SPECIAL and u.arg[0][0] == "l"}
        # with work-group dimensions gidx is the group id and the size is fixed; without, gidx is the global id
        self.work_group = (local.get(0, 1), local.get(1, 1), local.get(2, 1)) if local else None

    def fresh(self, prefix: str) -> str:
        self.counter[prefix] = self.counter.get(prefix, 0) + 1
        return f"{prefix}{self.counter[prefix] - 1}"

    def line(self, text: str) -> None:
        self.lines.append("  " * self.indent + text)

    def inline(self, u: UOp) -> bool:
        """Whether `u`'s expression can be written into its only user instead of into a variable of its own."""
        us = self.users[u]
        if len(us) != 1 or self.depth_at[us[0]] != self.depth_at[u] or us[0].op in GroupOp.Block:
            return False
        # a value read from an accumulator must be read where it stands, unless it is what gets assigned back
        return us[0].op is Ops.ASSIGN or not any(s.op is Ops.DEFINE_ACC for s in u.src)

    def value(self, u: UOp, expr: str, prefix: str) -> None:
        """Name `u`'s value: its expression if it is inlined, else a new variable holding it."""
        if self.inline(u):
            self.r[u] = expr
        else:
            self.r[u] = self.fresh(prefix)
            self.line(f"{self.ren.render_dtype(u.dtype)} {self.r[u]} = {expr};")

    def workitem(self, name: str) -> str:
        dim = int(name[-1])
        if name[0] == "l":
            return f"get_local_id({dim})"
        if name[0] == "g":
            return f"get_group_id({dim})" if self.work_group is not None else f"get_global_id({dim})"
        raise NotImplementedError(f"the OpenCL renderer has no hardware index named {name}")

    def source(self) -> str:
        ren, r = self.ren, self.r
        for u in self.uops:
            op, src = u.op, u.src
            if op is Ops.SINK:
                continue
            if op is Ops.DEFINE_GLOBAL:
                r[u] = f"data{u.arg}"
                self.params.append((r[u], u.dtype))
            elif op is Ops.DEFINE_VAR:
                r[u] = u.arg[0]
                self.params.append((r[u], u.dtype))
            elif op is Ops.DEFINE_LOCAL:
                if not isinstance(u.dtype, PtrDType) or u.dtype.size <= 0:
                    raise ValueError(f"DEFINE_LOCAL {u.arg!r} needs a pointer dtype of known size, got {u.dtype!r}")
                r[u] = u.arg if isinstance(u.arg, str) and u.arg.isidentifier() else f"temp{u.arg}"
                self.line(f"__local {ren.render_dtype(u.dtype.base)} {r[u]}[{u.dtype.size}];")
            elif op is Ops.CONST:
                r[u] = ren.render_const(u.arg, u.dtype)
            elif op is Ops.SPECIAL:
                name, size = u.arg
                r[u] = name
                self.line(f"int {name} = {self.workitem(name)}; /* {size} */")
            elif op is Ops.RANGE:
                r[u] = f"ridx{u.arg}"
                self.line(f"for (int {r[u]} = 0; {r[u]} < {r[src[0]]}; {r[u]}++) {{")
                self.indent += 1
            elif op is Ops.IF:
                self.line(f"if ({r[src[0]]}) {{")
                self.indent += 1
            elif op in GroupOp.BlockEnd:
                self.indent -= 1
                self.line("}")
            elif op is Ops.BARRIER:
                self.line("barrier(CLK_LOCAL_MEM_FENCE);")
            elif op is Ops.DEFINE_ACC:
                r[u] = f"acc{u.arg[0]}"
                self.line(f"{ren.render_dtype(u.dtype)} {r[u]} = {r[src[0]]};")
            elif op is Ops.ASSIGN:
                r[u] = r[src[0]]
                self.line(f"{r[u]} = {r[src[1]]};")
            elif op is Ops.INDEX:
                r[u] = f"({r[src[0]]}+{r[src[1]]})"
            elif op is Ops.LOAD:
                # a second source that is a BARRIER only orders the load after it
                gated = len(src) == 3
                value = f"({r[src[2]]}?*{r[src[0]]}:{r[src[1]]})" if gated else f"(*{r[src[0]]})"
                r[u] = self.fresh("val")
                self.line(f"{ren.render_dtype(u.dtype)} {r[u]} = {value};")
            elif op is Ops.STORE:
                store = f"*{r[src[0]]} = {r[src[1]]};"
                self.line(store if len(src) == 2 else f"if ({r[src[2]]}) {store}")
            elif op is Ops.CAST:
                self.value(u, ren.render_cast(r[src[0]], src[0].dtype, u.dtype), "cast")
            elif op is Ops.BITCAST:
                self.value(u, ren.render_bitcast(r[src[0]], src[0].dtype, u.dtype), "cast")
            elif op in GroupOp.ALU:
                self.value(u, ren.render_alu(op, u.dtype, [r[s] for s in src], [s.dtype for s in src]), "alu")
            else:
                # vectors (VECTORIZE, GEP) don't reach a renderer whose vector_width is 1; WMMA needs tensor cores
                raise NotImplementedError(f"the OpenCL renderer can't render {op}")
        return self.assemble()

    def prelude(self) -> list[str]:
        """Extension pragmas and helper functions for the types the kernel uses."""
        uses = {(u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype).scalar() for u in self.uops}
        lines: list[str] = []
        if dtypes.float64 in uses and not self.ren.fp64:
            raise NotImplementedError("this OpenCL device has no cl_khr_fp64: it can't run float64 kernels")
        if dtypes.float64 in uses:
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        if dtypes.float16 in uses and self.ren.half_native:
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
        if dtypes.float16 in uses and not self.ren.half_native:
            lines.extend(_HALF_HELPERS)
            if dtypes.float64 in uses:
                lines.append(_HALF_DOUBLE_HELPER)
        if dtypes.bfloat16 in uses:
            lines.extend(_BF16_HELPERS)
        return lines

    def assemble(self) -> str:
        ren = self.ren
        args = [
            f"{ren.buffer_prefix}{ren.render_dtype(dt)} {name}"
            if isinstance(dt, PtrDType)
            else f"{ren.arg_int_prefix} {name}"
            for name, dt in self.params
        ]
        # the launcher reads the required size back from the compiled kernel
        size = (
            ""
            if self.work_group is None
            else f"__attribute__((reqd_work_group_size({','.join(map(str, self.work_group))}))) "
        )
        head = f"{ren.kernel_prefix}{size}void {kernel_function_name(self.uops)}({', '.join(args)}) {{"
        return "\n".join([*self.prelude(), head, *self.lines, "}", ""])
