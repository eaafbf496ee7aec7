"""TF32 tensor cores, only when asked: the rounding the emulated core does (against a numpy reference built another
way), and float32 matmuls and convolutions on the PYTHON device rendering for a GPU with CUDA's tensor cores, which
run on the TF32 core with `TF32=1` (matching numpy on TF32-rounded inputs, and measurably different from float32)
and never without it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyinterp_helpers import mantissa_reference

from lazygrad_python import GPUTarget, PythonRenderer
from lazygrad_python.numerics import round_float32_mantissa
from lazygrad_python.tensor_cores import wmma_function
from lazygrad_uop import Ops, dtypes
from lazygrad_uop.config import Context

codegen = pytest.importorskip("lazygrad_codegen")
from lazygrad_codegen.kernel_ast import matmul  # noqa: E402 - after the skip: codegen may be missing
from lazygrad_codegen.tensor_cores import wmma_arg as _wmma_arg  # noqa: E402

cuda_cores = pytest.importorskip("lazygrad_cuda.tensor_cores", reason="the TF32 core is CUDA's")

RNG = np.random.default_rng(14)
TF32_CORE = next(tc for tc in cuda_cores.TENSOR_CORES["sm_80"] if tc.input_mantissa_bits is not None)


def _rounded(values: list[float], bits: int) -> np.ndarray:
    return np.array(round_float32_mantissa(values, bits), np.float32)


# *** the rounding ***


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=16), st.integers(0, 22))
def test_rounding_matches_the_reference_on_every_bit_pattern(patterns: list[int], bits: int) -> None:
    # any 32 bits: normals and subnormals of both signs, zeros, infinities and nans
    x = np.array(patterns, np.uint32).view(np.float32)
    got, want = _rounded(x.tolist(), bits), mantissa_reference(x, bits)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))


@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_subnormal=True))
def test_tf32_rounding_keeps_ten_bits_and_the_nearest_value(x: float) -> None:
    (got,) = round_float32_mantissa([x], 10)
    assert got == mantissa_reference(np.array([x], np.float32), 10)[0]
    if math.isfinite(got):
        # only the sign, the exponent and the top 10 mantissa bits are left
        assert np.array([got], np.float32).view(np.uint32)[0] & 0x1FFF == 0
        # within half a TF32 step of x (subnormals: the step of the smallest normals, 2**-136)
        assert abs(got - x) <= 2.0 ** (max(math.frexp(x)[1], -125) - 12)


@pytest.mark.parametrize(
    ("x", "want"),
    [
        (1 + 2**-11, 1 + 2**-10),  # a tie goes away from zero
        (-(1 + 2**-11), -(1 + 2**-10)),
        (1 + 3 * 2**-11, 1 + 2 * 2**-10),  # a tie between odd and even: still away (not to even)
        (1 + 2**-11 - 2**-23, 1.0),  # just under the tie
        (2 - 2**-23, 2.0),  # the carry moves to the next binade
        (2.0**-137, 2.0**-136),  # a subnormal tie: the same bit position as the normals
        (2.0**-149, 0.0),  # the smallest subnormal rounds to zero
        (-(2.0**-149), -0.0),
        ((2 - 2**-23) * 2.0**127, math.inf),  # the largest float32 is past the largest TF32's half step
        ((2 - 2**-10) * 2.0**127, (2 - 2**-10) * 2.0**127),  # the largest TF32 stays
        (math.inf, math.inf),
        (-math.inf, -math.inf),
    ],
)
def test_tf32_rounding_cases(x: float, want: float) -> None:
    (got,) = round_float32_mantissa([x], 10)
    assert got == want and math.copysign(1, got) == math.copysign(1, want)


def test_nan_stays_nan() -> None:
    nans = np.array([0x7FC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF], np.uint32).view(np.float32)
    assert all(math.isnan(v) for v in round_float32_mantissa(nans.tolist(), 10))


def test_rounding_refuses_bits_a_float32_does_not_have() -> None:
    with pytest.raises(ValueError, match="0 to 22"):
        round_float32_mantissa([1.0], 23)


# *** one emulated instruction ***


def test_the_wmma_arg_carries_the_rounding() -> None:
    arg = _wmma_arg(TF32_CORE)
    assert len(arg) == 8 and arg[7] == 10
    assert all(len(_wmma_arg(tc)) == 7 for tc in cuda_cores.TENSOR_CORES["sm_80"] if tc is not TF32_CORE)


def test_one_tf32_instruction_rounds_its_inputs() -> None:
    """A, B, C scattered over a warp by the core's layout (read here from the PTX ISA's tables as plain formulas),
    run through the emulated instruction, against numpy on TF32-rounded A and B."""
    a = RNG.standard_normal((16, 8)).astype(np.float32)
    b = RNG.standard_normal((8, 8)).astype(np.float32)
    c = RNG.standard_normal((16, 8)).astype(np.float32)
    lanes = range(32)
    # PTX ISA, mma.m16n8k8 .tf32: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); b0 (t, g), b1 (t + 4, g);
    # c0, c1 (g, 2t and 2t + 1), c2, c3 (g + 8, ...), with g = lane // 4, t = lane % 4
    a_regs = [tuple(float(a[i // 4 + 8 * (r & 1)][i % 4 + 4 * (r >> 1)]) for r in range(4)) for i in lanes]
    b_regs = [tuple(float(b[i % 4 + 4 * r][i // 4]) for r in range(2)) for i in lanes]
    c_at = [[(i // 4 + 8 * (r >> 1), 2 * (i % 4) + (r & 1)) for r in range(4)] for i in lanes]
    c_regs = [tuple(float(c[p]) for p in c_at[i]) for i in lanes]
    out = wmma_function(_wmma_arg(TF32_CORE))(a_regs, b_regs, c_regs)
    got = np.zeros((16, 8), np.float32)
    for i in lanes:
        for r, p in enumerate(c_at[i]):
            got[p] = out[i][r]
    rounded = mantissa_reference(a).astype(np.float64) @ mantissa_reference(b).astype(np.float64)
    np.testing.assert_allclose(got, (rounded + c).astype(np.float32), rtol=1e-6, atol=1e-6)
    exact = a.astype(np.float64) @ b.astype(np.float64) + c
    assert np.abs(got - exact).max() > 1e-4  # what full float32 inputs would give is measurably different


def test_a_rounding_core_takes_float32_only() -> None:
    arg = (*_wmma_arg(TF32_CORE)[:2], dtypes.float16, *_wmma_arg(TF32_CORE)[3:])
    with pytest.raises(ValueError, match="takes float32"):
        wmma_function(arg)


# *** codegen takes the TF32 core only with TF32=1 ***

EMULATED = GPUTarget(
    name="TF32GPU", tensor_cores=cuda_cores.TENSOR_CORES["sm_80"], warp_size=32, async_copy=True, ldmatrix=True
)


def test_the_tc_opt_names_the_setting_it_needs() -> None:
    ast = matmul(32, 32, 32, dtypes.float32)
    select = cuda_cores.TENSOR_CORES["sm_80"].index(TF32_CORE)
    opt = codegen.Opt(codegen.OptOps.TC, 0, (select, 0))
    with pytest.raises(codegen.KernelOptError, match="TF32=1"):
        codegen.get_program(ast, PythonRenderer(EMULATED), [opt])
    with Context(TF32=1):
        spec = codegen.get_program(ast, PythonRenderer(EMULATED), [opt])
    assert any(u.op is Ops.WMMA and u.arg[2] == dtypes.float32 for u in spec.uops)


@pytest.fixture
def emulated_gpu():
    """The PYTHON device rendering for a GPU with CUDA's tensor cores; programs compiled for it are forgotten after."""
    pytest.importorskip("lazygrad")
    from lazygrad import engine
    from lazygrad_uop.registry import Device

    dev = Device["PYTHON"]
    before = dev.renderer
    engine._runners.clear()
    dev.use_renderer(PythonRenderer(EMULATED))
    yield engine
    dev.use_renderer(before)
    engine._runners.clear()


