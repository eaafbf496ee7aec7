"""The Tensor API surface: tinygrad's Tensor names exist (a model ports by changing the import), properties,
creation, casts, and the smaller ops (linspace, unfold, rearrange, max_unpool2d, atan/asin/acos, logaddexp)
against torch."""

from __future__ import annotations

import numpy as np
import pytest
from torch_reference import compare, rand

from lazygrad import Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional

# tinygrad's documented Tensor API (properties, creation, movement, elementwise, complex ops) that lazygrad provides
TINYGRAD_NAMES = """
shape dtype device ndim numel element_size nbytes is_floating_point size requires_grad grad
empty zeros ones full arange linspace eye full_like zeros_like ones_like rand_like randn_like manual_seed rand randn
randint normal uniform scaled_uniform glorot_uniform kaiming_uniform kaiming_normal randperm multinomial
item tolist numpy clone to realize contiguous detach assign backward gradient
view reshape expand permute flip shrink pad gather cat stack repeat repeat_interleave split chunk unfold meshgrid
squeeze unsqueeze T transpose flatten unflatten roll rearrange masked_select masked_fill diagonal diag
logical_not neg log log2 exp exp2 sqrt rsqrt sin cos tan asin acos atan trunc ceil floor round isinf isnan isfinite
lerp square clamp clip sign abs reciprocal relu sigmoid logsigmoid hardsigmoid elu celu selu swish silu relu6
hardswish tanh sinh cosh atanh asinh acosh hardtanh erf gelu quick_gelu leaky_relu mish softplus softsign
add sub mul div idiv mod bitwise_xor bitwise_and bitwise_or bitwise_not lshift rshift pow maximum minimum where
copysign logaddexp logical_and logical_or logical_xor eq ne cast bitcast float half int bool double long bfloat16
sum prod max min any all isclose allclose mean var var_mean std std_mean softmax log_softmax logsumexp logcumsumexp
argmax argmin avg_pool2d max_pool2d max_unpool2d conv2d conv_transpose2d dot matmul einsum cumsum cumprod cummax
triu tril interpolate scatter scatter_reduce sort topk argsort
linear sequential layernorm batchnorm dropout one_hot scaled_dot_product_attention binary_crossentropy
binary_crossentropy_logits sparse_categorical_crossentropy cross_entropy nll_loss
""".split()


def test_tinygrad_names_exist() -> None:
    missing = [n for n in TINYGRAD_NAMES if not hasattr(Tensor, n) and n not in ("requires_grad", "grad")]
    assert not missing, f"Tensor lacks {missing}"
    t = Tensor.ones(2)
    assert t.requires_grad is None and t.grad is None


def test_properties() -> None:
    t = Tensor(rand((2, 3, 4), 1))
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.numel() == 24 and len(t) == 2
    assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
    assert t.element_size() == 4 and t.nbytes == 96 and t.is_floating_point()
    assert t.device == "CPU" and t.dtype == dtypes.float32 and t.T.shape == (4, 3, 2)
    assert not Tensor([1, 2]).is_floating_point()


def test_casts() -> None:
    x = rand((5,), 2, -100, 100)
    for name, tname in [
        ("double", "double"),
        ("long", "long"),
        ("short", "short"),
        ("char", "char"),
        ("half", "half"),
        ("int", "int"),
        ("float", "float"),
        ("bool", "bool"),
    ]:
        compare(lambda t, name=name: getattr(t, name)(), lambda t, tname=tname: getattr(t, tname)(), [x], grad=False)
    compare(lambda t: t.abs().byte(), lambda t: t.abs().byte(), [x], grad=False)
    np.testing.assert_allclose(Tensor(x).bfloat16().float().numpy(), torch.tensor(x).bfloat16().float().numpy())


