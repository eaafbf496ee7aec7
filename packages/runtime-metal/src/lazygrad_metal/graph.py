"""`MetalGraph`, the METAL device's graph type: a list of kernel launches encoded once into an
MTLIndirectCommandBuffer (ICB) and replayed as one `executeCommandsInBuffer:withRange:` per call, which is how the
JIT runs a captured function on Apple GPUs without encoding every launch again.

Each launch is one indirect compute command: its pipeline (made with `supportIndirectCommandBuffers`), its buffers
bound with `setKernelBuffer:offset:atIndex:` in parameter order, its symbolic variables as int32s in a small buffer
of the graph (an ICB command has no `setBytes`), and a barrier, so each kernel sees the writes of the ones before
it. Inputs are swapped between replays with `update`, which re-encodes the launches that changed.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from lazygrad_metal import objc
from lazygrad_metal.device import (
    COMMAND_BUFFER,
    COMMIT,
    COMPUTE_ENCODER,
    CONTENTS,
    END_ENCODING,
    NEW_BUFFER,
    RESOURCE_STORAGE_MODE_SHARED,
    MetalBuffer,
    MetalProgram,
    MTLSize,
)
from lazygrad_metal.objc import BOOL, Message, NSUInteger, ObjCError, autorelease_pool, id_t
from lazygrad_uop.device import CompileError

if TYPE_CHECKING:
    from lazygrad_metal.device import MetalDevice


class NSRange(ctypes.Structure):
    """Foundation's range: first index and count."""

    _fields_: ClassVar = [("location", NSUInteger), ("length", NSUInteger)]


INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH = 1 << 5
RESOURCE_USAGE_READ_WRITE = 1 | 2
MAX_KERNEL_BUFFERS = 31
# Offsets of buffers bound to `constant` parameters must be 256-byte aligned on some Macs (Intel GPUs).
VALUE_SLOT_BYTES = 256

SET_COMPUTE_FUNCTION = Message("setComputeFunction:", None, id_t)
SET_SUPPORT_ICB = Message("setSupportIndirectCommandBuffers:", None, BOOL)
NEW_PIPELINE_WITH_DESCRIPTOR = Message(
    "newComputePipelineStateWithDescriptor:options:reflection:error:",
    id_t,
    id_t,
    NSUInteger,
    ctypes.c_void_p,
    ctypes.POINTER(id_t),
)
SET_COMMAND_TYPES = Message("setCommandTypes:", None, NSUInteger)
SET_INHERIT_BUFFERS = Message("setInheritBuffers:", None, BOOL)
SET_INHERIT_PIPELINE = Message("setInheritPipelineState:", None, BOOL)
SET_MAX_KERNEL_BUFFERS = Message("setMaxKernelBufferBindCount:", None, NSUInteger)
NEW_ICB = Message("newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", id_t, id_t, NSUInteger, NSUInteger)
COMMAND_AT = Message("indirectComputeCommandAtIndex:", id_t, NSUInteger)
RESET = Message("reset", None)
ICB_SET_PIPELINE = Message("setComputePipelineState:", None, id_t)
ICB_SET_BUFFER = Message("setKernelBuffer:offset:atIndex:", None, id_t, NSUInteger, NSUInteger)
ICB_DISPATCH = Message("concurrentDispatchThreadgroups:threadsPerThreadgroup:", None, MTLSize, MTLSize)
ICB_SET_BARRIER = Message("setBarrier", None)
USE_RESOURCES = Message("useResources:count:usage:", None, ctypes.POINTER(id_t), NSUInteger, NSUInteger)
EXECUTE_ICB = Message("executeCommandsInBuffer:withRange:", None, id_t, NSRange)


def new_icb_pipeline(device: MetalDevice, function: int, name: str) -> int:
    """An owned compute pipeline of `function` that indirect command buffers can use."""
    with autorelease_pool():
        desc = objc.new_object("MTLComputePipelineDescriptor")
        try:
            SET_COMPUTE_FUNCTION(desc, function)
            SET_SUPPORT_ICB(desc, True)
            error = id_t()
            pipeline = NEW_PIPELINE_WITH_DESCRIPTOR(device.mtl, desc, 0, None, ctypes.byref(error))
        finally:
            objc.release(desc)
        if not pipeline:
            raise CompileError(f"Metal could not make an indirect pipeline for {name}: {objc.error_text(error.value)}")
        return pipeline


@dataclass(frozen=True)
class GraphLaunch:
    """One kernel launch of a graph: the program, its buffers (in parameter order), launch sizes and the values of
    its symbolic variables."""

    program: MetalProgram
    bufs: tuple[MetalBuffer, ...]
    global_size: tuple[int, int, int] = (1, 1, 1)
    local_size: tuple[int, int, int] = (1, 1, 1)
    vals: tuple[int, ...] = ()


