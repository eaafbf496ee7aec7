"""The CL device on whatever OpenCL platform this machine has (PoCL in CI): the parts the op suite doesn't reach —
half and bfloat16 rounding when the device has no fp16, build logs, timing, work-group sizes, sub-buffers. Skips with
the reason where no OpenCL platform exists."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from lazygrad_amd import plugin
from lazygrad_uop.device import CompileError

if (REASON := plugin.cl_usable()) is not None:
    pytest.skip(f"no usable OpenCL device: {REASON}", allow_module_level=True)

from lazygrad_amd.opencl import CLDevice, cl_devices


@pytest.fixture(scope="module")
def dev() -> CLDevice:
    return CLDevice("CL", cl_devices()[0])


def run(dev: CLDevice, src: str, name: str, arrays: list[np.ndarray], **launch) -> list[np.ndarray]:
    """Compile and run kernel `name` of `src` on copies of `arrays`; return them after the run."""
    prg = dev.load_program(name, dev.compiler.compile(src))
    bufs = []
    for a in arrays:
        b = dev.allocator.alloc(max(a.nbytes, 1))
        dev.allocator.copyin(b, memoryview(np.ascontiguousarray(a)).cast("B"))
        bufs.append(b)
    prg(*bufs, **launch)
    out = [np.empty_like(a) for a in arrays]
    for o, b in zip(out, bufs, strict=True):
        dev.allocator.copyout(memoryview(o).cast("B"), b)
    return out


def test_the_renderer_has_the_devices_compute_units(dev: CLDevice) -> None:
    # pyopencl's own query of the device, which split reductions size their parts by
    assert dev.renderer.compute_units == cl_devices()[0].max_compute_units > 0
    dev.use_renderer(type(dev.renderer)())
    assert dev.renderer.compute_units == cl_devices()[0].max_compute_units


def test_build_failure_shows_the_build_log(dev: CLDevice) -> None:
    with pytest.raises(CompileError, match=r"OpenCL build failed on .*\n(.|\n)*undeclared_thing"):
        dev.compiler.compile("__kernel void k(__global float* a) { a[0] = undeclared_thing; }")


def test_global_id_kernels_let_the_driver_pick_the_group_and_report_time(dev: CLDevice) -> None:
    src = "__kernel void k(__global float* a, const int n) { int i = get_global_id(0); a[i] = i * n; }"
    prg = dev.load_program("k", dev.compiler.compile(src))
    assert prg.work_group is None
    buf = dev.allocator.alloc(4 * 1000)
    seconds = prg(buf, global_size=(1000, 1, 1), vals=(3,), wait=True)
    assert isinstance(seconds, float) and seconds >= 0
    out = np.empty(1000, np.float32)
    dev.allocator.copyout(memoryview(out).cast("B"), buf)
    np.testing.assert_array_equal(out, np.arange(1000, dtype=np.float32) * 3)
    with pytest.raises(ValueError, match="no work-group dimensions"):
        prg(buf, global_size=(250, 1, 1), local_size=(4, 1, 1))


def test_work_group_kernels_launch_groups_of_their_size(dev: CLDevice) -> None:
    src = (
        "__kernel __attribute__((reqd_work_group_size(4,2,1))) void k(__global int* a) {"
        " int g = get_group_id(0) + 10 * get_group_id(1); int l = get_local_id(0) + 4 * get_local_id(1);"
        " a[(get_group_id(1) * 3 + get_group_id(0)) * 8 + l] = 100 * g + l; }"
    )
    (out,) = run(dev, src, "k", [np.zeros(3 * 2 * 8, np.int32)], global_size=(3, 2, 1), local_size=(4, 2, 1))
    want = [100 * (gx + 10 * gy) + lane for gy in range(2) for gx in range(3) for lane in range(8)]
    np.testing.assert_array_equal(out, np.array(want, np.int32))
    prg = dev.load_program("k", dev.compiler.compile(src))
    with pytest.raises(ValueError, match=r"built for work-groups of \(4, 2, 1\)"):
        prg(dev.allocator.alloc(4), global_size=(1, 1, 1), local_size=(1, 1, 1))


def test_sub_buffers_must_be_aligned_as_the_device_says(dev: CLDevice) -> None:
    align = dev.cl_device.mem_base_addr_align // 8
    base = dev.allocator.alloc(4 * align)
    dev.allocator.copyin(base, memoryview(np.zeros(4 * align, np.uint8)))
    part = dev.allocator._offset(base, align, align)
    dev.allocator.copyin(part, memoryview(np.full(align, 7, np.uint8)))
    whole = np.zeros(4 * align, np.uint8)
    dev.allocator.copyout(memoryview(whole), base)
    assert whole[align : 2 * align].tolist() == [7] * align and whole[:align].sum() == 0
    if align > 1:
        with pytest.raises(ValueError, match=f"multiple of {align} bytes"):
            dev.allocator._offset(base, 1, 1)
    # what the memory planner places its views by
    assert dev.allocator.offset_alignment == align


# *** numerics through the frontend, against numpy and Python ints ***

lazygrad = pytest.importorskip("lazygrad", reason="runs Tensor graphs: needs the lazygrad frontend")
Tensor, dtypes = lazygrad.Tensor, lazygrad.dtypes


def test_half_arithmetic_rounds_after_every_op() -> None:
    rng = np.random.default_rng(1)
    a, b, c = (rng.uniform(-40, 40, 257).astype(np.float16) for _ in range(3))
    got = ((Tensor(a, device="CL") * Tensor(b, device="CL")) + Tensor(c, device="CL")).numpy()
    # numpy's float16 ops round each result to half: the same as real half hardware
    np.testing.assert_array_equal(got, a * b + c)


def test_double_to_half_rounds_once() -> None:
    # just above the midpoint between 1 and the next half: through float it would round to the tie, then to even
    x = np.array([1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 65519.99, 65520.0, 1e-8, 6e-8], np.float64)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    np.testing.assert_array_equal(Tensor(x, device="CL").cast(dtypes.float16).numpy(), want)


def _bf16_bits(f: float) -> int:
    """bfloat16 bits of float32 `f`, rounded to nearest even, with Python ints."""
    b = struct.unpack("<I", struct.pack("<f", f))[0]
    if f != f:
        return (b >> 16) | 0x40
    upper, rest = b >> 16, b & 0xFFFF
    return (upper + (rest > 0x8000 or (rest == 0x8000 and upper & 1))) & 0xFFFF


def test_bfloat16_casts_round_to_nearest_even() -> None:
    xs = [1.0, 1.00390625, 1.005859375, 1.0078125 + 2**-20, -3.3, 1e38, 3.4e38, float("inf"), float("nan"), 2.5e-39]
    x = np.array(xs, np.float32)
    got = Tensor(x, device="CL").cast(dtypes.bfloat16).bitcast(dtypes.uint16).numpy()
    assert got.tolist() == [_bf16_bits(float(v)) for v in x]
    back = Tensor(x, device="CL").cast(dtypes.bfloat16).cast(dtypes.float32).numpy()
    want = np.array([struct.unpack("<f", struct.pack("<I", _bf16_bits(float(v)) << 16))[0] for v in x], np.float32)
    np.testing.assert_array_equal(back, want)


def test_bool_buffers_hold_bytes() -> None:
    a = np.array([True, False, True, True])
    t = Tensor(a, device="CL")
    assert (t != Tensor(np.array([True, True, False, True]), device="CL")).numpy().tolist() == [0, 1, 1, 0]
    assert (t.cast(dtypes.uint8) + 1).numpy().tolist() == [2, 1, 2, 2]
