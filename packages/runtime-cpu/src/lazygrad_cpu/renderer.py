"""The CPU's renderer: codegen's LLVM IR renderer for the host, with the kernel's outermost parallel axis (the
`core0` SPECIAL codegen makes on renderers that have threads) as a loop over a range of it that the caller chooses,
so that `CPUProgram` can hand each core a contiguous part of it."""

from __future__ import annotations

import functools
import glob
import os
from typing import ClassVar

from lazygrad_codegen.cstyle import kernel_function_name
from lazygrad_codegen.llvmir import LLVMFunction, LLVMRenderer
from lazygrad_cpu.compiler import host_vector_bits
from lazygrad_cpu.threads import usable_cores
from lazygrad_uop.config import ContextVar
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

# the hardware index a CPU kernel is split over cores by
CORE_AXIS = "core0"
# the values of core0 this call runs: the last two parameters of every CPU kernel
CORE_START, CORE_END = "%core_start", "%core_end"

# 1: a vector of scalar loads from one buffer (strided convolutions, transposes) is one llvm.masked.gather. LLVM
# compiles ResNet-18's kernels in about 0.6x the time, but on the x86 CPUs measured some kernels ran 2-4x slower
# (gathers inside reductions, a weight gradient's): for quick first runs, off by default
CPU_GATHERS = ContextVar("CPU_GATHERS", 0)
# bytes ahead of a reduction's streamed vector loads to prefetch (0: none)
CPU_PREFETCH = ContextVar("CPU_PREFETCH", 4096)
# vector stores to buffers of this many bytes or more are non-temporal (they bypass the caches); -1: half the
# last-level cache (an output that size would not stay cached until read, with its inputs beside it); 0: never
CPU_STREAM_STORES = ContextVar("CPU_STREAM_STORES", -1)


@functools.cache
def last_level_cache_bytes() -> int:
    """The size of the host's largest data cache, from Linux's sysfs; 32 MiB where it can't be read."""
    sizes = []
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(index, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(index, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        if kind != "Instruction" and text[:-1].isdigit() and text[-1] in units:
            sizes.append(int(text[:-1]) * units[text[-1]])
    return max(sizes, default=32 << 20)


def arity_symbol(name: str) -> str:
    """The global constant in kernel `name`'s module holding how many buffers and variables it takes, which
    `CPUProgram` checks a call against: a wrong count would shift the core range into the wrong parameters."""
    return f"{name}.arity"


class CPURenderer(LLVMRenderer):
    """LLVM IR for the host CPU: no shared memory and no workgroups; the `core0` axis, if the kernel has one, is split
    over threads.

    Every kernel takes two trailing `i32` parameters `[start, end)`: the body after the `core0` SPECIAL runs once for
    each value of core0 in that range, and `CPUProgram` calls the function once per thread with disjoint ranges that
    cover `[0, global_size[0])`. A kernel without core0 ignores them."""

    device = "CPU"
    has_local = False
    has_shared = False
    has_threads = True
    # codegen's vectors are as wide as the host's registers in float32 lanes (16 with AVX-512, 8 with AVX, 4 with
    # SSE or NEON), so that one vector op is one instruction; narrower ones leave half of an AVX-512 unit idle
    vector_width = host_vector_bits() // 32
    # "prefer-vector-width" lets LLVM use the host's widest vectors (AVX-512 on CPUs that have it): some x86 CPUs'
    # default tuning caps vectorised loops at 256 bits to avoid clock drops that the newer ones no longer have
    function_attributes: ClassVar[str] = 'nounwind "prefer-vector-width"="512"'
    # the threads a kernel's core0 axis is split over (see lazygrad_cpu.threads)
    compute_units = usable_cores()
    # a strided or padded view's lanes are constant offsets from one pointer: a third less time in LLVM for
    # ResNet-18's kernels, the same machine code
    based_addresses = True
    # exp2, log2 and sin on whole vectors (lazygrad_codegen.llvm_math): LLVM would call the C library once per lane
    polynomial_math = True

    def __init__(self) -> None:
        # the setting when the renderer is made, as an instance attribute: the program cache keys on those
        self.gathers = bool(CPU_GATHERS.value)
        self.prefetch_bytes = int(CPU_PREFETCH.value)
        stream = int(CPU_STREAM_STORES.value)
        self.stream_bytes = last_level_cache_bytes() // 2 if stream < 0 else stream

    def render_special(self, fn: LLVMFunction, u: UOp) -> str:
        """Open the loop over this call's range of core0; `render` closes it at the end of the function."""
        name = u.arg[0]
        if name != CORE_AXIS:
            raise NotImplementedError(f"the CPU has no hardware index {name!r}, only {CORE_AXIS!r} (split over cores)")
        if any(v.op is Ops.SPECIAL for v in fn.uops[: fn.position[u]]):
            raise NotImplementedError("a CPU kernel can be split over cores along one axis only")
        fn.emit("br label %core_entry")
        fn.label("core_entry")
        fn.emit("br label %core_header")
        fn.label("core_header")
        fn.emit(f"%core0 = phi i32 [{CORE_START}, %core_entry], [%core0_next, %core_latch]")
        go = fn.op(f"icmp slt i32 %core0, {CORE_END}")
        fn.emit(f"br i1 {go}, label %core_body, label %core_exit")
        fn.label("core_body")
        return "%core0"

    def render(self, uops: list[UOp]) -> str:
        """LLVM IR of the linear program `uops`, taking `i32 %core_start, i32 %core_end` after its buffers and
        variables."""
        fn = LLVMFunction(self, uops)
        for u in uops:
            fn.render_uop(u)
        if any(u.op is Ops.SPECIAL for u in uops):
            # everything after core0 ran inside its loop: step to the next value
            fn.emit("br label %core_latch")
            fn.label("core_latch")
            fn.emit("%core0_next = add nuw nsw i32 %core0, 1")
            fn.emit("br label %core_header")
            fn.label("core_exit")
        name = kernel_function_name(uops)
        arity = f'@"{arity_symbol(name)}" = constant i32 {len(fn.params)}\n'
        fn.params += [f"i32 {CORE_START}", f"i32 {CORE_END}"]
        return arity + fn.source(name, self.function_attributes)
