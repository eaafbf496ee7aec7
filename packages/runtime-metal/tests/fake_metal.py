"""A stand-in for the Objective-C runtime and Metal, so that the METAL runtime's own logic (which messages it sends
with which arguments, ownership, waiting, indirect command buffers) runs on machines without a Mac.

`FakeMetal.install(monkeypatch)` routes every `lazygrad_metal.objc.Message` to Python objects that follow Apple's
documented behaviour for the calls the runtime makes: buffers are real host memory (so copies are real), and every
call is recorded. The MSL is only stored; kernels run where a test registers a host implementation for their name
(`FakeMetal.kernels`), and then only from indirect command buffers: a command buffer that executes one runs when it
is waited for (until then its status says it is committed, as a GPU still busy would), its commands in order across
barriers and in reverse between them (commands without a barrier may run concurrently), each only on buffers declared
with `useResources:count:usage:`. Changing a command of an ICB that such a command buffer will still run fails the
test, as it would race with the GPU. Other command buffers complete when committed.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import pytest

from lazygrad_metal import device as metal_device
from lazygrad_metal import graph as metal_graph
from lazygrad_metal import objc

# ids are unique across fakes, so an object that outlives its fake can't be mistaken for another fake's
_ids = itertools.count(0x1000, 0x10)


# A host implementation of a kernel: (threadgroups, threads per group, buffer addresses, int values) -> None.
HostKernel = Callable[[tuple[int, int, int], tuple[int, int, int], list[int], list[int]], None]


@dataclass
class Obj:
    """An Objective-C object: its class, retain count (0 for autoreleased objects nobody retained) and state."""

    cls: str
    refs: int = 1
    state: dict[str, Any] = field(default_factory=dict)


class FakeMetal:
    """The fake runtime: objects by id, the calls made, and the command buffers committed."""

    def __init__(self) -> None:
        self.objects: dict[int, Obj] = {}
        self.calls: list[tuple[str, str, tuple[Any, ...]]] = []
        self.memory: dict[int, ctypes.Array] = {}
        self.fail_kernels: set[str] = set()
        self.kernels: dict[str, tuple[int, int, HostKernel]] = {}  # name -> (buffers, int values, implementation)
        self.pending: list[int] = []  # committed command buffers that run ICBs, not yet run
        self.launched: list[str] = []  # names of the ICB commands run, in order
        self.refuse: dict[str, str] = {}  # selector -> error text: the call returns nil with that NSError
        self.classes = {name: self.new(f"class {name}", refs=-1) for name in _CLASSES}

    def new(self, cls: str, refs: int = 1, **state: Any) -> int:
        i = next(_ids)
        self.objects[i] = Obj(cls, refs, dict(state))
        return i

    def owned(self, cls: str) -> list[int]:
        """Ids of live objects of class `cls` that someone owns."""
        return [i for i, o in self.objects.items() if o.cls == cls and o.refs > 0]

    def calls_to(self, selector: str) -> list[tuple[Any, ...]]:
        return [(receiver, *args) for sel, receiver, args in self.calls if sel == selector]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeMetal:
        fake = self

        def send(message: objc.Message, receiver: int | None, *args: Any) -> Any:
            if not receiver:
                raise objc.ObjCError(f"message {message.selector} sent to nil")
            obj = fake.objects[receiver]
            fake.calls.append((message.selector, receiver, args))
            if message.selector in fake.refuse:
                error = next((a for a in args if hasattr(a, "_obj")), None)
                if error is not None:
                    error._obj.value = fake.new("NSError", refs=0, text=fake.refuse[message.selector])
                return None
            handler = _HANDLERS.get(message.selector)
            if handler is None:
                raise AssertionError(f"the fake Metal doesn't know {message.selector} (sent to a {obj.cls})")
            return handler(fake, receiver, obj, *args)

        monkeypatch.setattr(objc.Message, "__call__", send)
        monkeypatch.setattr(objc, "objc_class", lambda name: fake.classes[name])
        monkeypatch.setattr(objc, "framework", lambda name: None)
        monkeypatch.setattr(objc, "_selector", lambda name: name)
        for module in (objc, metal_device, metal_graph):
            monkeypatch.setattr(module, "autorelease_pool", nullcontext)
        monkeypatch.setattr(metal_device, "_metal", lambda: _FakeMetalFramework(fake))
        return fake


class _FakeMetalFramework:
    def __init__(self, fake: FakeMetal) -> None:
        self.fake = fake

    def MTLCreateSystemDefaultDevice(self) -> int:  # noqa: N802 - Metal's function name
        return self.fake.new("MTLDevice", name="Fake GPU")

    def MTLCopyAllDevices(self) -> int:  # noqa: N802 - Metal's function name
        devices = [self.fake.new("MTLDevice", refs=0, name=f"Fake GPU {i}") for i in range(2)]
        return self.fake.new("NSArray", items=devices)


_CLASSES = (
    "NSString",
    "NSArray",
    "MTLCompileOptions",
    "MTLComputePipelineDescriptor",
    "MTLIndirectCommandBufferDescriptor",
)


def _new_string(fake: FakeMetal, text: str, refs: int = 0) -> int:
    return fake.new("NSString", refs=refs, text=text.encode())


def _alloc(fake: FakeMetal, i: int, obj: Obj) -> int:
    return fake.new(obj.cls.removeprefix("class "))


def _release(fake: FakeMetal, i: int, obj: Obj) -> None:
    assert obj.refs > 0, f"release of a {obj.cls} nobody owns"
    obj.refs -= 1


def _retain(fake: FakeMetal, i: int, obj: Obj) -> int:
    obj.refs += 1
    return i


def _new_buffer(fake: FakeMetal, i: int, obj: Obj, length: int, options: int) -> int:
    assert options == metal_device.RESOURCE_STORAGE_MODE_SHARED
    mem = (ctypes.c_char * length)()
    buf = fake.new("MTLBuffer", length=length)
    fake.memory[buf] = mem
    return buf


def _new_library(fake: FakeMetal, i: int, obj: Obj, source: int, options: int, error: Any) -> int | None:
    text = fake.objects[source].state["text"].decode()
    if "syntax_error" in text:
        error._obj.value = fake.new("NSError", refs=0, text="program_source:3:5: error: use of undeclared identifier")
        return None
    return fake.new("MTLLibrary", source=text, options=dict(fake.objects[options].state))


def _new_function(fake: FakeMetal, i: int, obj: Obj, name: int) -> int | None:
    fname = fake.objects[name].state["text"].decode()
    return fake.new("MTLFunction", name=fname) if f"kernel void {fname}(" in obj.state["source"] else None


def _new_pipeline(fake: FakeMetal, i: int, obj: Obj, function: int, error: Any) -> int:
    return fake.new("MTLComputePipelineState", function=function, icb=False)


def _new_pipeline_desc(fake: FakeMetal, i: int, obj: Obj, desc: int, options: int, refl: Any, error: Any) -> int:
    state = fake.objects[desc].state
    return fake.new("MTLComputePipelineState", function=state["function"], icb=state["icb"])


def _command_buffer(fake: FakeMetal, i: int, obj: Obj) -> int:
    return fake.new("MTLCommandBuffer", refs=0, status=0, kernels=[], icb_runs=[])


def _encoder(fake: FakeMetal, i: int, obj: Obj) -> int:
    return fake.new("MTLComputeCommandEncoder", refs=0, cbuf=i, ended=False)


def _set_pipeline(fake: FakeMetal, i: int, obj: Obj, pipeline: int) -> None:
    obj.state["pipeline"] = pipeline


def _dispatch(fake: FakeMetal, i: int, obj: Obj, groups: Any, threads: Any) -> None:
    if groups.width * groups.height * groups.depth == 0:
        return  # no threadgroups: nothing runs
    function = fake.objects[fake.objects[obj.state["pipeline"]].state["function"]]
    fake.objects[obj.state["cbuf"]].state["kernels"].append(function.state["name"])


def _end_encoding(fake: FakeMetal, i: int, obj: Obj) -> None:
    obj.state["ended"] = True


def _execute_icb(fake: FakeMetal, i: int, obj: Obj, icb: int, rng: Any) -> None:
    commands = fake.objects[icb].state["commands"]
    for k in range(rng.location, rng.location + rng.length):
        pipeline = fake.objects[commands[k]].state["pipeline"]
        assert fake.objects[pipeline].state["icb"], "an ICB command needs a pipeline made for indirect command buffers"
        function = fake.objects[fake.objects[pipeline].state["function"]]
        fake.objects[obj.state["cbuf"]].state["kernels"].append(function.state["name"])
    resident = set(obj.state.get("resources", ()))
    fake.objects[obj.state["cbuf"]].state["icb_runs"].append((icb, rng.location, rng.length, resident))


def _commit(fake: FakeMetal, i: int, obj: Obj) -> None:
    if obj.state["icb_runs"]:
        obj.state["status"] = 2  # MTLCommandBufferStatusCommitted: it runs when waited for
        fake.pending.append(i)
        return
    failed = any(k in fake.fail_kernels for k in obj.state["kernels"])
    obj.state["status"] = metal_device.COMMAND_BUFFER_STATUS_ERROR if failed else 4


def _wait(fake: FakeMetal, i: int, obj: Obj) -> None:
    if i not in fake.pending:
        return
    # the queue runs command buffers in the order they were committed
    k = fake.pending.index(i) + 1
    ready, fake.pending = fake.pending[:k], fake.pending[k:]
    for cbuf in ready:
        state = fake.objects[cbuf].state
        for icb, start, count, resident in state["icb_runs"]:
            _run_commands(fake, fake.objects[icb].state["commands"][start : start + count], resident)
        failed = any(name in fake.fail_kernels for name in state["kernels"])
        state["status"] = metal_device.COMMAND_BUFFER_STATUS_ERROR if failed else 4


def _run_commands(fake: FakeMetal, commands: list[int], resident: set[int]) -> None:
    # A command with a barrier waits for every command before it; those between two barriers may run in any order,
    # so they run in reverse here to make a missing barrier show.
    groups: list[list[dict[str, Any]]] = []
    for c in commands:
        state = fake.objects[c].state
        if state.get("barrier") or not groups:
            groups.append([])
        groups[-1].append(state)
    for group in groups:
        for state in reversed(group):
            function = fake.objects[fake.objects[state["pipeline"]].state["function"]].state["name"]
            fake.launched.append(function)
            if function not in fake.kernels:
                continue
            nbufs, nvals, run = fake.kernels[function]
            bound = state["bufs"]
            assert sorted(bound) == list(range(nbufs + nvals)), f"{function} has bindings {sorted(bound)}"
            for buf, _ in bound.values():
                assert buf in resident, f"{function} uses buffer {buf:#x}, which useResources didn't declare"
            addrs = [ctypes.addressof(fake.memory[buf]) + offset for buf, offset in (bound[j] for j in range(nbufs))]
            vals = [
                ctypes.c_int32.from_address(ctypes.addressof(fake.memory[buf]) + offset).value
                for buf, offset in (bound[nbufs + j] for j in range(nvals))
            ]
            groups_, threads = state["dispatch"]
            run(groups_, threads, addrs, vals)


def _error(fake: FakeMetal, i: int, obj: Obj) -> int | None:
    if obj.state["status"] != metal_device.COMMAND_BUFFER_STATUS_ERROR:
        return None
    return fake.new("NSError", refs=0, text="Execution of the command buffer was aborted due to an error (GPU fault)")


def _new_icb(fake: FakeMetal, i: int, obj: Obj, desc: int, count: int, options: int) -> int:
    state = fake.objects[desc].state
    assert state["types"] == metal_graph.INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH and not state["inherit_buffers"]
    icb = fake.new("MTLIndirectCommandBuffer")
    fake.objects[icb].state["commands"] = [fake.new("MTLIndirectComputeCommand", refs=0, icb=icb) for _ in range(count)]
    for c in fake.objects[icb].state["commands"]:
        fake.objects[c].state["bufs"] = {}
    return icb


def _command_change(handler: Any) -> Any:
    """`handler` for a message that changes an ICB command, after checking no queued command buffer will run it."""

    def change(fake: FakeMetal, i: int, obj: Obj, *args: Any) -> Any:
        if obj.cls == "MTLIndirectComputeCommand":
            icb = obj.state["icb"]
            queued = [c for c in fake.pending if any(run[0] == icb for run in fake.objects[c].state["icb_runs"])]
            assert not queued, "an ICB command changed while a committed command buffer will still run it"
        return handler(fake, i, obj, *args)

    return change


def _icb_set_buffer(fake: FakeMetal, i: int, obj: Obj, buf: int, offset: int, index: int) -> None:
    obj.state["bufs"][index] = (buf, offset)


def _icb_dispatch(fake: FakeMetal, i: int, obj: Obj, groups: Any, threads: Any) -> None:
    size = lambda s: (s.width, s.height, s.depth)  # noqa: E731
    obj.state["dispatch"] = (size(groups), size(threads))


def _reset(fake: FakeMetal, i: int, obj: Obj) -> None:
    icb = obj.state["icb"]
    obj.state.clear()
    obj.state.update(bufs={}, icb=icb)


def _setter(key: str) -> Any:
    def set_(fake: FakeMetal, i: int, obj: Obj, value: Any) -> None:
        obj.state[key] = value

    return set_


def _getter(key: str) -> Any:
    return lambda fake, i, obj: obj.state[key]


_HANDLERS: dict[str, Any] = {
    "alloc": _alloc,
    "init": lambda fake, i, obj: i,
    "retain": _retain,
    "release": _release,
    "respondsToSelector:": lambda fake, i, obj, sel: sel in ("setMathMode:", "UTF8String"),
    "initWithUTF8String:": lambda fake, i, obj, text: (obj.state.update(text=text), i)[1],
    "UTF8String": lambda fake, i, obj: obj.state["text"],
    "localizedDescription": lambda fake, i, obj: _new_string(fake, obj.state["text"]),
    "count": lambda fake, i, obj: len(obj.state["items"]),
    "objectAtIndex:": lambda fake, i, obj, k: obj.state["items"][k],
    "name": lambda fake, i, obj: _new_string(fake, obj.state["name"]),
    "newCommandQueue": lambda fake, i, obj: fake.new("MTLCommandQueue"),
    # an M1: Apple GPU families 1 to 7
    "supportsFamily:": lambda fake, i, obj, family: 1001 <= family <= 1007,
    "newBufferWithLength:options:": _new_buffer,
    "contents": lambda fake, i, obj: ctypes.addressof(fake.memory[i]),
    "setMathMode:": _setter("math_mode"),
    "setMathFloatingPointFunctions:": _setter("math_functions"),
    "setFastMathEnabled:": _setter("fast_math"),
    "newLibraryWithSource:options:error:": _new_library,
    "newFunctionWithName:": _new_function,
    "newComputePipelineStateWithFunction:error:": _new_pipeline,
    "maxTotalThreadsPerThreadgroup": lambda fake, i, obj: 1024,
    "commandBuffer": _command_buffer,
    "computeCommandEncoder": _encoder,
    "setComputePipelineState:": _command_change(_set_pipeline),
    "setBuffer:offset:atIndex:": lambda fake, i, obj, buf, offset, index: None,
    "setBytes:length:atIndex:": lambda fake, i, obj, ptr, length, index: None,
    "dispatchThreadgroups:threadsPerThreadgroup:": _dispatch,
    "endEncoding": _end_encoding,
    "commit": _commit,
    "waitUntilCompleted": _wait,
    "status": _getter("status"),
    "error": _error,
    "GPUStartTime": lambda fake, i, obj: 100.0,
    "GPUEndTime": lambda fake, i, obj: 100.25,
    "setComputeFunction:": _setter("function"),
    "setSupportIndirectCommandBuffers:": _setter("icb"),
    "newComputePipelineStateWithDescriptor:options:reflection:error:": _new_pipeline_desc,
    "setCommandTypes:": _setter("types"),
    "setInheritBuffers:": _setter("inherit_buffers"),
    "setInheritPipelineState:": _setter("inherit_pipeline"),
    "setMaxKernelBufferBindCount:": _setter("max_buffers"),
    "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:": _new_icb,
    "indirectComputeCommandAtIndex:": lambda fake, i, obj, k: obj.state["commands"][k],
    "reset": _command_change(_reset),
    "setKernelBuffer:offset:atIndex:": _command_change(_icb_set_buffer),
    "concurrentDispatchThreadgroups:threadsPerThreadgroup:": _command_change(_icb_dispatch),
    "setBarrier": _command_change(lambda fake, i, obj: obj.state.update(barrier=True)),
    "useResources:count:usage:": lambda fake, i, obj, arr, n, usage: obj.state.update(resources=list(arr[:n])),
    "executeCommandsInBuffer:withRange:": _execute_icb,
}
