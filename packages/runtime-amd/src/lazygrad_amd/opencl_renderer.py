"""The OpenCL C renderer: codegen's C-style family specialised for OpenCL 1.2 devices.

What differs from plain C, and why:

- buffers are `__global` pointers and the function is a `__kernel`;
- hardware indices: with work-group dimensions (`lidx` indices) `gidx` is the work-group id and the kernel declares
  its work-group size with `reqd_work_group_size`, so the launcher knows it; without them `gidx` is the global
  work-item id, so the launcher may leave the work-group size to the driver (on PoCL a work-group of one item per
  element is some fifty times slower than the groups it picks);
- `bool` has no defined size in a buffer and no vector types, so bool buffers (global and local) hold `uchar`s and a
  vector of bools is a `uchar` vector of 0s and 1s;
- `half` needs `cl_khr_fp16` to be a value type. Without it (PoCL on most CPUs, some Intel drivers) a half buffer
  holds its 16 bits (`ushort`), values are floats in registers, read and written with the core `vload_half` and
  `vstore_half`, and every half result is rounded to half precision, so results match a device with real halves;
- OpenCL has no bfloat16: it is always stored as 16 bits and computed in float, rounded after each op;
- math functions are OpenCL's overloads (`exp2`, `log2`, `sin`, ...), and doubles need `cl_khr_fp64`;
- local memory (`DEFINE_LOCAL`) is a `__local` array, a `BARRIER` is `barrier(CLK_LOCAL_MEM_FENCE)`;
- vectors (`supports_float4`): 2- and 4-element loads and stores are `vloadN`/`vstoreN` in global and local memory
  (not loads through a pointer cast to `float4*`: PoCL's LLVM fails to select AVX-512 instructions for some kernels
  whose aligned vector loads feed comparisons, and vloadN needs no alignment of the address), vectors are built with
  literals `(float4)(a, b, c, d)` and read lane by lane (`.s0`); halves held as bits are read and written with
  `vload_halfN`/`vstore_halfN`, bfloat16 bits with `vloadN`/`vstoreN` and a shift or a rounding per lane.

The walk over the linear program is the base class's (`CStyleLanguage.render`), run on the program with its buffers
retyped to what they hold (`_with_storage_types`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import ClassVar

from lazygrad_codegen.cstyle import GPU_TYPE_NAMES, OVERLOADED_MATH, CStyleLanguage, Workgroup
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import Ops
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


def _bool_or(sym: str) -> Callable[..., str]:
    # on bools a sum is "or" and a product "and": C's + would give 2, which breaks a comparison it is inlined into
    logical = {"+": "|", "*": "&"}[sym]
    return lambda a, b, dtype: f"({a}{logical if dtypes.is_bool(dtype) else sym}{b})"


def _bf16_bits_vector(n: int) -> str:
    """The helper that rounds a vector of `n` floats to bfloat16 bits, lane by lane."""
    lanes = ", ".join(f"lg_bf16_bits(x.s{i:x})" for i in range(n))
    return f"static inline ushort{n} lg_bf16_bits{n}(float{n} x) {{ return (ushort{n})({lanes}); }}"


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
    supports_float4 = True
    has_local = True
    has_shared = True
    kernel_prefix: ClassVar[str] = "__kernel "
    buffer_prefix: ClassVar[str] = "__global "
    smem_prefix: ClassVar[str] = "__local "
    local_pointer_prefix: ClassVar[str] = "__local "
    barrier: ClassVar[str] = "barrier(CLK_LOCAL_MEM_FENCE);"
    code_for_workitem: ClassVar[dict[str, Callable[[int], str]]] = {
        "g": lambda d: f"get_group_id({d})",
        "l": lambda d: f"get_local_id({d})",
    }
    type_map: ClassVar[dict[DType, str]] = GPU_TYPE_NAMES
    int64_suffix: ClassVar[str] = "l"
    code_for_op: ClassVar[dict[Ops, Callable[..., str]]] = {
        **CStyleLanguage.code_for_op,
        Ops.ADD: _bool_or("+"),
        Ops.MUL: _bool_or("*"),
        **OVERLOADED_MATH,
    }

    def __init__(
        self,
        half_native: bool = False,
        fp64: bool = True,
        local_max: tuple[int, int, int] | None = None,
        shared_max: int = 32768,
        max_workgroup_threads: int = 256,
        compute_units: int = 0,
    ) -> None:
        self.half_native, self.fp64 = half_native, fp64
        # the device's compute units (CL_DEVICE_MAX_COMPUTE_UNITS; 0 when not opened on one), for split reductions
        self.compute_units = compute_units
        # instance attributes: the limits are the opened device's
        self.local_max = local_max
        self.shared_max = shared_max
        self.max_workgroup_threads = max_workgroup_threads
        # 16-bit float types held as their bits in buffers and as floats in registers
        self.emulated: frozenset[DType] = frozenset(
            {dtypes.bfloat16} if half_native else {dtypes.bfloat16, dtypes.float16}
        )

    # *** types, constants, conversions ***

    def render_dtype(self, dtype: DType) -> str:
        """The OpenCL type name; an emulated 16-bit float is a `float` in registers, a vector of bools a vector of
        `uchar`s."""
        if not isinstance(dtype, PtrDType) and dtype.scalar() in self.emulated:
            return "float" if dtype.count == 1 else f"float{dtype.count}"
        if not isinstance(dtype, PtrDType) and dtypes.is_bool(dtype.scalar()) and dtype.count > 1:
            return f"uchar{dtype.count}"
        return super().render_dtype(dtype)

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

    # *** vectors and memory ***

    def render_vectorize(self, dtype: DType, parts: list[str]) -> str:
        """A vector literal, `(float4)(a, b, c, d)`."""
        return f"({self.render_dtype(dtype)})({','.join(parts)})"

    def render_gep(self, x: str, lane: int, dtype: DType) -> str:
        """Lane `lane` of `x` by its number (`.s0` to `.sf`); a vector literal is parenthesised, as `.s0` would
        bind to its parts."""
        return f"{x if x.isidentifier() else f'({x})'}.s{lane:x}"

    def render_load(self, ptr: str, dtype: DType, index: UOp) -> str:
        """A read; vectors with `vloadN` (see `_vector_access`)."""
        access = self._vector_access(ptr, dtype, index)
        return super().render_load(ptr, dtype, index) if access is None else access[0]

    def render_store(self, ptr: str, value: str, dtype: DType, index: UOp) -> str:
        """A write; vectors with `vstoreN` (see `_vector_access`)."""
        access = self._vector_access(ptr, dtype, index)
        return super().render_store(ptr, value, dtype, index) if access is None else access[1](value)

    def _vector_access(self, ptr: str, dtype: DType, index: UOp) -> tuple[str, Callable[[str], str]] | None:
        """For a vector, the load expression and the store statement of a value (None for a scalar): `vloadN` and
        `vstoreN`, with halves and bfloat16 that memory holds as bits converted while read and rounded while
        written."""
        n = dtype.count
        if n == 1:
            return None
        if dtype.scalar() in self.emulated and index.dtype.base == dtypes.uint16:
            if dtype.scalar() == dtypes.float16:
                half = f"({self.address_space(index)}half*){ptr}"
                # vstore_halfN rounds to nearest even, as every half result here is rounded
                return f"vload_half{n}(0, {half})", lambda v: f"vstore_half{n}({v}, 0, {half});"
            bits = f"as_float{n}(convert_uint{n}(vload{n}(0, {ptr})) << 16)"
            return bits, lambda v: f"vstore{n}(lg_bf16_bits{n}({v}), 0, {ptr});"
        return f"vload{n}(0, {ptr})", lambda v: f"vstore{n}({v}, 0, {ptr});"

    # *** the kernel ***

    def render_workitem(self, kind: str, dim: int, workgroup: Workgroup | None) -> str:
        """With work-group dimensions `gidx` is the group id; without, the global work-item id, so the launcher may
        leave the work-group size to the driver."""
        if kind == "g" and workgroup is None:
            return f"get_global_id({dim})"
        return super().render_workitem(kind, dim, workgroup)

    def launch_attributes(self, workgroup: Workgroup | None) -> str:
        """The fixed work-group size, which the launcher reads back from the compiled kernel."""
        return "" if workgroup is None else f"__attribute__((reqd_work_group_size({','.join(map(str, workgroup))}))) "

    def render_prelude(self, uops: list[UOp]) -> list[str]:
        """Extension pragmas and helper functions for the types the kernel uses."""
        uses = {(u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype).scalar() for u in uops}
        lines: list[str] = []
        if dtypes.float64 in uses and not self.fp64:
            raise NotImplementedError("this OpenCL device has no cl_khr_fp64: it can't run float64 kernels")
        if dtypes.float64 in uses:
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        if dtypes.float16 in uses and self.half_native:
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
        if dtypes.float16 in uses and not self.half_native:
            lines.extend(_HALF_HELPERS)
            if dtypes.float64 in uses:
                lines.append(_HALF_DOUBLE_HELPER)
        if dtypes.bfloat16 in uses:
            lines.extend(_BF16_HELPERS)
            stored = sorted({u.src[1].dtype.count for u in uops if u.op is Ops.STORE and u.src[1].dtype.count > 1})
            lines.extend(_bf16_bits_vector(n) for n in stored)
        return lines

    def render(self, uops: list[UOp]) -> str:
        """OpenCL C of the linear program `uops`."""
        return super().render(self._with_storage_types(uops))

    def _storage(self, buf: UOp) -> DType | None:
        """What a DEFINE_GLOBAL or DEFINE_LOCAL of its dtype holds instead, or None when it holds that type itself
        (local memory holds emulated 16-bit floats as the floats they are in registers)."""
        if buf.op not in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL):
            return None
        if dtypes.is_bool(buf.dtype.base):
            return dtypes.uint8
        return dtypes.uint16 if buf.op is Ops.DEFINE_GLOBAL and buf.dtype.base in self.emulated else None

    def _with_storage_types(self, uops: list[UOp]) -> list[UOp]:
        """`uops` with bool buffers as uchar and emulated 16-bit float buffers in global memory as ushort: scalar
        loads convert after reading, scalar stores before writing (vectors convert in `render_load` and
        `render_store`)."""
        if not any(self._storage(u) is not None for u in uops):
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
            buf = u.src[0] if u.op is Ops.INDEX else u
            if (held := self._storage(buf)) is not None:
                nu = u.replace(dtype=held.ptr(u.dtype.size, u.dtype.local), src=src)
            elif u.op is Ops.LOAD and u.dtype.count == 1 and src[0].dtype.base != u.dtype:
                held = src[0].dtype.base
                ld = UOp(Ops.LOAD, held, (src[0], convert(src[1], held), src[2]) if len(src) == 3 else src)
                out.append(ld)
                nu = convert(ld, u.dtype)
                new[u] = nu
                continue
            elif u.op is Ops.STORE and src[1].dtype.count == 1 and src[0].dtype.base != src[1].dtype:
                nu = UOp(Ops.STORE, u.dtype, (src[0], convert(src[1], src[0].dtype.base), *src[2:]))
            else:
                nu = u if src == u.src else u.replace(src=src)
            new[u] = nu
            out.append(nu)
        return out
