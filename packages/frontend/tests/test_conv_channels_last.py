"""conv2d through channels-last copies (`_conv_channels_last`, taken on GPUs whose tensor cores take the dtype): the
forward and both gradients against torch in float64 on the PYTHON device emulating a GPU with CUDA's tensor cores,
its staged 16-byte copies and its pipeline, on the CPU with the path forced (any shape, stride and dilation it
takes), second derivatives; which convolutions take it; and what the kernels stage."""

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


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch):
    """Every convolution the path computes takes it, on any device and for any channel count."""
    monkeypatch.setattr(functional, "_matmul_units", lambda device, dtype: True)
    monkeypatch.setattr(functional, "IM2COL_CHANNELS", 1 << 30)
    return monkeypatch


def _takes(x: Tensor, w: Tensor, groups: int = 1) -> bool:
    return functional._channels_last_pays(x, w, groups, None)


CASES = [
    # (input shape, weight shape, padding, stride, dilation)
    ((2, 8, 6, 7), (5, 8, 3, 3), 1, 1, 1),
    ((2, 8, 9, 8), (4, 8, 3, 2), (1, 0), (2, 3), 1),
    ((1, 8, 9, 9), (3, 8, 3, 3), 2, 1, 2),
    ((2, 8, 15, 15), (4, 8, 7, 7), 3, 2, 1),  # a stem-like stride-2 7x7
    ((3, 8, 11), (5, 8, 4), 2, 3, 1),  # 1-d
    ((1, 8, 5, 4, 5), (3, 8, 2, 3, 2), 1, 1, 1),  # 3-d
]


@pytest.mark.parametrize("xs,ws,padding,stride,dilation", CASES)
def test_passes_match_torch(forced, xs, ws, padding, stride, dilation) -> None:
    x, w = Tensor.empty(*xs), Tensor.empty(*ws)
    assert _takes(x, w)
    conv_passes_match_torch(xs, ws, padding, stride=stride, dilation=dilation)


@settings(max_examples=8, deadline=None)
@given(
    n=st.integers(1, 3),
    cin=st.sampled_from([4, 8]),
    cout=st.integers(1, 5),
    size=st.integers(1, 6),
    k=st.integers(2, 3),
    stride=st.integers(1, 2),
    before=st.integers(0, 2),
    after=st.integers(0, 2),
)
def test_random_shapes_match_torch(n, cin, cout, size, k, stride, before, after) -> None:
    if size + before + after < k:
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(functional, "_matmul_units", lambda device, dtype: True)
        conv_passes_match_torch(
            (n, cin, size + 1, size), (cout, cin, k, k), (before, after, after, before), stride=stride
        )


def test_second_derivatives_match_torch(forced) -> None:
    rng = np.random.default_rng(3)
    x_np, w_np = rng.standard_normal((2, 4, 5, 5)), rng.standard_normal((3, 4, 3, 3))
    x, w = Tensor(x_np, dtype=dtypes.float64).requires_grad_(), Tensor(w_np, dtype=dtypes.float64).requires_grad_()
    (dx,) = x.conv2d(w, padding=1).square().sum().gradient(x)
    (dxw,) = (dx * dx).sum().gradient(w)
    tx, tw = torch.from_numpy(x_np).requires_grad_(), torch.from_numpy(w_np).requires_grad_()
    (tdx,) = torch.autograd.grad(torch.nn.functional.conv2d(tx, tw, padding=1).square().sum(), tx, create_graph=True)
    (tdxw,) = torch.autograd.grad((tdx * tdx).sum(), tw)
    np.testing.assert_allclose(dxw.numpy(), tdxw.numpy(), rtol=1e-9, atol=1e-9)


