"""`CUDAGraph`, the CUDA device's `GraphRunner`: the driver calls it makes and their arguments against a stand-in
driver (`fake_cuda`), driver failures as clear exceptions, the JIT's use of it, and the graph contract
(`lazygrad_testkit.graph_contract`) on the stand-in and, where there is one, on a real GPU (those tests skip
elsewhere, saying why).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as real_driver
from fake_cuda import FakeDriver, FakeKernel, driver_missing, install

from lazygrad_cuda import device, graph
from lazygrad_cuda.errors import CUDAError
from lazygrad_testkit.graph_contract import (
    CHECKS,
    GraphHarness,
    add_kernel_uops,
    check_jit_replays_through_the_graph,
    host_add,
)
from lazygrad_testkit.registry import stand_in
from lazygrad_uop.device import GraphError, KernelLaunch

no_driver = pytest.mark.skipif(
    not driver_missing(), reason="a CUDA driver is installed: the GPU tests run these calls for real"
)
STAND_IN_CUBIN = b"\x7fELF stand-in cubin"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDriver]:
    yield install(monkeypatch)
    # objects of this test (a graph kept alive by a traceback) go while this stand-in still answers for the driver
    gc.collect()


def _harness(gpu: device.CUDADevice, program, block: int) -> GraphHarness:
    def upload(a: np.ndarray):
        buf = gpu.allocator.alloc(a.nbytes)
        gpu.allocator.copyin(buf, memoryview(np.ascontiguousarray(a)).cast("B"))
        return buf

    def download(buf, n: int) -> np.ndarray:
        out = np.empty(n, np.float32)
        gpu.allocator.copyout(memoryview(out).cast("B"), buf)
        return out

    return GraphHarness(gpu, block, program, upload, download, lambda: program("lg_foreign", other=True))


def _stand_in_harness(fake: FakeDriver) -> GraphHarness:
    gpus = {False: device.CUDADevice("CUDA"), True: device.CUDADevice("CUDA:1")}

    def program(name: str, other: bool = False):
        fake.kernels[name] = FakeKernel(3, 1, host_add)
        return gpus[other].load_program(name, STAND_IN_CUBIN)

    return _harness(gpus[False], program, block=4)


# *** the driver calls ***


@no_driver
def test_nodes_are_chained_in_order_and_instantiated(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    prog = gpu.load_program("E_4", STAND_IN_CUBIN)
    a, b, c = (gpu.allocator.alloc(16) for _ in range(3))
    fake.param_shape = (2, 1)
    launches = [
        KernelLaunch(prog, (a, b), (4, 1, 1), (32, 1, 1), vals=(0,)),
        KernelLaunch(prog, (b, c), (4, 2, 1), vals=(1,)),
        KernelLaunch(prog, (c, a), (1, 1, 1), vals=(2,)),
    ]
    start = len(fake.calls)
    g = graph.CUDAGraph(gpu, launches)
    built = [name for name, _ in fake.calls[start:] if name != "cuCtxSetCurrent"]
    assert built == ["cuGraphCreate", *["cuGraphAddKernelNode"] * 3, "cuGraphInstantiate"]
    adds = fake.args_of("cuGraphAddKernelNode")
    (create,) = fake.args_of("cuGraphCreate")
    assert all(args[0] is not None and int(args[0]) == int(fake.args_of("cuGraphInstantiate")[0][0]) for args in adds)
    assert create == (0,)
    # each node depends on the one before it, and only on it
    assert [[int(d) for d in args[1]] for args in adds] == [[], [int(g.nodes[0])], [int(g.nodes[1])]]
    assert [args[2] for args in adds] == [0, 1, 1]
    params = [args[3] for args in adds]
    assert all(int(p.func) == int(prog.function) for p in params)
    assert [(p.gridDimX, p.gridDimY, p.blockDimX) for p in params] == [(4, 1, 32), (4, 2, 1), (1, 1, 1)]
    assert all(p.sharedMemBytes == 0 for p in params)
    assert fake.kernel_args == [([a.ptr, b.ptr], [0]), ([b.ptr, c.ptr], [1]), ([c.ptr, a.ptr], [2])]


@no_driver
def test_kernel_nodes_carry_each_programs_dynamic_shared_memory(fake: FakeDriver) -> None:
    from lazygrad_cuda.renderer import DYNAMIC_SHARED_SYMBOL

    gpu = device.CUDADevice("CUDA")
    # a PTX module as the driver reads it, with the constant the renderer writes for 80 KB of dynamic shared memory
    image = f".const .align 4 .u32 {DYNAMIC_SHARED_SYMBOL} = {80 * 1024};\n".encode() + b"\0"
    big, plain = gpu.load_program("r_4", image), gpu.load_program("E_4", STAND_IN_CUBIN)
    a, b = gpu.allocator.alloc(16), gpu.allocator.alloc(16)
    fake.param_shape = (2, 0)
    g = graph.CUDAGraph(gpu, [KernelLaunch(big, (a, b), (4, 1, 1)), KernelLaunch(plain, (b, a), (4, 1, 1))])
    assert [args[3].sharedMemBytes for args in fake.args_of("cuGraphAddKernelNode")] == [80 * 1024, 0]
    g.update({0: KernelLaunch(big, (b, a), (2, 1, 1))})
    assert fake.args_of("cuGraphExecKernelNodeSetParams")[-1][2].sharedMemBytes == 80 * 1024
    g()
    assert [n.shared for n in fake.g.execs[int(g.exec)].values()] == [80 * 1024, 0]


@no_driver
def test_replays_launch_on_the_stream_and_time_with_events(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    prog = gpu.load_program("E_4", STAND_IN_CUBIN)
    a = gpu.allocator.alloc(16)
    fake.param_shape = (1, 0)
    g = graph.CUDAGraph(gpu, [KernelLaunch(prog, (a,)), KernelLaunch(prog, (a,))])
    start = len(fake.calls)
    assert g() is None
    assert fake.names()[start:] == ["cuCtxSetCurrent", "cuGraphLaunch"]
    (launch,) = fake.args_of("cuGraphLaunch")
    assert int(launch[0]) == int(g.exec) and int(launch[1]) == int(gpu.stream)
    start = len(fake.calls)
    assert g(wait=True) == pytest.approx(1.5e-3)
    timed = fake.names()[start:]
    assert timed[-5:] == ["cuEventRecord", "cuGraphLaunch", "cuEventRecord", "cuEventSynchronize", "cuEventElapsedTime"]
    records = fake.args_of("cuEventRecord")[-2:]
    assert all(int(r[1]) == int(gpu.stream) for r in records) and int(records[0][0]) != int(records[1][0])
    g(wait=True)
    assert fake.names().count("cuEventCreate") == 2, "the timing events are made once per graph"


@no_driver
def test_update_patches_only_the_changed_nodes_of_the_executable_graph(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    prog = gpu.load_program("E_4", STAND_IN_CUBIN)
    a, b, c = (gpu.allocator.alloc(16) for _ in range(3))
    fake.param_shape = (2, 1)
    launches = [KernelLaunch(prog, (a, b), (4, 1, 1), vals=(0,)), KernelLaunch(prog, (b, c), (4, 1, 1), vals=(1,))]
    g = graph.CUDAGraph(gpu, launches)
    fake.kernel_args.clear()
    g.update({1: KernelLaunch(prog, (c, a), (8, 1, 1), (2, 1, 1), vals=(5,))})
    (set_params,) = fake.args_of("cuGraphExecKernelNodeSetParams")
    assert int(set_params[0]) == int(g.exec) and int(set_params[1]) == int(g.nodes[1])
    assert (set_params[2].gridDimX, set_params[2].blockDimX, int(set_params[2].func)) == (8, 2, int(prog.function))
    assert fake.kernel_args == [([c.ptr, a.ptr], [5])]
    assert g.launches[0] is launches[0]
    # the executable graph now holds the new arguments; the graph it came from keeps the old ones
    (exec_nodes,) = fake.g.execs.values()
    assert [(n.bufs, n.vals) for n in exec_nodes.values()] == [([a.ptr, b.ptr], [0]), ([c.ptr, a.ptr], [5])]
    (graph_nodes,) = fake.g.graphs.values()
    assert [(n.bufs, n.vals) for n in graph_nodes.values()][1] == ([b.ptr, c.ptr], [1])
    sub = gpu.allocator._offset(a, 8, 8)
    g.update({0: KernelLaunch(prog, (sub, b), (4, 1, 1), vals=(9,))})
    assert fake.kernel_args[-1] == ([a.ptr + 8, b.ptr], [9])


@no_driver
def test_what_the_graph_cant_batch_is_a_graph_error(fake: FakeDriver) -> None:
    gpu, gpu1 = device.CUDADevice("CUDA"), device.CUDADevice("CUDA:1")
    prog, prog1 = gpu.load_program("E_4", STAND_IN_CUBIN), gpu1.load_program("E_4", STAND_IN_CUBIN)
    a = gpu.allocator.alloc(16)
    fake.param_shape = (1, 0)
    with pytest.raises(GraphError, match="at least one"):
        graph.CUDAGraph(gpu, [])
    with pytest.raises(GraphError, match=r"launch 1 \(E_4\) is not a kernel loaded on CUDA$"):
        graph.CUDAGraph(gpu, [KernelLaunch(prog, (a,)), KernelLaunch(prog1, (a,))])
    with pytest.raises(GraphError, match=r"buffer 0 of launch 0 .* is a int, not memory of a CUDA allocator"):
        graph.CUDAGraph(gpu, [KernelLaunch(prog, (1234,))])
    with pytest.raises(GraphError, match=r"launch 0 .*positive"):
        graph.CUDAGraph(gpu, [KernelLaunch(prog, (a,), (0, 1, 1))])
    assert "cuGraphCreate" not in fake.names(), "launches are checked before the driver is asked for anything"
    g = graph.CUDAGraph(gpu, [KernelLaunch(prog, (a,))])
    with pytest.raises(GraphError, match="build a new graph"):
        g.update({0: KernelLaunch(gpu.load_program("E_8", STAND_IN_CUBIN), (a,))})
    with pytest.raises(GraphError, match="positive"):
        g.update({0: KernelLaunch(prog, (a,), local_size=(1, 0, 1))})
    assert "cuGraphExecKernelNodeSetParams" not in fake.names()


@no_driver
@pytest.mark.parametrize("call", ["cuGraphCreate", "cuGraphAddKernelNode", "cuGraphInstantiate"])
def test_a_graph_the_driver_cant_build_is_a_graph_error_naming_the_call(fake: FakeDriver, call: str) -> None:
    gpu = device.CUDADevice("CUDA")
    prog, a = gpu.load_program("E_4", STAND_IN_CUBIN), gpu.allocator.alloc(16)
    fake.param_shape = (1, 0)
    fake.fail[call] = real_driver.CUresult.CUDA_ERROR_NOT_SUPPORTED
    with pytest.raises(GraphError, match=f"graph of 2 kernels on CUDA: {call}.* CUDA_ERROR_NOT_SUPPORTED") as info:
        graph.CUDAGraph(gpu, [KernelLaunch(prog, (a,)), KernelLaunch(prog, (a,))])
    assert isinstance(info.value.__cause__, CUDAError)
    # what was built is freed at once, not when the half-built graph is collected
    assert len(fake.args_of("cuGraphDestroy")) == (call != "cuGraphCreate")


@no_driver
def test_driver_failures_updating_or_launching_raise_cuda_errors(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    prog, a = gpu.load_program("E_4", STAND_IN_CUBIN), gpu.allocator.alloc(16)
    fake.param_shape = (1, 0)
    g = graph.CUDAGraph(gpu, [KernelLaunch(prog, (a,))])
    fake.fail["cuGraphExecKernelNodeSetParams"] = real_driver.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CUDAError, match=r"cuGraphExecKernelNodeSetParams\(launch 0, E_4\) failed with .*INVALID_VALUE"):
        g.update({0: KernelLaunch(prog, (a,), (2, 1, 1))})
    fake.fail["cuGraphLaunch"] = real_driver.CUresult.CUDA_ERROR_LAUNCH_FAILED
    with pytest.raises(CUDAError, match=r"cuGraphLaunch \(1 kernels\) failed with CUDA_ERROR_LAUNCH_FAILED: described"):
        g()
    fake.fail["cuEventSynchronize"] = real_driver.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(CUDAError, match="cuEventSynchronize failed with CUDA_ERROR_ILLEGAL_ADDRESS"):
        g(wait=True)


@no_driver
def test_graph_frees_its_driver_objects(fake: FakeDriver) -> None:
    gpu = device.CUDADevice("CUDA")
    prog, a = gpu.load_program("E_4", STAND_IN_CUBIN), gpu.allocator.alloc(16)
    fake.param_shape = (1, 0)
    g = graph.CUDAGraph(gpu, [KernelLaunch(prog, (a,))])
    g(wait=True)
    exec_, graph_, events = int(g.exec), int(g.graph), [int(e) for e in g._events]
    del g
    assert [int(x[0]) for x in fake.args_of("cuGraphExecDestroy")] == [exec_]
    assert [int(x[0]) for x in fake.args_of("cuGraphDestroy")] == [graph_]
    assert sorted(int(x[0]) for x in fake.args_of("cuEventDestroy")) == sorted(events)


@no_driver
def test_the_cuda_device_declares_its_graph_type(fake: FakeDriver) -> None:
    assert device.CUDADevice("CUDA").graph is graph.CUDAGraph


@pytest.fixture
def lazygrad_on_the_stand_in(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The lazygrad frontend with CUDA usable in the device registry while the stand-in answers; afterwards the
    registry and the frontend's program cache forget the stand-in's device, before its objects are collected."""
    lazygrad = pytest.importorskip("lazygrad", reason="the JIT is part of the lazygrad frontend")
    from lazygrad import engine
    from lazygrad_uop.registry import Device

    assert Device.DEFAULT  # chosen before CUDA looks usable, so it stays what it was
    runners = dict(engine._runners)
    with stand_in("CUDA"):
        yield lazygrad
    engine._runners.clear()
    engine._runners.update(runners)


