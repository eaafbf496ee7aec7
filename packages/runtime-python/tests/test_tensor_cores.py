"""Every tensor-core description that lazygrad's device packages define, verified on the CPU: matmuls compiled by
codegen for a PYTHON renderer pretending to be that GPU (`GPUTarget`) run through the WMMA emulation, against numpy,
for several shapes, some of which need padding, and with more opts around the tensor core."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from pyinterp_helpers import mantissa_reference

from lazygrad_python import GPUTarget, PythonCompiler, PythonProgram, PythonRenderer
from lazygrad_python.program_text import arg_text
from lazygrad_python.tensor_cores import TensorCoreLayoutError, wmma_function
from lazygrad_uop import DType, Ops, UOp, dtypes
from lazygrad_uop.config import Context
from lazygrad_uop.device import TensorCore
from lazygrad_uop.plugins import RendererSpec, TensorCoreSpec, hookimpl
from lazygrad_uop.registry import Device, DeviceRegistry

codegen = pytest.importorskip("lazygrad_codegen")
views = pytest.importorskip("lazygrad_uop.views")

RNG = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def _tf32_allowed():
    """Every description runs here, TF32 cores too (they need TF32=1; test_tf32.py checks that they do)."""
    with Context(TF32=1):
        yield


def _descriptions() -> list[tuple[str, TensorCore]]:
    """(device-target, description) for every distinct description the installed plugins registered."""
    found: dict[TensorCore, str] = {}
    for device in Device.installed():
        for target in Device.tensor_core_targets(device):
            for tc in Device.tensor_cores(device, target):
                found.setdefault(tc, f"{device.lower()}-{target}")
    # (cores that read their operands from local memory need staged tiles of their own: test_wgmma in codegen's tests)
    return [(target, tc) for tc, target in found.items() if not tc.shared_operands]


DESCRIPTIONS = _descriptions()
if not DESCRIPTIONS:
    pytest.skip("no device package with tensor cores is installed", allow_module_level=True)


def _id(target: str, tc: TensorCore) -> str:
    return f"{target}-{tc}"


# *** kernels ***


def _st(*shape: Any) -> Any:
    return views.ShapeTracker.from_shape(shape)


def _load(slot: int, dtype: DType, view: Any) -> UOp:
    buf = UOp(Ops.DEFINE_GLOBAL, dtype.ptr(view.real_size()), arg=slot)
    return UOp(Ops.LOAD, dtype, (buf, UOp(Ops.VIEW, arg=view)))


def _matmul_ast(m: int, n: int, k: int, tc: TensorCore) -> UOp:
    a = _load(1, tc.dtype_in, _st(m, 1, k).expand((m, n, k)))
    b = _load(2, tc.dtype_in, _st(1, k, n).permute((0, 2, 1)).expand((m, n, k)))
    prod = a * b if tc.dtype_in == tc.dtype_out else a.cast(tc.dtype_out) * b.cast(tc.dtype_out)
    red = UOp(Ops.REDUCE_AXIS, tc.dtype_out, (prod,), (Ops.ADD, (2,)))
    out = UOp(Ops.DEFINE_GLOBAL, tc.dtype_out.ptr(m * n), arg=0)
    return UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (out, UOp(Ops.VIEW, arg=_st(m, n, 1)), red)),))


def _encode(x: np.ndarray, dtype: DType) -> tuple[bytes, np.ndarray]:
    """The bytes of `x` as `dtype`, and the values those bytes hold (as float64)."""
    if dtype == dtypes.bfloat16:
        bits = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits.tobytes(), (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    npdt = {dtypes.float16: np.float16, dtypes.float32: np.float32}[dtype]
    v = x.astype(npdt)
    return v.tobytes(), v.astype(np.float64)


def _decode(raw: bytes, dtype: DType) -> np.ndarray:
    if dtype == dtypes.bfloat16:
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.frombuffer(raw, {dtypes.float16: np.float16, dtypes.float32: np.float32}[dtype]).astype(np.float64)


def _run(
    tc: TensorCore,
    m: int,
    n: int,
    k: int,
    opts: list[Any] | None,
    target: GPUTarget | None = None,
    renderer: PythonRenderer | None = None,
) -> Any:
    """Compile the matmul with `opts` (None: codegen's choice) for a GPU with `tc`, run it, check it against numpy;
    returns the spec."""
    renderer = renderer or PythonRenderer(target or GPUTarget(tensor_cores=(tc,)))
    ast = _matmul_ast(m, n, k, tc)
    spec = codegen.get_program(ast, renderer, opts)
    a_raw, a = _encode(RNG.standard_normal((m, k)), tc.dtype_in)
    b_raw, b = _encode(RNG.standard_normal((k, n)), tc.dtype_in)
    mems = {
        0: memoryview(bytearray(m * n * tc.dtype_out.itemsize)),
        1: memoryview(bytearray(a_raw)),
        2: memoryview(bytearray(b_raw)),
    }
    prg = PythonProgram(Device["PYTHON"], spec.name, PythonCompiler().compile(spec.src))
    prg(*(mems[s] for s in spec.globals), global_size=spec.global_size, local_size=spec.local_size)
    got = _decode(bytes(mems[0]), tc.dtype_out).reshape(m, n)
    if tc.input_mantissa_bits is not None:  # a TF32 core multiplies its inputs rounded
        a, b = (mantissa_reference(v, tc.input_mantissa_bits).astype(np.float64) for v in (a, b))
    want = a.reshape(m, k) @ b.reshape(k, n)
    tol = 1e-4 if tc.dtype_out == dtypes.float32 else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * (1 + np.abs(want).max()))
    return spec


def _wmma_count(spec: Any) -> int:
    return sum(u.op is Ops.WMMA for u in spec.uops)


# *** every description ***


@pytest.mark.parametrize(("target", "tc"), DESCRIPTIONS, ids=[_id(*d) for d in DESCRIPTIONS])
def test_matmul_on_tensor_core_tiles(target: str, tc: TensorCore) -> None:
    n, m, k = tc.dims
    spec = _run(tc, 2 * m, 2 * n, 2 * k, [codegen.Opt(codegen.OptOps.TC, 0, (0, 0))])
    assert _wmma_count(spec) == 1  # one instruction per loop step: the K tiles are a loop
    assert spec.local_size[0] == tc.threads


@pytest.mark.parametrize(("target", "tc"), DESCRIPTIONS, ids=[_id(*d) for d in DESCRIPTIONS])
def test_matmul_that_needs_padding(target: str, tc: TensorCore) -> None:
    n, m, k = tc.dims
    # every axis a little past a multiple of the tile: padded up, the padding masked off
    spec = _run(tc, m + 3, n + n // 2, k + 5 if k > 8 else k + 3, [codegen.Opt(codegen.OptOps.TC, 0, (0, 1))])
    assert _wmma_count(spec) >= 1
    with pytest.raises(codegen.KernelOptError, match="fits this kernel"):
        codegen.get_program(
            _matmul_ast(m + 3, n, k, tc),
            PythonRenderer(GPUTarget(tensor_cores=(tc,))),
            [codegen.Opt(codegen.OptOps.TC, 0, (0, 0))],
        )


@pytest.mark.parametrize(("target", "tc"), DESCRIPTIONS, ids=[_id(*d) for d in DESCRIPTIONS])
def test_tensor_core_with_more_opts(target: str, tc: TensorCore) -> None:
    n, m, k = tc.dims
    ops = codegen.OptOps
    opts = [
        codegen.Opt(ops.TC, 0, (0, 0)),
        codegen.Opt(ops.UPCAST, 0, 2),  # two tiles of M per thread
        codegen.Opt(ops.UNROLL, 0, 2),  # two K tiles per loop step
        codegen.Opt(ops.LOCAL, 0, 2),  # two warps per workgroup along N
    ]
    spec = _run(tc, 2 * m, 4 * n, 4 * k, opts)
    assert _wmma_count(spec) == 4
    assert spec.local_size[0] == tc.threads and spec.local_size[1] == 2


def test_random_opts_after_tensor_cores() -> None:
    rng = random.Random(3)
    from lazygrad_codegen.search import ACTIONS

    for _, tc in DESCRIPTIONS[:: max(1, len(DESCRIPTIONS) // 4)]:
        n, m, k = tc.dims
        renderer = PythonRenderer(GPUTarget(tensor_cores=(tc,)))
        kernel = codegen.Kernel(_matmul_ast(2 * m, 2 * n, 4 * k, tc), renderer)
        kernel.apply_opt(codegen.Opt(codegen.OptOps.TC, 0, (0, 0)))
        pool = [o for o in ACTIONS if o.op is not codegen.OptOps.TC]
        for _ in range(3):
            rng.shuffle(pool)
            for opt in pool:
                try:
                    kernel.apply_opt(opt)
                except codegen.KernelOptError:
                    continue
                break
        _run(tc, 2 * m, 2 * n, 4 * k, kernel.applied_opts)


def test_heuristics_pick_tensor_cores_when_they_fit() -> None:
    _, tc = DESCRIPTIONS[0]
    n, m, k = tc.dims
    renderer = PythonRenderer(GPUTarget(tensor_cores=(tc,)))
    spec = codegen.get_program(_matmul_ast(2 * m, 2 * n, 2 * k, tc), renderer)
    assert spec.opts[0].op is codegen.OptOps.TC and _wmma_count(spec) >= 1


def test_every_registered_description_is_covered() -> None:
    """What device plugins register through `lazygrad_tensor_cores` is what the tests above run."""
    from lazygrad_uop.registry import Device

    tested = {tc for _, tc in DESCRIPTIONS}
    for device in ("CUDA", "AMD", "METAL"):
        try:
            registered = Device.tensor_cores(device)
        except Exception:  # noqa: BLE001 - a device whose plugin is not installed registers nothing
            continue
        # (cores that read local memory themselves run in codegen's test_wgmma)
        registered = tuple(tc for tc in registered if not tc.shared_operands)
        assert set(registered) <= tested, f"{device} registers tensor cores these tests do not run"


# *** the emulation itself ***


def test_emulation_is_sensitive_to_the_layout() -> None:
    """A program compiled for one layout and run with another gives wrong results: the check above can fail."""
    tc = next(c for _, c in DESCRIPTIONS if c.threads == 32)
    n, m, k = tc.dims
    ast = _matmul_ast(m, n, k, tc)
    spec = codegen.get_program(
        ast, PythonRenderer(GPUTarget(tensor_cores=(tc,))), [codegen.Opt(codegen.OptOps.TC, 0, (0, 0))]
    )
    (lay_a, lay_b, lay_c) = tc.swizzle
    # the first two thread bits of C swapped: every element is still held once, but by the wrong thread
    swapped_c = ((lay_c[0][1], lay_c[0][0], *lay_c[0][2:]), lay_c[1])
    layouts = arg_text((lay_a, lay_b, lay_c))
    assert layouts in spec.src
    wrong_src = spec.src.replace(layouts, arg_text((lay_a, lay_b, swapped_c)))
    a_raw, a = _encode(RNG.standard_normal((m, k)), tc.dtype_in)
    b_raw, b = _encode(RNG.standard_normal((k, n)), tc.dtype_in)

    def run(src: str) -> np.ndarray:
        mems = {0: memoryview(bytearray(m * n * 4)), 1: memoryview(bytearray(a_raw)), 2: memoryview(bytearray(b_raw))}
        PythonProgram(Device["PYTHON"], spec.name, PythonCompiler().compile(src))(
            *(mems[s] for s in spec.globals), global_size=spec.global_size, local_size=spec.local_size
        )
        return _decode(bytes(mems[0]), tc.dtype_out).reshape(m, n)

    want = a.reshape(m, k) @ b.reshape(k, n)
    np.testing.assert_allclose(run(spec.src), want, rtol=1e-2, atol=1e-2)
    assert not np.allclose(run(wrong_src), want, rtol=1e-2, atol=1e-2)


def test_replicated_lanes_must_agree() -> None:
    # AMD's RDNA 3 layout holds A and B twice: threads that should hold the same element but don't are an error
    rdna = next((tc for _, tc in DESCRIPTIONS if "" in tc.swizzle[0][0]), None)
    if rdna is None:
        pytest.skip("no description with replicated lanes installed")
    fn = wmma_function(
        (str(rdna), rdna.dims, rdna.dtype_in, rdna.dtype_out, rdna.threads, rdna.elements_per_thread, rdna.swizzle)
    )
    a = [tuple(float(t) for _ in range(16)) for t in range(32)]
    b = [tuple(1.0 for _ in range(16)) for _ in range(32)]
    c = [tuple(0.0 for _ in range(8)) for _ in range(32)]
    with pytest.raises(ValueError, match="disagree"):
        fn(a, b, c)


def test_layouts_that_do_not_cover_the_matrix_are_refused() -> None:
    arg = (
        "bad",
        (2, 2, 2),
        dtypes.float32,
        dtypes.float32,
        2,
        (2, 2, 2),
        ((("m0",), ("k0",)), (("k0",), ("n0",)), (("m0",), ("m0",))),
    )
    with pytest.raises(TensorCoreLayoutError, match="does not cover"):
        wmma_function(arg)


class _EmulatedGPU:
    """A renderer plugin for PYTHON: the interpreter pretending to be a GPU named EMU, with no tensor cores of its
    own."""

    @hookimpl
    def lazygrad_renderers(self) -> list[RendererSpec]:
        return [RendererSpec("PYTHON", "EMU", make=lambda: PythonRenderer(GPUTarget("EMU")))]


class _TensorCoresFor:
    """A plugin that only registers tensor-core descriptions."""

    def __init__(self, *specs: TensorCoreSpec) -> None:
        self.specs = specs

    @hookimpl
    def lazygrad_tensor_cores(self) -> list[TensorCoreSpec]:
        return list(self.specs)


def test_a_tensor_core_plugin_reaches_the_python_device() -> None:
    from lazygrad_python import plugin

    _, tc = DESCRIPTIONS[0]
    registry = DeviceRegistry(group="lazygrad_tests_no_entry_points")
    for p in (plugin, _EmulatedGPU(), _TensorCoresFor(TensorCoreSpec("PYTHON", "EMU", (tc,)))):
        registry.register_plugin(p)
    renderer = registry["PYTHON:EMU"].renderer
    assert isinstance(renderer, PythonRenderer) and renderer.tensor_cores == (tc,)
    n, m, k = tc.dims
    # codegen's own choice uses the handed-over tensor core, and the interpreter's result matches numpy
    spec = _run(tc, 2 * m, 2 * n, 2 * k, None, renderer=renderer)
    assert spec.opts[0].op is codegen.OptOps.TC and _wmma_count(spec) >= 1


def test_the_python_device_rejects_a_description_without_a_layout() -> None:
    from lazygrad_python import plugin

    bare = TensorCore((8, 16, 16), 32, (8, 4, 4), dtypes.float16, dtypes.float32)
    registry = DeviceRegistry(group="lazygrad_tests_no_entry_points")
    registry.register_plugin(plugin)
    registry.register_plugin(_TensorCoresFor(TensorCoreSpec("PYTHON", "EMU", (bare,))), name="bare-tc")
    with pytest.warns(UserWarning, match="'bare-tc': tensor core .* emulates tensor cores from their layout"):
        assert registry.tensor_cores("PYTHON") == ()
