"""nn layers against torch.nn modules with the same weights: forward, the gradient of the input and of every
parameter, parameter names (state dicts load across), initialisation ranges, running statistics."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from lazygrad import Context, Tensor, dtypes, nn
from lazygrad.nn.state import get_parameters, get_state_dict, load_state_dict

torch = pytest.importorskip("torch")


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def copy_weights(layer: Any, module: torch.nn.Module) -> None:
    """torch's parameters and buffers into the layer, by name: the names must be the same."""
    sd = {k: Tensor(v.detach().numpy()) for k, v in module.state_dict().items()}
    assert set(sd) == set(get_state_dict(layer)), "parameter names differ from torch's"
    load_state_dict(layer, sd)


def check_layer(
    layer: Any, module: torch.nn.Module, x: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5, **call: Any
) -> None:
    """Same weights -> same output, same input gradient, same gradient of every parameter."""
    copy_weights(layer, module)
    params = {k: t for k, t in get_state_dict(layer).items() if dtypes.is_float(t.dtype) and "running" not in k}
    for t in params.values():
        t.requires_grad_()
    xt = torch.tensor(x, requires_grad=True)
    xl = Tensor(x, requires_grad=True)
    out, tout = layer(xl, **call), module(xt, **call)
    seed = rand(tuple(tout.shape), 7)
    (out * Tensor(seed)).sum().backward()
    (tout * torch.tensor(seed)).sum().backward()
    Tensor.realize(out, xl.grad, *(t.grad for t in params.values()))  # one schedule for all of it
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(xl.grad.numpy(), xt.grad.numpy(), rtol=rtol, atol=atol, err_msg="input gradient")
    tparams = dict(module.named_parameters())
    for k, t in params.items():
        np.testing.assert_allclose(t.grad.numpy(), tparams[k].grad.numpy(), rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias: bool) -> None:
    check_layer(nn.Linear(5, 3, bias=bias), torch.nn.Linear(5, 3, bias=bias), rand((4, 5), 1))
    check_layer(nn.Linear(5, 3, bias=bias), torch.nn.Linear(5, 3, bias=bias), rand((2, 3, 5), 2))


CONV2D = [
    {"stride": 2, "padding": 1},
    {"padding": (1, 2), "dilation": 2},
    {"groups": 2, "bias": False},
    {"padding": "same"},
]


@pytest.mark.parametrize("kw", CONV2D, ids=str)
def test_conv2d(kw: dict) -> None:
    check_layer(nn.Conv2d(4, 6, 3, **kw), torch.nn.Conv2d(4, 6, 3, **kw), rand((2, 4, 7, 6), 3))


def test_conv2d_rectangular_kernel() -> None:
    check_layer(
        nn.Conv2d(2, 3, (2, 3), stride=(1, 2)), torch.nn.Conv2d(2, 3, (2, 3), stride=(1, 2)), rand((2, 2, 5, 7), 4)
    )


@pytest.mark.parametrize("kw", [{}, {"stride": 2, "padding": 2}, {"groups": 3, "dilation": 2}], ids=str)
def test_conv1d(kw: dict) -> None:
    check_layer(nn.Conv1d(3, 6, 3, **kw), torch.nn.Conv1d(3, 6, 3, **kw), rand((2, 3, 9), 5))


@pytest.mark.parametrize(
    "kw", [{"stride": 2, "padding": 1, "output_padding": 1}, {"groups": 2, "bias": False}], ids=str
)
def test_conv_transpose2d(kw: dict) -> None:
    check_layer(nn.ConvTranspose2d(4, 6, 3, **kw), torch.nn.ConvTranspose2d(4, 6, 3, **kw), rand((2, 4, 5, 4), 6))