@no_driver
def test_jit_replays_through_a_cuda_graph_patched_with_each_new_input(
    fake: FakeDriver, lazygrad_on_the_stand_in: Any
) -> None:
    """The JIT on the stand-in: its kernels (compiled by NVRTC, not run) become one CUDA graph, and each replay
    with new inputs patches the nodes that read them and launches the graph once, with no launch per kernel."""
    from lazygrad.jit import _GraphStep

    lazygrad = lazygrad_on_the_stand_in

    @lazygrad.TinyJit
    def f(a, b):
        x = (a + b).contiguous()
        return ((x * a - 1).contiguous() * 2 + x).sum(axis=1)

    def inputs():
        return [lazygrad.Tensor(np.ones((4, 8), np.float32), device="CUDA").realize() for _ in range(2)]

    f(*inputs())
    f(*inputs())
    (step,) = f.captured.steps
    assert isinstance(step, _GraphStep) and isinstance(step.graph, graph.CUDAGraph) and len(step.items) == 3
    for launch in step.graph.launches:
        fake.kernels[launch.program.name] = FakeKernel(len(launch.bufs), len(launch.vals))
    for _ in range(3):
        a, b = inputs()
        start, fake.kernel_args = len(fake.calls), []
        f(a, b)
        replay = [name for name, _ in fake.calls[start:]]
        assert replay.count("cuGraphLaunch") == 1 and "cuLaunchKernel" not in replay
        # the two kernels that read an input, and only they, were patched with the new inputs' addresses
        patched = fake.args_of("cuGraphExecKernelNodeSetParams")[-2:]
        assert len(fake.kernel_args) == 2 and {int(p[1]) for p in patched} == {int(n) for n in step.graph.nodes[:2]}
        new = {_ptr(a), _ptr(b)}
        assert all(new & set(bufs) for bufs, _ in fake.kernel_args), fake.kernel_args


