"""The HIP launcher without a GPU, against a ctypes-level fake of libamdhip64: every HIP function is a C function
pointer with the signature HIP's header gives it, calling Python, so the launcher's arguments go through the same
ctypes conversions as with the real library. Device memory is host memory. The code objects are real ones, compiled
here; the kernarg layout the launcher packs is checked against the metadata LLVM prints in the kernel's assembly
(`.amdgpu_metadata`), read independently of the launcher's own reader, and kernels "run" by executing the same linear
program on the PYTHON device. Loading and running on a real GPU is skipped with the reason where ROCm, an AMD GPU or
ld.lld is missing."""

from __future__ import annotations

import ctypes
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from lazygrad_amd import hip, plugin
from lazygrad_amd.amdgpu_compiler import AMDGPUCompiler, amdgpu_target_reason, code_object_kernels, find_ld_lld
from lazygrad_amd.amdgpu_renderer import AMDGPURenderer
from lazygrad_amd.hip import HIPBuffer, HIPDevice, HIPError, hip_reason, pack_kernargs
from lazygrad_codegen import get_program
from lazygrad_uop import Ops, UOp, dtypes
from lazygrad_uop.registry import Device
from lazygrad_uop.views import ShapeTracker

CAN_LINK = amdgpu_target_reason() is None and find_ld_lld() is not None
needs_code_objects = pytest.mark.skipif(not CAN_LINK, reason="needs llvmlite's AMDGPU target and ld.lld")


# *** the fake libamdhip64 ***


@dataclass
class Launch:
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    stream: int | None
    kernel_params: bool
    kernargs: bytes


