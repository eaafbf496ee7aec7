"""Optimizers: SGD (momentum, nesterov, weight decay), Adam, AdamW, LAMB (tinygrad's signatures) and Muon (torch's).

A step is lazy graph work like everything else: each parameter and state tensor is `assign`ed its update, and
`step()` realizes them all in one schedule, so the backward pass fuses into the update kernels. The learning rate
and Adam's bias-correction powers live in small tensors rather than Python floats, so a changing learning rate
does not change the kernels (and never recompiles them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lazygrad.errors import InputError
from lazygrad.multi import device_uops
from lazygrad.tensor import Tensor, _all_tensors, _holding
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.tensor_graph import base_buffer, is_view_of_leaf, view_base
from lazygrad_uop.uop import UOp

__all__ = ["LAMB", "SGD", "Adam", "AdamW", "Muon", "Optimizer", "OptimizerGroup"]


def _dedup(tensors: Sequence[Tensor]) -> list[Tensor]:
    seen: set[int] = set()
    return [t for t in tensors if not (id(t) in seen or seen.add(id(t)))]


def _zeros(p: Tensor, dtype: DType | None = None) -> Tensor:
    """Zeros shaped as `p` in a buffer of their own. (`Tensor.zeros(...).contiguous()` would not do: equal lazy
    graphs are one node, so two of them realized together would share one buffer.)"""
    dt = dtype or p.dtype
    if p.uop.op is Ops.MULTI:
        # state of a parameter on several devices is split (or replicated) as the parameter is
        return Tensor(UOp(Ops.MULTI, dt, tuple(_zeros(Tensor(u), dt).uop for u in p.uop.src), p.uop.arg))
    return Tensor.empty(*p.shape, dtype=dt, device=p.device).assign(Tensor.zeros(*p.shape, dtype=dt, device=p.device))


def _state_tensor(value: float, like: Tensor) -> Tensor:
    """A realized one-element float32 tensor on `like`'s device: state that kernels read instead of a constant."""
    return Tensor([value], device=like.device, dtype=dtypes.float32).requires_grad_(False)


class Optimizer:
    """The base of every optimizer: `params` with requires_grad None become trainable (True), those with False are
    state to keep realized alongside (e.g. BatchNorm's running statistics).

    Subclasses implement `_step(grads)`, which assigns each parameter its update and returns the state tensors it
    changed.
    """

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor) -> None:
        for p in params:
            if p.requires_grad is None:
                p.requires_grad = True
        self.params = _dedup([p for p in params if p.requires_grad])
        if not self.params:
            raise InputError(
                "the optimizer got no parameters to train; pass get_parameters(model) or a list of tensors"
            )
        self.buffers = _dedup([p for p in params if not p.requires_grad])
        self.device = self.params[0].device
        self.lr = lr if isinstance(lr, Tensor) else _state_tensor(lr, self.params[0])

    def zero_grad(self) -> None:
        """Forget the gradients of every parameter (the next backward() starts from zero)."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Update every parameter from its `.grad`, realizing all of it in one schedule."""
        parts = [u for p in (*self.params, *self.buffers) for u in device_uops(p.uop)]
        before = {base_buffer(view_base(u)) for u in parts if is_view_of_leaf(u)}
        targets = self.schedule_step()
        Tensor.realize(*targets, *_unrealized_readers(before, targets))

    def schedule_step(self) -> list[Tensor]:
        """Assign the updates without running them; returns the tensors to realize (parameters, state, buffers)."""
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:
            raise RuntimeError(
                f"parameters {missing} have no .grad: call loss.backward() before step(), and check that the loss "
                "depends on every parameter given to the optimizer"
            )
        grads = [p.grad for p in self.params]
        state = self._step(grads)  # type: ignore[arg-type]
        return [*self.params, *state, *self.buffers, self.lr]

    def _step(self, grads: list[Tensor]) -> list[Tensor]:
        raise NotImplementedError(f"{type(self).__name__} must implement _step(grads)")

    def _lr(self, p: Tensor) -> Tensor | float:
        return self.lr.cast(p.dtype) if isinstance(self.lr, Tensor) else self.lr


