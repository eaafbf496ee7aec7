"""Muon against torch.optim.Muon (whose Newton-Schulz runs in bfloat16: compared to that precision) and against a
float64 numpy transcription of the update (compared tightly), for wide, tall and conv-shaped parameters."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad import Tensor
from lazygrad.errors import InputError
from lazygrad.nn.optim import Muon

torch = pytest.importorskip("torch")

STEPS = 2
SHAPES = [(4, 6), (7, 3)]


def init(shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def loss_of(params: list, xs: list) -> object:
    """A loss whose gradient changes from step to step: sum(tanh(x @ w) * (x @ w)) per parameter."""
    total = None
    for w, x in zip(params, xs):
        y = x @ w.reshape(w.shape[0], -1)
        term = (y.tanh() * y).sum()
        total = term if total is None else total + term
    return total


def inputs(shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal((5, s[0])).astype(np.float32) for s in shapes]


def run_lazygrad(shapes: list[tuple[int, ...]], **kw) -> list[np.ndarray]:
    params = [Tensor(a) for a in init(shapes)]
    opt = Muon(params, **kw)
    xs = [Tensor(x) for x in inputs(shapes)]
    for _ in range(STEPS):
        opt.zero_grad()
        loss_of(params, xs).backward()
        opt.step()
    return [p.numpy() for p in params]


def run_torch(shapes: list[tuple[int, ...]], **kw) -> list[np.ndarray]:
    params = [torch.tensor(a, requires_grad=True) for a in init(shapes)]
    opt = torch.optim.Muon(params, **kw)
    xs = [torch.tensor(x) for x in inputs(shapes)]
    for _ in range(STEPS):
        opt.zero_grad()
        loss_of(params, xs).backward()
        opt.step()
    return [p.detach().numpy() for p in params]


def run_numpy(shapes: list[tuple[int, ...]], lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True, eps=1e-7,
              ns_steps=5, coefficients=(3.4445, -4.7750, 2.0315), adjust_lr_fn=None) -> list[np.ndarray]:  # fmt: skip
    """The update as torch documents it (momentum as an average, quintic Newton-Schulz, decoupled decay), float64,
    with gradients from torch autograd."""
    params = [a.astype(np.float64) for a in init(shapes)]
    bufs = [np.zeros_like(p) for p in params]
    xs = [torch.tensor(x, dtype=torch.float64) for x in inputs(shapes)]
    a, b, c = coefficients
    for _ in range(STEPS):
        tp = [torch.tensor(p, requires_grad=True) for p in params]
        loss_of(tp, xs).backward()
        for i, (p, t) in enumerate(zip(params, tp)):
            g = t.grad.numpy()
            bufs[i] = momentum * bufs[i] + (1 - momentum) * g
            u = ((1 - momentum) * g + momentum * bufs[i] if nesterov else bufs[i]).reshape(p.shape[0], -1)
            x = u.T if u.shape[0] > u.shape[1] else u
            x = x / max(np.linalg.norm(x), eps)
            for _ in range(ns_steps):
                gram = x @ x.T
                x = a * x + (b * gram + c * gram @ gram) @ x
            o = (x.T if u.shape[0] > u.shape[1] else x).reshape(p.shape)
            rows, cols = u.shape
            scale = (
                0.2 * np.sqrt(max(rows, cols)) if adjust_lr_fn == "match_rms_adamw" else np.sqrt(max(1, rows / cols))
            )
            params[i] = p * (1 - lr * weight_decay) - lr * scale * o
    return params


CASES = [
    {"lr": 0.02},
    {"lr": 0.05, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0, "adjust_lr_fn": "match_rms_adamw"},
]


@pytest.mark.parametrize("kw", CASES)
def test_matches_torch_and_the_update_in_float64(kw: dict) -> None:
    got = run_lazygrad(SHAPES, **kw)
    for mine, want, start in zip(got, run_torch(SHAPES, **kw), init(SHAPES)):
        # torch orthogonalizes in bfloat16 (8 bits of mantissa): compare the updates to that precision
        np.testing.assert_allclose(mine - start, want - start, atol=0.02 * np.abs(want - start).max())
    for mine, want in zip(got, run_numpy(SHAPES, **kw)):
        np.testing.assert_allclose(mine, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(3, 2, 2, 2), (5,)])
def test_conv_weights_and_biases_are_orthogonalized_as_matrices(shape: tuple[int, ...]) -> None:
    got = run_lazygrad([shape], lr=0.02, ns_steps=3, ns_params=(3.0, -3.2, 1.2))
    for mine, want in zip(got, run_numpy([shape], lr=0.02, ns_steps=3, coefficients=(3.0, -3.2, 1.2))):
        np.testing.assert_allclose(mine, want, rtol=1e-4, atol=1e-5)


def test_errors() -> None:
    with pytest.raises(InputError, match="adjust_lr_fn"):
        Muon([Tensor.ones(3, 3)], adjust_lr_fn="bogus")
    with pytest.raises(InputError, match="ns_steps"):
        Muon([Tensor.ones(3, 3)], ns_steps=100)