@dataclass
class FakeHIP:
    """libamdhip64 in Python: one device of `arch`, memory from ctypes buffers, modules kept as their images."""

    arch: str = "gfx1100"
    compute_units: int = 48
    memory: dict[int, ctypes.Array] = field(default_factory=dict)
    modules: dict[int, bytes] = field(default_factory=dict)
    functions: dict[int, str] = field(default_factory=dict)
    events: dict[int, int] = field(default_factory=dict)
    launches: list[Launch] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    executors: dict[str, Any] = field(default_factory=dict)
    fail: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._handles = 0x1000
        self._error_text = {code: ctypes.create_string_buffer(text) for code, text in ERRORS.items()}
        prototypes = {**hip.HIP_PROTOTYPES, **hip._OPTIONAL_PROTOTYPES}
        for name, (restype, argtypes) in prototypes.items():
            # a C callback can't return a char*: it returns the address, and `hip.declare` types it as the real
            # library's function is typed
            c_restype = ctypes.c_void_p if restype is ctypes.c_char_p else restype
            setattr(self, name, ctypes.CFUNCTYPE(c_restype, *argtypes)(self._traced(name)))
        hip.declare(self, prototypes, required=True)

    def _traced(self, name: str) -> Any:
        impl = getattr(self, re.sub(r"(?<!^)(?=[A-Z])", "_", name[3:]).lower())  # hipMemcpy -> memcpy

        def call(*args: Any) -> Any:
            self.calls.append(name)
            return self.fail[name] if name in self.fail else impl(*args)

        return call

    def _handle(self) -> int:
        self._handles += 0x10
        return self._handles

    def get_error_string(self, status: int) -> int:
        return ctypes.addressof(self._error_text.get(status, self._error_text[-1]))

    def get_device_count(self, count: Any) -> int:
        count[0] = 1
        return 0

    def get_device_properties_r0600(self, props: int, index: int) -> int:
        if index != 0:
            return 101  # hipErrorInvalidDevice
        # the name first, the architecture name further on, as in hipDeviceProp_t
        ctypes.memmove(props, b"AMD Radeon Fake\0", 16)
        arch = f"{self.arch}:sramecc-:xnack-\0".encode()
        ctypes.memmove(props + 1160, arch, len(arch))
        return 0

    get_device_properties = get_device_properties_r0600

    def device_get_attribute(self, value: Any, attr: int, index: int) -> int:
        # hipDeviceAttributeMultiprocessorCount (63 in ROCm 5's numbering) is the one attribute the fake knows
        if index != 0:
            return 101
        if attr != 63:
            return 1
        value[0] = self.compute_units
        return 0

    def set_device(self, index: int) -> int:
        return 0 if index == 0 else 101

    def device_synchronize(self) -> int:
        return 0

    def malloc(self, out: Any, size: int) -> int:
        buf = ctypes.create_string_buffer(size)
        self.memory[ctypes.addressof(buf)] = buf
        out[0] = ctypes.addressof(buf)
        return 0

    def free(self, addr: int) -> int:
        return 0 if self.memory.pop(addr, None) is not None else 1  # hipErrorInvalidValue

    def memcpy(self, dst: int, src: int, size: int, kind: int) -> int:
        device = dst if kind == 1 else src
        if kind not in (1, 2) or self.region(device, size) is None:
            return 1
        ctypes.memmove(dst, src, size)
        return 0

    def module_load_data(self, out: Any, image: int) -> int:
        # the image's size is in its ELF header: the section headers end it
        (shoff,) = struct.unpack_from("<Q", ctypes.string_at(image, 64), 0x28)
        shentsize, shnum = struct.unpack_from("<HH", ctypes.string_at(image, 64), 0x3A)
        handle = self._handle()
        self.modules[handle] = ctypes.string_at(image, shoff + shentsize * shnum)
        out[0] = handle
        return 0

    def module_get_function(self, out: Any, module: int, name: bytes) -> int:
        if module not in self.modules or b"\0" + name + b"\0" not in self.modules[module]:
            return 500  # hipErrorNotFound
        handle = self._handle()
        self.functions[handle] = name.decode()
        out[0] = handle
        return 0

    def module_unload(self, module: int) -> int:
        return 0 if self.modules.pop(module, None) is not None else 1

    def module_launch_kernel(self, f: int, gx, gy, gz, bx, by, bz, shared, stream, params, extra) -> int:
        if f not in self.functions or not extra:
            return 1
        if (extra[0], extra[2], extra[4]) != (1, 2, 3):
            return 1  # BUFFER_POINTER, BUFFER_SIZE, END
        size = ctypes.c_size_t.from_address(extra[3]).value
        launch = Launch(
            self.functions[f],
            (gx, gy, gz),
            (bx, by, bz),
            shared,
            stream,
            bool(params),
            ctypes.string_at(extra[1], size),
        )
        self.launches.append(launch)
        if launch.name in self.executors:
            self.executors[launch.name](self, launch)
        return 0

    def event_create(self, out: Any) -> int:
        handle = self._handle()
        self.events[handle] = 0
        out[0] = handle
        return 0

    def event_record(self, event: int, stream: int | None) -> int:
        if event not in self.events:
            return 400  # hipErrorInvalidResourceHandle
        self.events[event] = len(self.calls)
        return 0

    def event_synchronize(self, event: int) -> int:
        return 0 if event in self.events else 400

    def event_elapsed_time(self, ms: Any, start: int, end: int) -> int:
        ms[0] = 0.25 * (self.events[end] - self.events[start])
        return 0

    def event_destroy(self, event: int) -> int:
        return 0 if self.events.pop(event, None) is not None else 400

    def region(self, addr: int, size: int) -> memoryview | None:
        """The fake device memory [addr, addr + size), when one allocation holds it."""
        for base, buf in self.memory.items():
            if base <= addr and addr + size <= base + len(buf):
                return memoryview(buf).cast("B")[addr - base : addr - base + size]
        return None


ERRORS = {-1: b"unknown error", 1: b"hipErrorInvalidValue", 2: b"hipErrorOutOfMemory", 500: b"hipErrorNotFound"}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeHIP:
    lib = FakeHIP()
    monkeypatch.setattr(hip, "libhip", lambda: lib)
    return lib


# *** the kernels, and the metadata LLVM prints for them ***


def elementwise_ast(n: int) -> UOp:
    """out[i] = a[i] * b[i] + a[i] in float32."""
    st = ShapeTracker.from_shape((n,))
    bufs = [UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(n), arg=i) for i in range(3)]
    a, b = (UOp(Ops.LOAD, dtypes.float32, (buf, UOp(Ops.VIEW, arg=st))) for buf in bufs[1:])
    store = UOp(Ops.STORE, dtypes.void, (bufs[0], UOp(Ops.VIEW, arg=st), a * b + a))
    return UOp(Ops.SINK, dtypes.void, (store,))


