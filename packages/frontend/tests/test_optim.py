"""Optimizers against torch.optim over several steps (LAMB against a numpy transcription of its paper), learning-rate
schedules against torch's, and what a step realizes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
import pytest

from lazygrad import Tensor, engine, nn
from lazygrad.nn import lr_scheduler
from lazygrad.nn.optim import LAMB, SGD, Adam, AdamW, Optimizer, OptimizerGroup
from lazygrad.nn.state import get_parameters

torch = pytest.importorskip("torch")

STEPS = 4


def init() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3,)).astype(np.float32)]


def loss_fn(w: Any, b: Any, x: Any) -> Any:
    """A loss whose gradient changes from step to step."""
    return ((x @ w + b).tanh() * (x @ w)).sum() + (w * w * w).sum()


X = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)


def run_lazygrad(make: Callable[[list[Tensor]], Optimizer]) -> list[np.ndarray]:
    params = [Tensor(a) for a in init()]
    opt = make(params)
    for _ in range(STEPS):
        opt.zero_grad()
        loss_fn(*params, Tensor(X)).backward()
        opt.step()
    return [p.numpy() for p in params]


def run_torch(make: Callable[[list[torch.Tensor]], torch.optim.Optimizer]) -> list[np.ndarray]:
    params = [torch.tensor(a, requires_grad=True) for a in init()]
    opt = make(params)
    for _ in range(STEPS):
        opt.zero_grad()
        loss_fn(*params, torch.tensor(X)).backward()
        opt.step()
    return [p.detach().numpy() for p in params]


CASES = {
    "sgd": (lambda p: SGD(p, lr=0.05), lambda p: torch.optim.SGD(p, lr=0.05)),
    "sgd_momentum": (lambda p: SGD(p, lr=0.05, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "sgd_nesterov_wd": (
        lambda p: SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1),
    ),
    "sgd_wd": (lambda p: SGD(p, lr=0.05, weight_decay=0.3), lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=0.3)),
    "adam": (lambda p: Adam(p, lr=0.05), lambda p: torch.optim.Adam(p, lr=0.05)),
    "adam_betas_wd": (
        lambda p: Adam(p, lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
        lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
    ),
    "adamw": (lambda p: AdamW(p, lr=0.05), lambda p: torch.optim.AdamW(p, lr=0.05)),
    "adamw_wd": (
        lambda p: AdamW(p, lr=0.05, b1=0.85, b2=0.99, weight_decay=0.2),
        lambda p: torch.optim.AdamW(p, lr=0.05, betas=(0.85, 0.99), weight_decay=0.2),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name: str) -> None:
    mine, ref = CASES[name]
    for got, want in zip(run_lazygrad(mine), run_torch(ref)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def lamb_reference(lr: float, b1: float, b2: float, eps: float, wd: float) -> list[np.ndarray]:
    """LAMB as its paper writes it (You et al. 2019, algorithm 2), in float64 numpy, gradients from torch."""
    params = [a.astype(np.float64) for a in init()]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t in range(1, STEPS + 1):
        tp = [torch.tensor(p, requires_grad=True) for p in params]
        loss_fn(*tp, torch.tensor(X, dtype=torch.float64)).backward()
        for i, p in enumerate(params):
            g = tp[i].grad.numpy()
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            r = (m[i] / (1 - b1**t)) / (np.sqrt(v[i] / (1 - b2**t)) + eps) + wd * p
            w_norm, r_norm = np.linalg.norm(p), np.linalg.norm(r)
            trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
            params[i] = p - lr * trust * r
    return params


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_lamb_matches_the_paper(wd: float) -> None:
    got = run_lazygrad(lambda p: LAMB(p, lr=0.05, b1=0.9, b2=0.99, eps=1e-6, weight_decay=wd))
    for g, want in zip(got, lamb_reference(0.05, 0.9, 0.99, 1e-6, wd)):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)


class TwoLayer:
    def __init__(self) -> None:
        self.l1, self.l2 = nn.Linear(4, 8), nn.Linear(8, 2)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def test_step_is_one_schedule_and_keeps_values_read_before_it() -> None:
    model = TwoLayer()
    opt = Adam(get_parameters(model), lr=0.1)
    x = Tensor(X[:, :4])
    out = model(x)
    loss = out.square().mean()
    loss.backward()
    before = [p.numpy().copy() for p in get_parameters(model)]
    ref_loss = float(np.square(np.maximum(X[:, :4] @ before[0].T + before[1], 0) @ before[2].T + before[3]).mean())
    with mock.patch.object(engine, "realize", wraps=engine.realize) as realize_all:
        opt.step()
    assert realize_all.call_count == 1, "a step must realize parameters, state and gradients in one schedule"
    # the loss and the gradients were built from the old weights; the step overwrote them, but kept those values
    np.testing.assert_allclose(loss.item(), ref_loss, rtol=1e-5)
    assert all(not np.array_equal(p.numpy(), b) for p, b in zip(get_parameters(model), before))
    assert opt.params[0].grad is not None and opt.params[0].grad.numpy().shape == (8, 4)


def test_changing_the_learning_rate_compiles_nothing_new() -> None:
    params = [Tensor(a) for a in init()]
    opt = SGD(params, lr=0.1, momentum=0.9)
    sched = lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    def step() -> None:
        opt.zero_grad()
        loss_fn(*params, Tensor(X)).backward()
        opt.step()
        sched.step()

    step()
    step()
    compiled = len(engine._runners)
    step()
    assert len(engine._runners) == compiled, "a new learning rate must not change the kernels"
    np.testing.assert_allclose(sched.get_last_lr(), [0.1 * 0.5**3], rtol=1e-6)
    np.testing.assert_allclose(opt.lr.item(), 0.0125)


def test_parameters_and_buffers() -> None:
    bn = nn.BatchNorm(3)
    params = get_parameters(bn)
    opt = SGD(params, lr=0.1)
    assert {id(p) for p in opt.params} == {id(bn.weight), id(bn.bias)}, "running statistics are not trained"
    assert {id(b) for b in opt.buffers} == {id(bn.running_mean), id(bn.running_var), id(bn.num_batches_tracked)}
    assert bn.weight.requires_grad is True and bn.running_mean.requires_grad is False
    x = Tensor(np.random.default_rng(2).standard_normal((6, 3)).astype(np.float32))
    with Tensor.train():
        opt.zero_grad()
        bn(x).square().sum().backward()
        opt.step()
    # the running statistics were realized by the step, with the parameters
    assert bn.running_mean.uop.op.name == "VIEW"
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * x.numpy().mean(0), rtol=1e-5, atol=1e-6)


def test_optimizer_group() -> None:
    a, b = Tensor([1.0, 2.0]), Tensor([3.0])
    opt = OptimizerGroup(SGD([a], lr=0.1), SGD([b], lr=1.0))
    opt.zero_grad()
    ((a * a).sum() + (b * b).sum()).backward()
    opt.step()
    np.testing.assert_allclose(a.numpy(), [0.8, 1.6])
    np.testing.assert_allclose(b.numpy(), [-3.0])
    assert opt[1].params == [b]


def test_errors_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="no parameters"):
        SGD([Tensor([1.0], requires_grad=False)])
    a = Tensor([1.0])
    opt = SGD([a])
    with pytest.raises(RuntimeError, match="backward"):
        opt.step()
    with pytest.raises(ValueError, match="nesterov"):
        SGD([a], nesterov=True)


SCHEDULES = {
    "step": (lambda o: lr_scheduler.StepLR(o, 3, 0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5)),
    "multistep": (
        lambda o: lr_scheduler.MultiStepLR(o, [2, 5], 0.1),
        lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [2, 5], 0.1),
    ),
    "exponential": (
        lambda o: lr_scheduler.ExponentialLR(o, 0.8),
        lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.8),
    ),
    "cosine": (
        lambda o: lr_scheduler.CosineAnnealingLR(o, 8, eta_min=0.01),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 8, eta_min=0.01),
    ),
    "linear": (
        lambda o: lr_scheduler.LinearLR(o, 0.25, 1.0, 4),
        lambda o: torch.optim.lr_scheduler.LinearLR(o, 0.25, 1.0, 4),
    ),
    "lambda": (
        lambda o: lr_scheduler.LambdaLR(o, lambda e: 1 / (1 + e)),
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1 / (1 + e)),
    ),
    "onecycle_cos": (
        lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=10),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=10, cycle_momentum=False),
    ),
    "onecycle_linear": (
        lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=10, pct_start=0.4, anneal_strategy="linear"),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(
            o, max_lr=0.5, total_steps=10, pct_start=0.4, anneal_strategy="linear", cycle_momentum=False
        ),
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedule_matches_torch(name: str) -> None:
    mine, ref = SCHEDULES[name]
    opt = SGD([Tensor([1.0])], lr=0.1)
    topt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched, tsched = mine(opt), ref(topt)
    got, want = [], []
    for _ in range(9):
        got.append(opt.lr.item())
        want.append(topt.param_groups[0]["lr"])
        sched.step()
        topt.step()
        tsched.step()
    np.testing.assert_allclose(got, want, rtol=1e-6)
