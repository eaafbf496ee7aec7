"""conv2d's backward as conv2d states it (`set_gradient_rule`): the input gradient is one convolution of the output
gradient with no intermediate buffer, the weight gradient one reduction (split along the batch on a GPU with more
compute units than tiles); values against torch for strides, paddings (asymmetric, larger than the kernel),
dilations and groups in 1 to 3 spatial dims, second derivatives through the rule, and the kernels and bytes of the
schedule of a ResNet-18 3x3 layer at batch 64 (scheduled only, nothing runs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch_reference import conv_passes_match_torch

import lazygrad.functional
from lazygrad import Tensor
from lazygrad_codegen.kernel import AxisType, Kernel
from lazygrad_codegen.reductions import SPLIT_K_MAX, SPLIT_K_MIN, SPLIT_K_WARPS, GemmLaunch, split_k_parts
from lazygrad_uop.config import Context
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def direct_kernels(monkeypatch: pytest.MonkeyPatch):
    """The direct kernels, here: on the CPU by default, the weight gradient of kernels of more than one tap, and the
    forward of convolutions of few input channels, are products over the window matrix (IM2COL_WEIGHT_GRADIENT,
    WINDOWS_FORWARD_CHANNELS, tested in test_conv_im2col)."""
    monkeypatch.setattr(lazygrad.functional, "WINDOWS_FORWARD_CHANNELS", 0)
    with Context(IM2COL_WEIGHT_GRADIENT=0):
        yield


F = torch.nn.functional


CASES = [
    # (input shape, weight shape, groups, stride, dilation, padding)
    ((2, 4, 8, 8), (6, 4, 3, 3), 1, 1, 1, 1),
    ((2, 4, 9, 8), (6, 4, 3, 3), 1, 2, 1, 1),
    ((1, 4, 10, 9), (4, 2, 3, 2), 2, (2, 3), (2, 1), (1, 2)),
    ((1, 3, 7, 7), (2, 3, 3, 3), 1, 1, 1, (0, 2, 1, 0)),  # flat (left, right, top, bottom)
    ((1, 2, 6, 6), (2, 2, 2, 2), 1, 1, 1, 3),  # padding wider than the kernel: whole windows of zeros
    ((1, 4, 8, 8), (4, 1, 3, 3), 4, 2, 1, "valid"),  # depthwise
    ((2, 4, 9, 8), (6, 4, 1, 1), 1, 2, 1, 0),  # ResNet's downsample
    ((1, 3, 16, 15), (4, 3, 7, 7), 1, 2, 1, 3),  # ResNet's stem
    ((1, 4, 10, 9), (4, 2, 3, 4), 2, (2, 1), (1, 2), (2, 1)),  # stride 2 by phases next to a dilated dim
    ((1, 2, 7, 8), (2, 2, 2, 3), 1, 2, 1, (0, 3, 2, 1)),  # even kernels, asymmetric padding
    ((2, 3, 11), (4, 3, 3), 1, 3, 2, 2),  # 1-d
    ((1, 2, 5, 6, 5), (4, 1, 2, 3, 2), 2, (1, 2, 1), (1, 1, 2), 1),  # 3-d
]


@pytest.mark.parametrize("xs,ws,groups,stride,dilation,padding", CASES)
def test_gradients_match_torch(xs, ws, groups, stride, dilation, padding) -> None:
    conv_passes_match_torch(xs, ws, padding, groups=groups, stride=stride, dilation=dilation)


def test_half_precision_gradients_match_torch() -> None:
    conv_passes_match_torch((2, 8, 8, 8), (8, 8, 3, 3), 1, stride=2, dtype=dtypes.float16, tol=2e-2)


@given(
    size=st.integers(4, 9),
    k=st.integers(1, 3),
    stride=st.integers(1, 3),
    dilation=st.integers(1, 2),
    before=st.integers(0, 3),
    after=st.integers(0, 3),
    groups=st.sampled_from([1, 2]),
)
def test_one_dimensional_gradients_match_torch(size, k, stride, dilation, before, after, groups) -> None:
    if size + before + after < dilation * (k - 1) + 1:
        return
    conv_passes_match_torch(
        (1, 2, size), (2, 2 // groups, k), (before, after), groups=groups, stride=stride, dilation=dilation
    )


def test_second_derivatives_match_torch() -> None:
    rng = np.random.default_rng(3)
    x_np, w_np = (
        rng.standard_normal((1, 2, 6, 6)).astype(np.float32),
        rng.standard_normal((3, 2, 3, 3)).astype(np.float32),
    )
    x, w = Tensor(x_np).requires_grad_(), Tensor(w_np).requires_grad_()
    (dx,) = x.conv2d(w, stride=2, padding=1).square().sum().gradient(x)
    (dw,) = (dx * dx).sum().gradient(w)
    tx, tw = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x_np, w_np))
    (tdx,) = torch.autograd.grad(F.conv2d(tx, tw, stride=2, padding=1).square().sum(), tx, create_graph=True)
    (tdw,) = torch.autograd.grad((tdx * tdx).sum(), tw)
    np.testing.assert_allclose(dw.numpy(), tdw.numpy(), rtol=1e-4, atol=1e-4 * np.abs(tdw.numpy()).max())


def test_split_weight_gradient_matches_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # the parts and their sum, as a GPU would get them, on the CPU: the 6 output rows in 2, 3 and 6 parts
    for parts in (2, 3, 6):
        monkeypatch.setattr(lazygrad.functional, "split_k_parts", lambda *a, p=parts, **k: p)
        conv_passes_match_torch((2, 4, 6, 6), (6, 2, 3, 3), 1, groups=2)
        conv_passes_match_torch((2, 4, 12, 11), (4, 4, 3, 2), 1, stride=2, dilation=(1, 2))
        x, w = Tensor.empty(2, 4, 6, 6).requires_grad_(), Tensor.empty(6, 4, 3, 3).requires_grad_()
        (dw,) = x.conv2d(w, padding=1).gradient(w, gradient=Tensor.empty(2, 6, 6, 6))
        items = dw.schedule()
        assert len(items) == 2 and items[-1].bufs[1].size == parts * 6 * 4 * 9


# *** what is scheduled: a ResNet-18 3x3 layer at batch 64 ***


def _intermediate_bytes(items) -> int:
    """Bytes of the buffers one kernel of `items` writes and a later one reads."""
    written, between = {}, 0
    for si in items:
        for b in si.bufs[1:]:
            if id(b) in written:
                between += written.pop(id(b))
        written[id(si.bufs[0])] = si.bufs[0].size * si.bufs[0].dtype.itemsize
    return between


def _layer(stride: int, device: str = "CPU"):
    x = Tensor.empty(64, 64, 56 * stride, 56 * stride, device=device).requires_grad_()
    w = Tensor.empty(64, 64, 3, 3, device=device).requires_grad_()
    out = x.conv2d(w, padding=1, stride=stride)
    return out.gradient(x, w, gradient=Tensor.empty(*out.shape, device=device))


@pytest.mark.parametrize("stride", [1, 2])
def test_input_gradient_is_one_kernel_reading_the_output_gradient(stride: int) -> None:
    dx, _ = _layer(stride)
    items = dx.schedule()
    assert len(items) == 1
    (si,) = items
    # it writes the input's gradient and reads only the output gradient and the weight
    assert si.bufs[0].size == 64 * 64 * (56 * stride) ** 2
    assert sorted(b.size for b in si.bufs[1:]) == [64 * 64 * 9, 64 * 64 * 56 * 56]
    assert len([u for u in si.ast.toposort if u.op is Ops.REDUCE_AXIS]) == 1
    # over output channels x kernel rows x kernel columns; at stride 2, x the 2 taps of each phase (of 2 per dim)
    k = Kernel(si.ast, Device["CPU"].renderer)
    assert sorted(k.full_shape[a] for a in k.axes(AxisType.REDUCE)) == ([3, 3, 64] if stride == 1 else [2, 2, 64])
    assert _intermediate_bytes(items) == 0


def test_weight_gradient_on_the_cpu_is_one_kernel() -> None:
    _, dw = _layer(1)
    assert len(dw.schedule()) == 1


class _SomeGpu:
    """Just what `split_k_parts` reads of a renderer."""

    warp_size = 32

    def __init__(self, units: int, local: bool = True) -> None:
        self.compute_units, self.has_local, self.has_shared = units, local, local


@given(
    units=st.integers(1, 300),
    workgroups=st.integers(1, 600),
    threads=st.sampled_from([1, 8, 32, 64, 128, 256]),
    axis=st.integers(1, 256),
    rest=st.integers(1, 5000),
)
def test_split_k_parts_fill_the_device_within_bounds(units, workgroups, threads, axis, rest) -> None:
    length = axis * rest
    parts = split_k_parts(_SomeGpu(units), GemmLaunch(workgroups, threads), axis, length)
    assert axis % parts == 0 and 1 <= parts <= SPLIT_K_MAX
    fits = [p for p in range(2, min(axis, SPLIT_K_MAX) + 1) if axis % p == 0 and length // p >= SPLIT_K_MIN]
    warps = workgroups * math.ceil(threads / 32)

    def enough(p: int) -> bool:
        # a workgroup per compute unit, SPLIT_K_WARPS warps per unit
        return workgroups * p >= units and warps * p >= SPLIT_K_WARPS * units

    if units < 2 or enough(1) or not fits:
        assert parts == 1
    else:
        # the fewest parts that are enough, or as many as fit
        assert parts == next((p for p in fits if enough(p)), max(fits))
    assert split_k_parts(_SomeGpu(units, local=False), GemmLaunch(workgroups, threads), axis, length) == 1


def test_a_short_reduction_to_many_outputs_is_split_to_fill_a_gpu() -> None:
    # ResNet-18's 1x1 downsampling weight gradient at its last layer: 512x256 outputs in 8 workgroups, a reduction
    # of 64 x 7 x 7 over rows of 7: on 132 compute units its 7 rows become 7 parts of 448 products each
    assert 3136 // 7 >= SPLIT_K_MIN
    assert split_k_parts(_SomeGpu(132), GemmLaunch(8, 128), 7, 64 * 7 * 7) == 7


def test_cpu_weight_gradient_is_not_split() -> None:
    assert split_k_parts(Device["CPU"].renderer, GemmLaunch(1, 1), 64, 64 * 56 * 56) == 1
