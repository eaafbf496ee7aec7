"""The device interfaces: allocator checks and LRU reuse, buffers (through the registry), the compiler cache, and the
tensor-core description's consistency checks."""

from __future__ import annotations

import array
import gc
import struct
from typing import Any

import pytest

from lazygrad_uop.config import Context
from lazygrad_uop.device import (
    Allocator,
    Buffer,
    BufferSpec,
    CompiledDevice,
    Compiler,
    LRUAllocator,
    Program,
    Renderer,
    TensorCore,
)
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.plugins import DeviceSpec, hookimpl
from lazygrad_uop.registry import Device


class HostAllocator(LRUAllocator):
    """Device memory that is host bytearrays, with a byte budget so that running out of memory can be provoked."""

    def __init__(self, budget: int = 1 << 20) -> None:
        super().__init__()
        self.budget, self.in_use, self.allocs, self.frees = budget, 0, 0, 0

    def _alloc(self, size: int, options: BufferSpec) -> Any:
        if self.in_use + size > self.budget:
            raise MemoryError(f"{size} bytes requested, {self.budget - self.in_use} left")
        self.in_use += size
        self.allocs += 1
        return bytearray(size)

    def _free(self, handle: Any, options: BufferSpec) -> None:
        self.in_use -= len(handle)
        self.frees += 1

    def _copyin(self, dest: Any, src: memoryview) -> None:
        dest[:] = src

    def _copyout(self, dest: memoryview, src: Any) -> None:
        dest[:] = src

    def _offset(self, handle: Any, size: int, offset: int) -> Any:
        return memoryview(handle)[offset : offset + size]


class EchoRenderer(Renderer):
    device = "TESTMEM"
    suffix = "ECHO"

    def render(self, uops: list[Any]) -> str:
        return f"{len(uops)} uops"


class CountingCompiler(Compiler):
    def __init__(self, cachekey: str | None) -> None:
        super().__init__(cachekey)
        self.compiles = 0

    def compile(self, src: str) -> bytes:
        self.compiles += 1
        return src[::-1].encode()


class SleepProgram(Program):
    def __call__(self, *bufs: Any, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=(), wait=False) -> float | None:
        return 0.25 if wait else None


class MemPlugin:
    """Registers the TESTMEM device, whose memory is a HostAllocator, on the process-wide registry."""

    def __init__(self) -> None:
        self.allocator = HostAllocator()

    @hookimpl
    def lazygrad_devices(self) -> list[DeviceSpec]:
        def open_device(name: str) -> CompiledDevice:
            return CompiledDevice(name, self.allocator, EchoRenderer(), CountingCompiler(None), SleepProgram)

        return [DeviceSpec("TESTMEM", open=open_device, usable=lambda: None, priority=-100, package="tests")]


@pytest.fixture
def testmem():
    plugin = MemPlugin()
    Device.register_plugin(plugin)
    yield plugin.allocator
    Device.unregister_plugin(plugin)


# ---- allocators


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "8"])
def test_alloc_rejects_sizes_that_are_not_positive_ints(size: Any) -> None:
    with pytest.raises(ValueError, match="positive number of bytes"):
        HostAllocator().alloc(size)


def test_allocator_is_abstract() -> None:
    with pytest.raises(TypeError):
        Allocator()  # type: ignore[abstract]


def test_lru_reuses_freed_memory_of_the_same_size_and_options() -> None:
    alloc = HostAllocator()
    a = alloc.alloc(64)
    alloc.free(a, 64)
    assert alloc.alloc(64) is a
    assert alloc.allocs == 1
    alloc.free(a, 64)
    assert alloc.alloc(32) is not a
    assert alloc.alloc(64, BufferSpec(cpu_access=True)) is not a
    assert alloc.allocs == 3


def test_nolru_frees_at_once() -> None:
    alloc = HostAllocator()
    spec = BufferSpec(nolru=True)
    alloc.free(alloc.alloc(16, spec), 16, spec)
    assert (alloc.frees, alloc.in_use, dict(alloc.cache)) == (1, 0, {})


def test_free_cache_gives_everything_back() -> None:
    alloc = HostAllocator()
    handles = [alloc.alloc(n) for n in (8, 8, 16)]
    for h in handles:
        alloc.free(h, len(h))
    assert alloc.in_use == 32
    alloc.free_cache()
    assert (alloc.in_use, alloc.frees, dict(alloc.cache)) == (0, 3, {})


def test_out_of_memory_frees_the_cache_and_retries_once() -> None:
    alloc = HostAllocator(budget=100)
    alloc.free(alloc.alloc(60), 60)
    # 60 cached bytes + 50 new ones exceed the budget: the cache must be emptied for this to succeed.
    assert len(alloc.alloc(50)) == 50
    assert alloc.in_use == 50
    with pytest.raises(MemoryError):
        alloc.alloc(80)