def _unrealized_readers(buffers: set, exclude: list[Tensor]) -> list[Tensor]:
    """Live lazy tensors (a loss, an output, a gradient) that read parameter buffers a step is about to overwrite:
    they are realized in the same schedule, before the writes, so they keep the values they were built from."""
    skip = {id(t) for t in exclude}
    # one walk over all of their graphs, not a toposort per tensor: a step's gradients and activations share most
    # of their nodes
    candidates = [t for t in list(_all_tensors) if id(t) not in skip and not is_view_of_leaf(t.uop)]
    return _holding(candidates, {u for u in buffers if u.op is Ops.BUFFER}, remember=False)


class OptimizerGroup(Optimizer):
    """Several optimizers stepped as one (e.g. different learning rates for different parameters)."""

    def __init__(self, *optimizers: Optimizer) -> None:
        self.optimizers = optimizers
        self.params = [p for o in optimizers for p in o.params]
        self.buffers = [b for o in optimizers for b in o.buffers]

    def __getitem__(self, i: int) -> Optimizer:
        return self.optimizers[i]

    def zero_grad(self) -> None:
        """Forget the gradients of every optimizer's parameters."""
        for o in self.optimizers:
            o.zero_grad()

    def schedule_step(self) -> list[Tensor]:
        """Every optimizer's update, to realize together."""
        return [t for o in self.optimizers for t in o.schedule_step()]


class SGD(Optimizer):
    """Stochastic gradient descent as torch.optim.SGD (dampening 0): g = grad + weight_decay * p;
    with momentum, b = momentum * b + g and the step uses b (nesterov: g + momentum * b); p -= lr * step."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float | Tensor = 0.001,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        if nesterov and momentum <= 0:
            raise InputError("nesterov momentum needs momentum > 0")
        super().__init__(params, lr)
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
        # momentum buffers start at zero, so the first step's buffer is the gradient itself, as in torch
        self.b = [_zeros(p) for p in self.params] if momentum else []
        if self.b:
            Tensor.realize(*self.b)

    def _step(self, grads: list[Tensor]) -> list[Tensor]:
        for i, (p, g) in enumerate(zip(self.params, grads)):
            g = g.detach()
            if self.weight_decay:
                g = g + self.weight_decay * p.detach()
            if self.momentum:
                b = self.b[i].assign(self.momentum * self.b[i] + g)
                g = g + self.momentum * b if self.nesterov else b
            p.assign((p.detach() - self._lr(p) * g).cast(p.dtype))
        return self.b


class LAMB(Optimizer):
    """LAMB (layer-wise adaptive moments): Adam's update u = m^ / (sqrt(v^) + eps) + weight_decay * p, scaled per
    parameter by the trust ratio ||p|| / ||u||. With adam=True the trust ratio is 1: that is AdamW (and Adam when
    weight_decay is 0), with decoupled weight decay as in torch.optim.AdamW."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float | Tensor = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adam: bool = False,
        *,
        betas: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(params, lr)
        self.b1, self.b2 = betas if betas is not None else (b1, b2)
        self.eps, self.weight_decay, self.adam = eps, weight_decay, adam
        # b1**t and b2**t for the bias correction, advanced on the device with every step
        self.b1_t, self.b2_t = _state_tensor(1.0, self.params[0]), _state_tensor(1.0, self.params[0])
        self.m = [_zeros(p, dtypes.float32) for p in self.params]
        self.v = [_zeros(p, dtypes.float32) for p in self.params]
        Tensor.realize(*self.m, *self.v)

    def _step(self, grads: list[Tensor]) -> list[Tensor]:
        self.b1_t.assign(self.b1_t * self.b1)
        self.b2_t.assign(self.b2_t * self.b2)
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            g = g.detach().float()
            m.assign(self.b1 * m + (1.0 - self.b1) * g)
            v.assign(self.b2 * v + (1.0 - self.b2) * g * g)
            m_hat = m / (1.0 - self.b1_t)
            v_hat = v / (1.0 - self.b2_t)
            up = m_hat / (v_hat.sqrt() + self.eps) + self.weight_decay * p.detach().float()
            if self.adam:
                step = self._lr(p) * up
            else:
                r1 = p.detach().float().square().sum().sqrt()
                r2 = up.square().sum().sqrt()
                trust = (r1 > 0).where((r2 > 0).where(r1 / r2, 1.0), 1.0)
                step = self._lr(p) * trust * up
            p.assign((p.detach() - step).cast(p.dtype))
        return [self.b1_t, self.b2_t, *self.m, *self.v]


