"""The AMDGPU renderer: codegen's LLVM IR renderer specialised for amdgcn kernels (gfx90a, gfx942, gfx1100, ...).

What differs from the CPU's IR, and why:

- the function is an `amdgpu_kernel`; buffers arrive as global pointers (`ptr addrspace(1)`), cast once to flat
  pointers so the shared renderer can address them as on the CPU; LLVM's address-space inference turns the flat
  accesses back into global ones;
- accumulators are stack slots in the private address space (5), where AMDGPU wants every `alloca`, likewise cast
  to flat pointers (SROA then keeps them in registers);
- `gidx`/`lidx` are the work-group and work-item ids (`llvm.amdgcn.workgroup.id.*`, `llvm.amdgcn.workitem.id.*`),
  and the kernel states its exact work-group size, which the launcher then must use;
- local memory (`DEFINE_LOCAL`) is a module-level array in the local address space (3), a `BARRIER` is
  `s_barrier` between workgroup-scope release and acquire fences;
- double-precision exp2, log2 and sin have no AMDGPU instructions and no library to call: they are
  `lazygrad_amd.amdgpu_math`'s IR functions;
- a `WMMA` (tensor core) is one call of the matrix intrinsic its description names: RDNA 3's
  `llvm.amdgcn.wmma.f32.16x16x16.{f16,bf16}` (wave32) or CDNA's `llvm.amdgcn.mfma.f32.16x16x16{f16,bf16.1k}`
  (wave64). The operand vectors' lanes are the instruction's registers in order, which is what the descriptions in
  `lazygrad_amd.tensor_cores` lay out, so the values pass straight through. bfloat16 operands are their bits
  (`i16`), as the intrinsics take them.
"""

from __future__ import annotations

import math

from lazygrad_amd import amdgpu_math
from lazygrad_amd.tensor_cores import BY_INSTRUCTION, INSTRUCTION_FAMILY
from lazygrad_codegen.cstyle import kernel_function_name
from lazygrad_codegen.llvmir import LLVMFunction, LLVMRenderer, ltype, mtype
from lazygrad_codegen.tensor_cores import wmma_arg
from lazygrad_uop.device import TensorCore
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

_AXES = "xyz"
_F64_MATH = {Ops.EXP2: amdgpu_math.EXP2, Ops.LOG2: amdgpu_math.LOG2, Ops.SIN: amdgpu_math.SIN}
# The LLVM intrinsic of each matrix instruction a description names (its `opts[0]`), and the constant operands that
# follow A, B and C. LLVM completes the overload suffix of the WMMA names from the operand types. MFMA's three
# trailing operands (CBSZ, ABID, BLGP) broadcast blocks of A and B between lanes: 0 is the plain product.
_MATRIX_INTRINSICS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "v_wmma_f32_16x16x16_f16": ("llvm.amdgcn.wmma.f32.16x16x16.f16", ()),
    "v_wmma_f32_16x16x16_bf16": ("llvm.amdgcn.wmma.f32.16x16x16.bf16", ()),
    "v_mfma_f32_16x16x16f16": ("llvm.amdgcn.mfma.f32.16x16x16f16", (("i32", "0"),) * 3),
    "v_mfma_f32_16x16x16bf16_1k": ("llvm.amdgcn.mfma.f32.16x16x16bf16.1k", (("i32", "0"),) * 3),
}


