"""The LLVM IR renderer family: `LLVMRenderer` turns a linear program into one LLVM IR function, which a device
package compiles for its target (the CPU with llvmlite; GPU targets specialise the parameters and hardware indices).

How the IR is shaped, and why:

- loops are a header block with a phi for the index, a body, and a latch block that steps it, so LLVM sees
  canonical counted loops it can vectorise;
- accumulators live in stack slots (`alloca` in the entry block, read with `load`, written with `store`); LLVM's
  mem2reg turns them into phis, which is simpler than threading phis through nested loops here;
- float adds and multiplies that fold into an accumulator carry the `reassoc` flag, so the loop vectoriser may
  reorder the reduction into vector lanes;
- index arithmetic carries `nsw`, so scalar evolution can prove that consecutive iterations touch consecutive
  elements;
- on targets with `based_addresses` (the CPU), an element `base + c` of a buffer is a constant offset from one
  pointer per (buffer, base), made where `base` is computed: the lanes of a strided view cost LLVM one address each
  instead of an add, a sign extension and a GEP that its passes (IndVarSimplify, SLP, InstCombine) work through one
  by one. The lanes of a vector with gated (padding) loads keep their indexes: SLP makes masked gathers of those;
- a gated load reads element 0 when its gate is false (its own index may be out of bounds) and selects the
  alternative value, which keeps the loop branch-free;
- `bool` is `i1` in registers and `i8` in memory; `bfloat16` is its 16 bits in an `i16`, computed in float32;
- vectors are LLVM vectors (`<8 x float>`): a vector LOAD or STORE moves consecutive elements (aligned to one
  element), `VECTORIZE` is a constant vector, a splat, a `shufflevector` when its lanes are lanes of one or two
  vectors, or else a chain of `insertelement`, `GEP` an `extractelement` or a `shufflevector`; the multiplies and
  adds of a reduction carry `contract` too, so LLVM fuses them into FMAs;
- on targets with `polynomial_math` (the CPU), float32 and float16 exp2, log2 and sin call `llvm_math`'s functions,
  defined in the module, instead of LLVM's intrinsics, which the host lowers to a C library call per lane;
- on targets with `prefetch_bytes` (the CPU), a vector load in a reduction's innermost loop whose address steps
  forward by a constant asks for the line it will read that many bytes later (`llvm.prefetch`): measured on the 2-core
  Xeon, a 256 MiB sum read 32.6-33.2 GB/s with it against 29.8-31.6 without.
"""

from __future__ import annotations

import math
import re
import struct
from typing import ClassVar

from lazygrad_codegen import llvm_math
from lazygrad_codegen.cstyle import kernel_function_name
from lazygrad_codegen.vectors import split_offset
from lazygrad_uop.device import Renderer
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import linear_strides

_LTYPE: dict[DType, str] = {
    dtypes.bool: "i1",
    dtypes.int8: "i8",
    dtypes.uint8: "i8",
    dtypes.int16: "i16",
    dtypes.uint16: "i16",
    dtypes.int32: "i32",
    dtypes.uint32: "i32",
    dtypes.int64: "i64",
    dtypes.uint64: "i64",
    dtypes.float16: "half",
    dtypes.bfloat16: "i16",
    dtypes.float32: "float",
    dtypes.float64: "double",
}
# the metadata node marking a store non-temporal
NONTEMPORAL = 0
_INTRINSIC_SUFFIX = {"half": "f16", "float": "f32", "double": "f64"}
# computed by llvm_math's polynomials on renderers with `polynomial_math`
_POLYNOMIAL_MATH = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin"}
_MATH_INTRINSICS = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}


def ltype(dtype: DType) -> str:
    """The LLVM type of a value of `dtype` in a register (`<n x t>` for a vector)."""
    if isinstance(dtype, PtrDType):
        return "ptr"
    if dtype.scalar() not in _LTYPE:
        raise NotImplementedError(f"the LLVM renderer has no type for {dtype} yet (fp8 types are not supported)")
    return _vector_type(_LTYPE[dtype.scalar()], dtype.count)


def mtype(dtype: DType) -> str:
    """The LLVM type of `dtype` in memory (a bool is a byte there)."""
    return _vector_type("i8", dtype.count) if dtypes.is_bool(dtype) else ltype(dtype)


def vec_of(dtype: DType, count: int) -> DType:
    """`dtype` with `count` lanes (the scalar itself for one)."""
    return dtype if count == 1 else dtype.vec(count)


def _vector_type(scalar: str, count: int) -> str:
    return scalar if count == 1 else f"<{count} x {scalar}>"


def _intrinsic_suffix(t: str, count: int) -> str:
    """The overload suffix of an intrinsic on scalar LLVM type `t` with `count` lanes: f32, v8f32, i32, v4i32."""
    base = _INTRINSIC_SUFFIX.get(t, t)
    return base if count == 1 else f"v{count}{base}"


def lconst(value: float | int | bool, dtype: DType) -> str:
    """An LLVM literal of `dtype`."""
    scalar = dtype.scalar()
    if dtypes.is_bool(scalar):
        return "true" if value else "false"
    if scalar == dtypes.bfloat16:
        return str(struct.unpack("<h", _bf16_bits(float(value)))[0])
    if scalar == dtypes.float16:
        return f"0xH{struct.unpack('<H', struct.pack('<e', float(value)))[0]:04X}"
    if dtypes.is_float(scalar):
        # LLVM takes float constants as the hex of the double of equal value (float32 values are exact doubles)
        return f"0x{struct.unpack('<Q', struct.pack('<d', float(value)))[0]:016X}"
    bits = 8 * scalar.itemsize
    v = int(value) & ((1 << bits) - 1)
    return str(v - (1 << bits) if v >= 1 << (bits - 1) else v)


def _bf16_bits(x: float) -> bytes:
    """The bfloat16 bits of `x`, rounded to nearest even as the renderer's conversion does."""
    if math.isnan(x):
        return struct.pack("<H", 0x7FC0)
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFFFFFF
    return struct.pack("<H", b >> 16)


