"""Neural-network functions of the Tensor API against torch.nn.functional: convolutions (groups, stride, dilation,
padding, "same"), transposed convolution, pooling (ceil_mode, dilation, padding), interpolation, normalization,
dropout, attention and losses; forward and backward, a subset on the PYTHON device."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch_reference import compare, rand

from lazygrad import Tensor

torch = pytest.importorskip("torch")
F = torch.nn.functional

CONV2D = [
    # (input shape, weight shape, groups, stride, dilation, padding)
    ((2, 3, 7, 6), (4, 3, 3, 3), 1, 1, 1, 0),
    ((1, 4, 8, 8), (6, 2, 3, 2), 2, (2, 1), 1, (1, 2)),
    ((1, 2, 9, 7), (2, 1, 3, 3), 2, 1, (2, 1), "same"),
    ((2, 3, 6, 6), (3, 3, 1, 1), 1, 2, 1, 0),
    ((1, 2, 7, 9), (3, 2, 2, 3), 1, (3, 2), (2, 2), 1),
    ((1, 3, 5, 5), (2, 3, 5, 5), 1, 1, 1, "valid"),
    ((1, 4, 6, 6), (4, 1, 3, 3), 4, 2, 1, 1),
]


@pytest.mark.parametrize("xs,ws,groups,stride,dilation,padding", CONV2D)
def test_conv2d(xs: tuple, ws: tuple, groups: int, stride: object, dilation: object, padding: object) -> None:
    x, w, b = rand(xs, 1), rand(ws, 2), rand((ws[0],), 3)
    compare(
        lambda t, u, v: t.conv2d(u, v, groups=groups, stride=stride, dilation=dilation, padding=padding),
        lambda t, u, v: F.conv2d(t, u, v, stride=stride, padding=padding, dilation=dilation, groups=groups),
        [x, w, b],
        rtol=1e-4,
        atol=1e-5,
        grad_tol=(1e-4, 1e-4),
    )


def test_conv_flat_padding_and_no_bias() -> None:
    x, w = rand((1, 2, 5, 6), 4), rand((3, 2, 3, 3), 5)
    compare(
        lambda t, u: t.conv2d(u, padding=(1, 2, 0, 1)),
        lambda t, u: F.conv2d(F.pad(t, (1, 2, 0, 1)), u),
        [x, w],
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "stride,dilation,padding,groups", [(1, 1, 0, 1), (2, 1, 1, 1), (1, 3, "same", 2), (3, 2, 2, 2)]
)
def test_conv1d(stride: int, dilation: int, padding: object, groups: int) -> None:
    x, w, b = rand((2, 4, 11), 6), rand((6, 4 // groups, 3), 7), rand((6,), 8)
    compare(
        lambda t, u, v: t.conv1d(u, v, groups, stride, dilation, padding),
        lambda t, u, v: F.conv1d(t, u, v, stride, padding, dilation, groups),
        [x, w, b],
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "stride,dilation,padding,groups", [(1, 1, 0, 1), ((1, 2, 2), 1, 1, 2), (1, (1, 2, 1), "same", 1)]
)
def test_conv3d(stride: object, dilation: object, padding: object, groups: int) -> None:
    x, w = rand((1, 2, 5, 6, 5), 9), rand((4, 2 // groups, 2, 3, 2), 10)
    compare(
        lambda t, u: t.conv3d(u, None, groups, stride, dilation, padding),
        lambda t, u: F.conv3d(t, u, None, stride, padding, dilation, groups),
        [x, w],
        rtol=1e-4,
        atol=1e-5,
    )


def test_conv_python_device(device: str) -> None:
    x, w = rand((1, 2, 5, 4), 11), rand((2, 1, 3, 2), 12)
    compare(
        lambda t, u: t.conv2d(u, groups=2, stride=(2, 1), padding=1),
        lambda t, u: F.conv2d(t, u, stride=(2, 1), padding=1, groups=2),
        [x, w],
        device=device,
        grad=False,
        rtol=1e-5,
    )


def test_conv_errors() -> None:
    with pytest.raises(ValueError):
        Tensor.ones(1, 3, 5, 5).conv2d(Tensor.ones(2, 2, 3, 3))
    with pytest.raises(ValueError):
        Tensor.ones(1, 2, 5, 5).conv2d(Tensor.ones(2, 2, 3, 3), stride=2, padding="same")
    with pytest.raises(ValueError):
        Tensor.ones(1, 2, 2, 2).conv2d(Tensor.ones(2, 2, 3, 3))


@pytest.mark.parametrize(
    "xs,ws,groups,stride,dilation,padding,output_padding",
    [
        ((1, 3, 4, 5), (3, 2, 3, 3), 1, 1, 1, 0, 0),
        ((2, 4, 3, 3), (4, 3, 3, 2), 2, 2, 1, 1, 1),
        ((1, 2, 4, 4), (2, 3, 2, 3), 1, (3, 2), (1, 2), (0, 1), (2, 1)),
        ((1, 2, 5, 5), (2, 2, 4, 4), 1, 2, 1, 3, 0),
    ],
)
def test_conv_transpose2d(
    xs: tuple, ws: tuple, groups: int, stride: object, dilation: object, padding: object, output_padding: object
) -> None:
    x, w, b = rand(xs, 13), rand(ws, 14), rand((ws[1] * groups,), 15)
    compare(
        lambda t, u, v: t.conv_transpose2d(u, v, groups, stride, dilation, padding, output_padding),
        lambda t, u, v: F.conv_transpose2d(t, u, v, stride, padding, output_padding, groups, dilation),
        [x, w, b],
        rtol=1e-4,
        atol=1e-5,
    )


POOLS = [
    # (kernel, stride, padding, dilation, ceil_mode)
    ((2, 2), None, 0, 1, False),
    ((3, 3), 2, 1, 1, False),
    ((3, 2), (2, 1), (1, 0), 1, True),
    ((2, 2), 3, 0, 1, True),
    ((3, 3), 2, 0, 2, True),
    (2, 1, 0, 1, False),
    ((2, 3), (3, 2), (1, 1), (2, 1), True),
]


@pytest.mark.parametrize("k,stride,padding,dilation,ceil_mode", POOLS)
def test_max_pool2d(k: object, stride: object, padding: object, dilation: object, ceil_mode: bool) -> None:
    x = rand((2, 3, 7, 8), 16)
    compare(
        lambda t: t.max_pool2d(k, stride, dilation, padding, ceil_mode, return_indices=True),
        lambda t: F.max_pool2d(t, k, stride, padding, dilation, ceil_mode, return_indices=True),
        [x],
        grad=False,
    )


@pytest.mark.parametrize("k,stride,padding,dilation,ceil_mode", [p for p in POOLS if p[3] == 1])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d(
    k: object, stride: object, padding: object, dilation: object, ceil_mode: bool, count_include_pad: bool
) -> None:
    x = rand((2, 2, 7, 8), 17)
    compare(
        lambda t: t.avg_pool2d(k, stride, 1, padding, ceil_mode, count_include_pad),
        lambda t: F.avg_pool2d(t, k, stride, padding, ceil_mode, count_include_pad),
        [x],
        grad=False,
    )


# The gradient of a window view pads the output's gradient back to the input's shape. The scheduler evaluates a
# padded expression with its inputs read as 0, and these gradients hold a reciprocal (max's tie count, avg's divisor),
# which is inf at 0: nan in the padding. Needs the scheduler to store a value before padding it when it holds
# EXP2/LOG2/RECIP/IDIV/MOD (as the frontend's Tensor.pad already guards against).


@pytest.mark.parametrize("k,stride,padding,dilation,ceil_mode", POOLS[:4])
def test_pool_backward(k: object, stride: object, padding: object, dilation: object, ceil_mode: bool) -> None:
    x = rand((1, 2, 7, 8), 18)
    compare(
        lambda t: t.max_pool2d(k, stride, dilation, padding, ceil_mode),
        lambda t: F.max_pool2d(t, k, stride, padding, dilation, ceil_mode),
        [x],
    )
    compare(
        lambda t: t.avg_pool2d(k, stride, 1, padding, ceil_mode),
        lambda t: F.avg_pool2d(t, k, stride, padding, ceil_mode),
        [x],
    )


@pytest.mark.parametrize("k,stride,padding,dilation,ceil_mode", POOLS)
def test_max_pool_gradient_goes_to_the_first_max_of_a_window(
    k: object, stride: object, padding: object, dilation: object, ceil_mode: bool
) -> None:
    # integers after a ReLU: most windows hold their max more than once (all zeros, or equal integers); torch gives
    # each window's gradient to its first max only, and so must lazygrad, forward values and indices alike
    x = np.maximum(np.random.default_rng(21).integers(-3, 3, (2, 2, 7, 8)), 0).astype(np.float32)
    compare(
        lambda t: t.max_pool2d(k, stride, dilation, padding, ceil_mode),
        lambda t: F.max_pool2d(t, k, stride, padding, dilation, ceil_mode),
        [x],
        grad_tol=(1e-5, 1e-6),  # an element first in several windows sums their gradients, in its own order
    )
    compare(
        lambda t: t.max_pool2d(k, stride, dilation, padding, ceil_mode, return_indices=True),
        lambda t: F.max_pool2d(t, k, stride, padding, dilation, ceil_mode, return_indices=True),
        [x],
        grad=False,
    )


@settings(max_examples=20, deadline=None)
@given(
    k=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    stride=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    size=st.tuples(st.integers(1, 11), st.integers(1, 11)),
    ceil_mode=st.booleans(),
    ties=st.booleans(),
    data=st.data(),
)
def test_max_pool_matches_torch_on_random_windows(
    k: tuple[int, int],
    stride: tuple[int, int],
    dilation: tuple[int, int],
    size: tuple[int, int],
    ceil_mode: bool,
    ties: bool,
    data: st.DataObject,
) -> None:
    padding = tuple(data.draw(st.integers(0, kk // 2)) for kk in k)  # torch allows at most half the kernel
    span = [(kk - 1) * d + 1 for kk, d in zip(k, dilation)]
    assume(all(n + 2 * p >= sp for n, p, sp in zip(size, padding, span)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = (rng.integers(-2, 3, (1, 2, *size)) if ties else rng.standard_normal((1, 2, *size))).astype(np.float32)
    compare(
        lambda t: t.max_pool2d(k, stride, dilation, padding, ceil_mode),
        lambda t: F.max_pool2d(t, k, stride, padding, dilation, ceil_mode),
        [x],
        grad_tol=(1e-5, 1e-6),
    )
    compare(
        lambda t: t.max_pool2d(k, stride, dilation, padding, ceil_mode, return_indices=True)[1],
        lambda t: F.max_pool2d(t, k, stride, padding, dilation, ceil_mode, return_indices=True)[1],
        [x],
        grad=False,
    )


def test_max_pool_after_batchnorm_backward_is_fused() -> None:
    """ResNet's stem: BatchNorm, ReLU, a 3x3 stride-2 max-pool. The pool's gradient is a sum over the windows an
    element is in; BatchNorm's backward sums it per channel and its input gradient reads it again. Both compute it
    from the output's gradient and the stored window choice (the choice, stored after a reciprocal square root, reads
    0 under the padding like any load), with no kernel per window offset."""
    from lazygrad import nn
    from lazygrad_uop.ops import Ops

    rng = np.random.default_rng(23)
    x = rng.standard_normal((2, 3, 11, 10)).astype(np.float32)
    g = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    old, Tensor.training = Tensor.training, True
    try:
        t = Tensor(x).requires_grad_()
        bn = nn.BatchNorm2d(3)
        out = bn(t).relu().max_pool2d(3, 2, padding=1)
        grads = out.gradient(t, bn.weight, bn.bias, gradient=Tensor(g))
        kernels = [si for si in Tensor.schedule(*grads) if si.ast.op is Ops.SINK]
        values = [v.numpy() for v in grads]
    finally:
        Tensor.training = old
    tx = torch.tensor(x, requires_grad=True)
    tbn = torch.nn.BatchNorm2d(3)
    F.max_pool2d(tbn(tx).relu(), 3, 2, 1).backward(torch.tensor(g))
    for got, want in zip(values, (tx.grad, tbn.weight.grad, tbn.bias.grad)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    # 7 kernels; storing each window offset's share of the gradient, and their partial sums, made 21
    assert len(kernels) <= 10, [si.ast.src[0].src[1].arg.shape for si in kernels]


def test_max_pool_of_nan_inf_and_lowest() -> None:
    x = rand((1, 2, 6, 6), 22)
    x[0, 0, 1, 1], x[0, 0, 4, 2], x[0, 1, 0, 0] = np.nan, np.inf, -np.inf
    x[0, 1, 3, 3] = np.finfo(np.float32).min
    compare(lambda t: t.max_pool2d(3, 2, padding=1), lambda t: F.max_pool2d(t, 3, 2, padding=1), [x], grad=False)


def test_pool_1d_3d_and_python(device: str) -> None:
    compare(
        lambda t: t.max_pool2d((3,), 2, padding=1),
        lambda t: F.max_pool1d(t, 3, 2, 1),
        [rand((1, 2, 9), 18)],
        device=device,
        grad=False,
    )
    compare(
        lambda t: t.avg_pool2d((2, 2, 2)),
        lambda t: F.avg_pool3d(t, 2),
        [rand((1, 1, 4, 4, 6), 19)],
        device=device,
        grad=False,
    )
    ints = rand((1, 1, 4, 4), 20, -9, 9, np.int32)
    compare(lambda t: t.max_pool2d(2), lambda t: F.max_pool2d(t.float(), 2).int(), [ints], grad=False)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "linear"])
@pytest.mark.parametrize("size", [(8, 3), (5, 10), (4, 6)])
@pytest.mark.parametrize("align_corners", [False, True])
def test_interpolate(mode: str, size: tuple[int, int], align_corners: bool) -> None:
    if mode != "linear" and align_corners:
        return
    x = rand((1, 2, 4, 6), 21)
    tmode = "bilinear" if mode == "linear" else mode
    kw = {"align_corners": align_corners} if mode == "linear" else {}
    compare(
        lambda t: t.interpolate(size, mode, align_corners),
        lambda t: F.interpolate(t, size, mode=tmode, **kw),
        [x],
        rtol=1e-5,
        atol=1e-5,
    )
    if mode == "linear":
        y = rand((2, 3, 5), 22)
        compare(
            lambda t: t.interpolate((9,), mode, align_corners),
            lambda t: F.interpolate(t, (9,), mode="linear", align_corners=align_corners),
            [y],
            rtol=1e-5,
            atol=1e-5,
        )


def test_interpolate_scale_factor_and_3d() -> None:
    x = rand((1, 1, 3, 4), 23)
    compare(
        lambda t: t.interpolate(scale_factor=2.0, mode="nearest"), lambda t: F.interpolate(t, scale_factor=2.0), [x]
    )
    v = rand((1, 1, 2, 3, 4), 24)
    compare(
        lambda t: t.interpolate((3, 5, 2), mode="trilinear"),
        lambda t: F.interpolate(t, (3, 5, 2), mode="trilinear"),
        [v],
        rtol=1e-5,
        atol=1e-5,
    )


# *** normalization ***


@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 5)])
def test_norms(shape: tuple[int, ...]) -> None:
    x = rand(shape, 25)
    compare(lambda t: t.layernorm(), lambda t: F.layer_norm(t, t.shape[-1:]), [x], rtol=1e-4, atol=1e-5)
    compare(
        lambda t: t.layernorm((-2, -1), eps=1e-3),
        lambda t: F.layer_norm(t, t.shape[-2:], eps=1e-3),
        [x],
        rtol=1e-4,
        atol=1e-5,
    )
    compare(lambda t: t.rmsnorm(), lambda t: F.rms_norm(t, t.shape[-1:], eps=1e-6), [x], rtol=1e-4, atol=1e-5)


def test_groupnorm_batchnorm() -> None:
    x, w, b = rand((2, 6, 3, 2), 26), rand((6,), 27), rand((6,), 28)
    for groups in (1, 2, 6):
        compare(
            lambda t, u, v, groups=groups: t.groupnorm(groups, u, v),
            lambda t, u, v, groups=groups: F.group_norm(t, groups, u, v),
            [x, w, b],
            rtol=1e-4,
            atol=1e-5,
        )
    mean, var = rand((6,), 29), rand((6,), 30, 0.5, 2)
    compare(
        lambda t, u, v, m, s: t.batchnorm(u, v, m, (s + 1e-5).rsqrt()),
        lambda t, u, v, m, s: F.batch_norm(t, m, s, u, v, training=False, eps=1e-5),
        [x, w, b, mean, var],
        nondiff=(3, 4),
        rtol=1e-4,
        atol=1e-5,
    )


def test_dropout() -> None:
    Tensor.manual_seed(5)
    x = Tensor.ones(200, 100)
    assert (x.dropout(0.3).numpy() == 1).all()  # not training: identity
    with Tensor.train():
        y = x.dropout(0.3).numpy()
        assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.7)}
        assert abs((y == 0).mean() - 0.3) < 0.02
        assert (x.dropout(1.0).numpy() == 0).all() and (x.dropout(0.0).numpy() == 1).all()
    with pytest.raises(ValueError):
        x.dropout(1.5)


@pytest.mark.parametrize("mask", [None, "bool", "float", "causal"])
def test_scaled_dot_product_attention(mask: str | None) -> None:
    q, k, v = rand((2, 3, 4, 8), 31), rand((2, 3, 5, 8), 32), rand((2, 3, 5, 6), 33)
    if mask == "causal":
        compare(
            lambda a, b, c: a.scaled_dot_product_attention(b, c, is_causal=True),
            lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
            [q, k, v],
            rtol=1e-5,
        )
        return
    m = None if mask is None else rand((4, 5), 34, dtype=np.bool_) if mask == "bool" else rand((4, 5), 35)
    if m is not None and mask == "bool":
        m[:, 0] = True  # a query with no key left gives nan in both
    tm = None if m is None else torch.tensor(m)
    lm = None if m is None else Tensor(m)
    compare(
        lambda a, b, c: a.scaled_dot_product_attention(b, c, lm, scale=0.3),
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, tm, scale=0.3),
        [q, k, v],
        rtol=1e-5,
    )


def test_sdpa_gqa() -> None:
    q, k, v = rand((1, 4, 3, 8), 36), rand((1, 2, 3, 8), 37), rand((1, 2, 3, 8), 38)
    compare(
        lambda a, b, c: a.scaled_dot_product_attention(b, c, enable_gqa=True),
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, enable_gqa=True),
        [q, k, v],
        rtol=1e-5,
    )


# *** losses ***


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_losses(reduction: str) -> None:
    p, y = rand((4, 3), 39, 0.01, 0.99), rand((4, 3), 40, 0, 1)
    compare(
        lambda a, b: a.binary_crossentropy(b, reduction),
        lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction),
        [p, y],
        rtol=1e-5,
    )
    x = rand((4, 3), 41, -30, 30)
    compare(
        lambda a, b: a.binary_crossentropy_logits(b, reduction),
        lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction),
        [x, y],
        rtol=1e-5,
    )
    pw = rand((3,), 42, 0.5, 2)
    compare(
        lambda a, b, w: a.binary_crossentropy_logits(b, reduction, pos_weight=w),
        lambda a, b, w: F.binary_cross_entropy_with_logits(a, b, reduction=reduction, pos_weight=w),
        [x, y, pw],
        nondiff=(2,),
        rtol=1e-5,
    )


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(smoothing: float, reduction: str) -> None:
    x = rand((5, 4), 43, -3, 3)
    y = rand((5,), 44, 0, 3, np.int64)
    compare(
        lambda a, b: a.cross_entropy(b, reduction, smoothing),
        lambda a, b: F.cross_entropy(a, b, reduction=reduction, label_smoothing=smoothing),
        [x, y],
        rtol=1e-5,
    )
    probs = np.random.default_rng(45).dirichlet(np.ones(4), size=5).astype(np.float32)
    compare(
        lambda a, b: a.cross_entropy(b, reduction, smoothing),
        lambda a, b: F.cross_entropy(a, b, reduction=reduction, label_smoothing=smoothing),
        [x, probs],
        rtol=1e-5,
    )
    x3, y3 = rand((2, 4, 3), 46), rand((2, 3), 47, 0, 3, np.int64)
    compare(
        lambda a, b: a.cross_entropy(b, reduction, smoothing),
        lambda a, b: F.cross_entropy(a, b, reduction=reduction, label_smoothing=smoothing),
        [x3, y3],
        rtol=1e-5,
    )


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_sparse_categorical_crossentropy(smoothing: float) -> None:
    x = rand((6, 5), 48, -3, 3)
    y = np.array([0, 4, -1, 2, -1, 1], np.int64)
    for reduction in ("mean", "sum"):
        compare(
            lambda a, b, reduction=reduction: a.sparse_categorical_crossentropy(
                b, label_smoothing=smoothing, reduction=reduction
            ),
            lambda a, b, reduction=reduction: F.cross_entropy(
                a, b, ignore_index=-1, label_smoothing=smoothing, reduction=reduction
            ),
            [x, y],
            rtol=1e-5,
        )
    compare(
        lambda a, b: a.sparse_categorical_crossentropy(b, ignore_index=4, reduction="none"),
        lambda a, b: F.cross_entropy(a, b.clamp(0), ignore_index=4, reduction="none"),
        [x, np.abs(y)],
        rtol=1e-5,
    )


def test_nll_loss() -> None:
    logp = np.log(np.random.default_rng(49).dirichlet(np.ones(4), size=6)).astype(np.float32)
    y = rand((6,), 50, 0, 3, np.int64)
    w = rand((4,), 51, 0.5, 2)
    for reduction in ("mean", "sum", "none"):
        compare(
            lambda a, b, c, reduction=reduction: a.nll_loss(b, c, reduction=reduction),
            lambda a, b, c, reduction=reduction: F.nll_loss(a, b, c, reduction=reduction),
            [logp, y, w],
            nondiff=(2,),
            rtol=1e-5,
        )
        compare(
            lambda a, b, reduction=reduction: a.nll_loss(b, ignore_index=2, reduction=reduction),
            lambda a, b, reduction=reduction: F.nll_loss(a, b, ignore_index=2, reduction=reduction),
            [logp, y],
            rtol=1e-5,
        )


def test_losses_python_device(device: str) -> None:
    x, y = rand((3, 4), 52), rand((3,), 53, 0, 3, np.int64)
    compare(
        lambda a, b: a.cross_entropy(b),
        lambda a, b: F.cross_entropy(a, b),
        [x, y],
        device=device,
        grad=False,
        rtol=1e-5,
    )
    compare(
        lambda a: a.layernorm(), lambda a: F.layer_norm(a, (4,)), [x], device=device, grad=False, rtol=1e-4, atol=1e-5
    )


def test_linear_sequential() -> None:
    x, w, b = rand((3, 4), 54), rand((4, 2), 55), rand((2,), 56)
    compare(lambda a, u, v: a.linear(u, v), lambda a, u, v: a @ u + v, [x, w, b])
    compare(lambda a: a.sequential([lambda t: t * 2, lambda t: t.relu()]), lambda a: (a * 2).relu(), [x])