def _tf32_kernels(engine) -> list[str]:
    """The names of the compiled kernels that run a TF32 WMMA (float32 inputs)."""
    return [
        r.spec.name
        for r in engine._runners.values()
        if any(u.op is Ops.WMMA and u.arg[2] == dtypes.float32 for u in r.spec.uops)
    ]


def _check(got: np.ndarray, tf32: np.ndarray, exact: np.ndarray) -> None:
    """`got` matches the float64 result on TF32-rounded inputs closely, and the float32 result measurably less."""
    scale = np.abs(exact).max()
    np.testing.assert_allclose(got, tf32, rtol=0, atol=2e-6 * scale)
    assert np.abs(got - exact).max() > 20 * np.abs(got - tf32).max()


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((64, 48), (48, 40)),  # whole tensor-core tiles
        ((33, 20), (20, 17)),  # no axis a multiple of the tile: padded, the padding masked off
        ((3, 32, 24), (3, 24, 16)),  # batched
    ],
)
def test_float32_matmuls_on_tf32_only_when_asked(emulated_gpu, a_shape, b_shape) -> None:
    from lazygrad import Tensor

    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    tf32 = mantissa_reference(a).astype(np.float64) @ mantissa_reference(b).astype(np.float64)
    # off (the default): float32 as it is, no tensor core
    got = (Tensor(a, device="PYTHON") @ Tensor(b, device="PYTHON")).numpy()
    np.testing.assert_allclose(got, exact, rtol=0, atol=2e-6 * np.abs(exact).max())
    assert not _tf32_kernels(emulated_gpu)
    assert not any(u.op is Ops.WMMA for r in emulated_gpu._runners.values() for u in r.spec.uops)
    # on: the same graph compiles to a program on the TF32 core
    with Context(TF32=1):
        got = (Tensor(a, device="PYTHON") @ Tensor(b, device="PYTHON")).numpy()
    assert _tf32_kernels(emulated_gpu)
    _check(got, tf32, exact)


