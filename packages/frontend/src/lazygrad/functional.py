"""Neural-network functions of `Tensor` (torch.nn.functional's counterparts): convolutions, pooling, interpolation,
normalization, dropout, embedding, attention and losses.

Convolution and pooling see the input through `_pool`, a view of shape (..., *out, *kernel) that puts every window
next to its output position using only movement ops (repeat the input, reshape it so that rows overlap by the
dilation, take every stride-th row); a convolution is then a broadcast multiply with the weight and one sum.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lazygrad.errors import InputError, KindError
from lazygrad.gradient import GradientRule, set_gradient_rule
from lazygrad.movement import concrete_sizes
from lazygrad_codegen.reductions import gemm_launch, split_k_parts
from lazygrad_uop.config import Context, ContextVar
from lazygrad_uop.dtype import DType, dtypes, least_upper_float, sum_dtype, to_dtype
from lazygrad_uop.shape import shape_of
from lazygrad_uop.uop import UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor


def _tuple(x: int | Sequence[int], n: int, what: str) -> tuple[int, ...]:
    if isinstance(x, int):
        return (x,) * n
    t = tuple(int(v) for v in x)
    if len(t) != n:
        raise InputError(f"{what} needs {n} values (one per spatial dimension), got {t}")
    return t


def _window_counts(ins: Sequence[int], k: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> list[int]:
    """Per windowed dim of length `ins`, how many windows of `k` elements `dilation` apart fit at `stride`."""
    return [(n - d * (kk - 1) - 1) // s + 1 for n, kk, s, d in zip(ins, k, stride, dilation)]


def _pool_reach(ins: Sequence[int], k: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> list[int]:
    """Per windowed dim, the length `Tensor._pool_offsets` cuts into rows: (out + (k-1)*dil // stride) * stride, at
    least the input's."""
    outs = _window_counts(ins, k, stride, dilation)
    return [max(n, (o + (kk - 1) * d // s) * s) for n, kk, s, d, o in zip(ins, k, stride, dilation, outs)]


def _pads(padding: int | str | Sequence[int], k: tuple[int, ...], dilation: tuple[int, ...]) -> list[list[int]]:
    """[before, after] per spatial dim from torch's forms: an int, one int per dim, "valid", "same", or a flat
    (left, right, top, bottom, ...) tuple that starts at the last dim (tinygrad's and F.pad's order)."""
    n = len(k)
    if padding == "valid":
        return [[0, 0] for _ in k]
    if padding == "same":
        total = [d * (kk - 1) for kk, d in zip(k, dilation)]
        return [[t // 2, t - t // 2] for t in total]
    if isinstance(padding, str):
        raise InputError(f"padding must be an int, a tuple, 'same' or 'valid', got {padding!r}")
    if isinstance(padding, int):
        return [[padding, padding] for _ in k]
    p = [int(v) for v in padding]
    if len(p) == n:
        return [[v, v] for v in p]
    if len(p) == 2 * n:
        return [[p[2 * i], p[2 * i + 1]] for i in range(n)][::-1]
    raise InputError(f"padding {tuple(p)} needs 1, {n} or {2 * n} values for {n} spatial dimensions")


def _reduce_loss(loss: Tensor, reduction: str, weight_sum: Tensor | None = None) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / weight_sum if weight_sum is not None else loss.mean()
    raise InputError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _transposed_kernel(weight: Tensor, groups: int) -> Tensor:
    """(C_a, C_b/groups, *kernel) -> (C_b, C_a/groups, *kernel), each group's channels swapped and the kernel
    flipped: the weight of the convolution that is the transpose (the input gradient) of one with `weight`."""
    nd = weight.ndim - 2
    ca, cb_g, k = weight.shape[0], weight.shape[1], weight.shape[2:]
    w = weight.reshape(groups, ca // groups, cb_g, *k).transpose(1, 2).flip(*range(3, 3 + nd))
    return w.reshape(groups * cb_g, ca // groups, *k)


def _conv_input_gradient(
    g: Tensor, weight: Tensor, size: tuple[int, ...], groups: int, s: tuple[int, ...], d: tuple[int, ...], pads
) -> Tensor:
    """The gradient of conv2d's input (spatial `size`) from its output's, `g`: one convolution (dilation d, stride
    1) of g, spread out by the stride and padded, with the transposed kernel, so one reduction over output channels
    and kernel positions. Rows of the padded input past the last window get zeros (a pad), those of the padding none
    (a negative pad)."""
    if _by_phase(s, d):
        return _conv_input_gradient_by_phase(g, weight, size, groups, s, d, pads)
    edges = _input_gradient_edges(size, weight.shape[2:], s, d, g.shape[2:], pads)
    x = g._spread(s).pad(((0, 0), (0, 0), *edges))
    w = _transposed_kernel(weight, groups)
    if _im2col_pays(x, w, groups, (1,) * len(s), d, ((0, 0),) * len(s), None):
        # the product over the window matrix reads the kernel as (C_in, C_out x taps): stored so, its rows are
        # contiguous and staged 16 bytes at a time; read through the flip its taps run backwards and its channels lie
        # taps apart, one element a copy (ResNet-18's 512-channel layers at 7x7, TF32, batch 64, on an H100: the
        # input gradient's product 0.67 ms at 22 TFLOPS, the forward's over the same shapes 0.19 ms at 80)
        w = w.contiguous()
    return x.conv2d(w, groups=groups, dilation=d)


def _input_gradient_edges(size, k, s: tuple[int, ...], d: tuple[int, ...], out, pads) -> list[tuple[int, int]]:
    """The padding of the spread output gradient (`out` positions per dim) whose convolution with the transposed
    kernel is the input's gradient (`size` positions): zeros where windows reach past the input, negative where the
    forward's padding is cropped back off."""
    edges = []
    for n, kk, ss, dd, o, (before, _) in zip(size, k, s, d, out, pads):
        left = dd * (kk - 1) - before
        edges.append((left, n + dd * (kk - 1) - left - ((o - 1) * ss + 1)))
    return edges


def _conv_input_gradient_by_phase(
    g: Tensor,
    weight: Tensor,
    size: tuple[int, ...],
    groups: int,
    s: tuple[int, ...],
    d: tuple[int, ...],
    pads,
    padded: Tensor | None = None,
) -> Tensor:
    """`_conv_input_gradient` for strides of 2 (dilation 1 along them; any along dims of stride 1) without the zeros
    of the spread gradient, which would be 3/4 of a 2-d reduction's products: the input's positions 2i + p of phase
    p (0, 1) get the taps k with k = p + padding (mod 2), ceil(K/2) of them (the other phase's last one a zero tap of
    the padded kernel), from g at i + c_p - j for the j-th of them, where c_p = (p + padding) // 2 steps by 0 or 1
    from phase to phase. Both phases are outputs of one reduction, over output channels x ceil(K/2) taps per dim:
    g is read through windows of windows (taps, then phases), the kernel through a reshape that puts its taps in
    (tap pair, phase) order.

    `padded`: g already padded by `_phase_edges` (stored channels-last by `_channels_last_gradients`); the kernel's
    rearranged taps are then stored with the output channels, the reduction's, innermost, so that both operands are
    read 16 bytes at a time along it."""
    nd, k = len(s), weight.shape[2:]
    cout, cin_g = weight.shape[:2]
    taps, rows, steps = _phase_taps(k, s), _phase_rows(size, s), _phase_steps(s, pads)
    # (N, C_out, *taps, *rows, *phases): g at i + c_p - j, the j-th tap counted from the last
    stored_padded = padded is not None
    if padded is None:
        padded = g.pad(((0, 0), (0, 0), *_phase_edges(size, k, s, d, g.shape[2:], pads)))
    a = padded._pool(tuple(taps), (1,) * nd, d)
    a = a.permute(0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd))._pool(
        tuple(x + 1 for x in steps), (1,) * nd, (1,) * nd
    )
    a = a.expand(*a.shape[: 2 + 2 * nd], *s)
    # (C_out, C_in/groups, *taps, *phases): the kernel's taps k = 2j + k0 as (j, k0), j from the last, k0 = p + padding
    w = weight.pad(((0, 0), (0, 0), *((0, j * ss - kk) for j, ss, kk in zip(taps, s, k))))
    w = w.reshape(cout, cin_g, *(v for j, ss in zip(taps, s) for v in (j, ss)))
    w = w.flip(*(2 + 2 * i for i in range(nd)), *(3 + 2 * i for i, x in enumerate(steps) if x))
    w = w.permute(0, 1, *(2 + 2 * i for i in range(nd)), *(3 + 2 * i for i in range(nd)))
    if stored_padded:
        last = (*range(1, w.ndim), 0)
        w = w.permute(*last).contiguous().permute(w.ndim - 1, *range(w.ndim - 1))
    a = a.reshape(a.shape[0], groups, cout // groups, 1, *a.shape[2:])
    w = w.reshape(1, groups, cout // groups, cin_g, *taps, *(1,) * nd, *s)
    dx = (a * w).sum((2, *range(4, 4 + nd))).reshape(a.shape[0], groups * cin_g, *rows, *s)
    # interleave the phases: position 2i + p
    dx = dx.permute(0, 1, *(v for i in range(nd) for v in (2 + i, 2 + nd + i)))
    dx = dx.reshape(*dx.shape[:2], *(r * ss for r, ss in zip(rows, s)))
    return dx.shrink(((0, dx.shape[0]), (0, dx.shape[1]), *((0, n) for n in size)))


def _phase_taps(k, s: tuple[int, ...]) -> list[int]:
    """The taps of each phase of `_conv_input_gradient_by_phase`, per dim."""
    return [-(-kk // ss) for kk, ss in zip(k, s)]


def _phase_rows(size, s: tuple[int, ...]) -> list[int]:
    """The input positions of each phase, per dim."""
    return [-(-n // ss) for n, ss in zip(size, s)]


def _phase_steps(s: tuple[int, ...], pads) -> list[int]:
    """c_1 - c_0 of `_conv_input_gradient_by_phase`, per dim: where phase 1's reads start after phase 0's."""
    return [1 if ss == 2 and before % 2 else 0 for ss, (before, _) in zip(s, pads)]


def _phase_edges(size, k, s: tuple[int, ...], d: tuple[int, ...], out, pads) -> list[tuple[int, int]]:
    """The padding of the output's gradient that `_conv_input_gradient_by_phase` reads its windows from."""
    edges = []
    for j, dd, r, a, o, ss, (before, _) in zip(
        _phase_taps(k, s), d, _phase_rows(size, s), _phase_steps(s, pads), out, s, pads
    ):
        left = (j - 1) * dd - before // ss
        edges.append((left, r + a + (j - 1) * dd - left - o))
    return edges


def _by_phase(s: tuple[int, ...], d: tuple[int, ...]) -> bool:
    """Whether `_conv_input_gradient` takes `_conv_input_gradient_by_phase` for these strides and dilations."""
    return any(ss == 2 for ss in s) and all(ss == 1 or (ss == 2 and dd == 1) for ss, dd in zip(s, d))


def _conv_weight_gradient(
    g: Tensor,
    x: Tensor,
    wshape: tuple[int, ...],
    groups: int,
    s: tuple[int, ...],
    d: tuple[int, ...],
    pads,
    channels_last: bool = False,
) -> Tensor:
    """The gradient of conv2d's weight (of shape `wshape`) from its output's, `g`: a sum over the batch and the
    output pixels of g times the input's windows. On a GPU that would get fewer tiles than it has compute units, the
    output rows are cut into parts summed by separate workgroups (split-K, `split_k_parts`), then the parts are
    summed. Rows, not the batch: the batch is the reduction axis tensor cores take (a few rows may not fill one)."""
    from lazygrad.split_reduce import renderer_of

    nd, bs = len(s), g.shape[0]
    cout_g, cin_g, k = wshape[0] // groups, wshape[1], wshape[2:]
    xp = x.pad(((0, 0), (0, 0), *(tuple(p) for p in pads)))._pool(k, s, d)  # (N, C_in, *out, *k)
    out = xp.shape[2 : 2 + nd]
    renderer = renderer_of(g.device)
    length = bs * math.prod(out)
    parts = 1
    if renderer is not None and all(isinstance(v, int) for v in (bs, *out)):
        # the tiles the unsplit kernel gets: output channels against input channels and each tap, per group (a
        # symbolic batch or size is left whole)
        taps = tuple(v for v in (cin_g, *k) if v > 1)
        one = gemm_launch(renderer, g.dtype, (cout_g,), taps, tuple(v for v in (bs, *out) if v > 1))
        parts = split_k_parts(renderer, dataclasses.replace(one, workgroups=groups * one.workgroups), out[0], length)
    # (parts, N, groups, C_out/groups, C_in/groups, rows of a part, *out[1:], *k), the product summed over N and pixels
    xp = xp.reshape(bs, groups, 1, cin_g, parts, out[0] // parts, *out[1:], *k)
    gg = g.reshape(bs, groups, cout_g, 1, parts, out[0] // parts, *out[1:], *(1,) * nd)
    acc = sum_dtype(g.dtype)
    pixel_axes, tap_axes = range(5, 5 + nd), range(5 + nd, 5 + 2 * nd)
    # read channels-last, the parts are stored with the input channels innermost too, (C_out, *k, C_in), so that
    # their tensor-core tiles store whole sectors (C_in before the taps, each 4-byte lane sat 9 elements from the next)
    order = (4, 0, 1, 2, *((*tap_axes, 3, *pixel_axes) if channels_last else (3, *pixel_axes, *tap_axes)))
    # the batch and the pixels, where the permute put them
    summed = (1, *(range(5 + nd, 5 + 2 * nd) if channels_last else pixel_axes))
    partial = (gg.permute(*order) * xp.permute(*order)).sum(summed, dtype=acc)
    dw = (partial.sum(0, dtype=acc) if parts > 1 else partial).cast(g.dtype)
    if not channels_last:
        return dw.reshape(wshape)
    return dw.reshape(wshape[0], *k, cin_g).permute(0, nd + 1, *range(1, nd + 1))


def _conv_gradients(x: UOp, weight: UOp, groups: int, s: tuple[int, ...], d: tuple[int, ...], pads) -> GradientRule:
    """conv2d's backward (see `set_gradient_rule`): the input's and the weight's gradients, each what is needed."""

    def rule(ctx: UOp, needed: Callable[[UOp], bool]) -> dict[UOp, UOp]:
        from lazygrad.tensor import Tensor

        g, grads = Tensor(ctx), {}
        if needed(x):
            grads[x] = _conv_input_gradient(g, Tensor(weight), shape_of(x)[2:], groups, s, d, pads).uop
        if needed(weight):
            if _windows_weight_gradient(Tensor(x), Tensor(weight), groups, d, pads):
                cols = _window_matrix(Tensor(x), shape_of(weight)[2:], s, pads)
                grads[weight] = _weight_gradient_of_cols(g, cols, shape_of(weight)).uop
            else:
                grads[weight] = _conv_weight_gradient(g, Tensor(x), shape_of(weight), groups, s, d, pads).uop
        return grads

    return rule


IM2COL_CHANNELS = 256
"""A stride-1 convolution with at least this many output channels runs as matrix products over the matrix of its
input's windows (`_conv_by_im2col`) on a GPU whose tensor cores take its dtype: writing and reading that matrix
costs about 1/C_out of the products' time, and the products are then plain matmuls, whose staged copies are
contiguous 16-byte vectors. Read in place (the direct kernels), a window's input channels lie a whole image apart.
Measured on an H200 (ResNet-18's 3x3 convolutions at batch 64, TF32, all three passes' kernels): 512 channels at
7x7 in 0.70 ms (63.5 TFLOPS; torch/cuDNN 0.61 ms), where the direct kernels' best tiles take about 2.5 ms; 256 at
14x14 in 0.76 ms (58.5; torch 0.44). From 64 channels on, the training step went from 38.2 to 44.0 ms and its peak
memory from 8.4 to 18.6 GB: at 64 channels (fp16, 56x56) the forward gained (39.5 TFLOPS against 35.2) and the
weight gradient too (35.4 against 20.3), but the input gradient, a matmul to 9x the input and the sum of its
shifted columns, lost (21.8 against 35.4)."""


IM2COL_WEIGHT_GRADIENT = ContextVar("IM2COL_WEIGHT_GRADIENT", -1)
"""Whether the weight gradient of a convolution that runs by neither `_conv_by_im2col` nor `_conv_channels_last`
(any stride) is G^T @ the matrix of its input's windows, built in the backward, instead of the direct kernel. -1
and 1: on devices without workgroups (the CPU), where the direct kernel gathers each window lane by lane, for
kernels of more than one tap, and on GPUs whose tensor cores take the dtype (ResNet's RGB stem, its 1x1 downsampling
layers); 0: never.

On the CPU (2-core Xeon, ResNet-18's convolutions at batch 8, 64x64, float32, the gradient's realize): the 7x7
stride-2 stem 39.1 ms direct against 6.3 ms, the 3x3 layers 1.05-2.8x faster, a 1x1 slower (1.7 against 2.3 ms,
so it stays direct). On GPUs, by the offline measures (sm_90, TF32, batch 64; `memory_traffic`): the stem's direct
kernel loads 4.5 GB, a quarter of each 32-byte sector it reads used (it took 4.4 ms at 3.9 TFLOPS of the H200's
38 ms step); by the window matrix its kernels move about 1.5 GB at 0.8-1.0 of their sectors. A 1x1 stride-2 layer's
(128 to 256 channels at 28x28): 24 MB at 0.13 direct, 12 + 6 + 24 MB at 0.55-1.0 so. Not yet timed on a GPU. The
matrix is transient: N x pixels x C_in x taps elements (the stem's: 472 MB in float32 at batch 64 and 224x224)."""


def _windows_weight_gradient(x: Tensor, weight: Tensor, groups: int, d: tuple[int, ...], pads) -> bool:
    """Whether conv2d's weight gradient is the product over the window matrix (see `IM2COL_WEIGHT_GRADIENT`)."""
    from lazygrad.split_reduce import renderer_of

    mode = IM2COL_WEIGHT_GRADIENT.value
    if mode == 0 or not _windows_compute(x, weight, groups, d, pads):
        return False
    r = renderer_of(x.device)
    if r is not None and not r.has_local:
        return math.prod(weight.shape[2:]) > 1
    return _matmul_units(x.device, x.dtype)


WINDOWS_FORWARD_CHANNELS = 4
"""On devices without workgroups (the CPU), a convolution of at most this many input channels (an image's: ResNet's
7x7 stride-2 stem over RGB) and more than one tap runs as the product of the matrix of its input's windows and the
weight (`_conv_by_im2col`, any stride; the input's gradient stays the direct kernel): the direct kernel's reduction
over 3 channels x 49 taps gave its vectors little to do. ResNet-18's stem at batch 8 on the 2-core Xeon: 20.6 ms
direct against 7.5 (64x64), 140 against 56 (224x224). With more channels the direct kernels were as fast or faster
(3x3, 64 to 512 channels: 0.85-1.2x). Not on GPUs: for ResNet-18's stem on sm_90 (TF32, batch 64) the forward and
the weight gradient move about as many bytes (2.4 GB, `memory_traffic`) with the forward direct as with it over the
matrix the weight gradient builds anyway; untimed either way."""


def _windows_forward(x: Tensor, weight: Tensor, groups: int, d: tuple[int, ...], pads, dtype) -> bool:
    """Whether conv2d of `x` with `weight` runs by `_conv_by_im2col` with the direct input gradient (see
    `WINDOWS_FORWARD_CHANNELS`)."""
    from lazygrad.split_reduce import renderer_of

    if dtype is not None or weight.shape[1] > WINDOWS_FORWARD_CHANNELS or math.prod(weight.shape[2:]) < 2:
        return False
    r = renderer_of(x.device)
    return r is not None and not r.has_local and _windows_compute(x, weight, groups, d, pads)


def _windows_compute(x: Tensor, weight: Tensor, groups: int, d: tuple[int, ...], pads) -> bool:
    """Whether the matrix of the input's windows computes conv2d of `x` with `weight`: one group, dilation 1, no
    cropping, the same float dtype."""
    if groups != 1 or any(v != 1 for v in d) or any(p < 0 for pp in pads for p in pp):
        return False
    return x.dtype == weight.dtype and dtypes.is_float(x.dtype)


def _im2col_pays(x: Tensor, weight: Tensor, groups: int, s: tuple[int, ...], d: tuple[int, ...], pads, dtype) -> bool:
    """Whether conv2d of `x` with `weight` runs by `_conv_by_im2col` (see `IM2COL_CHANNELS`): one that it computes
    (stride 1, the inputs' dtype) on a device it pays on."""
    if dtype is not None or any(v != 1 for v in s) or weight.shape[0] < IM2COL_CHANNELS:
        return False
    return _windows_compute(x, weight, groups, d, pads) and _matmul_units(x.device, x.dtype)


def _matmul_units(device: str, dtype: DType) -> bool:
    """Whether `device` is a GPU (workgroups, shared memory) with a tensor core the settings let take `dtype`."""
    from lazygrad.split_reduce import renderer_of
    from lazygrad_codegen.tensor_cores import allowed

    r = renderer_of(device)
    if r is None or not (r.has_local and r.has_shared):
        return False
    return any(tc.dtype_in == dtype and allowed(tc) for tc in r.tensor_cores)


CONV_CHANNELS_LAST = ContextVar("CONV_CHANNELS_LAST", 1)
"""Whether a convolution on a GPU whose tensor cores take its dtype reads its input, its weight and its output's
gradient through channels-last copies (N, *spatial, C; `_conv_channels_last`). 1 (the default): for convolutions
of one group and more than one tap whose input channels fill whole 16-byte vectors (`_channels_last_pays`); 0:
never.

Why: in NCHW a window's input channels, the reduction the tensor cores take 16 at a time, lie a whole image apart,
so the direct kernel stages its operands with one 2-byte load per element (35 TFLOPS on the H200 for ResNet-18's
64-channel 3x3 forward in fp16, cuDNN 136). Channels-last, a step of the reduction is 16 neighbours in memory, and
the input padded before it is stored makes the windows one view (overlapping strides, no mask), so the kernel
stages both operands with the 16-byte `cp.async` copies of its 4-stage pipeline, as the matmuls do. The copies cost
one read and write of the input (and of the output's gradient in the backward). Not yet measured on a GPU."""


def _channels_last(t: Tensor) -> Tensor:
    """`t` (N, C, *spatial) stored channels-last, (N, *spatial, C), and read back as (N, C, *spatial): the same
    values, the channels neighbours in memory."""
    nd = t.ndim - 2
    return t.permute(0, *range(2, 2 + nd), 1).contiguous().permute(0, nd + 1, *range(1, nd + 1))


def _channels_last_pays(x: Tensor, weight: Tensor, groups: int, dtype) -> bool:
    """Whether conv2d of `x` with `weight` runs by `_conv_channels_last` (see `CONV_CHANNELS_LAST`)."""
    if not CONV_CHANNELS_LAST.value or dtype is not None or groups != 1 or math.prod(weight.shape[2:]) < 2:
        return False
    if x.dtype != weight.dtype or not dtypes.is_float(x.dtype) or not isinstance(cin := x.shape[1], int):
        return False
    return cin * x.dtype.itemsize % 16 == 0 and _matmul_units(x.device, x.dtype)


def _conv_direct(x: Tensor, weight: Tensor, groups: int, s: tuple[int, ...], d: tuple[int, ...], pads, dtype) -> Tensor:
    """conv2d as one reduction over the windows of the padded input, read in place: the input channels of a group
    and the kernel's taps of the product of each window and the weight, in `dtype` (the product's, for floats)."""
    nd, bs, (cout, cin_g), k = weight.ndim - 2, x.shape[0], weight.shape[:2], weight.shape[2:]
    xw = x.pad(((0, 0), (0, 0), *(tuple(p) for p in pads)))._pool(k, s, d)  # (N, C_in, *out, *k)
    out = xw.shape[2 : 2 + nd]
    xw = xw.reshape(bs, groups, 1, cin_g, *out, *k)
    w = weight.reshape(1, groups, cout // groups, cin_g, *(1,) * nd, *k)
    axes = (3, *range(4 + nd, 4 + 2 * nd))
    prod = xw * w
    acc = to_dtype(dtype) if dtype is not None else None
    if acc is None and not dtypes.is_float(prod.dtype):
        acc = prod.dtype
    return prod.sum(axes, dtype=acc).reshape(bs, cout, *out)


def _conv_channels_last(x: Tensor, weight: Tensor, s: tuple[int, ...], d: tuple[int, ...], pads) -> Tensor:
    """conv2d (one group) read through channels-last copies (see `CONV_CHANNELS_LAST`): the input padded, then
    stored channels-last, and the weight likewise, each read back as (N, C, *spatial) by the direct kernel. Its
    backward (`_channels_last_gradients`): the weight's gradient the direct weight gradient over a channels-last copy
    of the output's and the stored input; the input's, at stride 1, the direct convolution of that copy padded (one
    copy for both), else as an NCHW convolution's."""
    nd = len(s)
    xp = _channels_last(x.pad(((0, 0), (0, 0), *(tuple(p) for p in pads))))
    ret = _conv_direct(xp, _channels_last(weight), 1, s, d, ((0, 0),) * nd, None)
    if not type(x).no_grad:
        set_gradient_rule(ret.uop, _channels_last_gradients(x.uop, weight.uop, xp, s, d, pads))
    return ret


def _channels_last_gradients(
    x: UOp, weight: UOp, xp: Tensor, s: tuple[int, ...], d: tuple[int, ...], pads
) -> GradientRule:
    """`_conv_channels_last`'s backward from the padded channels-last input `xp` its forward stored."""

    def rule(ctx: UOp, needed: Callable[[UOp], bool]) -> dict[UOp, UOp]:
        from lazygrad.tensor import Tensor

        g, grads, nd = Tensor(ctx), {}, len(s)
        size, out = shape_of(x)[2:], g.shape[2:]
        phases = _by_phase(s, d)
        edges = (_phase_edges if phases else _input_gradient_edges)(size, shape_of(weight)[2:], s, d, out, pads)
        fits = all(e >= 0 for pair in edges for e in pair)  # the copy's padding holds the reads, cropping nothing
        if needed(x) and fits and (phases or all(v == 1 for v in s)):
            # the output's gradient padded and stored channels-last in one copy, which the input gradient reads as it
            # is (at stride 1 a convolution, at a stride of 2 by phases, their windows of windows) and the weight
            # gradient inside its padding
            gp = _channels_last(g.pad(((0, 0), (0, 0), *edges)))
            if phases:
                grads[x] = _conv_input_gradient_by_phase(g, Tensor(weight), size, 1, s, d, pads, padded=gp).uop
            else:
                with Context(CONV_CHANNELS_LAST=0):
                    grads[x] = gp.conv2d(_channels_last(_transposed_kernel(Tensor(weight), 1)), dilation=d).uop
            g = gp.shrink(((0, gp.shape[0]), (0, gp.shape[1]), *((a, a + o) for (a, _), o in zip(edges, out))))
        else:
            # the input gradient as NCHW convolutions do, the weight gradient from a channels-last copy
            if needed(x):
                grads[x] = _conv_input_gradient(g, Tensor(weight), size, 1, s, d, pads).uop
            g = _channels_last(g)
        if needed(weight):
            none = ((0, 0),) * nd
            grads[weight] = _conv_weight_gradient(g, xp, shape_of(weight), 1, s, d, none, channels_last=True).uop
        return grads

    return rule


def _window_matrix(x: Tensor, k: tuple[int, ...], s: tuple[int, ...], pads) -> Tensor:
    """The windows (stride `s`) of the padded input as a stored matrix: a row per output pixel (N x pixels, batch
    first) and a column per input channel and tap (channel first)."""
    nd, (n, c) = len(k), x.shape[:2]
    cols = x.pad(((0, 0), (0, 0), *(tuple(p) for p in pads)))._pool(k, s, (1,) * nd)  # (N, C, *out, *k)
    rows, width = n * math.prod(cols.shape[2 : 2 + nd]), c * math.prod(k)
    cols = cols.permute(0, *range(2, 2 + nd), 1, *range(2 + nd, 2 + 2 * nd))
    if math.prod(k) == 1:
        # one tap: the pixel rows of a strided input, stored in their own shape (see `_pixel_rows`)
        return cols.contiguous().reshape(rows, width)
    return cols.reshape(rows, width).contiguous()


def _pixel_rows(g: Tensor) -> Tensor:
    """The output's gradient (N, C_out, *out) stored as the matmuls over the window matrix read it: a row per output
    pixel (N x pixels), a column per channel."""
    from lazygrad.split_reduce import renderer_of

    nd, cout = g.ndim - 2, g.shape[1]
    rows = g.permute(0, *range(2, 2 + nd), 1)
    if (r := renderer_of(g.device)) is not None and r.has_local:
        # on a GPU stored channels-last in its own shape, then merged: a kernel storing the merged matrix sees one
        # axis of N x pixels whose reads jump at each image's end, where its heuristics see a transpose of 4 dims
        return rows.contiguous().reshape(math.prod(g.shape) // cout, cout)
    return rows.reshape(math.prod(g.shape) // cout, cout).contiguous()


def _weight_gradient_of_cols(g: Tensor, cols: Tensor, wshape: tuple[int, ...]) -> Tensor:
    """The weight gradient G^T @ cols from the output's gradient `g` (N, C_out, *out) and the window matrix `cols`
    of the same pixels; its reduction over every pixel of the batch is split into parts summed after where a GPU
    has few tiles, like `_conv_weight_gradient`'s."""
    from lazygrad.split_reduce import renderer_of

    cout = wshape[0]
    rows, width = cols.shape
    dt, acc = g.dtype, sum_dtype(g.dtype)
    gm = _pixel_rows(g)
    renderer = renderer_of(g.device)
    parts = 1
    if renderer is not None:
        # parts of whole rows (any divisor of them, not of the batch alone: ResNet-18's stem, 64 x 147 outputs,
        # one tile, got 64 parts of one image each, 64 workgroups on an H100's 132 multiprocessors)
        parts = split_k_parts(renderer, gemm_launch(renderer, dt, (cout,), (width,), (rows,)), rows, rows)
    # (parts, C_out, width, rows of a part), the product summed over the rows, then over the parts
    a = gm.reshape(parts, rows // parts, cout).permute(0, 2, 1).reshape(parts, cout, 1, rows // parts)
    b = cols.reshape(parts, rows // parts, width).permute(0, 2, 1).reshape(parts, 1, width, rows // parts)
    partial = (a * b).sum(3, dtype=acc)
    dw = partial.sum(0, dtype=acc) if parts > 1 else partial.reshape(cout, width)
    return dw.cast(dt).reshape(wshape)


def _conv_by_im2col(x: Tensor, weight: Tensor, s: tuple[int, ...], pads, col2im: bool = True) -> Tensor:
    """conv2d (one group, stride `s`) as a matmul: the windows of the input as a matrix, a row per output pixel
    (N x pixels) and a column per input channel and tap, stored once, times the weight as (C_in x taps, C_out). Its
    backward (`_im2col_gradients`): the weight's gradient a matmul over the same matrix, the input's the matrix's
    gradient summed back onto the input (`col2im`, stride 1) or the direct kernel's."""
    nd, n, cout, k = weight.ndim - 2, x.shape[0], weight.shape[0], weight.shape[2:]
    cols = _window_matrix(x, k, s, pads)
    out = _window_counts([v + b + a for v, (b, a) in zip(x.shape[2:], pads)], k, s, (1,) * nd)
    width = cols.shape[1]
    wm = weight.reshape(cout, width)
    # stored channel-major (NCHW) as convolutions are: the normalisation after it reduces each channel's pixels, which
    # the matmul's pixel-major (NHWC) rows hold C_out apart (ResNet-18's BatchNorm statistics at 7x7 ran at 9 GB/s)
    ret = (cols @ wm.transpose()).reshape(n, *out, cout).permute(0, nd + 1, *range(1, nd + 1)).contiguous()
    if not type(x).no_grad:
        set_gradient_rule(ret.uop, _im2col_gradients(x.uop, weight.uop, cols, s, pads, col2im))
    return ret


def _im2col_gradients(x: UOp, weight: UOp, cols: Tensor, s: tuple[int, ...], pads, col2im: bool) -> GradientRule:
    """`_conv_by_im2col`'s backward from the window matrix `cols` it stored: with G the output's gradient as
    (N x pixels, C_out), stored once, the weight's gradient G^T @ cols (its reduction over every pixel of the batch
    split into parts summed after, like `_conv_weight_gradient`'s); the input's, with `col2im` (stride 1), the sum,
    over the taps, of the columns of G @ W shifted back to where each tap read them, else the direct kernel's."""

    def rule(ctx: UOp, needed: Callable[[UOp], bool]) -> dict[UOp, UOp]:
        from lazygrad.tensor import Tensor

        wshape, xshape = shape_of(weight), shape_of(x)
        nd, n, c, cout, k = len(wshape) - 2, xshape[0], xshape[1], wshape[0], wshape[2:]
        width = cols.shape[1]
        dt = ctx.dtype
        acc = sum_dtype(dt)
        g = Tensor(ctx)
        out = g.shape[2:]
        grads: dict[UOp, UOp] = {}
        if needed(weight):
            grads[weight] = _weight_gradient_of_cols(g, cols, wshape).uop
        if needed(x) and not col2im:
            grads[x] = _conv_input_gradient(g, Tensor(weight), xshape[2:], 1, s, (1,) * nd, pads).uop
        elif needed(x):
            # (the same stored G as the weight gradient's: one kernel)
            gm = _pixel_rows(g)
            # (N, C, *k, *out): the gradient of each window's element
            dc = (gm @ Tensor(weight).reshape(cout, width)).reshape(n, *out, c, *k)
            dc = dc.permute(0, nd + 1, *range(nd + 2, 2 * nd + 2), *range(1, nd + 1)).cast(acc)
            padded = [xs + b + a for xs, (b, a) in zip(xshape[2:], pads)]
            total = None
            for tap in itertools.product(*(range(kk) for kk in k)):
                v = dc.shrink(((0, n), (0, c), *((t, t + 1) for t in tap), *((0, o) for o in out)))
                v = v.reshape(n, c, *out).pad(((0, 0), (0, 0), *((t, p - o - t) for t, p, o in zip(tap, padded, out))))
                total = v if total is None else total + v
            assert total is not None
            dx = total.shrink(((0, n), (0, c), *((b, b + xs) for xs, (b, _) in zip(xshape[2:], pads))))
            grads[x] = dx.cast(dt).uop
        return grads

    return rule


class FunctionalMixin:
    """Neural-network functions of `Tensor` (mixed into it; see `lazygrad.tensor`)."""

    __slots__ = ()

    # *** windows ***

    def _pool(self: Tensor, k: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
        """The windows of the last len(k) dims as a view of shape (..., *out, *k): out[o][w] = x[o*stride + w*dil]."""
        nd = len(k)
        lead, ins = self.shape[:-nd], self.shape[-nd:]
        outs = _window_counts(ins, k, stride, dilation)
        if any(o <= 0 for o in outs):
            raise InputError(f"kernel {k} (dilation {dilation}) is larger than the (padded) input {ins}")
        keep = tuple((0, d) for d in lead)
        disjoint = all(kk <= s and d == 1 for kk, s, d in zip(k, stride, dilation))
        if disjoint:
            # windows that don't overlap: cut the input into rows of `stride`, keep the first k of each
            x = self.pad(
                tuple((0, 0) for _ in lead) + tuple((0, max(0, o * s - n)) for o, s, n in zip(outs, stride, ins))
            )
            x = x.shrink(keep + tuple((0, o * s) for o, s in zip(outs, stride)))
            x = x.reshape(*lead, *(v for o, s in zip(outs, stride) for v in (o, s)))
            x = x.shrink(keep + tuple(v for o, kk in zip(outs, k) for v in ((0, o), (0, kk))))
        else:
            # repeat the input e times; rows of L = m*n + d elements then start d further along the input each
            rows = [n * max(1, math.ceil((o * s - d) / n)) + d for n, o, s, d in zip(ins, outs, stride, dilation)]
            reps = [math.ceil(kk * r / n) for kk, r, n in zip(k, rows, ins)]
            x = self.reshape(*lead, *(v for n in ins for v in (1, n)))
            x = x.expand(*lead, *(v for e, n in zip(reps, ins) for v in (e, n)))
            x = x.reshape(*lead, *(e * n for e, n in zip(reps, ins)))
            x = x.shrink(keep + tuple((0, kk * r) for kk, r in zip(k, rows)))
            x = x.reshape(*lead, *(v for kk, r in zip(k, rows) for v in (kk, r)))
            x = x.shrink(keep + tuple(v for kk, o, s in zip(k, outs, stride) for v in ((0, kk), (0, o * s))))
            x = x.reshape(*lead, *(v for kk, o, s in zip(k, outs, stride) for v in (kk, o, s)))
            x = x.shrink(keep + tuple(v for kk, o in zip(k, outs) for v in ((0, kk), (0, o), (0, 1))))
            x = x.reshape(*lead, *(v for kk, o in zip(k, outs) for v in (kk, o)))
        # x is (..., o1, k1, o2, k2, ...) or, from the second way, (..., k1, o1, k2, o2, ...): every o, then every k
        n, o_at = len(lead), 0 if disjoint else 1
        return x.permute(*range(n), *(n + 2 * i + o_at for i in range(nd)), *(n + 2 * i + 1 - o_at for i in range(nd)))

    def _pool_offsets(
        self: Tensor, k: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]
    ) -> list[Tensor]:
        """The windows of the last len(k) dims as one strided view per offset in the window, in row-major window
        order: view[w][..., o] = x[..., o*stride + w*dil], each of shape (..., *out). Unlike `_pool`'s single view,
        none repeats the input.

        The input is cut into rows of `stride` elements and each view is one column of `out` consecutive rows, so
        the input must reach (out + (k-1)*dil // stride) * stride elements (`_pool_reach`): it is padded once, with
        zeros no view reads, where it is shorter. A caller that pads the input anyway pads that far itself, so that
        its pad is the only one (the scheduler stores an expression it must not pad, a reciprocal say, before each
        pad of it)."""
        nd = len(k)
        lead, ins = self.shape[:-nd], self.shape[-nd:]
        outs = _window_counts(ins, k, stride, dilation)
        if any(o <= 0 for o in outs):
            raise InputError(f"kernel {k} (dilation {dilation}) is larger than the (padded) input {ins}")
        reach = _pool_reach(ins, k, stride, dilation)
        x = self
        if reach != list(ins):
            x = x.pad(tuple((0, 0) for _ in lead) + tuple((0, r - n) for r, n in zip(reach, ins)))
        views = []
        for offset in itertools.product(*(range(kk) for kk in k)):
            v = x
            for i, (w, o, s, d, r) in enumerate(zip(offset, outs, stride, dilation, reach)):
                # x[o'*s + w*d] = rows[o' + q][c] for w*d = q*s + c: the input cut into rows of s, every offset
                # with the same c one column of them
                ax, (q, c) = len(lead) + i, divmod(w * d, s)
                v = v.shrink(tuple((0, m) if j != ax else (0, r // s * s) for j, m in enumerate(v.shape)))
                v = v.reshape(*v.shape[:ax], r // s, s, *v.shape[ax + 1 :])
                v = v.shrink(
                    tuple(
                        (q, q + o) if j == ax else (c, c + 1) if j == ax + 1 else (0, m) for j, m in enumerate(v.shape)
                    )
                )
                v = v.reshape(*v.shape[: ax + 1], *v.shape[ax + 2 :])
            views.append(v)
        return views

    # *** convolution ***

    @concrete_sizes("conv2d")
    def conv2d(
        self: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        groups: int = 1,
        stride: int | Sequence[int] = 1,
        dilation: int | Sequence[int] = 1,
        padding: int | str | Sequence[int] = 0,
        dtype: DType | str | None = None,
    ) -> Tensor:
        """Convolution (cross-correlation, as torch) of (N, C_in, *spatial) with weight (C_out, C_in/groups,
        *kernel), over as many spatial dims as the weight has (tinygrad's argument order). padding: an int, one per
        dim, "same", "valid", or flat (left, right, top, bottom...). `dtype` is the accumulation/result type."""
        nd = weight.ndim - 2
        if nd < 1 or self.ndim != nd + 2:
            raise InputError(
                f"conv of input {self.shape} with weight {weight.shape}: need (N, C, *spatial) and "
                f"(C_out, C_in/groups, *kernel) with the same number of spatial dims"
            )
        cin = self.shape[1]
        cout, cin_g = weight.shape[:2]
        k = weight.shape[2:]
        if cin != groups * cin_g or cout % groups:
            raise InputError(
                f"conv of {cin} input channels in {groups} groups needs weight (C_out divisible by "
                f"{groups}, {cin // max(groups, 1)}, ...), got {weight.shape}"
            )
        s, d = _tuple(stride, nd, "stride"), _tuple(dilation, nd, "dilation")
        if padding == "same" and any(v != 1 for v in s):
            raise InputError("padding='same' needs stride 1, as in torch")
        pads = _pads(padding, k, d)
        # by the window matrix: on a tensor-core GPU with the input's gradient summed from the matrix's (col2im), or,
        # where convolutions read channels-last, a convolution of the output's gradient (by the window matrix again
        # at 256+ channels), whose kernels coalesce where col2im's 9 shifted copies read a fifth of each sector; on
        # the CPU with the direct one
        gpu = _im2col_pays(self, weight, groups, s, d, pads, dtype)
        if gpu or _windows_forward(self, weight, groups, d, pads, dtype):
            ret = _conv_by_im2col(self, weight, s, pads, col2im=gpu and not CONV_CHANNELS_LAST.value)
            return ret if bias is None else ret + bias.reshape(1, -1, *(1,) * nd)
        if _channels_last_pays(self, weight, groups, dtype):
            ret = _conv_channels_last(self, weight, s, d, pads)
            return ret if bias is None else ret + bias.reshape(1, -1, *(1,) * nd)
        ret = _conv_direct(self, weight, groups, s, d, pads, dtype)
        if not type(self).no_grad and dtypes.is_float(ret.dtype) and self.dtype == weight.dtype == ret.dtype:
            # autograd through the window view would store the product of the gradient and the weight at every window
            # position (9x the input for a 3x3 kernel) and sum it in a second kernel; written out, each gradient is one
            # reduction
            set_gradient_rule(ret.uop, _conv_gradients(self.uop, weight.uop, groups, s, d, pads))
        return ret if bias is None else ret + bias.reshape(1, -1, *(1,) * nd)

    @concrete_sizes("conv1d")
    def conv1d(
        self: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        groups: int = 1,
        stride: Any = 1,
        dilation: Any = 1,
        padding: Any = 0,
        dtype: DType | str | None = None,
    ) -> Tensor:
        """1-d convolution of (N, C_in, L) with weight (C_out, C_in/groups, K); see conv2d."""
        if weight.ndim != 3:
            raise InputError(f"conv1d needs a 3-d weight (C_out, C_in/groups, K), got {weight.shape}")
        return self.conv2d(weight, bias, groups, stride, dilation, padding, dtype)

    @concrete_sizes("conv3d")
    def conv3d(
        self: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        groups: int = 1,
        stride: Any = 1,
        dilation: Any = 1,
        padding: Any = 0,
        dtype: DType | str | None = None,
    ) -> Tensor:
        """3-d convolution of (N, C_in, D, H, W) with weight (C_out, C_in/groups, KD, KH, KW); see conv2d."""
        if weight.ndim != 5:
            raise InputError(f"conv3d needs a 5-d weight (C_out, C_in/groups, KD, KH, KW), got {weight.shape}")
        return self.conv2d(weight, bias, groups, stride, dilation, padding, dtype)

    @concrete_sizes("conv_transpose2d")
    def conv_transpose2d(
        self: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        groups: int = 1,
        stride: int | Sequence[int] = 1,
        dilation: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        output_padding: int | Sequence[int] = 0,
    ) -> Tensor:
        """Transposed convolution of (N, C_in, *spatial) with weight (C_in, C_out/groups, *kernel), as
        torch.nn.functional.conv_transpose2d (any number of spatial dims): the gradient of conv2d. Computed as a
        convolution of the input spread out by the stride, with the kernel flipped."""
        nd = weight.ndim - 2
        if nd < 1 or self.ndim != nd + 2:
            raise InputError(f"conv_transpose of input {self.shape} with weight {weight.shape}: spatial dims differ")
        cin = weight.shape[0]
        k = weight.shape[2:]
        if cin != self.shape[1] or cin % groups:
            raise InputError(
                f"conv_transpose weight {weight.shape} doesn't fit {self.shape[1]} channels in {groups} groups"
            )
        s, d = _tuple(stride, nd, "stride"), _tuple(dilation, nd, "dilation")
        p, op = _tuple(padding, nd, "padding"), _tuple(output_padding, nd, "output_padding")
        edge = [dd * (kk - 1) - pp for dd, kk, pp in zip(d, k, p)]
        x = self._spread(s).pad(((0, 0), (0, 0), *((e, e + o) for e, o in zip(edge, op))))
        return x.conv2d(_transposed_kernel(weight, groups), bias, groups=groups, dilation=d)

    def _spread(self: Tensor, stride: tuple[int, ...]) -> Tensor:
        """The spatial (last len(stride)) dims spread out by `stride`: each element followed by stride - 1 zeros,
        the last one's dropped (a view: the zeros are a pad)."""
        x = self
        for i, si in enumerate(stride):
            if si == 1:
                continue
            ax = x.ndim - len(stride) + i
            n = x.shape[ax]
            x = x.unsqueeze(ax + 1).pad(tuple((0, si - 1) if j == ax + 1 else (0, 0) for j in range(x.ndim + 1)))
            x = x.reshape(*x.shape[:ax], n * si, *x.shape[ax + 2 :])
            x = x.shrink(tuple((0, n * si - (si - 1)) if j == ax else None for j in range(x.ndim)))
        return x

    # *** pooling ***

    def _pool_setup(
        self: Tensor, kernel_size: Any, stride: Any, dilation: Any, padding: Any, ceil_mode: bool
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], list[list[int]], list[int]]:
        """Kernel, stride, dilation, the [before, after] padding per dim, and the extra right padding ceil_mode
        adds so that a last partial window counts (if it starts inside the input or its left padding)."""
        k = _tuple(kernel_size, 2, "kernel_size") if isinstance(kernel_size, int) else tuple(kernel_size)
        nd = len(k)
        if self.ndim < nd:
            raise InputError(f"a {nd}-d pool needs at least {nd} dimensions, got shape {self.shape}")
        s = k if stride is None else _tuple(stride, nd, "stride")
        d = _tuple(dilation, nd, "dilation")
        pads = _pads(padding, k, d)
        extra = []
        for n, kk, ss, dd, (b, a) in zip(self.shape[-nd:], k, s, d, pads):
            span = n + b + a - dd * (kk - 1) - 1
            if not ceil_mode or span < 0:
                extra.append(0)
                continue
            o = -(-span // ss) + 1
            if (o - 1) * ss >= n + b:
                o -= 1
            extra.append(max(0, (o - 1) * ss + dd * (kk - 1) + 1 - (n + b + a)))
        return k, s, d, pads, extra

    @concrete_sizes("avg_pool2d")
    def avg_pool2d(
        self: Tensor,
        kernel_size: int | Sequence[int] = (2, 2),
        stride: int | Sequence[int] | None = None,
        dilation: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> Tensor:
        """Average over windows of the last len(kernel_size) dims (2 for an int), as torch's avg_pool: the
        divisor counts padding with count_include_pad, never the extra windows of ceil_mode."""
        k, s, d, pads, extra = self._pool_setup(kernel_size, stride, dilation, padding, ceil_mode)
        nd = len(k)
        lead = ((0, 0),) * (self.ndim - nd)
        full = tuple((b, a + e) for (b, a), e in zip(pads, extra))
        x = self.cast(least_upper_float(self.dtype))
        axes = tuple(range(-nd, 0))
        summed = x.pad(lead + full)._pool(k, s, d).sum(axes)
        if not any(extra) and (count_include_pad or not any(b or a for b, a in pads)):
            return summed / math.prod(k)
        ones = type(self).ones(*self.shape[-nd:], dtype=x.dtype, device=self.device)
        if count_include_pad:
            ones = ones.pad(tuple((b, a) for b, a in pads), value=1.0).pad(tuple((0, e) for e in extra))
        else:
            ones = ones.pad(full)
        return summed / ones._pool(k, s, d).sum(axes)

    @concrete_sizes("max_pool2d")
    def max_pool2d(
        self: Tensor,
        kernel_size: int | Sequence[int] = (2, 2),
        stride: int | Sequence[int] | None = None,
        dilation: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        ceil_mode: bool = False,
        return_indices: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Max over windows of the last len(kernel_size) dims (2 for an int), as torch's max_pool. With
        return_indices, also the flat index (int64) into each input plane of the first max of every window."""
        k, s, d, pads, extra = self._pool_setup(kernel_size, stride, dilation, padding, ceil_mode)
        nd = len(k)
        lead = ((0, 0),) * (self.ndim - nd)
        full = tuple((b, a + e) for (b, a), e in zip(pads, extra))
        low = dtypes.min(self.dtype)
        # one pad: the window padding and the tail the strided views reach
        padded = [n + b + a for n, (b, a) in zip(self.shape[-nd:], full)]
        full = tuple((b, a + r - n) for (b, a), n, r in zip(full, padded, _pool_reach(padded, k, s, d)))
        views = self.pad(lead + full, value=low)._pool_offsets(k, s, d)
        # each window's value is its first maximum (a NaN counts as one), chosen by comparisons that carry no
        # gradient: the gradient then flows to that one element, as torch's max_pool does, also where a window
        # holds the max more than once (zeros after a ReLU). The offset of that element in its window is stored
        # (a byte per window), so that the backward, one kernel over the input, reads it instead of recomputing
        # every window's max for each of the windows an element is in.
        flat = [v.detach() for v in views]
        top = functools.reduce(lambda a, b: a.maximum(b), flat)
        last = len(views) - 1
        pick = type(self).full(top.shape, last, dtype=dtypes.uint8 if last < 256 else dtypes.int32, device=self.device)
        for offset in reversed(range(last)):
            v = flat[offset]
            hit = v.eq(top) | v.isnan() if dtypes.is_float(v.dtype) else v.eq(top)
            pick = hit.where(offset, pick).cast(pick.dtype)
        pick = pick.contiguous()
        # a sum of terms all 0 but the picked one (not nested selects): each view's gradient is then one comparison
        out = functools.reduce(lambda a, b: a + b, (pick.eq(i).where(v, 0) for i, v in enumerate(views)))
        if not return_indices:
            return out
        plane = self.shape[-nd:]
        pos = type(self).arange(math.prod(plane), dtype=dtypes.int64, device=self.device).reshape(plane)
        spots = pos.pad(full, value=-1)._pool_offsets(k, s, d)
        index = spots[-1].expand(*pick.shape)
        for offset in reversed(range(last)):
            index = pick.eq(offset).where(spots[offset], index)
        return out, index

    @concrete_sizes("max_unpool2d")
    def max_unpool2d(
        self: Tensor,
        indices: Tensor,
        kernel_size: int | Sequence[int] = (2, 2),
        stride: int | Sequence[int] | None = None,
        dilation: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        output_size: Sequence[int] | None = None,
    ) -> Tensor:
        """The inverse of max_pool2d(return_indices=True): each value placed at its index in a zero plane of
        output_size (by default the size the pool came from, as torch computes it)."""
        k = _tuple(kernel_size, 2, "kernel_size") if isinstance(kernel_size, int) else tuple(kernel_size)
        nd = len(k)
        s = k if stride is None else _tuple(stride, nd, "stride")
        d, p = _tuple(dilation, nd, "dilation"), _tuple(padding, nd, "padding")
        ins = self.shape[-nd:]
        if output_size is None:
            out = [(n - 1) * ss - 2 * pp + dd * (kk - 1) + 1 for n, ss, pp, dd, kk in zip(ins, s, p, d, k)]
        else:
            out = list(output_size)[-nd:]
        lead = self.shape[:-nd]
        plane = type(self).zeros(*lead, math.prod(out), dtype=self.dtype, device=self.device)
        flat = plane.scatter(-1, indices.reshape(*lead, -1), self.reshape(*lead, -1))
        return flat.reshape(*lead, *out)

    # *** interpolation ***

    @concrete_sizes("interpolate")
    def interpolate(
        self: Tensor,
        size: Sequence[int] | None = None,
        mode: str = "linear",
        align_corners: bool = False,
        scale_factor: float | Sequence[float] | None = None,
    ) -> Tensor:
        """Resize the last len(size) dims to `size` (or by `scale_factor`) with mode "nearest", "nearest-exact"
        or "linear" (also "bilinear"/"trilinear": linear in every resized dim), source coordinates as in torch."""
        if (size is None) == (scale_factor is None):
            raise InputError("interpolate needs exactly one of size and scale_factor")
        if size is None:
            assert scale_factor is not None
            sf = [scale_factor] * (self.ndim - 2) if isinstance(scale_factor, (int, float)) else list(scale_factor)
            size = [math.floor(dim * float(f)) for dim, f in zip(self.shape[-len(sf) :], sf)]
        size = [int(v) for v in size]
        if mode in ("bilinear", "trilinear"):
            mode = "linear"
        if mode not in ("nearest", "nearest-exact", "linear"):
            raise InputError(f"interpolate mode must be 'nearest', 'nearest-exact' or 'linear', got {mode!r}")
        x = self if mode != "linear" else self.cast(least_upper_float(self.dtype))
        for i, out in enumerate(size):
            ax = self.ndim - len(size) + i
            n = x.shape[ax]
            if out == n and not (mode == "linear" and align_corners and out == 1):
                continue
            dst = np.arange(out, dtype=np.float32)
            if mode == "linear":
                if align_corners:
                    scale = np.float32((n - 1) / (out - 1)) if out > 1 else np.float32(0)
                    src = dst * scale
                else:
                    src = np.maximum((dst + np.float32(0.5)) * np.float32(n / out) - np.float32(0.5), 0)
                lo = np.minimum(np.floor(src).astype(np.int64), n - 1)
                hi = np.minimum(lo + 1, n - 1)
                frac = (src - lo).astype(np.float32)
                w_shape = (out, *(1,) * (x.ndim - ax - 1))
                lam = type(self)(frac, device=self.device).cast(x.dtype).reshape(w_shape)
                x = x._along(ax, lo) * (1 - lam) + x._along(ax, hi) * lam
            else:
                shift = np.float32(0.5) if mode == "nearest-exact" else np.float32(0)
                src = np.floor((dst + shift) * np.float32(n / out)).astype(np.int64)
                x = x._along(ax, np.minimum(src, n - 1))
        return x

    def _along(self: Tensor, axis: int, positions: np.ndarray) -> Tensor:
        """self[..., positions, ...] along `axis` for host-known positions."""
        idx = type(self)(positions.astype(np.int32), device=self.device)
        return self.movedim(axis, 0)._select_rows(idx).movedim(0, axis)

    # *** normalization ***

    def layernorm(self: Tensor, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
        """(x - mean) / sqrt(var + eps) over `axis` (biased variance), without affine parameters."""
        x = self.cast(least_upper_float(self.dtype))
        centered = x - x.mean(axis, keepdim=True)
        return centered * (centered.square().mean(axis, keepdim=True) + eps).rsqrt()

    def batchnorm(
        self: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        mean: Tensor,
        invstd: Tensor,
        axis: int | Sequence[int] = 1,
    ) -> Tensor:
        """(x - mean) * invstd * weight + bias with the statistics (given, per channel) broadcast along `axis`."""
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(a % self.ndim for a in axes)
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        x = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
        return x + bias.reshape(shape) if bias is not None else x

    def groupnorm(
        self: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
    ) -> Tensor:
        """Layer norm over each group of channels of (N, C, *), then per-channel weight and bias, as
        torch.nn.functional.group_norm."""
        n, c = self.shape[:2]
        if c % num_groups:
            raise InputError(f"group norm of {c} channels in {num_groups} groups: {c} isn't divisible")
        x = self.reshape(n, num_groups, -1).layernorm(-1, eps).reshape(self.shape)
        shape = (1, c, *(1,) * (self.ndim - 2))
        if weight is not None:
            x = x * weight.reshape(shape)
        return x + bias.reshape(shape) if bias is not None else x

    def normalize(self: Tensor, p: float = 2.0, dim: int | Sequence[int] = 1, eps: float = 1e-12) -> Tensor:
        """x / max(||x||_p, eps) with the p-norm over `dim`, as torch.nn.functional.normalize (p may be inf)."""
        x = self.cast(least_upper_float(self.dtype))
        if p == math.inf:
            norm = x.abs().max(dim, keepdim=True)
        elif p == 2:
            norm = x.square().sum(dim, keepdim=True).sqrt()
        elif p == 1:
            norm = x.abs().sum(dim, keepdim=True)
        elif p > 0:
            norm = x.abs().pow(p).sum(dim, keepdim=True).pow(1.0 / p)
        else:
            raise InputError(f"normalize needs a positive p (or inf), got {p}")
        return x / norm.maximum(eps)

    def rmsnorm(self: Tensor, axis: int | Sequence[int] = -1, eps: float = 1e-6) -> Tensor:
        """x / sqrt(mean(x**2) + eps) over `axis`, without a weight."""
        x = self.cast(least_upper_float(self.dtype))
        return x * (x.square().mean(axis, keepdim=True) + eps).rsqrt()

    # *** layers as functions ***

    def linear(self: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """self @ weight + bias with weight (in, out) as tinygrad's (a 1-d weight multiplies elementwise)."""
        x = self * weight if weight.ndim == 1 else self.dot(weight)
        return x + bias if bias is not None else x

    def sequential(self: Tensor, layers: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
        """The layers applied in order."""
        return functools.reduce(lambda x, f: f(x), layers, self)

    def dropout(self: Tensor, p: float = 0.5) -> Tensor:
        """In training (`Tensor.training`), zero each element with probability p and scale the rest by
        1/(1-p); the identity otherwise."""
        if not 0 <= p <= 1:
            raise InputError(f"dropout probability must be in [0, 1], got {p}")
        if not type(self).training or p == 0:
            return self
        if p == 1:
            return self.zeros_like()
        keep = type(self).rand_like(self, contiguous=False) >= p
        return keep.where(self, 0) * (1 / (1 - p))

    def embedding(self: Tensor, weight: Tensor) -> Tensor:
        """The rows of `weight` (num, dim) at this integer tensor's values: weight[self]."""
        if not dtypes.is_int(self.dtype):
            raise KindError(f"embedding needs integer indices, got {self.dtype!r}")
        return weight[self]

    def scaled_dot_product_attention(
        self: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Tensor:
        """softmax(self @ key^T * scale + mask) @ value, as torch's: a bool mask keeps where true, a float mask is
        added; is_causal masks out keys after each query; enable_gqa repeats key/value heads to the query's."""
        if is_causal and attn_mask is not None:
            raise InputError("scaled_dot_product_attention takes is_causal or attn_mask, not both")
        if enable_gqa and key.ndim >= 3 and key.shape[-3] != self.shape[-3]:
            rep = self.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
        q = self.cast(least_upper_float(self.dtype))
        s = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
        scores = q @ key.transpose(-2, -1) * s
        if is_causal:
            ql, kl = scores.shape[-2:]
            attn_mask = type(self).ones(ql, kl, dtype=dtypes.bool, device=self.device).tril()
        if attn_mask is not None:
            scores = attn_mask.where(scores, -math.inf) if dtypes.is_bool(attn_mask.dtype) else scores + attn_mask
        weights = scores.softmax(-1)
        if dropout_p:
            weights = weights.dropout(dropout_p)
        return weights @ value

    # *** losses ***

    def binary_crossentropy(self: Tensor, Y: Tensor, reduction: str = "mean") -> Tensor:  # noqa: N803 - tinygrad's
        """-(Y log p + (1 - Y) log(1 - p)) of probabilities p = self, logs clamped at -100 as in torch."""
        loss = -(Y * self.log().maximum(-100) + (1 - Y) * (1 - self).log().maximum(-100))
        return _reduce_loss(loss, reduction)

    def binary_crossentropy_logits(
        self: Tensor,
        Y: Tensor,  # noqa: N803 - tinygrad's name
        reduction: str = "mean",
        pos_weight: Tensor | None = None,
    ) -> Tensor:
        """Binary cross entropy of sigmoid(self), computed stably from the logits; pos_weight scales the
        positive term, as torch's BCEWithLogits."""
        log_sig = self.logsigmoid()
        log_not = (-self).logsigmoid()
        pos = Y * log_sig if pos_weight is None else pos_weight * Y * log_sig
        return _reduce_loss(-(pos + (1 - Y) * log_not), reduction)

    def sparse_categorical_crossentropy(
        self: Tensor,
        Y: Tensor,  # noqa: N803 - tinygrad's name
        ignore_index: int = -1,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
    ) -> Tensor:
        """Cross entropy of logits (classes on the last axis) against integer labels Y; labels equal to
        ignore_index count neither in the loss nor in the mean."""
        if dtypes.is_float(Y.dtype) or Y.shape != self.shape[:-1]:
            raise InputError(
                f"sparse_categorical_crossentropy needs integer class labels of shape {self.shape[:-1]} for logits of "
                f"shape {self.shape}, got {Y.dtype!r} labels of shape {Y.shape}"
            )
        logp = self.log_softmax(-1)
        c = self.shape[-1]
        keep = Y.ne(ignore_index)
        # ignored labels may be anything; the others must be classes (checked on the device)
        labels = keep.where(Y, 0)._one_hot(c, "sparse_categorical_crossentropy labels") if c else None
        target = labels.cast(logp.dtype) if labels is not None else logp.zeros_like()
        nll = -(logp * target).sum(-1)
        loss = (1 - label_smoothing) * nll - label_smoothing * logp.mean(-1)
        loss = keep.where(loss, 0)
        return _reduce_loss(loss, reduction, keep.sum().cast(logp.dtype))

    def cross_entropy(
        self: Tensor,
        Y: Tensor,  # noqa: N803 - tinygrad's name
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> Tensor:
        """Cross entropy of logits (N, C, ...) or (C,) against class indices (N, ...) or class probabilities of the
        input's shape, with torch's label smoothing and reduction."""
        axis = 1 if self.ndim > 1 else 0
        logp = self.log_softmax(axis)
        c = self.shape[axis]
        class_shape = self.shape[:axis] + self.shape[axis + 1 :]
        if dtypes.is_int(Y.dtype) and Y.shape != class_shape:
            raise InputError(
                f"cross_entropy with class indices needs a target of shape {class_shape} for input {self.shape}, "
                f"got {Y.shape}"
            )
        if not dtypes.is_int(Y.dtype) and Y.shape != self.shape:
            raise InputError(
                f"cross_entropy with class probabilities needs a float target of the input's shape {self.shape}, got "
                f"{Y.dtype!r} of shape {Y.shape}; for class indices pass an integer tensor of shape {class_shape}"
            )
        if dtypes.is_int(Y.dtype):
            target = Y._one_hot(c, "cross_entropy target").cast(logp.dtype).movedim(-1, axis)
        else:
            target = Y.cast(logp.dtype)
        if label_smoothing:
            target = target * (1 - label_smoothing) + label_smoothing / c
        return _reduce_loss(-(logp * target).sum(axis), reduction)

    def nll_loss(
        self: Tensor,
        Y: Tensor,  # noqa: N803 - tinygrad's name
        weight: Tensor | None = None,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> Tensor:
        """Negative log likelihood of log-probabilities (N, C, ...) or (C,) at class indices Y, with optional
        per-class weights (the mean divides by the summed weights, as torch)."""
        axis = 1 if self.ndim > 1 else 0
        c = self.shape[axis]
        class_shape = self.shape[:axis] + self.shape[axis + 1 :]
        if Y.shape != class_shape:
            raise InputError(
                f"nll_loss needs class indices of shape {class_shape} for input {self.shape}, got {Y.shape}"
            )
        kept = None if ignore_index is None else Y.ne(ignore_index)  # the labels that count
        labels = Y if kept is None else kept.where(Y, 0)
        target = labels._one_hot(c, "nll_loss target").cast(self.dtype).movedim(-1, axis)
        w = target if weight is None else target * weight.reshape(c, *(1,) * (self.ndim - axis - 1))
        if kept is not None:
            w = w * kept.unsqueeze(axis)
        loss = -(self * w).sum(axis)
        if kept is not None:
            # (the gradient of an ignored label is 0 even where every label is ignored and the mean is 0 / 0, as torch)
            loss = kept.where(loss, 0)
        if weight is None:
            # the summed weights are the labels counted: no sum over the classes (a kernel of its own per row)
            count = None if kept is None else kept.sum().cast(loss.dtype)
            return _reduce_loss(loss, reduction, count)
        return _reduce_loss(loss, reduction, w.sum())
