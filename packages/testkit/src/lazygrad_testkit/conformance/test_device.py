"""The device contract on the device under test: what the registry hands out is a working `CompiledDevice`."""

from __future__ import annotations

import numpy as np

from lazygrad_uop.device import CompiledDevice, Compiler, Program, Renderer
from lazygrad_uop.registry import Device


def test_the_registry_opens_a_compiled_device_with_its_parts(lazygrad_device: str) -> None:
    dev = Device[lazygrad_device]
    assert isinstance(dev, CompiledDevice)
    assert isinstance(dev.renderer, Renderer) and isinstance(dev.compiler, Compiler)
    assert (isinstance(dev.runtime, type) and issubclass(dev.runtime, Program)) or callable(dev.runtime)
    # every tensor core the renderer was handed is one it says it can emit
    for target in dev.renderer.tensor_core_targets():
        for tc in dev.renderer.tensor_cores:
            if tc in Device.tensor_cores(lazygrad_device, target):
                assert dev.renderer.tensor_core_problem(tc, target) is None


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