class Adam(LAMB):
    """Adam as torch.optim.Adam; weight_decay adds weight_decay * p to the gradient (L2, not decoupled)."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float | Tensor = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        betas: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(params, lr, b1, b2, eps, 0.0, adam=True, betas=betas)
        self.l2 = weight_decay

    def _step(self, grads: list[Tensor]) -> list[Tensor]:
        if self.l2:
            grads = [g + self.l2 * p.detach() for g, p in zip(grads, self.params)]
        return super()._step(grads)


class AdamW(LAMB):
    """AdamW as torch.optim.AdamW: Adam with decoupled weight decay (p -= lr * weight_decay * p)."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float | Tensor = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        *,
        betas: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(params, lr, b1, b2, eps, weight_decay, adam=True, betas=betas)


class Muon(Optimizer):
    """Muon (momentum orthogonalized by Newton-Schulz) as torch.optim.Muon: the momentum buffer is an average,
    b = momentum * b + (1 - momentum) * g; the update u = (1 - momentum) * g + momentum * b with nesterov (else b) is
    orthogonalized by `ns_steps` iterations of the quintic X <- a X + (b A + c A^2) X, A = X X^T, from X = u / ||u||;
    then p *= 1 - lr * weight_decay and p -= lr * sqrt(max(1, rows / cols)) * X ("original"), or
    lr * 0.2 * sqrt(max(rows, cols)) * X ("match_rms_adamw").

    A parameter is orthogonalized as the matrix (first dimension) x (the rest): a conv weight as (out, in * kh * kw),
    a bias as a column, as tinygrad's Muon does (torch's accepts matrices only; biases are usually better given to
    AdamW, and `OptimizerGroup` steps both as one).
    The iteration runs in float32 (torch's in bfloat16), so results agree with torch to bfloat16 precision.
    `ns_params` is tinygrad's name for `ns_coefficients`.
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float | Tensor = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315),
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        *,
        ns_params: tuple[float, float, float] | None = None,
    ) -> None:
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise InputError(f"adjust_lr_fn must be None, 'original' or 'match_rms_adamw', got {adjust_lr_fn!r}")
        if not 0 <= ns_steps < 100:
            raise InputError(f"ns_steps must be in [0, 100), got {ns_steps}")
        super().__init__(params, lr)
        self.weight_decay, self.momentum, self.nesterov = weight_decay, momentum, nesterov
        self.coefficients = ns_params if ns_params is not None else ns_coefficients
        self.eps, self.ns_steps, self.adjust_lr_fn = eps, ns_steps, adjust_lr_fn
        self.b = [_zeros(p, dtypes.float32) for p in self.params]
        Tensor.realize(*self.b)

    def _orthogonalized(self, u: Tensor) -> Tensor:
        a, b, c = self.coefficients
        tall = u.shape[0] > u.shape[1]
        x = u.T if tall else u  # the Gram matrix of the shorter side is the smaller one
        x = x / x.square().sum().sqrt().maximum(self.eps)
        for _ in range(self.ns_steps):
            gram = x @ x.T
            x = a * x + (b * gram + c * (gram @ gram)) @ x
        return x.T if tall else x

    def _step(self, grads: list[Tensor]) -> list[Tensor]:
        for p, g, buf in zip(self.params, grads, self.b):
            g = g.detach().float()
            buf.assign(self.momentum * buf + (1.0 - self.momentum) * g)
            u = (1.0 - self.momentum) * g + self.momentum * buf if self.nesterov else buf
            rows, cols = (p.shape[0], math.prod(p.shape[1:])) if p.ndim else (1, 1)
            ortho = self._orthogonalized(u.reshape(rows, cols)).reshape(p.shape)
            if self.adjust_lr_fn == "match_rms_adamw":
                scale = 0.2 * math.sqrt(max(rows, cols))
            else:
                scale = math.sqrt(max(1.0, rows / cols))
            lr = self._lr(p)
            decayed = p.detach().float() * (1.0 - lr * self.weight_decay)
            p.assign((decayed - lr * scale * ortho).cast(p.dtype))
        return self.b
