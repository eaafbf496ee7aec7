"""The METAL device on a Mac's GPU: memory, compilation, launches, timing, variables, and the op suite end to end
against numpy (indirect command buffers: test_graph.py). Every test here skips where Metal is not usable, saying why."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad_metal import plugin
from lazygrad_metal.renderer import MetalRenderer
from lazygrad_uop.device import CompileError
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

WHY = plugin.metal_usable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"METAL is not usable here: {WHY}")


@pytest.fixture(scope="module")
def dev():
    from lazygrad_uop.registry import Device

    return Device["METAL"]


def glob(slot: int, size: int) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(size), arg=slot)


def affine_kernel(name: str, n: int, scale: float, shift: float) -> list[UOp]:
    """out[i] = x[i] * scale + shift, one threadgroup of one thread per element (gidx0 of size n)."""
    out, x = glob(0, n), glob(1, n)
    gid = UOp(Ops.SPECIAL, dtypes.int32, arg=("gidx0", n))
    value = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, x.dtype, (x, gid)),)) * scale + shift
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, gid)), value))
    return _ordered(st, UOp(Ops.SINK, dtypes.void, arg=name), first=[out, x, gid])


def _ordered(*last: UOp, first: list[UOp]) -> list[UOp]:
    out: list[UOp] = []

    def place(u: UOp) -> None:
        if u not in out:
            for s in u.src:
                place(s)
            out.append(u)

    for u in [*first, *last]:
        place(u)
    return out


def upload(dev, a: np.ndarray):
    handle = dev.allocator.alloc(a.nbytes)
    dev.allocator.copyin(handle, memoryview(np.ascontiguousarray(a)).cast("B"))
    return handle


def download(dev, handle, like: np.ndarray) -> np.ndarray:
    out = np.empty_like(like)
    dev.allocator.copyout(memoryview(out).cast("B"), handle)
    return out


def program(dev, uops: list[UOp]):
    src = MetalRenderer().render(uops)
    return dev.load_program(uops[-1].arg, dev.compiler.compile(src))


def test_memory_roundtrip_and_sub_buffers(dev) -> None:
    a = np.arange(64, dtype=np.float32)
    h = upload(dev, a)
    np.testing.assert_array_equal(download(dev, h, a), a)
    part = dev.allocator._offset(h, 16, 32)
    np.testing.assert_array_equal(download(dev, part, a[:4]), a[8:12])
    dev.allocator.copyin(part, memoryview(np.full(4, -1, np.float32)).cast("B"))
    np.testing.assert_array_equal(download(dev, h, a)[6:14], [6, 7, -1, -1, -1, -1, 12, 13])
    dev.allocator.free(h, a.nbytes)


def test_kernel_runs_and_reports_gpu_time(dev) -> None:
    a = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    out, x = upload(dev, np.zeros(64, np.float32)), upload(dev, a)
    prg = program(dev, affine_kernel("affine", 64, 2.0, 1.0))
    seconds = prg(out, x, global_size=(64, 1, 1), wait=True)
    assert isinstance(seconds, float) and 0 < seconds < 10
    np.testing.assert_allclose(download(dev, out, a), a * 2 + 1, rtol=1e-6)
    # asynchronous launches are waited for before memory is read
    for _ in range(40):
        assert prg(out, out, global_size=(64, 1, 1)) is None
    np.testing.assert_allclose(download(dev, out, a), (a * 2 + 1) * 2**40 + (2**40 - 1), rtol=1e-5)


def test_variables_are_passed_with_set_bytes(dev) -> None:
    n = UOp(Ops.DEFINE_VAR, dtypes.int32, arg=("n", 1, 64))
    out, x = glob(0, 64), glob(1, 64)
    r = UOp.range(n, 0)
    value = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, x.dtype, (x, r)),)) + 1.0
    st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, r)), value))
    uops = _ordered(
        r, st, UOp(Ops.END, dtypes.void, (r,)), UOp(Ops.SINK, dtypes.void, arg="first_n"), first=[out, x, n]
    )
    a = np.arange(64, dtype=np.float32)
    hout, hx = upload(dev, np.zeros(64, np.float32)), upload(dev, a)
    program(dev, uops)(hout, hx, vals=(5,), wait=True)
    np.testing.assert_array_equal(download(dev, hout, a), np.where(a < 5, a + 1, 0))


def test_compile_errors_carry_metals_message(dev) -> None:
    with pytest.raises(CompileError, match="undeclared_thing"):
        dev.compiler.compile("kernel void broken(device float* a [[buffer(0)]]) { a[0] = undeclared_thing; }")


def test_a_threadgroup_too_large_is_refused(dev) -> None:
    prg = program(dev, affine_kernel("affine_big", 64, 1.0, 0.0))
    h = upload(dev, np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="threadgroup"):
        prg(h, h, global_size=(1, 1, 1), local_size=(2048, 1, 1))


def test_op_suite_on_the_gpu() -> None:
    pytest.importorskip("lazygrad", reason="the op suite builds Tensor graphs with the lazygrad frontend")
    from lazygrad_testkit.op_suite import CASES

    failures = []
    for case in CASES:
        out, ref, tol = case.build("METAL")
        try:
            got = out.numpy()
            np.testing.assert_allclose(got, np.asarray(ref), equal_nan=True, **tol)
            assert got.dtype == np.asarray(ref).dtype
        except (AssertionError, CompileError) as exc:
            failures.append(f"{case.name}: {exc}")
    assert not failures, "\n".join(failures)