class AMDGPUFunction(LLVMFunction):
    """One amdgcn kernel being rendered: global buffer parameters, private-memory accumulators, hardware ids, and
    the double-precision math functions it calls."""

    renderer: AMDGPURenderer

    def __init__(self, renderer: AMDGPURenderer, uops: list[UOp]) -> None:
        super().__init__(renderer, uops)
        self.helpers: set[str] = set()
        self.shared: list[str] = []

    def render_uop(self, u: UOp) -> None:
        """Emit `u`; buffers and accumulators live in AMDGPU's address spaces, the rest as on any target."""
        if u.op is Ops.DEFINE_GLOBAL:
            flat = self.val[u] = f"%data{u.arg}"
            self.params.append(f"ptr addrspace(1) {flat}.global")
            self.allocas.append(f"  {flat} = addrspacecast ptr addrspace(1) {flat}.global to ptr")
        elif u.op is Ops.DEFINE_ACC:
            slot = self.val[u] = f"%acc{u.arg[0]}"
            self.allocas.append(f"  {slot}.private = alloca {ltype(u.dtype)}, addrspace(5)")
            self.allocas.append(f"  {slot} = addrspacecast ptr addrspace(5) {slot}.private to ptr")
            self.emit(f"store {ltype(u.dtype)} {self.get(u.src[0])}, ptr {slot}")
        elif u.op is Ops.DEFINE_LOCAL:
            if not isinstance(u.dtype, PtrDType) or u.dtype.size <= 0:
                raise ValueError(f"DEFINE_LOCAL {u.arg!r} needs a pointer dtype of known size, got {u.dtype!r}")
            name = f"lds_{len(self.shared)}"
            self.shared.append(
                f"@{name} = internal addrspace(3) global [{u.dtype.size} x {mtype(u.dtype.base)}] undef, align 16"
            )
            flat = self.val[u] = f"%{name}"
            self.allocas.append(f"  {flat} = addrspacecast ptr addrspace(3) @{name} to ptr")
        elif u.op is Ops.BARRIER:
            # every work-item's stores to local memory are visible to the group after the barrier
            self.emit('fence syncscope("workgroup") release')
            self.emit("call void @llvm.amdgcn.s.barrier()")
            self.emit('fence syncscope("workgroup") acquire')
            self.declares.add("declare void @llvm.amdgcn.s.barrier()")
        elif u.op is Ops.WMMA:
            intrinsic, constants = self.renderer.matrix_intrinsic(u.arg)
            operands = [(ltype(s.dtype), self.get(s)) for s in u.src]
            self.val[u] = self.call(ltype(u.dtype), intrinsic, [*operands, *constants])
        else:
            super().render_uop(u)

    def alu_on(self, op: Ops, dt: DType, out_dt: DType, a: list[str], u: UOp) -> str:
        """ALU op `op`; double-precision exp2, log2 and sin call the IR functions of `amdgpu_math`."""
        if op in _F64_MATH and dt.scalar() == dtypes.float64:
            name, n = _F64_MATH[op], u.dtype.count
            self.helpers.add(name)
            if n == 1:
                return self.op(f"call double @{name}(double {a[0]})")
            vector = "poison"
            for lane in range(n):
                x = self.op(f"extractelement <{n} x double> {a[0]}, i32 {lane}")
                y = self.op(f"call double @{name}(double {x})")
                vector = self.op(f"insertelement <{n} x double> {vector}, double {y}, i32 {lane}")
            return vector
        return super().alu_on(op, dt, out_dt, a, u)

    def source(self, name: str, attributes: str) -> str:
        """The module: its local-memory arrays, the kernel, the math functions it calls and their declarations."""
        if self.helpers:
            self.declares.update(amdgpu_math.DECLARATIONS)
        kernel = (
            super().source(name, attributes).replace(f"define void @{name}(", f"define amdgpu_kernel void @{name}(")
        )
        return "\n".join([*self.shared, kernel, *(amdgpu_math.DEFINITIONS[h] for h in sorted(self.helpers)), ""])