def test_conv_transpose1d() -> None:
    kw = {"stride": 3, "padding": 1}
    check_layer(nn.ConvTranspose1d(2, 4, 4, **kw), torch.nn.ConvTranspose1d(2, 4, 4, **kw), rand((2, 2, 6), 7))


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 5)])
def test_batchnorm_training(shape: tuple[int, ...]) -> None:
    cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[len(shape)]
    layer, module = nn.BatchNorm(3, momentum=0.2), cls(3, momentum=0.2)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
        module.bias.uniform_(-0.5, 0.5)
    with Tensor.train():
        check_layer(layer, module.train(), rand(shape, 8))
    np.testing.assert_allclose(layer.running_mean.numpy(), module.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.running_var.numpy(), module.running_var.numpy(), rtol=1e-5, atol=1e-6)
    assert layer.num_batches_tracked.item() == module.num_batches_tracked.item() == 1


def test_batchnorm_eval_uses_running_statistics() -> None:
    layer, module = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        module.running_mean.uniform_(-1, 1)
        module.running_var.uniform_(0.5, 2)
        module.weight.uniform_(0.5, 1.5)
    assert not Tensor.training
    check_layer(layer, module.eval(), rand((2, 3, 4, 4), 9))


def test_batchnorm_without_affine_or_running_stats() -> None:
    layer, module = (
        nn.BatchNorm(4, affine=False, track_running_stats=False),
        torch.nn.BatchNorm1d(4, affine=False, track_running_stats=False),
    )
    check_layer(layer, module, rand((5, 4), 10))


@pytest.mark.parametrize(("shape", "norm"), [((3, 5), 5), ((2, 3, 4), 4), ((2, 3, 4), (3, 4))])
def test_layernorm(shape: tuple[int, ...], norm: Any) -> None:
    module = torch.nn.LayerNorm(norm)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
        module.bias.uniform_(-0.5, 0.5)
    check_layer(nn.LayerNorm(norm), module, rand(shape, 11))
    check_layer(
        nn.LayerNorm(norm, elementwise_affine=False),
        torch.nn.LayerNorm(norm, elementwise_affine=False),
        rand(shape, 12),
    )


@pytest.mark.parametrize(("groups", "shape"), [(2, (3, 4, 5)), (1, (2, 4, 3, 3)), (4, (2, 4, 3, 2))])
def test_groupnorm(groups: int, shape: tuple[int, ...]) -> None:
    module = torch.nn.GroupNorm(groups, 4)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
        module.bias.uniform_(-0.5, 0.5)
    check_layer(nn.GroupNorm(groups, 4), module, rand(shape, 13))


def test_layernorm2d() -> None:
    module = torch.nn.LayerNorm(3)
    layer = nn.LayerNorm2d(3)
    x = rand((2, 3, 4, 5), 23)
    copy_weights(layer, module)
    out = layer(Tensor(x))
    ref = module(torch.tensor(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 4)])
def test_instancenorm(shape: tuple[int, ...]) -> None:
    cls = torch.nn.InstanceNorm1d if len(shape) == 3 else torch.nn.InstanceNorm2d
    module = cls(3, affine=True)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
        module.bias.uniform_(-0.5, 0.5)
    check_layer(nn.InstanceNorm(3), module, rand(shape, 24))


def test_rmsnorm() -> None:
    module = torch.nn.RMSNorm(6, eps=1e-6)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
    check_layer(nn.RMSNorm(6), module, rand((3, 6), 14))
    check_layer(
        nn.RMSNorm(6, elementwise_affine=False),
        torch.nn.RMSNorm(6, eps=1e-6, elementwise_affine=False),
        rand((2, 2, 6), 15),
    )