def test_creation() -> None:
    for args in [(0, 1, 5), (-3.0, 7.0, 4), (2, 2, 1), (1, 0, 6), (0, 1, 0)]:
        np.testing.assert_allclose(Tensor.linspace(*args).numpy(), torch.linspace(*args).numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(
        Tensor.linspace(-3, 7, 4, dtype=dtypes.int64).numpy(), torch.linspace(-3, 7, 4, dtype=torch.int64).numpy()
    )
    e = Tensor.empty(2, 3, dtype=dtypes.int16)
    assert e.shape == (2, 3) and e.dtype == dtypes.int16
    c = Tensor([1.0, 2.0]).realize()
    d = c.clone()
    c.assign(Tensor([5.0, 6.0]))
    assert d.tolist() == [1.0, 2.0] and c.tolist() == [5.0, 6.0]


@pytest.mark.parametrize("dim,size,step", [(0, 2, 1), (1, 3, 2), (-1, 4, 3), (1, 5, 1)])
def test_unfold(dim: int, size: int, step: int) -> None:
    compare(lambda t: t.unfold(dim, size, step), lambda t: t.unfold(dim, size, step), [rand((3, 5, 6), 3)])


def test_rearrange() -> None:
    x = rand((2, 3, 4, 6), 4)
    cases = [
        ("b c h w -> b h w c", {}, lambda t: t.permute(0, 2, 3, 1)),
        (
            "b c h (w k) -> b (h w) k c",
            {"k": 2},
            lambda t: t.reshape(2, 3, 4, 3, 2).permute(0, 2, 3, 4, 1).reshape(2, 12, 2, 3),
        ),
        ("b ... -> b (...)", {}, lambda t: t.reshape(2, -1)),
        ("b ... w -> w ... b", {}, lambda t: t.permute(3, 1, 2, 0)),
        ("b c h w -> 1 b (c h) w 1", {}, lambda t: t.reshape(1, 2, 12, 6, 1)),
        ("b (g c) h w -> (b g) c h w", {"g": 3}, lambda t: t.reshape(6, 1, 4, 6)),
    ]
    for formula, sizes, ref in cases:
        compare(lambda t, formula=formula, sizes=sizes: t.rearrange(formula, **sizes), ref, [x])
    with pytest.raises(ValueError):
        Tensor(x).rearrange("b c h -> b c h")
    with pytest.raises(ValueError):
        Tensor(x).rearrange("b c h w -> b c h")


def test_max_unpool2d() -> None:
    x = rand((2, 3, 6, 8), 5)
    out, idx = F.max_pool2d(torch.tensor(x), 2, return_indices=True)
    got = Tensor(out.numpy()).max_unpool2d(Tensor(idx.numpy()), 2)
    np.testing.assert_array_equal(got.numpy(), F.max_unpool2d(out, idx, 2).numpy())
    lo, li = Tensor(x).max_pool2d(3, 2, return_indices=True)
    np.testing.assert_array_equal(
        lo.max_unpool2d(li, 3, 2, output_size=(6, 8)).numpy(),
        F.max_unpool2d(*F.max_pool2d(torch.tensor(x), 3, 2, return_indices=True), 3, 2, output_size=(6, 8)).numpy(),
    )


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_inverse_trig(dt: type) -> None:
    x = np.concatenate([np.linspace(-6, 6, 61), [0.0, 1e-8, -1e-30, np.inf, -np.inf, np.nan]]).astype(dt)
    tol = {"rtol": 3e-7, "atol": 3e-7} if dt == np.float32 else {"rtol": 1e-13, "atol": 1e-14}
    compare(lambda t: t.atan(), torch.atan, [x], grad=False, **tol)
    unit = np.concatenate([np.linspace(-1, 1, 41), [1e-9, -0.999]]).astype(dt)
    with np.errstate(all="ignore"):
        compare(lambda t: t.asin(), torch.asin, [unit], grad=False, **{k: v * 4 for k, v in tol.items()})
        compare(lambda t: t.acos(), torch.acos, [unit], grad=False, **{k: v * 4 for k, v in tol.items()})
    compare(lambda t: t.atan(), torch.atan, [rand((3, 4), 6, -4, 4).astype(dt)], rtol=1e-5)


def test_logaddexp() -> None:
    a, b = rand((3, 4), 7, -50, 50), rand((4,), 8, -50, 50)
    compare(lambda x, y: x.logaddexp(y), torch.logaddexp, [a, b])
    inf = np.array([-np.inf, np.inf, -np.inf, 3.0], np.float32)
    compare(
        lambda x, y: x.logaddexp(y),
        torch.logaddexp,
        [inf, np.array([-np.inf, np.inf, 2.0, np.inf], np.float32)],
        grad=False,
    )
