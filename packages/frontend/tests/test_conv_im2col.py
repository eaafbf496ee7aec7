"""conv2d as matmuls over the matrix of its input's windows (`_conv_by_im2col`, taken on GPUs for convolutions with
many output channels): the forward and both gradients against torch in float64, on the CPU with the path forced
(any shape it takes, the weight gradient's split into parts included) and on the PYTHON device emulating a GPU with
CUDA's tensor cores; which convolutions take it; and what is scheduled."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_reference import conv_passes_match_torch

import lazygrad.functional as functional
from lazygrad import Tensor
from lazygrad_uop.config import Context
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch):
    """Every convolution the path computes takes it, on any device."""
    monkeypatch.setattr(functional, "IM2COL_CHANNELS", 1)
    monkeypatch.setattr(functional, "_matmul_units", lambda device, dtype: True)
    return monkeypatch


CASES = [
    # (input shape, weight shape, padding)
    ((2, 5, 6, 7), (8, 5, 3, 3), 1),
    ((3, 4, 5, 5), (9, 4, 2, 3), (1, 0)),
    ((2, 3, 4, 4), (8, 3, 3, 3), 0),
    ((1, 3, 7, 7), (2, 3, 3, 3), (0, 2, 1, 0)),  # flat (left, right, top, bottom)
    ((1, 2, 3, 3), (2, 2, 2, 2), 3),  # padding wider than the kernel: whole windows of zeros
    ((2, 6, 5, 4), (4, 6, 1, 1), 0),  # 1x1
    ((2, 3, 9), (8, 3, 4), 2),  # 1-d
    ((1, 2, 4, 3, 4), (3, 2, 2, 3, 2), 1),  # 3-d
]


@pytest.mark.parametrize("xs,ws,padding", CASES)
def test_passes_match_torch(forced, xs, ws, padding) -> None:
    conv_passes_match_torch(xs, ws, padding)


def test_half_precision_passes_match_torch(forced) -> None:
    conv_passes_match_torch((2, 8, 6, 6), (16, 8, 3, 3), 1, dtype=dtypes.float16, tol=2e-2)


@pytest.mark.parametrize("parts", [2, 4])
def test_weight_gradient_in_parts_matches_torch(forced, parts: int) -> None:
    # the reduction over the batch's pixels cut into parts along the batch, as on a GPU with few tiles
    forced.setattr(functional, "split_k_parts", lambda *a, p=parts, **k: p)
    conv_passes_match_torch((4, 3, 5, 5), (6, 3, 3, 3), 1)


@settings(max_examples=8, deadline=None)
@given(
    n=st.integers(1, 3),
    cin=st.integers(1, 4),
    cout=st.integers(1, 5),
    size=st.integers(1, 6),
    k=st.integers(1, 3),
    before=st.integers(0, 2),
    after=st.integers(0, 2),
)
def test_random_shapes_match_torch(n, cin, cout, size, k, before, after) -> None:
    if size + before + after < k:
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(functional, "IM2COL_CHANNELS", 1)
        mp.setattr(functional, "_matmul_units", lambda device, dtype: True)
        conv_passes_match_torch((n, cin, size + 1, size), (cout, cin, k, k), (before, after, after, before))


def test_second_derivatives_match_torch(forced) -> None:
    # through the rule's own graph: the input gradient depends on the weight, the weight gradient on the input
    rng = np.random.default_rng(3)
    x_np, w_np = (
        rng.standard_normal((2, 2, 5, 5)).astype(np.float32),
        rng.standard_normal((3, 2, 3, 3)).astype(np.float32),
    )
    x, w = Tensor(x_np).requires_grad_(), Tensor(w_np).requires_grad_()
    (dx,) = x.conv2d(w, padding=1).square().sum().gradient(x)
    (dw,) = (dx * dx).sum().gradient(w)
    tx, tw = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x_np, w_np))
    (tdx,) = torch.autograd.grad(F.conv2d(tx, tw, padding=1).square().sum(), tx, create_graph=True)
    (tdw,) = torch.autograd.grad((tdx * tdx).sum(), tw)
    np.testing.assert_allclose(dw.numpy(), tdw.numpy(), rtol=1e-4, atol=1e-4 * np.abs(tdw.numpy()).max())


def test_the_forward_stores_the_window_matrix_once(forced) -> None:
    x, w = Tensor.empty(2, 5, 6, 7), Tensor.empty(8, 5, 3, 3)
    items = x.conv2d(w, padding=1).schedule()
    # the windows as a (N x pixels, C_in x taps) matrix, its product with the weight (a row per pixel), then that
    # stored channel-major as convolutions are
    assert len(items) == 3
    assert items[0].bufs[0].size == (2 * 6 * 7) * (5 * 9)
    assert items[1].bufs[0].size == items[2].bufs[0].size == 2 * 6 * 7 * 8


def test_the_input_gradient_reads_its_kernel_stored_as_the_product_does(forced) -> None:
    """Without col2im (convolutions read channels-last, the default) the input's gradient is a convolution of the
    output's with the transposed, flipped kernel, again by the window matrix: that kernel is stored (C_in, C_out x
    taps) first, so the product reads rows of it in order (16-byte copies on a GPU) rather than through the flip; the
    values as torch's."""
    rng = np.random.default_rng(3)
    x_np, w_np = rng.standard_normal((2, 5, 6, 7)), rng.standard_normal((8, 5, 3, 3))
    g_np = rng.standard_normal((2, 8, 6, 7))
    x, w = Tensor(x_np.astype(np.float32)).requires_grad_(), Tensor(w_np.astype(np.float32))
    (dx,) = x.conv2d(w, padding=1).gradient(x, gradient=Tensor(g_np.astype(np.float32)))
    stored = [si for si in dx.schedule() if si.bufs[0].size == w_np.size]
    assert len(stored) == 1, [si.bufs[0].size for si in dx.schedule()]
    tx = torch.tensor(x_np, requires_grad=True)
    F.conv2d(tx, torch.tensor(w_np), padding=1).backward(torch.tensor(g_np))
    np.testing.assert_allclose(dx.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)