class MetalGraph:
    """Launches replayed as one unit through an indirect command buffer of the device `dev` (set by the device's
    bound subclass). Call it to run them all; `update` changes the buffers or variable values of some launches."""

    dev: ClassVar[MetalDevice]

    def __init__(self, launches: Sequence[GraphLaunch]) -> None:
        if not launches:
            raise ValueError("a MetalGraph needs at least one launch")
        self.launches = list(launches)
        for launch in self.launches:
            launch.program.check_launch(len(launch.bufs) + len(launch.vals), launch.local_size)
        self.icb: int | None = None
        self.vals_buf: int | None = None
        with autorelease_pool():
            desc = objc.new_object("MTLIndirectCommandBufferDescriptor")
            try:
                SET_COMMAND_TYPES(desc, INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH)
                SET_INHERIT_BUFFERS(desc, False)
                SET_INHERIT_PIPELINE(desc, False)
                SET_MAX_KERNEL_BUFFERS(desc, MAX_KERNEL_BUFFERS)
                self.icb = NEW_ICB(self.dev.mtl, desc, len(self.launches), RESOURCE_STORAGE_MODE_SHARED)
            finally:
                objc.release(desc)
        if not self.icb:
            raise ObjCError(f"{self.dev.device} could not make an indirect command buffer of {len(launches)} commands")
        # each launch's variables get consecutive slots of one buffer
        self.val_slot: list[int] = []
        slots = 0
        for launch in self.launches:
            self.val_slot.append(slots)
            slots += len(launch.vals)
        self.vals_buf = NEW_BUFFER(self.dev.mtl, max(slots, 1) * VALUE_SLOT_BYTES, RESOURCE_STORAGE_MODE_SHARED)
        if not self.vals_buf:
            raise MemoryError("Metal could not allocate the variable buffer of a graph")
        for i in range(len(self.launches)):
            self._encode(i)

    def _encode(self, i: int) -> None:
        launch, cmd = self.launches[i], COMMAND_AT(self.icb, i)
        RESET(cmd)
        ICB_SET_PIPELINE(cmd, launch.program.icb_pipeline())
        for j, b in enumerate(launch.bufs):
            ICB_SET_BUFFER(cmd, b.buf, b.offset, j)
        base = CONTENTS(self.vals_buf)
        for k, v in enumerate(launch.vals):
            offset = (self.val_slot[i] + k) * VALUE_SLOT_BYTES
            ctypes.c_int32.from_address(base + offset).value = v
            ICB_SET_BUFFER(cmd, self.vals_buf, offset, len(launch.bufs) + k)
        ICB_DISPATCH(cmd, MTLSize(*launch.global_size), MTLSize(*launch.local_size))
        ICB_SET_BARRIER(cmd)

    def update(
        self,
        bufs: Mapping[int, tuple[MetalBuffer, ...]] | None = None,
        vals: Mapping[int, tuple[int, ...]] | None = None,
    ) -> None:
        """Give launch `i` the buffers `bufs[i]` and variable values `vals[i]` for the next replays."""
        bufs, vals = bufs or {}, vals or {}
        changed = sorted(set(bufs) | set(vals))
        for i in changed:
            launch = self.launches[i]
            new = replace(launch, bufs=tuple(bufs.get(i, launch.bufs)), vals=tuple(vals.get(i, launch.vals)))
            if len(new.bufs) != len(launch.bufs) or len(new.vals) != len(launch.vals):
                raise ValueError(
                    f"launch {i} of the graph takes {len(launch.bufs)} buffers and {len(launch.vals)} values"
                )
            self.launches[i] = new
        if changed:
            # the GPU may still be reading the commands of an earlier replay
            self.dev.synchronize()
            for i in changed:
                self._encode(i)

    def __call__(self, wait: bool = False) -> float | None:
        """Run every launch in order; with `wait`, block until done and return the GPU time in seconds."""
        resources = list(dict.fromkeys([b.buf for launch in self.launches for b in launch.bufs] + [self.vals_buf]))
        array = (id_t * len(resources))(*resources)
        with autorelease_pool():
            cbuf = objc.RETAIN(COMMAND_BUFFER(self.dev.queue))
            encoder = COMPUTE_ENCODER(cbuf)
            USE_RESOURCES(encoder, array, len(resources), RESOURCE_USAGE_READ_WRITE)
            EXECUTE_ICB(encoder, self.icb, NSRange(0, len(self.launches)))
            END_ENCODING(encoder)
            COMMIT(cbuf)
        return self.dev.track(cbuf, wait)

    def __del__(self) -> None:
        objc.release(getattr(self, "icb", None))
        objc.release(getattr(self, "vals_buf", None))