class AMDGPURenderer(LLVMRenderer):
    """LLVM IR of amdgcn kernels for the GPU architecture `arch` (e.g. "gfx1100"), which the AMDGPU compiler builds
    into a code object."""

    device = "HIP"
    suffix = "AMDGPU"
    has_local = True
    has_shared = True
    # the HSA dispatch packet holds the grid in work-items as 32-bit numbers
    global_max: tuple[int, ...] | None = (2**31 - 1, 65535, 65535)
    local_max: tuple[int, ...] | None = (1024, 1024, 1024)
    shared_max: int = 65536
    # compute units, which size split reductions: a Radeon RX 7900 XTX's (gfx1100, the default arch) 96 unless the
    # opened GPU says otherwise (`lazygrad_amd.hip.device_compute_units`)
    compute_units: int = 96

    def __init__(
        self, arch: str = "gfx1100", tensor_cores: tuple[TensorCore, ...] = (), compute_units: int | None = None
    ) -> None:
        self.arch = arch
        if compute_units is not None:
            self.compute_units = compute_units
        # the matrix instructions of this target, which the registry hands over (lazygrad_amd.tensor_cores registers
        # the built-in ones) and codegen's heuristics then use for fitting matmuls
        self.tensor_cores: tuple[TensorCore, ...] = tuple(tensor_cores)

    def tensor_core_targets(self) -> tuple[str, ...]:
        """The descriptions registered for this architecture."""
        return (self.arch,)

    def tensor_core_problem(self, tc: TensorCore, target: str) -> str | None:
        """None when `tc` names (in `opts[0]`) a matrix instruction this renderer calls, describes exactly its
        shape, types and register layout, and `target` belongs to the family that has it; else why not."""
        instruction = tc.opts[0] if tc.opts else ""
        if (reference := BY_INSTRUCTION.get(instruction)) is None:
            known = ", ".join(sorted(BY_INSTRUCTION))
            return f"it names no AMD matrix instruction the renderer calls (opts[0] must be one of {known})"
        if (tc.dims, tc.threads, tc.elements_per_thread, tc.dtype_in, tc.dtype_out) != (
            reference.dims,
            reference.threads,
            reference.elements_per_thread,
            reference.dtype_in,
            reference.dtype_out,
        ) or _as_tuples(tc.swizzle) != _as_tuples(reference.swizzle):
            return f"{instruction} is {reference}, with the layout {reference.swizzle}; the description differs"
        family = INSTRUCTION_FAMILY[instruction[:6]]
        if not target.startswith(family):
            return f"{instruction} exists on {family}xx targets, not on {target}"
        return None

    def matrix_intrinsic(self, arg: tuple) -> tuple[str, tuple[tuple[str, str], ...]]:
        """The LLVM intrinsic that runs the WMMA UOp with `arg` on this target, and the constant (type, value)
        operands it takes after A, B and C. Raises NotImplementedError for a tensor core this renderer was not given
        (the registry gives it those of its target that `tensor_core_problem` accepts)."""
        tc = next((tc for tc in self.tensor_cores if wmma_arg(tc) == tuple(arg)), None)
        if tc is None or (why := self.tensor_core_problem(tc, self.arch)) is not None:
            have = ", ".join(tc.opts[0] for tc in self.tensor_cores if tc.opts) or "none"
            raise NotImplementedError(
                f"{self.arch} has no matrix instruction for the tensor core {arg[0]} with this layout (its tensor "
                f"cores: {have}){': ' + why if tc is not None and why else ''}"
            )
        return _MATRIX_INTRINSICS[tc.opts[0]]

    def render_special(self, fn: LLVMFunction, u: UOp) -> str:
        """`gidxN` is the work-group id, `lidxN` the work-item id within the group, in dimension N."""
        name, _ = u.arg
        kind = {"g": "workgroup", "l": "workitem"}.get(name[0])
        if kind is None:
            raise NotImplementedError(f"the AMDGPU renderer has no hardware index named {name}")
        return fn.call("i32", f"llvm.amdgcn.{kind}.id.{_AXES[int(name[-1])]}", [])

    def render(self, uops: list[UOp]) -> str:
        """LLVM IR of the linear program `uops`, as one amdgpu_kernel."""
        fn = AMDGPUFunction(self, uops)
        for u in uops:
            fn.render_uop(u)
        group = math.prod(int(u.arg[1]) for u in uops if u.op is Ops.SPECIAL and u.arg[0][0] == "l")
        # the exact work-group size lets LLVM size registers for it; launches must use it
        attributes = f'nounwind "amdgpu-flat-work-group-size"="{group},{group}"'
        return fn.source(kernel_function_name(uops), attributes)


def _as_tuples(x: object) -> object:
    return tuple(_as_tuples(v) for v in x) if isinstance(x, (tuple, list)) else x