# *** which convolutions take it ***


def _takes(x: Tensor, w: Tensor, stride: int = 1, groups: int = 1, dilation: int = 1) -> bool:
    pads = functional._pads(1, w.shape[2:], (dilation,) * 2)
    return functional._im2col_pays(x, w, groups, (stride,) * 2, (dilation,) * 2, pads, None)


def test_gpu_convolutions_with_many_output_channels_take_it(tensor_core_gpu) -> None:
    def take(cin=256, cout=256, dtype=dtypes.float16, device="PYTHON", **kw) -> bool:
        x = Tensor.empty(8, cin, 7, 7, dtype=dtype, device=device)
        return _takes(x, Tensor.empty(cout, cin // kw.get("groups", 1), 3, 3, dtype=dtype, device=device), **kw)

    assert take() and take(dtype=dtypes.bfloat16) and take(cin=3)
    assert not take(cout=functional.IM2COL_CHANNELS // 2)
    assert not take(stride=2) and not take(groups=2) and not take(dilation=2)
    # float32 only on the TF32 core, which only TF32=1 allows
    assert not take(dtype=dtypes.float32)
    with Context(TF32=1):
        assert take(dtype=dtypes.float32)
    # not on the CPU
    assert not take(device="CPU")


def test_passes_on_an_emulated_tensor_core_gpu_match_torch(tensor_core_gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(functional, "IM2COL_CHANNELS", 16)
    x = Tensor.empty(2, 8, 6, 6, dtype=dtypes.float16, device="PYTHON")
    assert _takes(x, Tensor.empty(16, 8, 3, 3, dtype=dtypes.float16, device="PYTHON"))
    conv_passes_match_torch((2, 8, 6, 6), (16, 8, 3, 3), 1, dtype=dtypes.float16, tol=2e-2, device="PYTHON")
    # the matmuls ran on the tensor cores
    from lazygrad import engine

    assert any(Ops.WMMA in [u.op for u in r.spec.uops] for r in engine._runners.values())


# *** the weight gradient alone from a window matrix built in the backward (IM2COL_WEIGHT_GRADIENT) ***


WEIGHT_GRADIENT_CASES = [
    # (input shape, weight shape, padding, stride)
    ((2, 3, 15, 15), (8, 3, 7, 7), 3, 2),  # a ResNet stem
    ((2, 5, 6, 7), (4, 5, 3, 3), 1, 1),
    ((2, 4, 9, 8), (6, 4, 3, 2), (1, 0), (2, 3)),
    ((3, 3, 11), (5, 3, 4), 2, 3),  # 1-d
    ((1, 2, 5, 4, 5), (3, 2, 2, 3, 2), 1, 2),  # 3-d
]


def _stores_windows(dw: Tensor, size: int) -> bool:
    """Whether computing `dw` stores a buffer of `size` elements (the window matrix)."""
    return any(si.bufs[0].size == size for si in dw.schedule())


@pytest.mark.parametrize("xs,ws,padding,stride", WEIGHT_GRADIENT_CASES)
def test_weight_gradient_from_windows_matches_torch(xs, ws, padding, stride) -> None:
    """On the CPU by default: every convolution of more than one tap."""
    conv_passes_match_torch(xs, ws, padding, stride=stride)


def test_weight_gradient_from_windows_in_parts_and_half_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(functional, "split_k_parts", lambda *a, **k: 2)
    conv_passes_match_torch((4, 3, 9, 9), (6, 3, 3, 3), 1, stride=2)
    conv_passes_match_torch((2, 8, 6, 6), (16, 8, 3, 3), 1, stride=2, dtype=dtypes.float16, tol=2e-2)


@settings(max_examples=8, deadline=None)
@given(
    n=st.integers(1, 3),
    cin=st.integers(1, 4),
    cout=st.integers(1, 5),
    size=st.integers(2, 9),
    k=st.integers(2, 4),
    stride=st.integers(1, 3),
    pad=st.integers(0, 2),
)
def test_weight_gradient_from_windows_of_random_shapes(n, cin, cout, size, k, stride, pad) -> None:
    if size + 2 * pad < k:
        return
    conv_passes_match_torch((n, cin, size, size + 1), (cout, cin, k, k), pad, stride=stride)


def test_which_weight_gradients_come_from_windows() -> None:
    """On the CPU by default for kernels of more than one tap; never with the setting 0, nor where the window
    matrix doesn't compute the convolution (dilation, groups)."""
    # (more input channels than a forward by the window matrix takes: the forward is the direct kernel)
    x = Tensor.empty(2, 5, 15, 15)

    def windows(weight: Tensor, **kw) -> bool:
        weight.requires_grad_()
        out = x.conv2d(weight, **kw)
        (dw,) = out.sum().gradient(weight)
        taps = int(np.prod(weight.shape[2:]))
        return _stores_windows(dw, out.shape[0] * int(np.prod(out.shape[2:])) * weight.shape[1] * taps)

    stem = Tensor.empty(8, 5, 7, 7)
    assert windows(stem, padding=3, stride=2)
    with Context(IM2COL_WEIGHT_GRADIENT=0):
        assert not windows(stem, padding=3, stride=2)
    assert not windows(stem, padding=6, stride=2, dilation=2)
    assert not windows(Tensor.empty(10, 1, 3, 3), padding=1, groups=5)
    # one tap: the direct kernel is faster on the CPU
    assert not windows(Tensor.empty(8, 5, 1, 1), stride=2)


def test_weight_gradient_from_windows_on_an_emulated_tensor_core_gpu(tensor_core_gpu) -> None:
    """On a GPU by default too (for the convolutions that don't read channels-last: 4 fp16 channels fill no 16-byte
    vector), one tap included, not with the setting 0; the product on tensor cores."""
    x = Tensor.empty(2, 4, 12, 12, dtype=dtypes.float16, device="PYTHON")
    w = Tensor.empty(16, 4, 3, 3, dtype=dtypes.float16, device="PYTHON")
    assert functional._windows_weight_gradient(x, w, 1, (1, 1), ((1, 1), (1, 1)))
    assert not functional._channels_last_pays(x, w, 1, None)
    with Context(IM2COL_WEIGHT_GRADIENT=0):
        assert not functional._windows_weight_gradient(x, w, 1, (1, 1), ((1, 1), (1, 1)))
    with Context(IM2COL_WEIGHT_GRADIENT=1):
        assert functional._windows_weight_gradient(x, w, 1, (1, 1), ((1, 1), (1, 1)))
    conv_passes_match_torch((2, 4, 12, 12), (16, 4, 3, 3), 1, stride=2, dtype=dtypes.float16, tol=2e-2, device="PYTHON")
    conv_passes_match_torch((2, 8, 6, 6), (16, 8, 1, 1), 0, stride=2, dtype=dtypes.float16, tol=2e-2, device="PYTHON")
    from lazygrad import engine

    # the product over the window matrix (2 x 6 x 6 pixels, 4 channels x 9 taps) ran on the tensor cores
    def reads_windows(uops) -> bool:
        return any(u.op is Ops.DEFINE_GLOBAL and u.dtype.size == 2 * 6 * 6 * 4 * 9 for u in uops)

    assert any(Ops.WMMA in [u.op for u in r.spec.uops] and reads_windows(r.spec.uops) for r in engine._runners.values())


# *** the forward of a convolution of few input channels on the CPU (WINDOWS_FORWARD_CHANNELS) ***


@pytest.mark.parametrize(
    "xs,ws,padding,stride",
    [
        ((2, 3, 15, 15), (8, 3, 7, 7), 3, 2),  # a ResNet stem
        ((2, 1, 9, 8), (4, 1, 3, 3), 1, 1),
        ((2, 4, 9, 10), (5, 4, 3, 2), (1, 0), (2, 3)),
        ((3, 2, 11), (5, 2, 4), 2, 3),  # 1-d
    ],
)
def test_few_channel_forward_from_windows_matches_torch(xs, ws, padding, stride) -> None:
    conv_passes_match_torch(xs, ws, padding, stride=stride)


def test_which_forwards_come_from_windows() -> None:
    """On the CPU, the forward of a convolution of at most WINDOWS_FORWARD_CHANNELS input channels and more than one
    tap stores the window matrix and then multiplies it; its weight gradient reads that matrix again instead of
    building it. Not with more channels, nor on one tap."""
    x = Tensor.rand(2, 3, 15, 15).requires_grad_()
    stem = Tensor.rand(8, 3, 7, 7).requires_grad_()
    windows = 2 * 8 * 8 * 3 * 49
    out = x.conv2d(stem, padding=3, stride=2)
    assert _stores_windows(out, windows)
    out.realize()
    _, dw = out.sum().gradient(x, stem)
    # one kernel: the product of the (ones) output gradient with the matrix the forward stored
    (item,) = dw.schedule()
    assert [b.size for b in item.bufs[1:]] == [windows]
    assert not _stores_windows(
        Tensor.empty(2, 5, 15, 15).conv2d(Tensor.empty(8, 5, 7, 7), padding=3, stride=2), 2 * 8 * 8 * 5 * 49
    )
    assert not _stores_windows(
        Tensor.empty(2, 3, 15, 15, device="PYTHON").conv2d(Tensor.empty(8, 3, 1, 1, device="PYTHON")), 2 * 15 * 15 * 3
    )


def test_passes_on_tma_match_torch(hopper_gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    # WGMMA=2 on an emulated sm_90: the window matrix and the kernel are plain stored matrices (rows of 576 halves),
    # which the tensor memory accelerator copies into the wgmma tiles of the product
    monkeypatch.setattr(functional, "IM2COL_CHANNELS", 16)
    with Context(WGMMA=2):
        conv_passes_match_torch((1, 64, 8, 8), (64, 64, 3, 3), 1, dtype=dtypes.float16, tol=2e-2, device="PYTHON")
    from lazygrad import engine

    assert any(Ops.TMA_LOAD in [u.op for u in r.spec.uops] for r in engine._runners.values())