def test_which_convolutions_take_it(tensor_core_gpu) -> None:
    def take(cin=16, cout=8, k=3, dtype=dtypes.float16, device="PYTHON", groups=1) -> bool:
        x = Tensor.empty(2, cin, 6, 6, dtype=dtype, device=device)
        return _takes(x, Tensor.empty(cout, cin // groups, k, k, dtype=dtype, device=device), groups)

    assert take() and take(cin=8) and take(dtype=dtypes.bfloat16)
    # channels that don't fill 16-byte vectors (an RGB stem), one tap (a 1x1 is a plain matmul), groups
    assert not take(cin=3) and not take(cin=12) and not take(k=1) and not take(cin=16, groups=2)
    # float32 only where TF32 is allowed; not on the CPU; not with the setting off
    assert not take(dtype=dtypes.float32)
    with Context(TF32=1):
        assert take(cin=4, dtype=dtypes.float32)
    assert not take(device="CPU")
    with Context(CONV_CHANNELS_LAST=0):
        assert not take()


def _sixteen_byte_copies(spec) -> bool:
    return any(u.op is Ops.ASYNC_COPY and u.arg * u.src[1].src[0].dtype.base.itemsize == 16 for u in spec.uops)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_passes_on_an_emulated_tensor_core_gpu_match_torch(cuda_like_gpu, dtype) -> None:
    from lazygrad import engine

    engine._runners.clear()
    x = Tensor.empty(2, 16, 8, 8, dtype=dtype, device="PYTHON")
    assert _takes(x, Tensor.empty(16, 16, 3, 3, dtype=dtype, device="PYTHON"))
    conv_passes_match_torch((2, 16, 8, 8), (16, 16, 3, 3), 1, dtype=dtype, tol=2e-2, device="PYTHON")
    # the forward (and the input gradient, the same kernel here) and the weight gradient ran on the tensor cores, each
    # operand copied into local memory in 16-byte asynchronous copies
    wmma = [r.spec for r in engine._runners.values() if Ops.WMMA in [u.op for u in r.spec.uops]]
    assert len(wmma) == 2 and all(_sixteen_byte_copies(sp) for sp in wmma)


def test_strided_and_odd_sizes_on_an_emulated_tensor_core_gpu_match_torch(cuda_like_gpu) -> None:
    # a stride-2 layer (its input gradient by phases), sizes that are no multiple of the tiles
    conv_passes_match_torch((3, 8, 9, 7), (5, 8, 3, 3), 1, stride=2, dtype=dtypes.float16, tol=2e-2, device="PYTHON")


@pytest.mark.parametrize("padding", [1, 0])
def test_strided_input_gradient_reads_the_padded_channels_last_copy(cuda_like_gpu, padding) -> None:
    """At a stride of 2 the output's gradient is padded and stored channels-last once: the input gradient by phases
    reads its windows of windows as one view, and the weight gradient its interior, both staged in 16-byte
    asynchronous copies along the channels (the phases' rearranged kernel is stored with its output channels last)."""
    from lazygrad import engine

    engine._runners.clear()
    conv_passes_match_torch(
        (2, 16, 10, 10), (24, 16, 3, 3), padding, stride=2, dtype=dtypes.float16, tol=2e-2, device="PYTHON"
    )
    wmma = [r.spec for r in engine._runners.values() if Ops.WMMA in [u.op for u in r.spec.uops]]
    # the input gradient by phases: (N, C_in, rows, rows, phase, phase) summed over (C_out, tap, tap)
    phases = [sp for sp in wmma if "_2_2_24_2_2" in sp.name]
    assert phases and all(_sixteen_byte_copies(sp) for sp in wmma), [sp.name for sp in wmma]


def test_tf32_passes_on_an_emulated_tensor_core_gpu_match_torch(cuda_like_gpu) -> None:
    # float32 on the TF32 core (TF32=1), its operands rounded to 10 mantissa bits
    from lazygrad import engine

    engine._runners.clear()
    with Context(TF32=1):
        x = Tensor.empty(2, 16, 8, 8, device="PYTHON")
        assert _takes(x, Tensor.empty(16, 16, 3, 3, device="PYTHON"))
        conv_passes_match_torch((2, 16, 8, 8), (16, 16, 3, 3), 1, tol=5e-3, device="PYTHON")
    wmma = [r.spec for r in engine._runners.values() if Ops.WMMA in [u.op for u in r.spec.uops]]
    assert wmma and all(_sixteen_byte_copies(sp) for sp in wmma)


@pytest.mark.parametrize("level", [1, 2])
def test_passes_on_wgmma_match_torch(hopper_gpu, level: int) -> None:
    # WGMMA=1 on an emulated sm_90: the channels-last forward (its 64-pixel rows the instruction's M), input gradient
    # (the same kernel) and weight gradient of a 64-channel 3x3 layer take wgmma tiles, each operand copied 16 bytes
    # at a time along the channels, and match torch; WGMMA=2 the same (the windows overlap: no tensor map for TMA)
    from lazygrad import engine

    with Context(WGMMA=level):
        conv_passes_match_torch((1, 64, 2, 64), (64, 64, 3, 3), 1, dtype=dtypes.float16, tol=2e-2, device="PYTHON")
    wgmma = [r.spec for r in engine._runners.values() if Ops.WGMMA in [u.op for u in r.spec.uops]]
    assert len(wgmma) == 2 and all(_sixteen_byte_copies(sp) for sp in wgmma)
