"""`MetalGraph`, the METAL device's graph type (`lazygrad_uop.device.GraphRunner`): kernel launches encoded once into
an MTLIndirectCommandBuffer (ICB) and replayed as one `executeCommandsInBuffer:withRange:` per call, which is how the
JIT runs a captured function on Apple GPUs without encoding every launch again.

Each launch is one indirect compute command: its pipeline (made with `supportIndirectCommandBuffers`), its buffers
bound with `setKernelBuffer:offset:atIndex:` in parameter order, its symbolic variables as int32s in a small buffer
of the graph (an ICB command has no `setBytes`), its threadgroups, and a barrier, so that it waits for the commands
before it and sees their writes. A replay declares every buffer the commands use with `useResources:count:usage:`
(an ICB's commands don't make their buffers resident by themselves). `update` re-encodes the launches that changed,
after waiting for a replay of this graph that may still be reading the commands and values it rewrites.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import ClassVar

from lazygrad_metal import objc
from lazygrad_metal.device import (
    COMMAND_BUFFER,
    COMMIT,
    COMPUTE_ENCODER,
    CONTENTS,
    DISPATCH,
    END_ENCODING,
    NEW_BUFFER,
    RESOURCE_STORAGE_MODE_SHARED,
    SET_PIPELINE,
    MetalBuffer,
    MetalDevice,
    MetalProgram,
    MTLSize,
)
from lazygrad_metal.objc import BOOL, Message, NSUInteger, autorelease_pool, id_t
from lazygrad_uop.device import CompiledDevice, GraphError, GraphRunner, KernelLaunch


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
    """An owned compute pipeline of `function` that indirect command buffers can use; GraphError if Metal can't
    make one (the kernel then runs on its own, with its ordinary pipeline)."""
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
            raise GraphError(
                f"Metal could not make a pipeline of {name} for indirect command buffers: "
                f"{objc.error_text(error.value)}"
            )
        return pipeline


class MetalGraph(GraphRunner):
    """`launches`, all of programs of the METAL device `device`, as one indirect command buffer (see the module
    docstring). Raises GraphError for launches it can't encode (programs or buffers of another device, more than 31
    buffers and variables, threadgroups larger than the pipeline allows) and when Metal can't make the ICB or an ICB
    pipeline: the JIT then runs those kernels one by one."""

    def __init__(self, device: CompiledDevice, launches: Sequence[KernelLaunch]) -> None:
        super().__init__(device, launches)
        if not isinstance(device, MetalDevice):
            raise GraphError(f"a MetalGraph runs on a METAL device, not {device.device}")
        self.dev: MetalDevice = device
        for i, launch in enumerate(self.launches):
            self._check(i, launch)
        # made before the ICB, so that a kernel Metal can't put in an ICB refuses the graph before anything is owned
        self.pipelines: dict[int, int] = {}
        for launch in self.launches:
            assert isinstance(launch.program, MetalProgram)
            self.pipelines.setdefault(id(launch.program), launch.program.icb_pipeline())
        self.icb: int | None = None
        self.vals_buf: int | None = None
        self._last_replay: int | None = None
        with autorelease_pool():
            desc = objc.new_object("MTLIndirectCommandBufferDescriptor")
            try:
                SET_COMMAND_TYPES(desc, INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH)
                SET_INHERIT_BUFFERS(desc, False)
                SET_INHERIT_PIPELINE(desc, False)
                SET_MAX_KERNEL_BUFFERS(desc, MAX_KERNEL_BUFFERS)
                self.icb = NEW_ICB(device.mtl, desc, len(self.launches), RESOURCE_STORAGE_MODE_SHARED) or None
            finally:
                objc.release(desc)
        if self.icb is None:
            raise GraphError(f"{device.device} could not make an indirect command buffer of {len(launches)} commands")
        # each launch's variables get consecutive slots of one buffer
        self.val_slot: list[int] = []
        slots = 0
        for launch in self.launches:
            self.val_slot.append(slots)
            slots += len(launch.vals)
        self.vals_buf = NEW_BUFFER(device.mtl, max(slots, 1) * VALUE_SLOT_BYTES, RESOURCE_STORAGE_MODE_SHARED) or None
        if self.vals_buf is None:
            raise MemoryError(f"{device.device} could not allocate the {slots} variable slots of a graph")
        for i in range(len(self.launches)):
            self._encode(i)
        self._resources = self._resource_array()

    def _check(self, i: int, launch: KernelLaunch) -> None:
        program = launch.program
        if not isinstance(program, MetalProgram) or program.device is not self.dev:
            raise GraphError(f"launch {i} ({program.name}) is not a kernel of {self.dev.device}")
        for j, b in enumerate(launch.bufs):
            if not isinstance(b, MetalBuffer):
                raise GraphError(
                    f"buffer {j} of launch {i} ({program.name}) is a {type(b).__name__}, not memory of a METAL "
                    "allocator"
                )
        if len(launch.bufs) + len(launch.vals) > MAX_KERNEL_BUFFERS:
            raise GraphError(
                f"launch {i} ({program.name}) binds {len(launch.bufs)} buffers and {len(launch.vals)} variables; an "
                f"indirect command binds at most {MAX_KERNEL_BUFFERS}"
            )
        try:
            program.check_launch(len(launch.bufs) + len(launch.vals), launch.local_size)
        except ValueError as exc:
            raise GraphError(f"launch {i}: {exc}") from exc

    def _encode(self, i: int) -> None:
        launch, cmd = self.launches[i], COMMAND_AT(self.icb, i)
        RESET(cmd)
        ICB_SET_PIPELINE(cmd, self.pipelines[id(launch.program)])
        for j, b in enumerate(launch.bufs):
            ICB_SET_BUFFER(cmd, b.buf, b.offset, j)
        base = CONTENTS(self.vals_buf)
        for k, v in enumerate(launch.vals):
            offset = (self.val_slot[i] + k) * VALUE_SLOT_BYTES
            ctypes.c_int32.from_address(base + offset).value = int(v)
            ICB_SET_BUFFER(cmd, self.vals_buf, offset, len(launch.bufs) + k)
        ICB_DISPATCH(cmd, MTLSize(*launch.global_size), MTLSize(*launch.local_size))
        ICB_SET_BARRIER(cmd)

    def _resource_array(self) -> ctypes.Array:
        """Every MTLBuffer the commands use (sub-buffers share theirs), for `useResources:count:usage:`."""
        resources = dict.fromkeys([b.buf for launch in self.launches for b in launch.bufs] + [self.vals_buf])
        return (id_t * len(resources))(*resources)

    def update(self, changes: Mapping[int, KernelLaunch]) -> None:
        """Launch `i` becomes `changes[i]` (same program; any buffers, values, sizes) for the next replays: its
        command is encoded again."""
        for i, launch in changes.items():
            self._check(i, launch)
        super().update(changes)
        if not changes:
            return
        # The GPU reads the commands and the variable buffer while it runs a replay; one may still be queued.
        if self._last_replay is not None and self._last_replay in self.dev.in_flight:
            self.dev.synchronize()
        self._last_replay = None
        for i in changes:
            self._encode(i)
        self._resources = self._resource_array()

    def __call__(self, wait: bool = False) -> float | None:
        """Run every launch in order; with `wait`, block until done and return the GPU time in seconds."""
        with autorelease_pool():
            cbuf = objc.RETAIN(COMMAND_BUFFER(self.dev.queue))
            encoder = COMPUTE_ENCODER(cbuf)
            USE_RESOURCES(encoder, self._resources, len(self._resources), RESOURCE_USAGE_READ_WRITE)
            if self.dev.icb_pipelines_need_use:
                # On GPUs before the Apple9 family (M1, M2), running an ICB whose pipelines the encoder never set can
                # fault the GPU; setting each of them for a dispatch of no threadgroups makes them used, and runs
                # nothing.
                for pipeline in self.pipelines.values():
                    SET_PIPELINE(encoder, pipeline)
                    DISPATCH(encoder, MTLSize(0, 0, 0), MTLSize(0, 0, 0))
            EXECUTE_ICB(encoder, self.icb, NSRange(0, len(self.launches)))
            END_ENCODING(encoder)
            COMMIT(cbuf)
        self._last_replay = None if wait else cbuf
        return self.dev.track(cbuf, wait)

    def __del__(self) -> None:
        # a command buffer still running a replay keeps the ICB and the buffers it references alive
        objc.release(getattr(self, "icb", None))
        objc.release(getattr(self, "vals_buf", None))