def test_convolution_forward_and_backward_on_tf32(emulated_gpu) -> None:
    torch = pytest.importorskip("torch")
    from lazygrad import Tensor

    x_np = RNG.standard_normal((2, 16, 6, 6)).astype(np.float32)
    w_np = (RNG.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    g_np = RNG.standard_normal((2, 16, 6, 6)).astype(np.float32)
    with Context(TF32=1):
        x, w = Tensor(x_np, device="PYTHON").requires_grad_(), Tensor(w_np, device="PYTHON").requires_grad_()
        out = x.conv2d(w, padding=1)
        dx, dw = out.gradient(x, w, gradient=Tensor(g_np, device="PYTHON"))
        got = [t.numpy() for t in (out, dx, dw)]
    # the forward and both gradients; read channels-last (`lazygrad.functional.CONV_CHANNELS_LAST`), the forward and
    # the input gradient are one kernel, of the same shapes and layouts
    assert len(_tf32_kernels(emulated_gpu)) >= 2

    def passes(x_: np.ndarray, w_: np.ndarray, g_: np.ndarray) -> list[np.ndarray]:
        tx, tw, tg = (torch.from_numpy(v).double().requires_grad_() for v in (x_, w_, g_))
        t_out = torch.nn.functional.conv2d(tx, tw, padding=1)
        t_dx, t_dw = torch.autograd.grad(t_out, (tx, tw), tg.detach())
        return [v.detach().numpy() for v in (t_out, t_dx, t_dw)]

    # every pass multiplies two of x, w, g as loaded: each rounded to TF32
    tf32 = passes(*(mantissa_reference(v) for v in (x_np, w_np, g_np)))
    for got_, tf32_, exact in zip(got, tf32, passes(x_np, w_np, g_np), strict=True):
        _check(got_, tf32_, exact)


def test_weight_gradient_with_padded_fragment_strides_on_tf32(monkeypatch) -> None:
    """A weight gradient whose staged A has its TC_K stride padded against bank conflicts (not only its rows: see
    lazygrad_codegen.staging._fragment_layout) computes what torch does on TF32-rounded inputs."""
    torch = pytest.importorskip("torch")
    from lazygrad import Tensor, engine, functional
    from lazygrad_codegen import staging
    from lazygrad_uop.registry import Device

    padded: list[int] = []
    choose = staging._fragment_layout

    def recording(k, operand, copy, sizes, vector):  # type: ignore[no-untyped-def]
        layout, pads = choose(k, operand, copy, sizes, vector)
        padded.extend(n for n in pads if n != staging._row(k, layout, sizes)[0])
        return layout, pads

    monkeypatch.setattr(staging, "_fragment_layout", recording)
    # the weight gradient whole (its A tile is the one that needs the padding), as on a GPU its tiles fill
    monkeypatch.setattr(functional, "split_k_parts", lambda *a, **k: 1)
    dev = Device["PYTHON"]
    before = dev.renderer
    engine._runners.clear()
    # as many compute units as an H100
    dev.use_renderer(PythonRenderer(dataclasses.replace(EMULATED, name="TF32GPU132", compute_units=132)))
    try:
        x_np = RNG.standard_normal((4, 16, 16, 16)).astype(np.float32)
        w_np = (RNG.standard_normal((32, 16, 3, 3)) * 0.3).astype(np.float32)
        g_np = RNG.standard_normal((4, 32, 16, 16)).astype(np.float32)
        # generated here, so the layouts chosen are seen; read in NCHW by the direct kernel, whose A tile has the
        # TC_K stride the padding is for
        with Context(TF32=1, PROGRAM_CACHE=0, CONV_CHANNELS_LAST=0, IM2COL_WEIGHT_GRADIENT=0):
            w = Tensor(w_np, device="PYTHON").requires_grad_()
            out = Tensor(x_np, device="PYTHON").conv2d(w, padding=1)
            (dw,) = out.gradient(w, gradient=Tensor(g_np, device="PYTHON"))
            got = dw.numpy()
        assert _tf32_kernels(engine) and padded
    finally:
        dev.use_renderer(before)
        engine._runners.clear()

    def weight_gradient(x_: np.ndarray, w_: np.ndarray, g_: np.ndarray) -> np.ndarray:
        tw = torch.from_numpy(w_).double().requires_grad_()
        t_out = torch.nn.functional.conv2d(torch.from_numpy(x_).double(), tw, padding=1)
        (t_dw,) = torch.autograd.grad(t_out, (tw,), torch.from_numpy(g_).double())
        return t_dw.numpy()

    tf32 = weight_gradient(*(mantissa_reference(v) for v in (x_np, w_np, g_np)))
    _check(got, tf32, weight_gradient(x_np, w_np, g_np))
