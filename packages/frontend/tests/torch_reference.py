"""Helpers of the Tensor API tests: run an op in lazygrad and in torch (the test-only reference) on the same random
inputs and compare the outputs (shape, dtype, values) and, for float inputs, the gradients of a random weighting;
`conv_passes_match_torch` does so for a convolution's forward and both gradients."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lazygrad import Tensor
from lazygrad_uop.dtype import DType, dtypes


def rand(shape: Sequence[int], seed: int, low: float = -2.0, high: float = 2.0, dtype: Any = np.float32) -> np.ndarray:
    """Seeded uniform values (integers in [low, high] for integer dtypes, booleans half true)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(tuple(shape)) < 0.5
    if dt.kind in "iu":
        return rng.integers(int(low), int(high) + 1, size=tuple(shape)).astype(dt)
    return rng.uniform(low, high, size=tuple(shape)).astype(dt)


def _flat(x: Any) -> list[Any]:
    return [v for item in x for v in _flat(item)] if isinstance(x, (tuple, list)) else [x]


def compare(
    fn: Callable[..., Any],
    tfn: Callable[..., Any],
    inputs: Sequence[np.ndarray],
    device: str = "CPU",
    grad: bool = True,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    grad_tol: tuple[float, float] = (1e-4, 1e-5),
    check_dtype: bool = True,
    nondiff: Sequence[int] = (),
) -> None:
    """fn(*tensors) equals tfn(*torch_tensors) (every output of a tuple); with grad, so do the gradients of
    sum(out * random weights) with respect to every float input (except those numbered in `nondiff`)."""
    import torch

    floats = [a.dtype.kind == "f" and i not in nondiff for i, a in enumerate(inputs)]
    grad = grad and any(floats)
    xs = [Tensor(a, device=device, requires_grad=(grad and f) or None) for a, f in zip(inputs, floats)]
    ts = [torch.tensor(a, requires_grad=grad and f) for a, f in zip(inputs, floats)]
    outs, touts = _flat(fn(*xs)), _flat(tfn(*ts))
    assert len(outs) == len(touts), f"{len(outs)} outputs, torch has {len(touts)}"
    if grad:
        diff = [(o, t) for o, t in zip(outs, touts) if t.dtype.is_floating_point and t.requires_grad]
        if diff:
            weights = [rand(tuple(t.shape), 1000 + i) for i, (_, t) in enumerate(diff)]
            terms = [(o.float() * Tensor(w, device=device)).sum() for (o, _), w in zip(diff, weights)]
            loss = sum(terms[1:], start=terms[0])
            tloss = sum((t.float() * torch.tensor(w)).sum() for (_, t), w in zip(diff, weights))
            loss.backward()
            tloss.backward()
    for i, (o, t) in enumerate(zip(outs, touts)):
        ref = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        got = o.numpy()
        assert got.shape == ref.shape, f"output {i}: shape {got.shape}, torch {ref.shape}"
        if check_dtype:
            assert got.dtype == ref.dtype, f"output {i}: dtype {got.dtype}, torch {ref.dtype}"
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"output {i}")
    if grad:
        for i, (x, t) in enumerate(zip(xs, ts)):
            if t.grad is None:
                continue
            assert x.grad is not None, f"input {i} got no gradient"
            np.testing.assert_allclose(
                x.grad.numpy(), t.grad.numpy(), rtol=grad_tol[0], atol=grad_tol[1], err_msg=f"gradient of input {i}"
            )


def conv_passes_match_torch(
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    padding: Any,
    groups: int = 1,
    stride: Any = 1,
    dilation: Any = 1,
    dtype: DType = dtypes.float32,
    tol: float = 1e-4,
    device: str | None = None,
) -> None:
    """conv2d of seeded random inputs of shapes `xs` and `ws` in `dtype` on `device`, its forward, input gradient and
    weight gradient (from a random output gradient) against torch's in float64 from the same values rounded to
    `dtype`. A flat padding of two values per spatial dim is torch's F.pad before the convolution."""
    import torch

    fn = torch.nn.functional
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x_np = rng.standard_normal(xs).astype(np.float32)
    w_np = (rng.standard_normal(ws) / math.sqrt(math.prod(ws[1:]))).astype(np.float32)
    x = Tensor(x_np, device=device).cast(dtype).requires_grad_()
    w = Tensor(w_np, device=device).cast(dtype).requires_grad_()
    out = x.conv2d(w, groups=groups, stride=stride, dilation=dilation, padding=padding)
    tdt = {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16}.get(dtype, torch.float32)
    tx, tw = (torch.from_numpy(v).to(tdt).double().requires_grad_() for v in (x_np, w_np))
    pad, tx_in = padding, tx
    if isinstance(padding, tuple) and len(padding) == 2 * (len(xs) - 2):
        tx_in, pad = fn.pad(tx, padding), 0
    conv = {3: fn.conv1d, 4: fn.conv2d, 5: fn.conv3d}[len(xs)]
    tout = conv(tx_in, tw, stride=stride, padding=pad, dilation=dilation, groups=groups)
    assert out.shape == tuple(tout.shape)
    g_np = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    dx, dw = out.gradient(x, w, gradient=Tensor(g_np, device=device).cast(dtype))
    tdx, tdw = torch.autograd.grad(tout, (tx, tw), torch.from_numpy(g_np).to(tdt).double())
    for got, want in ((out, tout), (dx, tdx), (dw, tdw)):
        assert got.dtype == dtype
        ref = want.detach().numpy()
        np.testing.assert_allclose(got.float().numpy(), ref, rtol=tol, atol=tol * max(1.0, np.abs(ref).max()))
