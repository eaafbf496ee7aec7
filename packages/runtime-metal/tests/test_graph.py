"""`MetalGraph`, the METAL device's `GraphRunner`: on the stand-in for Metal (`fake_metal`, any OS) the indirect
command buffer it encodes (selectors and arguments), what a replay sends, re-encoding on update, what it refuses,
ownership, the JIT's use of it, and the graph contract (`lazygrad_testkit.graph_contract`); on a
Mac's GPU the contract and a jitted function against numpy (those tests skip elsewhere, saying why)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fake_metal import FakeMetal

from lazygrad_metal import graph as metal_graph
from lazygrad_metal import plugin
from lazygrad_metal.device import MetalDevice
from lazygrad_metal.graph import VALUE_SLOT_BYTES, MetalGraph
from lazygrad_testkit.graph_contract import (
    CHECKS,
    GraphHarness,
    add_kernel_uops,
    check_jit_replays_through_the_graph,
    host_add,
)
from lazygrad_testkit.registry import stand_in
from lazygrad_uop.device import CompiledDevice, GraphError, KernelLaunch

KERNEL = """#include <metal_stdlib>
using namespace metal;
kernel void {name}(device float* data0 [[buffer(0)]], device float* data1 [[buffer(1)]],
                   device float* data2 [[buffer(2)]], constant int& k [[buffer(3)]],
                   uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {{}}
"""


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMetal]:
    yield FakeMetal().install(monkeypatch)
    # objects of this test (a graph kept alive by a traceback) go while this fake still stands in for Metal
    gc.collect()


@pytest.fixture
def dev(fake: FakeMetal) -> MetalDevice:
    return MetalDevice("METAL")


def program(dev: MetalDevice, name: str):
    return dev.load_program(name, dev.compiler.compile(KERNEL.format(name=name)))


def commands(fake: FakeMetal, graph: MetalGraph) -> list[dict]:
    return [fake.objects[c].state for c in fake.objects[graph.icb].state["commands"]]


def slot_values(fake: FakeMetal, graph: MetalGraph, count: int) -> list[int]:
    return np.frombuffer(bytes(fake.memory[graph.vals_buf]), np.int32)[:: VALUE_SLOT_BYTES // 4][:count].tolist()


# *** what it sends ***


def test_each_launch_is_an_indirect_command_with_a_barrier(fake: FakeMetal, dev: MetalDevice) -> None:
    first, second = program(dev, "first"), program(dev, "second")
    x, y, z = (dev.allocator.alloc(64) for _ in range(3))
    graph = dev.graph(
        dev,
        [
            KernelLaunch(first, (y, x), (4, 1, 1), (16, 1, 1), vals=(3,)),
            KernelLaunch(second, (z, dev.allocator._offset(y, 32, 32)), (2, 2, 1), vals=(9, -4)),
            KernelLaunch(first, (x, z), (1, 1, 1), vals=(5,)),
        ],
    )
    (desc,) = [r for r, *_ in fake.calls_to("setCommandTypes:")]
    assert fake.objects[desc].state == {
        "types": metal_graph.INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH,
        "inherit_buffers": False,
        "inherit_pipeline": False,
        "max_buffers": 31,
    }
    ((_, _, count, options),) = fake.calls_to("newIndirectCommandBufferWithDescriptor:maxCommandCount:options:")
    assert (count, options) == (3, 0)
    c0, c1, c2 = commands(fake, graph)
    vals = graph.vals_buf
    assert c0["bufs"] == {0: (y.buf, 0), 1: (x.buf, 0), 2: (vals, 0)}
    assert c1["bufs"] == {0: (z.buf, 0), 1: (y.buf, 32), 2: (vals, VALUE_SLOT_BYTES), 3: (vals, 2 * VALUE_SLOT_BYTES)}
    assert c2["bufs"] == {0: (x.buf, 0), 1: (z.buf, 0), 2: (vals, 3 * VALUE_SLOT_BYTES)}
    assert slot_values(fake, graph, 4) == [3, 9, -4, 5]
    assert [c["dispatch"] for c in commands(fake, graph)] == [
        ((4, 1, 1), (16, 1, 1)),
        ((2, 2, 1), (1, 1, 1)),
        ((1, 1, 1), (1, 1, 1)),
    ]
    assert all(c["barrier"] for c in commands(fake, graph))
    # the pipelines are the programs' ICB pipelines, one per program
    assert c0["pipeline"] == c2["pipeline"] == first.icb_pipeline() and c1["pipeline"] == second.icb_pipeline()
    assert fake.objects[c0["pipeline"]].state["icb"]
    assert not fake.owned("MTLIndirectCommandBufferDescriptor") and not fake.owned("MTLComputePipelineDescriptor")


def test_a_replay_declares_the_buffers_and_executes_the_whole_icb(fake: FakeMetal, dev: MetalDevice) -> None:
    first, second = program(dev, "first"), program(dev, "second")
    x, y = dev.allocator.alloc(64), dev.allocator.alloc(64)
    graph = dev.graph(
        dev, [KernelLaunch(first, (y, x), vals=(1,)), KernelLaunch(second, (x, dev.allocator._offset(y, 8, 8)))]
    )
    start = len(fake.calls)
    assert graph(wait=True) == pytest.approx(0.25)
    sent = [sel for sel, _, _ in fake.calls[start:] if sel not in ("retain", "release")]
    # the fake is an M1 (Apple7): each pipeline is set for an empty dispatch before the ICB runs
    assert sent == [
        "commandBuffer",
        "computeCommandEncoder",
        "useResources:count:usage:",
        *["setComputePipelineState:", "dispatchThreadgroups:threadsPerThreadgroup:"] * 2,
        "executeCommandsInBuffer:withRange:",
        "endEncoding",
        "commit",
        "waitUntilCompleted",
        "status",
        "GPUEndTime",
        "GPUStartTime",
    ]
    ((_, resources, count, usage),) = fake.calls_to("useResources:count:usage:")
    assert sorted(resources[:count]) == sorted({x.buf, y.buf, graph.vals_buf}) and count == 3 and usage == 3
    empty = fake.calls_to("dispatchThreadgroups:threadsPerThreadgroup:")
    assert all((g.width, g.height, g.depth) == (0, 0, 0) for _, g, _ in empty)
    ((encoder, icb, rng),) = fake.calls_to("executeCommandsInBuffer:withRange:")
    used = [p for r, p in fake.calls_to("setComputePipelineState:") if r == encoder]
    assert used == [first.icb_pipeline(), second.icb_pipeline()]
    assert icb == graph.icb and (rng.location, rng.length) == (0, 2)
    assert fake.objects[encoder].state["ended"]
    assert fake.launched == ["first", "second"]
    assert not fake.owned("MTLCommandBuffer") and not dev.in_flight


def test_apple9_gpus_run_the_icb_without_empty_dispatches(fake: FakeMetal, dev: MetalDevice) -> None:
    dev.icb_pipelines_need_use = False
    a = dev.allocator.alloc(64)
    dev.graph(dev, [KernelLaunch(program(dev, "first"), (a,)), KernelLaunch(program(dev, "second"), (a,))])()
    assert not fake.calls_to("dispatchThreadgroups:threadsPerThreadgroup:")
    on_encoders = [r for r, _ in fake.calls_to("setComputePipelineState:") if fake.objects[r].cls.endswith("Encoder")]
    assert not on_encoders


def test_update_reencodes_only_the_changed_commands(fake: FakeMetal, dev: MetalDevice) -> None:
    first, second = program(dev, "first"), program(dev, "second")
    x, y, z, w = (dev.allocator.alloc(64) for _ in range(4))
    graph = dev.graph(dev, [KernelLaunch(first, (y, x), vals=(3,)), KernelLaunch(second, (z, y), vals=(9,))])
    c0, c1 = fake.objects[graph.icb].state["commands"]
    start = len(fake.calls)
    graph.update({1: KernelLaunch(second, (w, y), (8, 1, 1), (2, 1, 1), vals=(11,))})
    changed = {receiver for _, receiver, _ in fake.calls[start:] if receiver in (c0, c1)}
    assert changed == {c1}, "only the changed launch's command is encoded again"
    s1 = fake.objects[c1].state
    assert s1["bufs"] == {0: (w.buf, 0), 1: (y.buf, 0), 2: (graph.vals_buf, VALUE_SLOT_BYTES)}
    assert s1["dispatch"] == ((8, 1, 1), (2, 1, 1)) and s1["barrier"]
    assert slot_values(fake, graph, 2) == [3, 11]
    graph()
    ((_, resources, count, _),) = fake.calls_to("useResources:count:usage:")
    assert w.buf in resources[:count] and z.buf not in resources[:count], "the declared buffers follow the update"
    dev.synchronize()


def test_update_waits_only_for_a_replay_of_the_graph_still_queued(fake: FakeMetal, dev: MetalDevice) -> None:
    prog = program(dev, "first")
    x, y = dev.allocator.alloc(64), dev.allocator.alloc(64)
    graph = dev.graph(dev, [KernelLaunch(prog, (y, x), vals=(1,)), KernelLaunch(prog, (x, y), vals=(2,))])
    graph(wait=True)
    waits = len(fake.calls_to("waitUntilCompleted"))
    graph.update({0: KernelLaunch(prog, (y, y), vals=(1,))})
    assert len(fake.calls_to("waitUntilCompleted")) == waits, "no replay queued: nothing to wait for"
    graph()
    (queued,) = dev.in_flight
    assert fake.objects[queued].state["status"] == 2
    # the stand-in fails the test if a command of an ICB a queued command buffer will run changes
    graph.update({1: KernelLaunch(prog, (x, x), vals=(5,))})
    assert fake.calls_to("waitUntilCompleted")[-1] == (queued,) and not dev.in_flight


def test_what_the_graph_cant_encode_is_a_graph_error(fake: FakeMetal, dev: MetalDevice) -> None:
    prog, a = program(dev, "first"), dev.allocator.alloc(64)
    other = MetalDevice("METAL:1")
    foreign = program(other, "first")
    with pytest.raises(GraphError, match="at least one"):
        MetalGraph(dev, [])
    with pytest.raises(GraphError, match=r"launch 1 \(first\) is not a kernel of METAL$"):
        MetalGraph(dev, [KernelLaunch(prog, (a,)), KernelLaunch(foreign, (a,))])
    with pytest.raises(GraphError, match="at most 31"):
        MetalGraph(dev, [KernelLaunch(prog, (a,) * 30, vals=(1, 2))])
    with pytest.raises(GraphError, match=r"launch 0: first: a threadgroup of .* more than the 1024"):
        MetalGraph(dev, [KernelLaunch(prog, (a,), local_size=(64, 32, 1))])
    with pytest.raises(GraphError, match=r"buffer 0 of launch 0 .* is a int, not memory of a METAL allocator"):
        MetalGraph(dev, [KernelLaunch(prog, (1234,))])
    cpu_like = CompiledDevice("CPU", dev.allocator, dev.renderer, dev.compiler, dev.runtime)
    with pytest.raises(GraphError, match="runs on a METAL device, not CPU"):
        MetalGraph(cpu_like, [KernelLaunch(prog, (a,))])
    assert not fake.calls_to("newIndirectCommandBufferWithDescriptor:maxCommandCount:options:")
    graph = MetalGraph(dev, [KernelLaunch(prog, (a,), vals=(1,))])
    with pytest.raises(GraphError, match="build a new graph"):
        graph.update({0: KernelLaunch(program(dev, "second"), (a,), vals=(1,))})
    with pytest.raises(GraphError, match="more than the 1024"):
        graph.update({0: KernelLaunch(prog, (a,), local_size=(2048, 1, 1), vals=(1,))})
    assert graph.launches[0].local_size == (1, 1, 1), "a refused update changes nothing"


def test_what_metal_refuses_to_make_is_a_graph_error(fake: FakeMetal, dev: MetalDevice) -> None:
    a = dev.allocator.alloc(64)
    fake.refuse["newComputePipelineStateWithDescriptor:options:reflection:error:"] = "ICBs not supported here"
    with pytest.raises(GraphError, match="pipeline of first for indirect command buffers: ICBs not supported here"):
        MetalGraph(dev, [KernelLaunch(program(dev, "first"), (a,))])
    fake.refuse = {"newIndirectCommandBufferWithDescriptor:maxCommandCount:options:": ""}
    with pytest.raises(GraphError, match="METAL could not make an indirect command buffer of 1 commands"):
        MetalGraph(dev, [KernelLaunch(program(dev, "second"), (a,))])
    assert not fake.owned("MTLIndirectCommandBufferDescriptor") and not fake.owned("MTLComputePipelineDescriptor")


def test_gpu_errors_of_a_replay_raise_metal_errors(fake: FakeMetal, dev: MetalDevice) -> None:
    from lazygrad_metal.device import MetalError

    fake.fail_kernels.add("bad")
    a = dev.allocator.alloc(64)
    graph = MetalGraph(dev, [KernelLaunch(program(dev, "bad"), (a,)), KernelLaunch(program(dev, "first"), (a,))])
    with pytest.raises(MetalError, match="GPU fault"):
        graph(wait=True)
    graph()
    with pytest.raises(MetalError, match="GPU fault"):
        dev.synchronize()


def test_graph_releases_what_it_owns(fake: FakeMetal, dev: MetalDevice) -> None:
    a = dev.allocator.alloc(64)
    graph = MetalGraph(dev, [KernelLaunch(program(dev, "first"), (a,), vals=(1,))])
    graph()
    icb, vals = graph.icb, graph.vals_buf
    dev.synchronize()
    del graph
    gc.collect()
    assert fake.objects[icb].refs == 0 and fake.objects[vals].refs == 0
    assert not fake.owned("MTLCommandBuffer")


def test_the_metal_device_declares_its_graph_type(dev: MetalDevice) -> None:
    assert dev.graph is MetalGraph
    assert dev.icb_pipelines_need_use, "the stand-in is an M1 (Apple7), before Apple9"


@pytest.fixture
def lazygrad_on_the_stand_in(fake: FakeMetal, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The lazygrad frontend with METAL usable in the device registry while the stand-in answers; afterwards the
    registry and the frontend's program cache forget the stand-in's device, before its objects are collected."""
    lazygrad = pytest.importorskip("lazygrad", reason="the JIT is part of the lazygrad frontend")
    from lazygrad import engine
    from lazygrad_uop.registry import Device

    assert Device.DEFAULT  # chosen before METAL looks usable, so it stays what it was
    runners = dict(engine._runners)
    with stand_in("METAL"):
        yield lazygrad
    engine._runners.clear()
    engine._runners.update(runners)


def test_jit_replays_through_the_icb_reencoded_with_each_new_input(
    fake: FakeMetal, lazygrad_on_the_stand_in: Any
) -> None:
    """The JIT on the stand-in: its kernels (rendered to MSL, not run) become one MetalGraph, and each replay with
    new inputs re-encodes the commands that read them and runs the ICB once, with no launch per kernel."""
    from lazygrad.jit import _GraphStep

    lazygrad = lazygrad_on_the_stand_in

    @lazygrad.TinyJit
    def f(a, b):
        x = (a + b).contiguous()
        return ((x * a - 1).contiguous() * 2 + x).sum(axis=1)

    def inputs():
        return [lazygrad.Tensor(np.ones((4, 8), np.float32), device="METAL").realize() for _ in range(2)]

    f(*inputs())
    f(*inputs())
    (step,) = f.captured.steps
    assert isinstance(step, _GraphStep) and isinstance(step.graph, MetalGraph) and len(step.items) == 3
    for _ in range(3):
        a, b = inputs()
        start = len(fake.calls)
        f(a, b)
        sent = [sel for sel, _, _ in fake.calls[start:]]
        assert sent.count("executeCommandsInBuffer:withRange:") == 1
        dispatches = [args[0] for sel, _, args in fake.calls[start:] if sel.startswith("dispatchThreadgroups:")]
        assert all(g.width * g.height * g.depth == 0 for g in dispatches), "no kernel is launched on its own"
        assert sent.count("reset") == 2, "the two kernels that read an input are encoded again"
        new = {t._buffer_view()[0].handle.buf for t in (a, b)}
        cmds = commands(fake, step.graph)
        assert all(new & {buf for buf, _ in c["bufs"].values()} for c in cmds[:2])
    lazygrad.Device["METAL"].synchronize()


# *** the contract ***


def _harness(device: MetalDevice, program_of, block: int) -> GraphHarness:
    def upload(a: np.ndarray):
        handle = device.allocator.alloc(a.nbytes)
        device.allocator.copyin(handle, memoryview(np.ascontiguousarray(a)).cast("B"))
        return handle

    def download(handle, n: int) -> np.ndarray:
        out = np.empty(n, np.float32)
        device.allocator.copyout(memoryview(out).cast("B"), handle)
        return out

    return GraphHarness(device, block, program_of, upload, download, lambda: program_of("lg_foreign", other=True))


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_contract_on_the_stand_in(fake: FakeMetal, check) -> None:
    devices = {False: MetalDevice("METAL"), True: MetalDevice("METAL:1")}

    def program_of(name: str, other: bool = False):
        fake.kernels[name] = (3, 1, host_add)
        return program(devices[other], name)

    check(_harness(devices[False], program_of, block=4))


def test_the_stand_in_catches_commands_without_barriers(fake: FakeMetal, monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract's order check fails for an ICB whose commands have no barriers: the stand-in runs commands
    between barriers in reverse."""
    monkeypatch.setattr(metal_graph, "ICB_SET_BARRIER", lambda cmd: None)
    dev = MetalDevice("METAL")

    def program_of(name: str, other: bool = False):
        fake.kernels[name] = (3, 1, host_add)
        return program(dev, name)

    with pytest.raises(AssertionError):
        CHECKS[0](_harness(dev, program_of, block=4))


WHY = plugin.metal_usable()
on_a_mac = pytest.mark.skipif(WHY is not None, reason=f"METAL is not usable here: {WHY}")


@pytest.fixture(scope="module")
def mac_harness() -> GraphHarness:
    if WHY is not None:
        pytest.skip(f"METAL is not usable here: {WHY}")
    from lazygrad_uop.registry import Device

    dev = Device["METAL"]
    programs: dict[tuple[str, bool], object] = {}

    def program_of(name: str, other: bool = False):
        # a program of another MetalDevice object (the same GPU opened again) stands in for another device's
        if (name, other) not in programs:
            target = MetalDevice("METAL") if other else dev
            lib = target.compiler.compile(target.renderer.render(add_kernel_uops(name, 32)))
            programs[(name, other)] = target.load_program(name, lib)
        return programs[(name, other)]

    return _harness(dev, program_of, block=32)


@on_a_mac
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_contract_on_the_gpu(mac_harness: GraphHarness, check) -> None:
    check(mac_harness)


@on_a_mac
def test_jit_replays_three_kernels_as_one_icb() -> None:
    check_jit_replays_through_the_graph("METAL")