def assembly_metadata(compiler: AMDGPUCompiler, src: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The explicit arguments (.offset, .size, .value_kind) and the kernel's sizes as the `.amdgpu_metadata` YAML
    of LLVM's assembly lists them: an independent reading of what the code object's metadata note holds."""
    asm = compiler.target_machine.emit_assembly(compiler.optimized_module(src))
    yaml = asm[asm.index(".amdgpu_metadata") : asm.index(".end_amdgpu_metadata")]
    args_text = yaml[yaml.index(".args:") : yaml.index(".group_segment_fixed_size")]
    args = []
    for entry in re.split(r"\n\s+- ", args_text)[1:]:
        fields = dict(re.findall(r"(\.\w+):\s+(\S+)", entry))
        if not fields[".value_kind"].startswith("hidden_"):
            args.append(
                {".offset": int(fields[".offset"]), ".size": int(fields[".size"]), ".value_kind": fields[".value_kind"]}
            )
    sizes = {k: int(v) for k, v in re.findall(r"^\s+(\.\w+size\w*|\.wavefront_size):\s+(\d+)$", yaml, re.MULTILINE)}
    return args, sizes


@dataclass
class Compiled:
    spec: Any
    lib: bytes
    args: list[dict[str, Any]]
    sizes: dict[str, int]


def compile_for(arch: str, ast: UOp, opts: list | None = None) -> Compiled:
    compiler = AMDGPUCompiler(arch)
    renderer = AMDGPURenderer(arch)
    renderer.add_tensor_cores(Device.tensor_cores_for("HIP", renderer))  # as the HIP device gets them
    spec = get_program(ast, renderer, opts)
    args, sizes = assembly_metadata(compiler, spec.src)
    return Compiled(spec, compiler.compile(spec.src), args, sizes)


def python_executor(spec: Any, args: list[dict[str, Any]], sizes: list[int]) -> Any:
    """A fake launch that runs `spec`'s linear program on the PYTHON device, on the fake memory the kernargs point
    to (read at the assembly metadata's offsets; `sizes` are the buffers' sizes in bytes, in parameter order)."""
    from lazygrad_python import PythonCompiler, PythonProgram
    from lazygrad_python.program_text import render_program

    program = PythonProgram(Device["PYTHON"], spec.name, PythonCompiler().compile(render_program(spec.uops)))

    def run(fake: FakeHIP, launch: Launch) -> None:
        addrs = [int.from_bytes(launch.kernargs[a[".offset"] : a[".offset"] + 8], "little") for a in args]
        views = [fake.region(addr, size) for addr, size in zip(addrs, sizes, strict=True)]
        assert all(v is not None for v in views), "a kernarg points outside the fake's memory"
        program(*views, global_size=launch.grid, local_size=launch.block)

    return run


# *** tests ***


@needs_code_objects
@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
def test_code_object_metadata_matches_the_assembly(arch: str) -> None:
    c = compile_for(arch, elementwise_ast(1000))
    (info,) = code_object_kernels(c.lib).values()
    assert info.name == c.spec.name
    assert [(a.offset, a.size, a.kind) for a in info.args] == [
        (a[".offset"], a[".size"], a[".value_kind"]) for a in c.args
    ]
    assert [a.kind for a in info.args] == ["global_buffer"] * 3
    assert info.kernarg_size == c.sizes[".kernarg_segment_size"]
    assert info.wavefront_size == c.sizes[".wavefront_size"] == (32 if arch == "gfx1100" else 64)
    assert info.max_workgroup_size == c.sizes[".max_flat_workgroup_size"] == int(np.prod(c.spec.local_size))
    assert info.group_segment_size == c.sizes[".group_segment_fixed_size"]


def test_kernargs_go_at_the_metadata_offsets() -> None:
    from lazygrad_amd.amdgpu_compiler import KernelArg, KernelInfo

    # a buffer, a 4-byte value, a buffer after padding to 8, an 8-byte value
    args = (
        KernelArg("a", 0, 8, "global_buffer"),
        KernelArg("n", 8, 4, "by_value"),
        KernelArg("b", 16, 8, "global_buffer"),
        KernelArg("m", 24, 8, "by_value"),
    )
    info = KernelInfo("k", args, 64, 8, 32, 64, 0, 0)
    packed = pack_kernargs(info, (HIPBuffer(0x1122334455, 4), HIPBuffer(0xAA00, 4)), (-3, 2**40))
    assert packed == struct.pack("<QiIQq", 0x1122334455, -3, 0, 0xAA00, 2**40)
    with pytest.raises(ValueError, match="takes 2 buffers and 2 values"):
        pack_kernargs(info, (HIPBuffer(0x10, 4),), (1, 2))
    with pytest.raises(ValueError, match="too few for"):
        pack_kernargs(info, (HIPBuffer(0x10, 4), HIPBuffer(0x20, 4)), (2**32, 0))


@needs_code_objects
@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
def test_launch_through_the_fake_runtime(fake: FakeHIP, arch: str) -> None:
    fake.arch = arch
    n = 1000
    device = HIPDevice("HIP")
    assert device.arch == arch and isinstance(device.renderer, AMDGPURenderer) and device.renderer.arch == arch
    c = compile_for(arch, elementwise_ast(n))
    fake.executors[c.spec.name] = python_executor(c.spec, c.args, [4 * n] * 3)
    a, b = np.linspace(-2, 2, n, dtype=np.float32), np.linspace(3, -1, n, dtype=np.float32)
    bufs = [device.allocator.alloc(4 * n) for _ in range(3)]
    device.allocator.copyin(bufs[1], memoryview(a.tobytes()))
    device.allocator.copyin(bufs[2], memoryview(b.tobytes()))
    program = device.load_program(c.spec.name, c.lib)
    assert fake.modules[program.module.value] == c.lib  # the whole image, found through its ELF header

    elapsed = program(*bufs, global_size=c.spec.global_size, local_size=c.spec.local_size, wait=True)

    (launch,) = fake.launches
    assert launch.grid == tuple(c.spec.global_size) and launch.block == tuple(c.spec.local_size)
    assert (launch.shared, launch.stream, launch.kernel_params) == (0, None, False)
    for arg, buf in zip(c.args, bufs, strict=True):
        assert launch.kernargs[arg[".offset"] : arg[".offset"] + arg[".size"]] == buf.addr.to_bytes(8, "little")
    out = bytearray(4 * n)
    device.allocator.copyout(memoryview(out), bufs[0])
    np.testing.assert_array_equal(np.frombuffer(out, np.float32), a * b + a)
    # the launch was timed between two events recorded around it, and both were destroyed
    assert isinstance(elapsed, float) and elapsed > 0 and not fake.events
    names = fake.calls
    assert (
        names.index("hipEventRecord")
        < names.index("hipModuleLaunchKernel")
        < len(names) - names[::-1].index("hipEventRecord")
    )
    del program
    assert not fake.modules  # unloaded with the program


def matmul_ast(m: int, n: int, k: int) -> UOp:
    """C (m x n, float32) = A (m x k, half) @ B (k x n, half), accumulated in float32."""
    a = UOp(Ops.DEFINE_GLOBAL, dtypes.float16.ptr(m * k), arg=1)
    b = UOp(Ops.DEFINE_GLOBAL, dtypes.float16.ptr(k * n), arg=2)
    va = ShapeTracker.from_shape((m, 1, k)).expand((m, n, k))
    vb = ShapeTracker.from_shape((1, k, n)).permute((0, 2, 1)).expand((m, n, k))
    prod = UOp(Ops.LOAD, dtypes.float16, (a, UOp(Ops.VIEW, arg=va))).cast(dtypes.float32) * UOp(
        Ops.LOAD, dtypes.float16, (b, UOp(Ops.VIEW, arg=vb))
    ).cast(dtypes.float32)
    red = UOp(Ops.REDUCE_AXIS, dtypes.float32, (prod,), (Ops.ADD, (2,)))
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(m * n), arg=0)
    view = UOp(Ops.VIEW, arg=ShapeTracker.from_shape((m, n, 1)))
    return UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (out, view, red)),))


@needs_code_objects
@pytest.mark.parametrize("arch", ["gfx1100", "gfx90a"])
def test_tensor_core_matmul_through_the_fake_runtime(fake: FakeHIP, arch: str) -> None:
    """A half matmul takes the tensor cores by default; launched as HIP would, its program gives numpy's product."""
    fake.arch = arch
    m, n, k = 48, 32, 40
    device = HIPDevice("HIP")
    c = compile_for(arch, matmul_ast(m, n, k))
    assert any(u.op is Ops.WMMA for u in c.spec.uops)
    fake.executors[c.spec.name] = python_executor(c.spec, c.args, [4 * m * n, 2 * m * k, 2 * k * n])
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16)
    bufs = [device.allocator.alloc(size) for size in (4 * m * n, 2 * m * k, 2 * k * n)]
    device.allocator.copyin(bufs[1], memoryview(a.tobytes()))
    device.allocator.copyin(bufs[2], memoryview(b.tobytes()))
    device.load_program(c.spec.name, c.lib)(*bufs, global_size=c.spec.global_size, local_size=c.spec.local_size)
    out = bytearray(4 * m * n)
    device.allocator.copyout(memoryview(out), bufs[0])
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(np.frombuffer(out, np.float32).reshape(m, n), want, rtol=1e-6, atol=1e-5)


