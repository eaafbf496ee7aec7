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
  `lazygrad_amd.amdgpu_math`'s IR functions.
"""

from __future__ import annotations

import math
from typing import ClassVar

from lazygrad_amd import amdgpu_math
from lazygrad_codegen.cstyle import kernel_function_name
from lazygrad_codegen.llvmir import LLVMFunction, LLVMRenderer, ltype, mtype
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

_AXES = "xyz"
_F64_MATH = {Ops.EXP2: amdgpu_math.EXP2, Ops.LOG2: amdgpu_math.LOG2, Ops.SIN: amdgpu_math.SIN}


class AMDGPUFunction(LLVMFunction):
    """One amdgcn kernel being rendered: global buffer parameters, private-memory accumulators, hardware ids, and
    the double-precision math functions it calls."""

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
    global_max: ClassVar[tuple[int, ...] | None] = (2**31 - 1, 65535, 65535)
    local_max: ClassVar[tuple[int, ...] | None] = (1024, 1024, 1024)
    shared_max: ClassVar[int] = 65536

    def __init__(self, arch: str = "gfx1100") -> None:
        self.arch = arch

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