def test_embedding() -> None:
    layer, module = nn.Embedding(10, 4), torch.nn.Embedding(10, 4)
    copy_weights(layer, module)
    layer.weight.requires_grad_()
    idx = np.array([[1, 3, 3], [9, 0, 1]], dtype=np.int32)
    out, tout = layer(Tensor(idx)), module(torch.tensor(idx, dtype=torch.long))
    seed = rand((2, 3, 4), 16)
    (out * Tensor(seed)).sum().backward()
    (tout * torch.tensor(seed)).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(layer.weight.grad.numpy(), module.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="integer indices"):
        layer(Tensor([0.0]))


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell(bias: bool) -> None:
    layer, module = nn.LSTMCell(3, 5, bias=bias), torch.nn.LSTMCell(3, 5, bias=bias)
    copy_weights(layer, module)
    params = get_parameters(layer)
    for p in params:
        p.requires_grad_()
    x, h, c = rand((2, 3), 17), rand((2, 5), 18), rand((2, 5), 19)
    xl, hl, cl = (Tensor(a, requires_grad=True) for a in (x, h, c))
    xt, ht, ct = (torch.tensor(a, requires_grad=True) for a in (x, h, c))
    h1, c1 = layer(xl, (hl, cl))
    h2, c2 = layer(h1[:, :3] * 0.5, (h1, c1))  # two steps: the gradient flows through the recurrence
    th1, tc1 = module(xt, (ht, ct))
    th2, tc2 = module(th1[:, :3] * 0.5, (th1, tc1))
    (h2.sum() + (c2 * c2).sum()).backward()
    (th2.sum() + (tc2 * tc2).sum()).backward()
    Tensor.realize(h2, xl.grad, hl.grad, cl.grad, *(p.grad for p in params))
    np.testing.assert_allclose(h2.numpy(), th2.detach().numpy(), rtol=1e-5, atol=1e-6)
    for mine, ref in ((xl, xt), (hl, ht), (cl, ct)):
        np.testing.assert_allclose(mine.grad.numpy(), ref.grad.numpy(), rtol=1e-4, atol=1e-5)
    for (k, t), tp in zip(get_state_dict(layer).items(), dict(module.named_parameters()).values()):
        np.testing.assert_allclose(t.grad.numpy(), tp.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
    h0, c0 = layer(Tensor(x))  # no state: zeros
    th0, tc0 = module(torch.tensor(x))
    np.testing.assert_allclose(h0.numpy(), th0.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c0.numpy(), tc0.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_layers_on_each_device(device: str) -> None:
    # layers make their parameters on the default device, as tinygrad's do
    with Context(DEV=device):
        check_layer(nn.Conv2d(2, 3, 2, stride=2), torch.nn.Conv2d(2, 3, 2, stride=2), rand((2, 2, 4, 4), 20))
        with Tensor.train():
            check_layer(nn.BatchNorm(3), torch.nn.BatchNorm1d(3), rand((4, 3), 21))
        check_layer(nn.LayerNorm(3), torch.nn.LayerNorm(3), rand((2, 3), 22))
        assert nn.Linear(2, 2).weight.device == device


def test_initialisation_follows_torch() -> None:
    Tensor.manual_seed(3)
    lin = nn.Linear(100, 50)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    bound = 1 / math.sqrt(100)
    assert w.shape == (50, 100) and np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert np.abs(b).max() <= bound and abs(w.mean()) < 0.1 * bound
    conv = nn.Conv2d(4, 8, 3, groups=2)
    assert np.abs(conv.weight.numpy()).max() <= 1 / math.sqrt(2 * 9)
    bn = nn.BatchNorm2d(4)
    np.testing.assert_array_equal(bn.weight.numpy(), 1)
    np.testing.assert_array_equal(bn.running_var.numpy(), 1)
    emb = nn.Embedding(1000, 8).weight.numpy()
    assert abs(emb.std() - 1) < 0.1, "Embedding is initialised standard normal, as in torch"


def test_layers_with_equal_initial_values_do_not_share_memory() -> None:
    # two LayerNorms start from equal ones and zeros; realized together they must still be two buffers
    a, b = nn.LayerNorm(4), nn.LayerNorm(4)
    Tensor.realize(a.weight, b.weight, a.bias, b.bias)
    a.weight.assign(Tensor([1.0, 2.0, 3.0, 4.0])).realize()
    np.testing.assert_array_equal(b.weight.numpy(), 1)


def test_layer_argument_errors() -> None:
    with pytest.raises(ValueError, match="groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="num_groups"):
        nn.GroupNorm(3, 4)
    with pytest.raises(ValueError, match="LayerNorm over"):
        nn.LayerNorm(4)(Tensor.ones(2, 5))
    with pytest.raises(ValueError, match=r"\(N, C, \.\.\.\)"):
        nn.BatchNorm(3)(Tensor.ones(3))