class LLVMFunction:
    """One function being rendered: its lines, the SSA value of each UOp, its stack slots and declarations.
    Target hooks (`LLVMRenderer.render_special`) get it to emit instructions with `op` and read values with `get`."""

    def __init__(self, renderer: LLVMRenderer, uops: list[UOp]) -> None:
        self.renderer = renderer
        self.uops = uops
        self.val: dict[UOp, str] = {}
        self.allocas: list[str] = []
        self.lines: list[str] = []
        self.declares: set[str] = set()
        # functions the module defines beside the kernel (llvm_math's), by name
        self.definitions: dict[str, str] = {}
        # whether any store is non-temporal
        self.streamed = False
        self.params: list[str] = []
        self.n = 0
        self.index_math = _index_math(uops)
        self.accumulate = _accumulation(uops)
        self.position = {u: i for i, u in enumerate(uops)}
        users = _users(uops)
        self.shuffled = _shuffled_lanes(users)
        # vectors of lane loads gathered with one masked gather; the loads and indexes only they use
        self.gathers, self.gathered = (
            _gathered_lanes(uops, users, self.position) if renderer.gathers else (set(), set())
        )
        # addresses as a pointer per (buffer, index base) and a constant offset from it: the buffers indexed at
        # each base, the INDEXes addressed so and the `base + c` ADDs only they use (not rendered)
        self.based, self.offsets, self.folded = (
            _based_indexes(uops, users, self.gathered) if renderer.based_addresses else ({}, set(), set())
        )
        self.base_ptr: dict[tuple[UOp, UOp], str] = {}
        # the loops reductions run over; each vector load's innermost loop, and the bytes each iteration of a loop
        # reads from a buffer by vector loads directly in it
        self.reduce_loops = {r for u in uops if u.op is Ops.DEFINE_ACC for r in u.src[1:]}
        self.load_loop, self.loop_reads = _loop_reads(uops) if renderer.prefetch_bytes else ({}, {})

    def tmp(self) -> str:
        """A fresh SSA name."""
        self.n += 1
        return f"%v{self.n}"

    def emit(self, text: str) -> None:
        """Append one instruction."""
        self.lines.append(f"  {text}")

    def label(self, name: str) -> None:
        """Start the basic block `name`."""
        self.lines.append(f"{name}:")

    def op(self, text: str) -> str:
        """Emit `%tmp = text` and return %tmp."""
        t = self.tmp()
        self.emit(f"{t} = {text}")
        return t

    def get(self, u: UOp) -> str:
        """The value of `u` where it is used; an accumulator is read from its stack slot at that point."""
        if u.op in (Ops.DEFINE_ACC, Ops.ASSIGN):
            acc = u if u.op is Ops.DEFINE_ACC else u.src[0]
            return self.op(f"load {ltype(acc.dtype)}, ptr {self.val[acc]}")
        return self.val[u]

    def splat(self, literal: str, scalar: str, count: int) -> str:
        """The constant `literal` of scalar LLVM type `scalar`, in every one of `count` lanes."""
        return literal if count == 1 else "<" + ", ".join([f"{scalar} {literal}"] * count) + ">"

    def call(self, ret: str, name: str, args: list[tuple[str, str]]) -> str:
        """Call function `name` (declared once at the end of the module) with (type, value) `args`."""
        self.declares.add(f"declare {ret} @{name}({', '.join(t for t, _ in args)})")
        return self.op(f"call {ret} @{name}({', '.join(f'{t} {v}' for t, v in args)})")

    # *** conversions ***

    def bf16_to_f32(self, v: str, n: int = 1) -> str:
        """The float32 of bfloat16 bits `v` (`n` lanes; exact: bfloat16 is float32's upper half)."""
        i16, i32, f32 = (_vector_type(t, n) for t in ("i16", "i32", "float"))
        wide = self.op(f"zext {i16} {v} to {i32}")
        shifted = self.op(f"shl {i32} {wide}, {self.splat('16', 'i32', n)}")
        return self.op(f"bitcast {i32} {shifted} to {f32}")

    def f32_to_bf16(self, v: str, n: int = 1) -> str:
        """The bfloat16 bits of float32 `v` (`n` lanes), rounded to nearest even; NaN stays a (quiet) NaN."""
        i16, i32, f32, i1 = (_vector_type(t, n) for t in ("i16", "i32", "float", "i1"))
        c = lambda x: self.splat(str(x), "i32", n)  # noqa: E731
        bits = self.op(f"bitcast {f32} {v} to {i32}")
        odd = self.op(f"and {i32} {self.op(f'lshr {i32} {bits}, {c(16)}')}, {c(1)}")
        rounded = self.op(f"add {i32} {bits}, {self.op(f'add {i32} {odd}, {c(32767)}')}")
        quiet = self.op(f"or {i32} {bits}, {c(4194304)}")
        isnan = self.op(f"fcmp uno {f32} {v}, zeroinitializer")
        picked = self.op(f"select {i1} {isnan}, {i32} {quiet}, {i32} {rounded}")
        return self.op(f"trunc {i32} {self.op(f'lshr {i32} {picked}, {c(16)}')} to {i16}")

    def f64_to_f32_round_to_odd(self, v: str, n: int = 1) -> str:
        """double -> float rounded toward zero with the last bit set when inexact, so that a second rounding (to
        half) gives the correctly rounded result."""
        f64, f32, i32, i1 = (_vector_type(t, n) for t in ("double", "float", "i32", "i1"))
        one = self.splat("1", "i32", n)
        fabs = f"llvm.fabs.{_intrinsic_suffix('double', n)}"
        r = self.op(f"fptrunc {f64} {v} to {f32}")
        back = self.op(f"fpext {f32} {r} to {f64}")
        inexact = self.op(f"fcmp one {f64} {back}, {v}")
        bits = self.op(f"bitcast {f32} {r} to {i32}")
        # rounded away from zero: step one ulp back toward zero (the magnitude is in the low 31 bits)
        abs_back = self.call(f64, fabs, [(f64, back)])
        away = self.op(f"fcmp ogt {f64} {abs_back}, {self.call(f64, fabs, [(f64, v)])}")
        stepped = self.op(f"select {i1} {away}, {i32} {self.op(f'sub {i32} {bits}, {one}')}, {i32} {bits}")
        odd = self.op(f"select {i1} {inexact}, {i32} {self.op(f'or {i32} {stepped}, {one}')}, {i32} {bits}")
        return self.op(f"bitcast {i32} {odd} to {f32}")

    def cast(self, v: str, src: DType, dest: DType) -> str:
        """`v` converted from `src` to `dest` with C semantics (float to int truncates, to bool is != 0); vectors
        convert lane by lane."""
        s, d, n = src.scalar(), dest.scalar(), dest.count
        for dt in (s, d):
            if dt in (dtypes.fp8e4m3, dtypes.fp8e5m2):
                raise NotImplementedError(f"the LLVM renderer can't convert {dt} yet")
        if s == d:
            return v
        f32 = vec_of(dtypes.float32, n)
        if s == dtypes.bfloat16:
            return self.cast(self.bf16_to_f32(v, n), f32, dest)
        if d == dtypes.bfloat16:
            return self.f32_to_bf16(self.cast(v, src, f32), n)
        # LLVM lowers conversions between half and anything but float to compiler-rt calls that aren't loaded in
        # this process: go through float (exact for every int half can hold; doubles are rounded to odd first)
        if s == dtypes.float16 and d != dtypes.float32:
            return self.cast(self.cast(v, src, f32), f32, dest)
        if d == dtypes.float16 and s != dtypes.float32:
            mid = self.f64_to_f32_round_to_odd(v, n) if s == dtypes.float64 else self.cast(v, src, f32)
            return self.cast(mid, f32, dest)
        st, dt = ltype(src), ltype(dest)
        if dtypes.is_bool(d):
            return self.op(
                f"fcmp une {st} {v}, zeroinitializer" if dtypes.is_float(s) else f"icmp ne {st} {v}, zeroinitializer"
            )
        if dtypes.is_bool(s):
            return self.op(f"uitofp {st} {v} to {dt}" if dtypes.is_float(d) else f"zext {st} {v} to {dt}")
        if dtypes.is_float(s) and dtypes.is_float(d):
            return self.op(f"{'fpext' if d.itemsize > s.itemsize else 'fptrunc'} {st} {v} to {dt}")
        if dtypes.is_float(s):
            return self.op(f"{'fptoui' if dtypes.is_unsigned(d) else 'fptosi'} {st} {v} to {dt}")
        if dtypes.is_float(d):
            return self.op(f"{'uitofp' if dtypes.is_unsigned(s) else 'sitofp'} {st} {v} to {dt}")
        if d.itemsize == s.itemsize:
            return v
        if d.itemsize < s.itemsize:
            return self.op(f"trunc {st} {v} to {dt}")
        return self.op(f"{'zext' if dtypes.is_unsigned(s) else 'sext'} {st} {v} to {dt}")

    # *** ops ***

    def alu(self, u: UOp) -> str:
        """The value of ALU op `u` (on scalars or vectors)."""
        op, dtype, n = u.op, u.dtype.scalar(), u.dtype.count
        operand_dtype = u.src[0].dtype.scalar() if op is not Ops.WHERE else dtype
        if operand_dtype == dtypes.bfloat16 and op is not Ops.WHERE:
            # bfloat16 math happens in float32, rounded back once per op as numpy-style libraries do
            args = [self.bf16_to_f32(self.get(s), n) for s in u.src]
            out = self.alu_on(op, dtypes.float32, dtypes.bool if op in GroupOp.Comparison else dtypes.float32, args, u)
            return out if op in GroupOp.Comparison else self.f32_to_bf16(out, n)
        return self.alu_on(op, operand_dtype, dtype, [self.get(s) for s in u.src], u)

    def alu_on(self, op: Ops, dt: DType, out_dt: DType, a: list[str], u: UOp) -> str:
        """ALU op `op` on operands `a` of scalar type `dt` (the condition excepted for WHERE) with as many lanes as
        `u`, giving `out_dt`."""
        n = u.dtype.count
        s = ltype(dt)
        t = _vector_type(s, n)
        is_float, is_bool, unsigned = dtypes.is_float(dt), dtypes.is_bool(dt), dtypes.is_unsigned(dt)
        if op is Ops.WHERE:
            return self.op(f"select {_vector_type('i1', n)} {a[0]}, {t} {a[1]}, {t} {a[2]}")
        if op is Ops.CMPLT:
            cmp = "fcmp olt" if is_float else f"icmp {'ult' if unsigned or is_bool else 'slt'}"
            return self.op(f"{cmp} {t} {a[0]}, {a[1]}")
        if op is Ops.CMPNE:
            return self.op(f"{'fcmp une' if is_float else 'icmp ne'} {t} {a[0]}, {a[1]}")
        if op in (Ops.ADD, Ops.MUL):
            if is_bool:
                return self.op(f"{'or' if op is Ops.ADD else 'and'} {t} {a[0]}, {a[1]}")
            if is_float:
                # a reduction may be reordered (so the loop vectoriser can split it over lanes) and its multiplies
                # fused into its adds
                flags = "reassoc contract " if u in self.accumulate else ""
                return self.op(f"{'fadd' if op is Ops.ADD else 'fmul'} {flags}{t} {a[0]}, {a[1]}")
            flags = " nsw" if u in self.index_math else ""
            return self.op(f"{'add' if op is Ops.ADD else 'mul'}{flags} {t} {a[0]}, {a[1]}")
        if op in (Ops.IDIV, Ops.MOD):
            if is_float:
                raise NotImplementedError(f"{op} is defined on integers only, got {dt}")
            kind = ("u" if unsigned or is_bool else "s") + ("div" if op is Ops.IDIV else "rem")
            return self.op(f"{kind} {t} {a[0]}, {a[1]}")
        if op is Ops.MAX:
            if is_bool:
                return self.op(f"or {t} {a[0]}, {a[1]}")
            # llvm.maximum propagates NaN, as numpy's maximum does (maxnum would drop it)
            suffix = _intrinsic_suffix(s, n)
            name = f"llvm.maximum.{suffix}" if is_float else f"llvm.{'umax' if unsigned else 'smax'}.{suffix}"
            return self.call(t, name, [(t, a[0]), (t, a[1])])
        if op in (Ops.AND, Ops.OR, Ops.XOR, Ops.SHL):
            if is_float:
                raise NotImplementedError(f"{op} is defined on integers and bools only, got {dt}")
            return self.op(f"{op.name.lower()} {t} {a[0]}, {a[1]}")
        if op is Ops.SHR:
            return self.op(f"{'lshr' if unsigned else 'ashr'} {t} {a[0]}, {a[1]}")
        if op is Ops.NEG:
            if is_bool:
                return self.op(f"xor {t} {a[0]}, {self.splat('true', 'i1', n)}")
            return self.op(f"fneg {t} {a[0]}" if is_float else f"sub {t} zeroinitializer, {a[0]}")
        if op is Ops.RECIP:
            return self.op(f"fdiv {t} {self.splat(lconst(1.0, dt), s, n)}, {a[0]}")
        if op in _POLYNOMIAL_MATH and self.renderer.polynomial_math and dt in (dtypes.float32, dtypes.float16):
            return self.polynomial(_POLYNOMIAL_MATH[op], dt, n, a[0])
        if op in _MATH_INTRINSICS:
            return self.call(t, f"llvm.{_MATH_INTRINSICS[op]}.{_intrinsic_suffix(s, n)}", [(t, a[0])])
        if op is Ops.MULACC:
            if is_float:
                return self.call(t, f"llvm.fmuladd.{_intrinsic_suffix(s, n)}", [(t, x) for x in a])
            return self.op(f"add {t} {self.op(f'mul {t} {a[0]}, {a[1]}')}, {a[2]}")
        raise NotImplementedError(f"the LLVM renderer can't render {op} yet")

    def polynomial(self, op: str, dt: DType, n: int, x: str) -> str:
        """`op` of `x` (float32 or float16, n lanes) by `llvm_math`'s function, which the module then defines; a
        float16 is computed in float32 and rounded back."""
        name = llvm_math.function_name(op, n)
        if name not in self.definitions:
            self.definitions[name], declares = llvm_math.definition(op, n)
            self.declares |= declares
        f32 = _vector_type("float", n)
        if dt == dtypes.float16:
            wide = self.op(f"fpext {_vector_type('half', n)} {x} to {f32}")
            return self.op(f"fptrunc {f32} {self.op(f'call {f32} @{name}({f32} {wide})')} to {_vector_type('half', n)}")
        return self.op(f"call {f32} @{name}({f32} {x})")

    def vectorize(self, u: UOp) -> str:
        """The vector of `u`'s scalar sources: a constant vector, a splat, or a chain of insertelements."""
        t, s = ltype(u.dtype), ltype(u.dtype.scalar())
        if all(x.op is Ops.CONST for x in u.src):
            return "<" + ", ".join(f"{s} {lconst(x.arg, x.dtype)}" for x in u.src) + ">"
        if (sources := _lane_sources(u)) is not None:
            return self.shuffle(u, sources)
        if u in self.gathers:
            return self.gather(u)
        if len(set(u.src)) == 1:
            one = self.op(f"insertelement {t} poison, {s} {self.get(u.src[0])}, i32 0")
            return self.op(f"shufflevector {t} {one}, {t} poison, <{u.dtype.count} x i32> zeroinitializer")
        v = "poison"
        for lane, x in enumerate(u.src):
            v = self.op(f"insertelement {t} {v}, {s} {self.get(x)}, i32 {lane}")
        return v

    def shuffle(self, u: UOp, sources: list[UOp]) -> str:
        """`u`, a VECTORIZE of single lanes of one or two vectors of the same type, as one shufflevector (the
        second operand's lanes are numbered after the first's, as LLVM's mask does)."""
        t = ltype(sources[0].dtype)
        a = self.get(sources[0])
        b = self.get(sources[1]) if len(sources) == 2 else "poison"
        count = sources[0].dtype.count
        mask = ", ".join(f"i32 {g.arg[0] + count * sources.index(g.src[0])}" for g in u.src)
        return self.op(f"shufflevector {t} {a}, {t} {b}, <{u.dtype.count} x i32> <{mask}>")

    def lanes(self, values: list[UOp], dtype: DType) -> str:
        """A vector of `values` (scalars of `dtype`): constant, a splat or (ints) `x + constants` as one vector add,
        or insertelements."""
        n, t, s = len(values), ltype(vec_of(dtype, len(values))), ltype(dtype)
        if all(v.op is Ops.CONST for v in values):
            return "<" + ", ".join(f"{s} {lconst(v.arg, dtype)}" for v in values) + ">"
        offsets = [split_offset(v) if dtypes.is_int(dtype) else (v, 0) for v in values]
        if len({base for base, _ in offsets}) == 1 and offsets[0][0] is not None:
            one = self.op(f"insertelement {t} poison, {s} {self.get(offsets[0][0])}, i32 0")
            splat = self.op(f"shufflevector {t} {one}, {t} poison, <{n} x i32> zeroinitializer")
            if all(c == 0 for _, c in offsets):
                return splat
            consts = "<" + ", ".join(f"{s} {lconst(c, dtype)}" for _, c in offsets) + ">"
            return self.op(f"add {t} {splat}, {consts}")
        v = "poison"
        for lane, x in enumerate(values):
            v = self.op(f"insertelement {t} {v}, {s} {self.get(x)}, i32 {lane}")
        return v

    def gather(self, u: UOp) -> str:
        """`u`, a VECTORIZE of scalar loads from one buffer (and constants: padding), as one masked gather: a vector
        of indexes (usually one vector add), a vector of gates (a constant lane is a gated-off one) and a vector of
        the values gated-off lanes take, instead of an index, an address, a load and selects per lane."""
        n, dtype = u.dtype.count, u.dtype.scalar()
        loads = [x for x in u.src if x.op is Ops.LOAD]
        idx_dtype = loads[0].src[0].src[1].dtype
        index = self.lanes([(x if x.op is Ops.LOAD else loads[0]).src[0].src[1] for x in u.src], idx_dtype)
        buf = self.get(loads[0].src[0].src[0])
        ptrs = self.op(f"getelementptr inbounds {ltype(dtype)}, ptr {buf}, {ltype(vec_of(idx_dtype, n))} {index}")
        gates: list[UOp | bool] = [x.op is Ops.LOAD and (x.src[2] if len(x.src) == 3 else True) for x in u.src]
        if all(isinstance(g, bool) for g in gates):
            mask = "<" + ", ".join(f"i1 {str(g).lower()}" for g in gates) + ">"
        elif len(set(gates)) == 1:
            mask = self.lanes([gates[0]] * n, dtypes.bool)  # type: ignore[list-item]
        else:
            # the constant lanes first, in one literal, then an insertelement per gated lane
            mask = "<" + ", ".join(f"i1 {str(g).lower() if isinstance(g, bool) else 'false'}" for g in gates) + ">"
            for lane, g in enumerate(gates):
                if not isinstance(g, bool):
                    mask = self.op(f"insertelement <{n} x i1> {mask}, i1 {self.get(g)}, i32 {lane}")
        # what a gated-off lane reads as: a constant lane's value, a gated load's alternative (any value elsewhere)
        alts = [x if x.op is Ops.CONST else x.src[1] if len(x.src) == 3 else None for x in u.src]
        fill = next((a for a in alts if a is not None), None)
        passthru = "poison" if fill is None else self.lanes([fill if a is None else a for a in alts], dtype)
        t, suffix = ltype(u.dtype), _intrinsic_suffix(ltype(dtype), n)
        args = [(f"<{n} x ptr>", ptrs), ("i32", str(max(dtype.itemsize, 1))), (f"<{n} x i1>", mask), (t, passthru)]
        return self.call(t, f"llvm.masked.gather.{suffix}.v{n}p0", args)

    def gep(self, u: UOp) -> str:
        """Lanes of a vector: one lane with extractelement, several with shufflevector."""
        src = u.src[0]
        t = ltype(src.dtype)
        if len(u.arg) == 1:
            return self.op(f"extractelement {t} {self.get(src)}, i32 {u.arg[0]}")
        mask = ", ".join(f"i32 {lane}" for lane in u.arg)
        return self.op(f"shufflevector {t} {self.get(src)}, {t} poison, <{len(u.arg)} x i32> <{mask}>")

    def element_pointer(self, buf: UOp, base: UOp) -> str:
        """A pointer to element `base` of buffer `buf`. No `inbounds`: the base of a padded view's index may lie
        outside its buffer while every element read at a constant offset from it is inside."""
        return self.op(
            f"getelementptr {mtype(buf.dtype.base)}, ptr {self.val[buf]}, {ltype(base.dtype)} {self.val[base]}"
        )

    def base_pointers(self, base: UOp) -> None:
        """The pointer to element `base` of each buffer indexed at `base + c`, emitted where `base` is defined: it
        dominates every use there, and sits outside the loops that `base` doesn't vary in."""
        for buf in self.based[base]:
            if buf in self.val:
                self.base_ptr[(buf, base)] = self.element_pointer(buf, base)

    def based_index(self, index: UOp) -> str:
        """The address of INDEX `index` (one of `offsets`): its constant offset from the pointer to its base element
        (from the buffer itself for a constant index)."""
        buf, (base, offset) = index.src[0], split_offset(index.src[1])
        if base is None:
            ptr = self.val[buf]
        elif (ptr := self.base_ptr.get((buf, base))) is None:
            # no pointer made where the base is (the buffer came later in the program): one here, for this use only,
            # since this block need not dominate the other uses
            ptr = self.element_pointer(buf, base)
        return self.op(f"getelementptr {mtype(index.dtype.base)}, ptr {ptr}, i64 {offset}") if offset else ptr

    def render_uop(self, u: UOp) -> None:
        """Emit the instructions of `u`, the next UOp of the linear program."""
        self.render_one(u)
        if u in self.based:
            self.base_pointers(u)

    def render_one(self, u: UOp) -> None:
        """Emit the instructions of `u` alone."""
        op, src = u.op, u.src
        if op is Ops.DEFINE_GLOBAL:
            self.val[u] = f"%data{u.arg}"
            self.params.append(f"ptr {self.val[u]}")
        elif op is Ops.DEFINE_VAR:
            self.val[u] = "%var_" + re.sub(r"\W", "_", u.arg[0])
            self.params.append(f"{ltype(u.dtype)} {self.val[u]}")
        elif op is Ops.CONST:
            self.val[u] = lconst(u.arg, u.dtype)
        elif op is Ops.SPECIAL:
            self.val[u] = self.renderer.render_special(self, u)
        elif op is Ops.RANGE:
            k = self.position[u]
            r = self.val[u] = f"%ridx{k}"
            self.emit(f"br label %loop_entry_{k}")
            self.label(f"loop_entry_{k}")
            self.emit(f"br label %loop_header_{k}")
            self.label(f"loop_header_{k}")
            it = ltype(u.dtype)
            self.emit(f"{r} = phi {it} [0, %loop_entry_{k}], [{r}_next, %loop_latch_{k}]")
            go = self.op(f"icmp slt {it} {r}, {self.get(src[0])}")
            self.emit(f"br i1 {go}, label %loop_body_{k}, label %loop_exit_{k}")
            self.label(f"loop_body_{k}")
        elif op is Ops.END:
            k = self.position[src[0]]
            r = self.val[src[0]]
            self.emit(f"br label %loop_latch_{k}")
            self.label(f"loop_latch_{k}")
            self.emit(f"{r}_next = add nuw nsw {ltype(src[0].dtype)} {r}, 1")
            self.emit(f"br label %loop_header_{k}")
            self.label(f"loop_exit_{k}")
        elif op is Ops.DEFINE_ACC:
            slot = self.val[u] = f"%acc{u.arg[0]}"
            self.allocas.append(f"  {slot} = alloca {ltype(u.dtype)}")
            self.emit(f"store {ltype(u.dtype)} {self.get(src[0])}, ptr {slot}")
        elif op is Ops.ASSIGN:
            self.emit(f"store {ltype(u.dtype)} {self.get(src[1])}, ptr {self.val[src[0]]}")
        elif (op in (Ops.INDEX, Ops.LOAD) and u in self.gathered) or u in self.folded:
            return
        elif op is Ops.INDEX and u in self.offsets:
            self.val[u] = self.based_index(u)
        elif op is Ops.INDEX:
            idx, it = self.get(src[1]), ltype(src[1].dtype)
            if len(src) == 3:
                # a masked-out index may point anywhere: read element 0 instead, and let the load's gate discard it
                idx = self.op(f"select i1 {self.get(src[2])}, {it} {idx}, {it} 0")
            self.val[u] = self.op(f"getelementptr inbounds {mtype(u.dtype.base)}, ptr {self.get(src[0])}, {it} {idx}")
        elif op is Ops.LOAD:
            # a vector load reads consecutive elements, aligned to one element
            align = max(u.dtype.scalar().itemsize, 1)
            value = self.op(f"load {mtype(u.dtype)}, ptr {self.get(src[0])}, align {align}")
            if dtypes.is_bool(u.dtype):
                value = self.op(f"icmp ne {mtype(u.dtype)} {value}, zeroinitializer")
            if len(src) == 3:
                value = self.op(
                    f"select i1 {self.get(src[2])}, {ltype(u.dtype)} {value}, {ltype(u.dtype)} {self.get(src[1])}"
                )
            self.val[u] = value
            self.prefetch(u)
        elif op is Ops.STORE:
            dtype = src[1].dtype
            value = self.get(src[1])
            if dtypes.is_bool(dtype):
                value = self.op(f"zext {ltype(dtype)} {value} to {mtype(dtype)}")
            align = max(dtype.scalar().itemsize, 1)
            store = f"store {mtype(dtype)} {value}, ptr {self.get(src[0])}, align {align}"
            if len(src) == 2 and self.streams(u):
                self.stream_store(u, store)
            elif len(src) == 3:
                k = self.position[u]
                self.emit(f"br i1 {self.get(src[2])}, label %store_{k}, label %stored_{k}")
                self.label(f"store_{k}")
                self.emit(store)
                self.emit(f"br label %stored_{k}")
                self.label(f"stored_{k}")
            else:
                self.emit(store)
        elif op is Ops.CAST:
            self.val[u] = self.cast(self.get(src[0]), src[0].dtype, u.dtype)
        elif op is Ops.BITCAST:
            for dt in (src[0].dtype, u.dtype):
                if dt.scalar() in (dtypes.fp8e4m3, dtypes.fp8e5m2) or dtypes.is_bool(dt):
                    raise NotImplementedError(f"the LLVM renderer can't bitcast {dt} yet")
            st, dt = ltype(src[0].dtype), ltype(u.dtype)
            self.val[u] = self.get(src[0]) if st == dt else self.op(f"bitcast {st} {self.get(src[0])} to {dt}")
        elif op in GroupOp.ALU:
            self.val[u] = self.alu(u)
        elif op is Ops.VECTORIZE:
            self.val[u] = self.vectorize(u)
        elif op is Ops.GEP:
            if u not in self.shuffled:
                self.val[u] = self.gep(u)
        elif op is Ops.SINK:
            return
        else:
            raise NotImplementedError(f"the LLVM renderer can't render {op} yet")

    def streams(self, store: UOp) -> bool:
        """Whether vector `store` writes a buffer of at least `stream_bytes`: one the caches would not keep until it
        is read again anyway."""
        least, index, value = self.renderer.stream_bytes, store.src[0], store.src[1]
        if not least or value.dtype.count == 1 or index.op is not Ops.INDEX:
            return False
        buf = index.src[0]
        return (
            buf.op is Ops.DEFINE_GLOBAL
            and isinstance(buf.dtype, PtrDType)
            and buf.dtype.size * buf.dtype.base.itemsize >= least
        )

    def stream_store(self, store: UOp, plain: str) -> None:
        """`plain` (the text of vector `store`) as a non-temporal store where its address is aligned to its size
        (which the instruction needs), else as it is."""
        k, dtype = self.position[store], store.src[1].dtype
        size = dtype.itemsize
        address = self.op(f"ptrtoint ptr {self.get(store.src[0])} to i64")
        aligned = self.op(f"icmp eq i64 {self.op(f'and i64 {address}, {size - 1}')}, 0")
        self.emit(f"br i1 {aligned}, label %stream_{k}, label %cached_{k}")
        self.label(f"stream_{k}")
        self.emit(plain.rsplit(", align", 1)[0] + f", align {size}, !nontemporal !{NONTEMPORAL}")
        self.emit(f"br label %stored_{k}")
        self.label(f"cached_{k}")
        self.emit(plain)
        self.emit(f"br label %stored_{k}")
        self.label(f"stored_{k}")
        self.streamed = True

    def prefetch(self, load: UOp) -> None:
        """Ask for the line that vector `load` will read as many iterations from now as the loop takes to read
        `prefetch_bytes` of its buffer, when it is in a reduction's innermost loop and its address steps forward by a
        constant each iteration."""
        ahead, loop, index = self.renderer.prefetch_bytes, self.load_loop.get(load), load.src[0]
        if not ahead or loop is None or loop not in self.reduce_loops or len(load.src) == 3:
            return
        (stride,) = linear_strides(index.src[1], UOp.const(dtypes.bool, True), [loop])
        if not isinstance(stride, int) or stride <= 0:
            return
        step = stride * load.dtype.scalar().itemsize
        # the iterations it takes to read `ahead` bytes of this buffer: as many ahead, in time, whether the loop reads
        # a contiguous stream or a piece of each row of a matrix
        reads = self.loop_reads[(loop, index.src[0])]
        # a loop that reads less than twice as much would ask mostly for lines it never reads (the next rows of a
        # short reduction, which other threads may own)
        if loop.src[0].op is not Ops.CONST or loop.src[0].arg * reads < 2 * ahead:
            return
        later = self.op(f"getelementptr i8, ptr {self.get(index)}, i64 {-(-ahead // reads) * step}")
        # read (0), keep in every cache level (3), data (1)
        self.declares.add("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
        self.emit(f"call void @llvm.prefetch.p0(ptr {later}, i32 0, i32 3, i32 1)")

    def source(self, name: str, attributes: str) -> str:
        """The module text: the function `name` with function `attributes`, and the declarations it needs."""
        head = f"define void @{name}({', '.join(self.params)}) #0 {{"
        body = [head, "entry:", *self.allocas, *self.lines, "  ret void", "}"]
        if self.streamed:
            # non-temporal stores are weakly ordered: they reach memory before the kernel returns
            body.insert(-2, "  fence seq_cst")
        helpers = [self.definitions[k] for k in sorted(self.definitions)]
        metadata = [f"!{NONTEMPORAL} = !{{i32 1}}"] if self.streamed else []
        return "\n".join(
            [*body, f"attributes #0 = {{ {attributes} }}", *helpers, *sorted(self.declares), *metadata, ""]
        )


def _loop_reads(uops: list[UOp]) -> tuple[dict[UOp, UOp], dict[tuple[UOp, UOp], int]]:
    """Each vector load's innermost loop, and per (loop, buffer) the bytes one iteration of the loop reads from the
    buffer by the vector loads directly in it (not in a loop inside it)."""
    load_loop: dict[UOp, UOp] = {}
    out: dict[tuple[UOp, UOp], int] = {}
    loops: list[UOp] = []
    for u in uops:
        if u.op is Ops.RANGE:
            loops.append(u)
        elif u.op is Ops.END and loops and loops[-1] is u.src[0]:
            loops.pop()
        elif u.op is Ops.LOAD and loops and u.dtype.count > 1 and u.src[0].op is Ops.INDEX:
            load_loop[u] = loops[-1]
            key = (loops[-1], u.src[0].src[0])
            out[key] = out.get(key, 0) + u.dtype.itemsize
    return load_loop, out


def _accumulation(uops: list[UOp]) -> set[UOp]:
    """The float adds (and multiplies) that fold values into an accumulator: the chain of ADD/MUL from each ASSIGN's
    value down to its DEFINE_ACC, and the MULs whose products that chain adds up."""
    out: set[UOp] = set()
    for u in uops:
        if u.op is not Ops.ASSIGN or not dtypes.is_float(u.dtype):
            continue
        acc, stack = u.src[0], [u.src[1]]
        while stack:
            x = stack.pop()
            if x in out or x.op not in (Ops.ADD, Ops.MUL):
                continue
            out.add(x)
            if any(s is acc for s in x.src) or x.op is Ops.ADD:
                stack.extend(s for s in x.src if s is not acc and s.op in (Ops.ADD, Ops.MUL))
    return out


def _lane_sources(u: UOp) -> list[UOp] | None:
    """The vectors a VECTORIZE takes its lanes from, in order of first use, when every lane is one lane (a GEP) of
    one of at most two vectors of the same type: it is then one shufflevector instead of an extractelement and an
    insertelement per lane, which LLVM would have to fold back into a shuffle."""
    if not all(s.op is Ops.GEP and len(s.arg) == 1 for s in u.src):
        return None
    sources = list(dict.fromkeys(s.src[0] for s in u.src))
    # an accumulator's lane is its value where the GEP is: it may be assigned again before this VECTORIZE
    if any(s.op in (Ops.DEFINE_ACC, Ops.ASSIGN) for s in sources) or len(sources) > 2:
        return None
    if len({s.dtype for s in sources}) != 1 or isinstance(sources[0].dtype, PtrDType) or sources[0].dtype.count == 1:
        return None
    return sources


def _gather_lanes(u: UOp) -> bool:
    """Whether VECTORIZE `u` is scalar loads (at least two different ones) from one buffer and constants, of a type
    LLVM gathers as is (not bool, which is a byte in memory and a bit in registers)."""
    loads = {s for s in u.src if s.op is Ops.LOAD and s.dtype.count == 1}
    if len(loads) < 2 or any(s not in loads and s.op is not Ops.CONST for s in u.src) or dtypes.is_bool(u.dtype):
        return False
    return len({s.src[0].src[0] for s in loads}) == 1


def _users(uops: list[UOp]) -> dict[UOp, list[UOp]]:
    """The ops of the linear program that read each op."""
    users: dict[UOp, list[UOp]] = {}
    for u in uops:
        for s in u.src:
            users.setdefault(s, []).append(u)
    return users


def _gathered_lanes(
    uops: list[UOp], users: dict[UOp, list[UOp]], position: dict[UOp, int]
) -> tuple[set[UOp], set[UOp]]:
    """The VECTORIZEs rendered as a masked gather; the LOADs whose every user is one, and the INDEXes only those use
    (none of which is rendered alone). The gather reads where the VECTORIZE is: no store may come between its
    first lane's load and it."""
    stores = [i for i, u in enumerate(uops) if u.op is Ops.STORE]
    vectors = {
        u
        for u in uops
        if u.op is Ops.VECTORIZE
        and _gather_lanes(u)
        and not any(min(position[s] for s in u.src if s.op is Ops.LOAD) < i < position[u] for i in stores)
    }
    skipped = {u for u in uops if u.op is Ops.LOAD and (us := users.get(u)) and all(x in vectors for x in us)}
    skipped |= {u for u in uops if u.op is Ops.INDEX and (us := users.get(u)) and all(x in skipped for x in us)}
    return vectors, skipped


def _based_indexes(
    uops: list[UOp], users: dict[UOp, list[UOp]], skipped: set[UOp]
) -> tuple[dict[UOp, list[UOp]], set[UOp], set[UOp]]:
    """The buffers indexed at each index base (an index is `base + constant`), the INDEXes addressed as a constant
    offset from the pointer to their buffer's element `base` (or from the buffer, for a constant index), and the
    `base + c` ADDs that only those use. LLVM then sees one address computation per base instead of one per load:
    the lanes of a strided view (a convolution's window, a transpose) are its constant offsets."""
    based: dict[UOp, list[UOp]] = {}
    # the lanes of a vector of loads that is gated (padding) stay indexes from the buffer: LLVM's SLP vectoriser
    # makes a masked gather of them where that pays (the stem's convolution runs 1.5x faster with it), and finds
    # none in loads addressed from a base pointer
    gated = {
        s.src[0]
        for u in uops
        if u.op is Ops.VECTORIZE and any(s.op is Ops.LOAD and len(s.src) == 3 for s in u.src)
        for s in u.src
        if s.op is Ops.LOAD
    }
    indexes = dict.fromkeys(
        u
        for u in uops
        if u.op is Ops.INDEX
        and len(u.src) == 2
        and u not in gated
        and u not in skipped
        and u.src[0].op is Ops.DEFINE_GLOBAL
        and u.src[1].dtype.count == 1
    )
    sharing: dict[tuple[UOp, UOp | None], list[UOp]] = {}
    for u in indexes:
        sharing.setdefault((u.src[0], split_offset(u.src[1])[0]), []).append(u)
    for (buf, base), users_of_base in sharing.items():
        # an accumulator's value is read where it is used: it has no one place of definition to put a pointer. A
        # base that one index alone uses saves nothing: that index stays an `inbounds` GEP from its buffer
        if (base is not None and base.op in (Ops.DEFINE_ACC, Ops.ASSIGN)) or len(users_of_base) == 1:
            for u in users_of_base:
                del indexes[u]
        elif base is not None:
            based.setdefault(base, []).append(buf)
    folded = {
        u.src[1]
        for u in indexes
        if u.src[1].op is Ops.ADD
        and u.src[1].src[1].op is Ops.CONST
        and u.src[1].src[0] in based
        and all(x in indexes and x.src[1] is u.src[1] for x in users[u.src[1]])
    }
    return based, set(indexes), folded


def _shuffled_lanes(users: dict[UOp, list[UOp]]) -> set[UOp]:
    """The GEPs whose every user is a VECTORIZE rendered as one shufflevector: they need no extractelement."""
    return {
        g
        for g, us in users.items()
        if g.op is Ops.GEP and all(x.op is Ops.VECTORIZE and _lane_sources(x) is not None for x in us)
    }


def _index_math(uops: list[UOp]) -> set[UOp]:
    """The integer ADD/MUL ops that compute addresses: they can't overflow for a valid element, so they get nsw."""
    out: set[UOp] = set()
    stack = [u.src[1] for u in uops if u.op is Ops.INDEX]
    while stack:
        u = stack.pop()
        if u in out or u.op not in (Ops.ADD, Ops.MUL) or not dtypes.is_int(u.dtype):
            continue
        out.add(u)
        stack.extend(u.src)
    return out


class LLVMRenderer(Renderer):
    """Linear UOps to the text of one LLVM IR function `void @name(ptr %data0, ..., i32 %var)`, in LLVM's opaque
    pointer dialect, with no target triple (the compiler sets it). Targets specialise `render_special` (hardware
    indices), `function_attributes`, and the class limits."""

    suffix = "LLVM"
    supports_float4 = False
    has_local = False
    has_shared = False
    # LLVM vectors of 8 lanes fill an AVX register with float32; a target with wider vectors (AVX-512) sets 16.
    # Wider vectors than the target has are split by LLVM, so any width is correct, only the speed differs.
    vector_width = 8
    # CPUs keep upcast and unrolled elements in vector registers and spill gracefully: search may try big tiles
    max_upcast = 1024
    function_attributes: ClassVar[str] = "nounwind"
    # whether a vector of scalar loads from one buffer (a strided or padded read) is one `llvm.masked.gather` instead
    # of a load per lane: a fraction of the IR for LLVM to optimise, but slower code where gathers are slow
    gathers = False
    # whether a buffer's element `base + c` is addressed as a constant offset from one pointer per (buffer, base),
    # computed where `base` is: LLVM then has one address computation per base to optimise instead of one per load
    based_addresses = False
    # bytes ahead of a vector load in a reduction's innermost loop to ask the cache for (`llvm.prefetch`), where the
    # load's address steps by a constant each iteration; 0: none. A stream read by a reduction alone leaves the
    # core waiting on memory with the hardware prefetcher's lines only (the CPU sets this)
    prefetch_bytes = 0
    # float32 (and float16) exp2, log2 and sin as `llvm_math`'s polynomials instead of LLVM's intrinsics, which the
    # CPU lowers to a C library call per lane
    polynomial_math = False
    # vector stores to a buffer of at least this many bytes bypass the caches (non-temporal, where aligned); 0: never.
    # A store that misses the cache reads the line first: a write costs two transfers where this one costs one
    stream_bytes = 0

    def render_special(self, fn: LLVMFunction, u: UOp) -> str:
        """The value of hardware index `u` (a SPECIAL); targets without hardware indices have none."""
        raise NotImplementedError(f"{type(self).__name__} has no hardware indices, can't render {u.arg[0]}")

    def render(self, uops: list[UOp]) -> str:
        """LLVM IR of the linear program `uops`."""
        fn = LLVMFunction(self, uops)
        for u in uops:
            fn.render_uop(u)
        return fn.source(kernel_function_name(uops), self.function_attributes)
