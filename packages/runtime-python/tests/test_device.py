"""The PYTHON device as a plugin: registry lookup, its place among devices, its allocator, and a kernel run through
the device's own renderer, compiler and program types."""

from __future__ import annotations

import numpy as np
import pytest
from pyinterp_helpers import elementwise

import lazygrad_python.plugin as plugin
from lazygrad_python import PythonAllocator, PythonProgram, PythonRenderer
from lazygrad_uop import Ops, dtypes
from lazygrad_uop.device import Buffer, BufferSpec, CompiledDevice
from lazygrad_uop.plugins import DeviceSpec, hookimpl
from lazygrad_uop.registry import Device, DeviceRegistry


@pytest.fixture(scope="module")
def python_device() -> CompiledDevice:
    # installed packages bring the plugin through their entry point; a source checkout on PYTHONPATH does not
    if "PYTHON" not in Device.installed():
        Device.register_plugin(plugin, name="lazygrad-runtime-python (test)")
    return Device["PYTHON"]


def test_registry_opens_the_device_once(python_device: CompiledDevice) -> None:
    assert isinstance(python_device, CompiledDevice) and python_device.device == "PYTHON"
    assert Device["python"] is python_device
    assert isinstance(python_device.renderer, PythonRenderer) and python_device.runtime is PythonProgram
    assert [r.name for r in Device.renderers("PYTHON")] == ["PYTHON"]
    assert Device.usable("PYTHON") is None


def test_lowest_priority_never_the_default_beside_another_device() -> None:
    class Other:
        @hookimpl
        def lazygrad_devices(self) -> list[DeviceSpec]:
            # the registry opens the default it chooses: an opened device with no parts is enough to be chosen
            stub = CompiledDevice("SLOWEST", None, None, None, None)  # type: ignore[arg-type]
            return [DeviceSpec("SLOWEST", open=lambda n: stub, usable=lambda: None, priority=-99, package="other")]

    registry = DeviceRegistry(group="lazygrad-python-test-no-entry-points")
    registry.register_plugin(plugin)
    assert registry.DEFAULT == "PYTHON"  # alone, it is what there is
    registry.register_plugin(Other())
    assert registry.DEFAULT == "SLOWEST"
    assert registry.spec("PYTHON").priority < -1  # below every device lazygrad ships


def test_buffers_and_a_kernel_through_the_device(python_device: CompiledDevice) -> None:
    a, b = np.arange(12, dtype=np.int64) - 6, np.full(12, 3, np.int64)
    bufs = [Buffer("PYTHON", 12, dtypes.int64).allocate() for _ in range(3)]
    bufs[1].copyin(memoryview(bytearray(a.tobytes())))
    bufs[2].copyin(memoryview(bytearray(b.tobytes())))
    uops = elementwise(Ops.MUL, dtypes.int64, [dtypes.int64] * 2, 12)
    src = python_device.renderer.render(uops)
    prg = python_device.load_program("E_12", python_device.compiler.compile_cached(src))
    elapsed = prg(*(buf.handle for buf in bufs), wait=True)
    assert isinstance(elapsed, float) and elapsed >= 0
    out = bytearray(96)
    bufs[0].copyout(memoryview(out))
    np.testing.assert_array_equal(np.frombuffer(out, np.int64), a * b)


def test_allocator_copies_offsets_and_recycles_memory() -> None:
    alloc = PythonAllocator()
    h = alloc.alloc(16)
    alloc.copyin(h, memoryview(bytes(range(16))))
    view = alloc._offset(h, 8, 4)
    out = bytearray(8)
    alloc.copyout(memoryview(out), view)
    assert bytes(out) == bytes(range(4, 12))
    view[0] = 99  # a sub-buffer shares its base's memory
    assert alloc._as_buffer(h)[4] == 99
    alloc.free(h, 16)
    assert alloc.alloc(16) is h  # kept by the LRU cache and handed out again
    other = alloc.alloc(16, BufferSpec(nolru=True))
    alloc.free(other, 16, BufferSpec(nolru=True))
    assert not alloc.cache[(16, BufferSpec(nolru=True))]


def test_transfer_between_two_python_devices(python_device: CompiledDevice) -> None:
    alloc = python_device.allocator
    src, dest = alloc.alloc(8), alloc.alloc(8)
    alloc.copyin(src, memoryview(b"abcdefgh"))
    alloc._transfer(dest, src, 8, python_device, python_device)
    assert bytes(alloc._as_buffer(dest)) == b"abcdefgh"


def test_compute_units_size_split_reductions() -> None:
    from lazygrad_codegen.reductions import split_plan
    from lazygrad_python import PythonRenderer
    from lazygrad_python.device import GPUTarget
    from lazygrad_uop import Ops

    # the interpreter runs one thread: a long sum to one output is cut only to bound its sequential length
    assert PythonRenderer().compute_units == 1
    big, small = PythonRenderer(GPUTarget(compute_units=1024)), PythonRenderer(GPUTarget(compute_units=2))
    assert big.compute_units == 1024
    # 256 sums of 2^15 elements: parts enough for two per multiprocessor on the big GPU, whole sums on the small one
    plan = split_plan(big, 256, 1 << 15, Ops.ADD)
    assert plan is not None and plan.parts * 256 >= 2 * 1024
    assert split_plan(small, 256, 1 << 15, Ops.ADD) is None