def test_backend_specific_out_of_memory_error_is_retried() -> None:
    class DriverOOMError(Exception):
        pass

    class DriverAllocator(HostAllocator):
        oom_errors = (DriverOOMError,)

        def _alloc(self, size: int, options: BufferSpec) -> Any:
            try:
                return super()._alloc(size, options)
            except MemoryError as exc:
                raise DriverOOMError from exc

    alloc = DriverAllocator(budget=10)
    alloc.free(alloc.alloc(10), 10)
    assert len(alloc.alloc(4)) == 4


def test_copies_take_any_contiguous_memory_as_bytes() -> None:
    alloc = HostAllocator()
    handle = alloc.alloc(8)
    alloc.copyin(handle, memoryview(array.array("f", [1.5, -2.0])))
    out = bytearray(8)
    alloc.copyout(memoryview(out), handle)
    assert struct.unpack("2f", out) == (1.5, -2.0)


def test_copies_reject_strided_and_read_only_memory() -> None:
    alloc = HostAllocator()
    handle = alloc.alloc(4)
    with pytest.raises(ValueError, match="C-contiguous"):
        alloc.copyin(handle, memoryview(bytearray(8))[::2])
    with pytest.raises(ValueError, match="read-only"):
        alloc.copyout(memoryview(bytes(4)), handle)


def test_sub_buffers_are_optional() -> None:
    class NoViews(HostAllocator):
        _offset = Allocator._offset

    with pytest.raises(NotImplementedError, match="sub-buffers"):
        NoViews()._offset(bytearray(8), 4, 4)


# ---- buffers


def test_buffer_roundtrip_through_the_registry(testmem: HostAllocator) -> None:
    values = (1.0, 2.5, -3.0, 4.25)
    buf = Buffer("testmem", 4, dtypes.float32).allocate()
    assert buf.is_allocated and buf.nbytes == 16
    buf.copyin(memoryview(struct.pack("4f", *values)))
    out = bytearray(16)
    buf.copyout(memoryview(out))
    assert struct.unpack("4f", out) == values
    assert testmem.allocs == 1


def test_buffer_view_reads_part_of_its_base(testmem: HostAllocator) -> None:
    base = Buffer("TESTMEM", 4, dtypes.int32)
    view = Buffer("TESTMEM", 2, dtypes.int32, base=base, offset=4)
    view.allocate()
    assert base.is_allocated
    base.copyin(memoryview(struct.pack("4i", 10, 20, 30, 40)))
    out = bytearray(8)
    view.copyout(memoryview(out))
    assert struct.unpack("2i", out) == (20, 30)


@pytest.mark.parametrize(("size", "offset"), [(2, 12), (1, -4), (5, 0)])
def test_buffer_view_must_fit_in_its_base(size: int, offset: int) -> None:
    base = Buffer("TESTMEM", 4, dtypes.int32)
    with pytest.raises(ValueError, match="doesn't fit"):
        Buffer("TESTMEM", size, dtypes.int32, base=base, offset=offset)


def test_buffer_argument_errors() -> None:
    base = Buffer("TESTMEM", 4, dtypes.int32)
    with pytest.raises(ValueError, match="non-negative number of elements"):
        Buffer("TESTMEM", -1, dtypes.int32)
    with pytest.raises(ValueError, match="only a view"):
        Buffer("TESTMEM", 1, dtypes.int32, offset=4)
    with pytest.raises(ValueError, match="base on TESTMEM"):
        Buffer("OTHER", 1, dtypes.int32, base=base)
    with pytest.raises(ValueError, match="not another view"):
        Buffer("TESTMEM", 1, dtypes.int32, base=Buffer("TESTMEM", 2, dtypes.int32, base=base))


def test_buffer_copies_check_sizes_and_allocation(testmem: HostAllocator) -> None:
    buf = Buffer("TESTMEM", 2, dtypes.float32)
    with pytest.raises(RuntimeError, match="not allocated"):
        buf.copyin(memoryview(bytes(8)))
    buf.allocate()
    with pytest.raises(ValueError, match="copyin of 4 bytes"):
        buf.copyin(memoryview(bytes(4)))
    with pytest.raises(ValueError, match="into 12 bytes"):
        buf.copyout(memoryview(bytearray(12)))
    with pytest.raises(RuntimeError, match="already allocated"):
        buf.allocate()


def test_freed_buffers_go_to_the_lru_cache(testmem: HostAllocator) -> None:
    buf = Buffer("TESTMEM", 8, dtypes.uint8).allocate()
    handle = buf.handle
    del buf
    gc.collect()
    assert testmem.cache[(8, BufferSpec())] == [handle]
    assert Buffer("TESTMEM", 2, dtypes.int32).allocate().handle is handle


def test_deallocate_and_external_memory(testmem: HostAllocator) -> None:
    buf = Buffer("TESTMEM", 4, dtypes.uint8).allocate()
    buf.deallocate()
    assert not buf.is_allocated
    with pytest.raises(RuntimeError, match="not allocated"):
        buf.deallocate()
    mine = bytearray(4)
    ext = Buffer("TESTMEM", 4, dtypes.uint8).allocate(mine)
    assert ext.handle is mine
    del ext
    gc.collect()
    assert all(mine is not h for hs in testmem.cache.values() for h in hs)


