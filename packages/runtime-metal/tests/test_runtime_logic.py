"""The METAL runtime's own logic on a stand-in for Metal (`fake_metal`), so it runs on any OS: the messages each
operation sends and their arguments as Apple documents them, ownership (every object the runtime owns is released
once), waiting before the CPU touches memory, error reporting. `MetalGraph` is tested in test_graph.py."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest
from fake_metal import FakeMetal

from lazygrad_metal.device import MetalBuffer, MetalDevice, MetalError, gpu_family_target
from lazygrad_metal.plugin import all_tensor_cores
from lazygrad_metal.renderer import MetalRenderer
from lazygrad_uop.device import CompileError
from lazygrad_uop.registry import Device

KERNEL = """#include <metal_stdlib>
using namespace metal;
kernel void {name}(device float* data0 [[buffer(0)]], device float* data1 [[buffer(1)]], constant int& n [[buffer(2)]],
                   uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {{}}
"""


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMetal]:
    yield FakeMetal().install(monkeypatch)
    # objects of this test (a program kept alive by a traceback) go while this fake still stands in for Metal
    gc.collect()


@pytest.fixture
def dev(fake: FakeMetal) -> MetalDevice:
    return MetalDevice("METAL")


def program(dev: MetalDevice, name: str):
    return dev.load_program(name, dev.compiler.compile(KERNEL.format(name=name)))


def test_device_opens_with_a_queue_and_tensor_cores_where_the_gpu_has_simdgroup_matrices(fake, dev) -> None:
    assert dev.gpu_name == "Fake GPU" and dev.queue in fake.owned("MTLCommandQueue")
    assert isinstance(dev.renderer, MetalRenderer)
    # the newest family with tensor-core descriptions that the GPU (an M1 here) supports
    tcs = all_tensor_cores()
    assert dev.target == ("apple7" if "apple7" in tcs else None)
    assert Device.tensor_cores_for("METAL", dev.renderer) == tcs.get("apple7", ())
    assert repr(dev) == "<MetalDevice METAL (Fake GPU)>"
    assert not fake.owned("NSString")


def test_renderer_gets_the_gpu_cores_of_known_gpus(fake, dev) -> None:
    from lazygrad_metal.renderer import APPLE_GPU_CORES, DEFAULT_GPU_CORES, gpu_cores

    # the fake's name is in no table: the documented default, never 0
    assert dev.renderer.compute_units == DEFAULT_GPU_CORES > 0
    assert gpu_cores("Apple M2 Max") == APPLE_GPU_CORES["Apple M2 Max"] and gpu_cores("Apple M9") == DEFAULT_GPU_CORES
    # a chip's bigger configurations have more cores
    for chip in ("M1", "M2", "M3"):
        assert gpu_cores(f"Apple {chip}") < gpu_cores(f"Apple {chip} Pro") < gpu_cores(f"Apple {chip} Max")


def test_gpu_family_picks_the_newest_described_target(fake, dev) -> None:
    assert gpu_family_target(dev.mtl, ["apple9", "apple7", "apple8", "sm_80"]) == "apple7"
    assert gpu_family_target(dev.mtl, ["apple8"]) is None


def test_second_device_comes_from_copy_all_devices(fake) -> None:
    dev = MetalDevice("METAL:1")
    assert dev.gpu_name == "Fake GPU 1"
    assert not fake.owned("NSArray"), "the array from MTLCopyAllDevices is released"
    with pytest.raises(Exception, match=r"METAL:5 doesn't exist: this Mac has 2 Metal GPU\(s\)"):
        MetalDevice("METAL:5")


def test_allocator_copies_through_shared_memory_and_waits_first(fake, dev) -> None:
    a = np.arange(16, dtype=np.float32)
    h = dev.allocator.alloc(a.nbytes)
    assert isinstance(h, MetalBuffer) and fake.objects[h.buf].state["length"] == 64
    prg = program(dev, "k")
    prg(h, h, vals=(1,))
    assert len(dev.in_flight) == 1
    dev.allocator.copyin(h, memoryview(a).cast("B"))
    assert not dev.in_flight, "copyin waited for the launch that uses the memory"
    part = dev.allocator._offset(h, 16, 8)
    out = np.zeros(4, np.float32)
    dev.allocator.copyout(memoryview(out).cast("B"), part)
    np.testing.assert_array_equal(out, a[2:6])
    dev.allocator.free(h, a.nbytes)
    dev.allocator.free_cache()
    assert not fake.owned("MTLBuffer")


def test_compile_options_are_safe_math_and_precise_functions(fake, dev) -> None:
    prg = program(dev, "k")
    assert prg.library in fake.owned("MTLLibrary")
    library = prg.library
    assert fake.objects[library].state["options"] == {"math_mode": 0, "math_functions": 1}
    assert not fake.owned("MTLCompileOptions") and not fake.owned("NSString")


def test_compile_errors_carry_metals_message(fake, dev) -> None:
    with pytest.raises(CompileError, match="use of undeclared identifier"):
        dev.compiler.compile("kernel void k() { syntax_error }")
    with pytest.raises(CompileError, match="no kernel named 'other'"):
        dev.load_program("other", dev.compiler.compile(KERNEL.format(name="k")))


def test_launch_binds_buffers_then_variables_in_parameter_order(fake, dev) -> None:
    prg = program(dev, "k")
    a, b = dev.allocator.alloc(64), dev.allocator.alloc(64)
    assert prg(a, dev.allocator._offset(b, 16, 32), global_size=(4, 2, 1), local_size=(8, 1, 1), vals=(7,)) is None
    assert [args[1:] for args in fake.calls_to("setBuffer:offset:atIndex:")] == [(a.buf, 0, 0), (b.buf, 32, 1)]
    ((_, value, length, index),) = fake.calls_to("setBytes:length:atIndex:")
    assert (value._obj.value, length, index) == (7, 4, 2)
    ((_, groups, threads),) = fake.calls_to("dispatchThreadgroups:threadsPerThreadgroup:")
    assert (groups.width, groups.height, groups.depth, threads.width) == (4, 2, 1, 8)
    assert all(fake.objects[e].state["ended"] for (e,) in fake.calls_to("endEncoding"))
    assert fake.calls_to("commit") and not fake.calls_to("waitUntilCompleted")
    dev.synchronize()
    assert fake.calls_to("waitUntilCompleted") and not fake.owned("MTLCommandBuffer")


def test_wait_returns_gpu_time(fake, dev) -> None:
    a = dev.allocator.alloc(64)
    assert program(dev, "k")(a, a, vals=(1,), wait=True) == pytest.approx(0.25)
    assert not dev.in_flight and not fake.owned("MTLCommandBuffer")


def test_too_many_threads_or_buffers_are_refused(fake, dev) -> None:
    prg, a = program(dev, "k"), dev.allocator.alloc(64)
    with pytest.raises(ValueError, match="more than the 1024"):
        prg(a, a, vals=(1,), local_size=(32, 64, 1))
    with pytest.raises(ValueError, match="at most 31"):
        prg(*[a] * 32)


def test_gpu_errors_raise_on_synchronize_and_on_wait(fake, dev) -> None:
    fake.fail_kernels.add("bad")
    prg, a = program(dev, "bad"), dev.allocator.alloc(64)
    prg(a, a, vals=(1,))
    with pytest.raises(MetalError, match="GPU fault"):
        dev.synchronize()
    with pytest.raises(MetalError, match="GPU fault"):
        prg(a, a, vals=(1,), wait=True)
    assert not fake.owned("MTLCommandBuffer")


def test_finished_command_buffers_are_let_go_while_running(fake, dev) -> None:
    prg, a = program(dev, "k"), dev.allocator.alloc(64)
    for _ in range(100):
        prg(a, a, vals=(1,))
    assert len(dev.in_flight) <= 33
    dev.synchronize()
    assert not fake.owned("MTLCommandBuffer")


def test_programs_release_what_they_own(fake, dev) -> None:
    prg = program(dev, "k")
    prg.icb_pipeline()
    assert len(fake.owned("MTLComputePipelineState")) == 2
    del prg
    gc.collect()
    assert not fake.owned("MTLComputePipelineState") and not fake.owned("MTLFunction") and not fake.owned("MTLLibrary")