@needs_code_objects
def test_launch_refuses_what_the_code_object_does_not_allow(fake: FakeHIP) -> None:
    device = HIPDevice("HIP")
    c = compile_for("gfx1100", elementwise_ast(256))
    program = device.load_program(c.spec.name, c.lib)
    bufs = [device.allocator.alloc(1024) for _ in range(3)]
    group = int(np.prod(c.spec.local_size))
    with pytest.raises(ValueError, match=f"compiled for at most {group}"):
        program(*bufs, global_size=(1, 1, 1), local_size=(2 * group, 1, 1))
    with pytest.raises(ValueError, match="takes 3 buffers and 0 values"):
        program(*bufs[:2], global_size=c.spec.global_size, local_size=c.spec.local_size)
    with pytest.raises(ValueError, match="fewer than 2\\*\\*32 work-items"):
        program(*bufs, global_size=(2**31, 1, 1), local_size=c.spec.local_size)
    assert not fake.launches
    with pytest.raises(HIPError, match="no metadata for it"):
        device.load_program("not_a_kernel", c.lib)


@needs_code_objects
def test_hip_errors_name_the_call_and_free_the_events(fake: FakeHIP) -> None:
    device = HIPDevice("HIP")
    c = compile_for("gfx1100", elementwise_ast(64))
    program = device.load_program(c.spec.name, c.lib)
    bufs = [device.allocator.alloc(256) for _ in range(3)]
    fake.fail["hipModuleLaunchKernel"] = 500
    with pytest.raises(HIPError, match=r"hipModuleLaunchKernel of .* failed: hipErrorNotFound \(HIP error 500\)"):
        program(*bufs, global_size=c.spec.global_size, local_size=c.spec.local_size, wait=True)
    assert not fake.events
    fake.fail["hipMalloc"] = 2
    with pytest.raises(MemoryError, match="hipMalloc of 4096 bytes failed: hipErrorOutOfMemory"):
        device.allocator.alloc(4096)