def _ptr(t) -> int:
    return t._buffer_view()[0].handle.ptr


# *** the contract ***


@no_driver
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_contract_on_the_stand_in(fake: FakeDriver, check) -> None:
    check(_stand_in_harness(fake))


@no_driver
def test_the_stand_in_catches_a_graph_without_dependencies(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract's order check fails for a graph whose nodes don't depend on each other: the stand-in runs
    independent nodes in reverse."""
    harness = _stand_in_harness(fake)
    real_add = graph.driver.cuGraphAddKernelNode
    monkeypatch.setattr(fake, "cuGraphAddKernelNode", lambda g, deps, n, p: real_add(g, [], 0, p), raising=False)
    with pytest.raises(AssertionError):
        CHECKS[0](harness)


@pytest.fixture(scope="module")
def gpu_harness(gpu: device.CUDADevice) -> Iterator[GraphHarness]:
    programs: dict[tuple[str, bool], object] = {}

    def program(name: str, other: bool = False):
        # a program of another context: the GPU opened again under another name needs a second GPU, so a program
        # of the same name on a CUDA device object that is not this one stands in for "another device"
        if (name, other) not in programs:
            target = gpu if not other else device.CUDADevice("CUDA")
            lib = gpu.compiler.compile(gpu.renderer.render(add_kernel_uops(name, 32)))
            programs[(name, other)] = target.load_program(name, lib)
        return programs[(name, other)]

    yield _harness(gpu, program, block=32)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_contract_on_the_gpu(gpu_harness: GraphHarness, check) -> None:
    check(gpu_harness)


def test_jit_replays_three_kernels_as_one_cuda_graph(gpu: device.CUDADevice) -> None:
    check_jit_replays_through_the_graph("CUDA")