def test_empty_buffer_gets_a_handle(testmem: HostAllocator) -> None:
    buf = Buffer("TESTMEM", 0, dtypes.float32).allocate()
    assert buf.is_allocated
    buf.copyin(memoryview(b""))
    assert buf.copyout(memoryview(bytearray())).nbytes == 0


# ---- compiler, program, renderer, device


def test_compiler_caches_on_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    first = CountingCompiler("test_compiler_caches_on_disk")
    assert first.compile_cached("abc") == b"cba"
    assert first.compile_cached("abc") == b"cba"
    assert first.compiles == 1
    # Another compiler with the same key (another process, say) finds the binary.
    second = CountingCompiler("test_compiler_caches_on_disk")
    assert second.compile_cached("abc") == b"cba"
    assert second.compiles == 0
    assert (tmp_path / "lazygrad" / "cache.db").is_file()


def test_compiler_cache_can_be_disabled(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    compiler = CountingCompiler("test_compiler_cache_can_be_disabled")
    with Context(DISABLE_COMPILER_CACHE=1):
        compiler.compile_cached("x")
        compiler.compile_cached("x")
    uncached = CountingCompiler(None)
    uncached.compile_cached("x")
    uncached.compile_cached("x")
    assert (compiler.compiles, uncached.compiles) == (2, 2)


def test_program_reports_time_only_when_waiting() -> None:
    dev = CompiledDevice("TESTMEM", HostAllocator(), EchoRenderer(), CountingCompiler(None), SleepProgram)
    prog = dev.load_program("k", b"lib")
    # a program is constructed with the device it is loaded on
    assert isinstance(prog, SleepProgram) and (prog.device, prog.name, prog.lib) == (dev, "k", b"lib")
    assert prog(wait=True) == 0.25
    assert prog() is None
    with pytest.raises(TypeError):
        Program(dev, "k", b"")  # type: ignore[abstract]


def test_renderer_defaults_and_device_bundle() -> None:
    renderer = EchoRenderer()
    assert renderer.render([1, 2]) == "2 uops"
    assert (renderer.tensor_cores, renderer.global_max, renderer.has_local) == ((), None, True)
    dev = CompiledDevice("TESTMEM", HostAllocator(), renderer, CountingCompiler(None), SleepProgram)
    dev.synchronize()
    other = EchoRenderer()
    dev.use_renderer(other)
    assert dev.renderer is other


# ---- tensor cores

# The shape of a CUDA mma.m16n8k16: A is 16x16, B 16x8, C 16x8, spread over a warp of 32 threads.
MMA = {"dims": (8, 16, 16), "threads": 32, "elements_per_thread": (8, 4, 4)}


def test_tensor_core_description() -> None:
    tc = TensorCore(**MMA, dtype_in=dtypes.half, dtype_out=dtypes.float, opts=("u0", "l0", "l0", "l1", "l1", "l1"))
    assert str(tc) == "WMMA_8_16_16_half_float"
    assert tc == TensorCore(**MMA, dtype_in=dtypes.half, dtype_out=dtypes.float, opts=tc.opts)
    assert len({tc, TensorCore(**MMA, dtype_in=dtypes.half, dtype_out=dtypes.float, opts=tc.opts)}) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"elements_per_thread": (4, 4, 4)}, "A has 256 elements but 32 threads x 4"),
        ({"elements_per_thread": (8, 8, 4)}, "B has 128 elements"),
        ({"elements_per_thread": (8, 4, 2)}, "C has 128 elements"),
        ({"dims": (8, 16)}, "three positive ints"),
        ({"threads": 0}, "threads must be positive"),
    ],
)
def test_tensor_core_shapes_must_agree(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TensorCore(**{**MMA, **change}, dtype_in=dtypes.half, dtype_out=dtypes.float, opts=())


def test_a_tensor_core_that_rounds_its_inputs() -> None:
    # TF32: float32 inputs rounded to 10 of their 23 mantissa bits; a different core from an exact float32 one
    tf32 = TensorCore((8, 16, 8), 32, (4, 2, 4), dtypes.float, dtypes.float, input_mantissa_bits=10)
    exact = TensorCore((8, 16, 8), 32, (4, 2, 4), dtypes.float, dtypes.float)
    assert tf32 != exact and str(tf32) != str(exact) and "m10" in str(tf32)
    for bad, dtype_in in ((23, dtypes.float), (-1, dtypes.float), (True, dtypes.float), (10, dtypes.half)):
        with pytest.raises(ValueError, match="input_mantissa_bits"):
            TensorCore((8, 16, 8), 32, (4, 2, 4), dtype_in, dtypes.float, input_mantissa_bits=bad)
    with pytest.raises(ValueError, match="is no float"):
        TensorCore((8, 16, 8), 32, (4, 2, 4), dtypes.int8, dtypes.int32, input_mantissa_bits=0)