def test_missing_hip_functions_are_reported(fake: FakeHIP) -> None:
    partial = type("Partial", (), {"hipMalloc": fake.hipMalloc})()
    with pytest.raises(OSError, match="has no hipGetErrorString"):
        hip.declare(partial, hip.HIP_PROTOTYPES, required=True)


def test_hip_reason_is_none_or_says_why() -> None:
    reason = hip_reason()
    assert reason is None or (isinstance(reason, str) and reason)


def test_kernels_run_on_a_gpu() -> None:
    if (reason := plugin.hip_usable()) is not None:
        pytest.skip(f"HIP device unavailable: {reason}")
    lazygrad = pytest.importorskip("lazygrad", reason="runs Tensor graphs: needs the lazygrad frontend")
    x = np.arange(-8, 8, dtype=np.float32).reshape(4, 4)
    t = lazygrad.Tensor(x, device="HIP")
    np.testing.assert_allclose((t * 2 + 1).numpy(), x * 2 + 1)
    np.testing.assert_allclose((t @ t).sum(axis=1).numpy(), (x @ x).sum(axis=1), rtol=1e-5)
    h = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float16)
    th = lazygrad.Tensor(h, device="HIP")
    want = h.astype(np.float32) @ h.astype(np.float32)
    np.testing.assert_allclose((th @ th).float().numpy(), want, rtol=2e-2, atol=2e-2)


def test_the_renderer_gets_the_gpus_compute_units(fake: FakeHIP) -> None:
    fake.compute_units = 48
    dev = hip.HIPDevice("HIP")
    assert dev.renderer.compute_units == 48
    dev.use_renderer(AMDGPURenderer("gfx1100"))
    assert dev.renderer.compute_units == 48, "a renderer swapped in keeps the device's count"
    # a runtime that can't tell: the renderer's documented default
    fake.fail["hipDeviceGetAttribute"] = 1
    assert hip.HIPDevice("HIP").renderer.compute_units == AMDGPURenderer.compute_units > 0
