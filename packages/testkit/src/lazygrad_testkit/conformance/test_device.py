"""The device contract on the device under test: what the registry hands out is a working `CompiledDevice`."""

from __future__ import annotations

import numpy as np

from lazygrad_uop.device import CompiledDevice, Compiler, Program, Renderer
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.registry import Device


def test_the_registry_opens_a_compiled_device_with_its_parts(lazygrad_device: str) -> None:
    dev = Device[lazygrad_device]
    assert isinstance(dev, CompiledDevice)
    assert isinstance(dev.renderer, Renderer) and isinstance(dev.compiler, Compiler)
    assert isinstance(dev.runtime, type) and issubclass(dev.runtime, Program), (
        f"{lazygrad_device}'s runtime is {dev.runtime!r}: it must be the Program subclass, constructed as "
        "runtime(device, name, lib)"
    )
    # every tensor core the renderer was handed is one it says it can emit
    for target in dev.renderer.tensor_core_targets():
        for tc in dev.renderer.tensor_cores:
            if tc in Device.tensor_cores(lazygrad_device, target):
                assert dev.renderer.tensor_core_problem(tc, target) is None


def test_a_program_is_loaded_on_its_device(lazygrad_device: str) -> None:
    from lazygrad_codegen import get_program
    from lazygrad_testkit.kernel_ast import load, sink, st, store

    dev = Device[lazygrad_device]
    # out = x + 1 over 16 floats, in whatever form the device's renderer gives it
    spec = get_program(sink(store(0, load(1, dtypes.float32, st(16)) + 1.0, st(16))), dev.renderer)
    program = dev.load_program(spec.name, dev.compiler.compile(spec.src))
    assert isinstance(program, dev.runtime) and program.device is dev and program.name == spec.name
    x = np.arange(16, dtype=np.float32)
    out, inp = dev.allocator.alloc(x.nbytes), dev.allocator.alloc(x.nbytes)
    dev.allocator.copyin(inp, memoryview(x).cast("B"))
    program(out, inp, global_size=spec.global_size, local_size=spec.local_size, wait=True)
    got = np.empty_like(x)
    dev.allocator.copyout(memoryview(got).cast("B"), out)
    np.testing.assert_array_equal(got, x + 1)


def test_memory_round_trips_through_the_allocator(lazygrad_device: str) -> None:
    dev = Device[lazygrad_device]
    data = np.random.default_rng(0).integers(0, 255, 1000, dtype=np.uint8)
    handle = dev.allocator.alloc(data.nbytes)
    dev.allocator.copyin(handle, memoryview(data))
    dev.synchronize()
    out = np.zeros_like(data)
    dev.allocator.copyout(memoryview(out), handle)
    np.testing.assert_array_equal(out, data)
    dev.allocator.free(handle, data.nbytes)


def test_a_tensor_copies_to_and_from_the_cpu(lazygrad_device: str) -> None:
    from lazygrad import Tensor

    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    there = Tensor(x, device="PYTHON").to(lazygrad_device)
    back = (there * 2).to("PYTHON")
    np.testing.assert_array_equal(back.numpy(), x * 2)
