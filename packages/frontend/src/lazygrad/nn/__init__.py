"""Neural-network layers, named and initialised as in tinygrad and PyTorch.

A layer is a plain object: its parameters are Tensor attributes, found by `lazygrad.nn.state.get_parameters` and
`get_state_dict` under the same names as in PyTorch (`weight`, `bias`, `running_mean`, ...), and calling it applies
it. There is no Module base class: any object holding tensors (or lists and dicts of them) is a model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lazygrad.errors import InputError, KindError
from lazygrad.index_checks import record as record_index_check
from lazygrad.indexing import kernel_iota, stored
from lazygrad.nn import datasets, lr_scheduler, optim, state
from lazygrad.tensor import Tensor
from lazygrad_uop.dtype import dtypes

__all__ = [
    "BatchNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv1d",
    "Conv2d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "Embedding",
    "GroupNorm",
    "InstanceNorm",
    "LSTMCell",
    "LayerNorm",
    "LayerNorm2d",
    "Linear",
    "RMSNorm",
    "datasets",
    "lr_scheduler",
    "optim",
    "state",
]


def _own(t: Tensor) -> Tensor:
    """`t` in a buffer of its own. Equal lazy graphs are one node, so two layers' `Tensor.ones(n)` realized together
    would otherwise share one buffer, and training one would train the other."""
    return Tensor.empty(*t.shape, dtype=t.dtype, device=t.device).assign(t)


def _uniform(*shape: int, bound: float) -> Tensor:
    """Uniform in [-bound, bound): PyTorch's default initialisation, with bound 1/sqrt(fan_in) for most layers."""
    return Tensor.uniform(*shape, low=-bound, high=bound)


def _tuple(x: int | Sequence[int], n: int) -> tuple[int, ...]:
    return (x,) * n if isinstance(x, int) else tuple(x)


class Linear:
    """y = x @ weight.T + bias, with weight of shape (out_features, in_features) as in PyTorch."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        # kaiming_uniform with a=sqrt(5), PyTorch's default, is uniform with bound 1/sqrt(fan_in)
        bound = 1 / math.sqrt(in_features)
        self.weight = _uniform(out_features, in_features, bound=bound)
        self.bias: Tensor | None = _uniform(out_features, bound=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        y = x @ self.weight.T
        return y + self.bias if self.bias is not None else y


class Conv2d:
    """A 2-d convolution over (N, C, H, W) inputs; weight (out_channels, in_channels // groups, *kernel_size)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | str = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        bias: bool = True,
        dims: int = 2,
    ) -> None:
        if in_channels % groups or out_channels % groups:
            raise InputError(
                f"in_channels {in_channels} and out_channels {out_channels} must divide by groups {groups}"
            )
        self.kernel_size = _tuple(kernel_size, dims)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        # kaiming_uniform with a=sqrt(5), PyTorch's default, is uniform with bound 1/sqrt(fan_in)
        bound = 1 / math.sqrt(in_channels // groups * math.prod(self.kernel_size))
        self.weight = _uniform(out_channels, in_channels // groups, *self.kernel_size, bound=bound)
        self.bias: Tensor | None = _uniform(out_channels, bound=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv2d(
            self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation, padding=self.padding
        )


class Conv1d(Conv2d):
    """A 1-d convolution over (N, C, L) inputs; weight (out_channels, in_channels // groups, kernel_size)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | str = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, dims=1)


class ConvTranspose2d:
    """The transpose (gradient) of Conv2d; weight (in_channels, out_channels // groups, *kernel_size) as in PyTorch."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        output_padding: int | Sequence[int] = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: int | Sequence[int] = 1,
        dims: int = 2,
    ) -> None:
        if in_channels % groups or out_channels % groups:
            raise InputError(
                f"in_channels {in_channels} and out_channels {out_channels} must divide by groups {groups}"
            )
        self.kernel_size = _tuple(kernel_size, dims)
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.dilation, self.groups = dilation, groups
        # PyTorch computes fan_in from weight.shape[1] * prod(kernel): out_channels // groups here
        bound = 1 / math.sqrt(out_channels // groups * math.prod(self.kernel_size))
        self.weight = _uniform(in_channels, out_channels // groups, *self.kernel_size, bound=bound)
        self.bias: Tensor | None = _uniform(out_channels, bound=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(
            self.weight,
            self.bias,
            groups=self.groups,
            stride=self.stride,
            dilation=self.dilation,
            padding=self.padding,
            output_padding=self.output_padding,
        )


class ConvTranspose1d(ConvTranspose2d):
    """The transpose of Conv1d; weight (in_channels, out_channels // groups, kernel_size)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        output_padding: int | Sequence[int] = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: int | Sequence[int] = 1,
    ) -> None:
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, bias, dilation, dims=1
        )


class BatchNorm:
    """Batch normalisation over the channel axis (axis 1) of (N, C, ...) inputs.

    In training (`Tensor.training`, see `Tensor.train()`) it normalises with the batch statistics and updates
    `running_mean`/`running_var` (the unbiased variance, as PyTorch); otherwise it uses the running statistics.
    """

    def __init__(
        self,
        sz: int,
        eps: float = 1e-5,
        affine: bool = True,
        track_running_stats: bool = True,
        momentum: float = 0.1,
    ) -> None:
        self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
        self.weight: Tensor | None = _own(Tensor.ones(sz)) if affine else None
        self.bias: Tensor | None = _own(Tensor.zeros(sz)) if affine else None
        if track_running_stats:
            # requires_grad=False: state an optimizer realizes with each step, but never differentiates
            self.running_mean = _own(Tensor.zeros(sz)).requires_grad_(False)
            self.running_var = _own(Tensor.ones(sz)).requires_grad_(False)
            self.num_batches_tracked = _own(Tensor.zeros((), dtype=dtypes.int64)).requires_grad_(False)

    def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The batch mean and inverse standard deviation over every axis but the channels."""
        mean, var = self._batch_stats(x)
        return mean, (var + self.eps).rsqrt()

    def _batch_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        axes = tuple(i for i in range(x.ndim) if i != 1)
        mean = x.mean(axis=axes)
        # centred with a detached mean: d(var)/d(mean) is zero, so this saves backward work and changes nothing
        y = x - mean.detach().reshape(1, -1, *[1] * (x.ndim - 2))
        return mean, (y * y).mean(axis=axes)

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2:
            raise InputError(f"BatchNorm needs (N, C, ...) inputs, got shape {x.shape}")
        if not Tensor.training and self.track_running_stats:
            return x.batchnorm(self.weight, self.bias, self.running_mean, (self.running_var + self.eps).rsqrt())
        mean, var = self._batch_stats(x)
        if Tensor.training and self.track_running_stats:
            n, m = x.numel() // x.shape[1], self.momentum
            unbiased = var.detach() * (n / max(n - 1, 1))
            self.running_mean.assign((1 - m) * self.running_mean + m * mean.detach())
            self.running_var.assign((1 - m) * self.running_var + m * unbiased)
            self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class LayerNorm:
    """Normalises over the last len(normalized_shape) axes, then scales by `weight` and shifts by `bias`."""

    def __init__(
        self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True
    ) -> None:
        self.normalized_shape = _tuple(normalized_shape, 1)
        self.axis = tuple(-1 - i for i in range(len(self.normalized_shape)))
        self.eps = eps
        self.weight: Tensor | None = _own(Tensor.ones(*self.normalized_shape)) if elementwise_affine else None
        self.bias: Tensor | None = _own(Tensor.zeros(*self.normalized_shape)) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.shape[-len(self.normalized_shape) :] != self.normalized_shape:
            raise InputError(f"LayerNorm over {self.normalized_shape} got an input of shape {x.shape}")
        x = x.layernorm(axis=self.axis, eps=self.eps)
        return x if self.weight is None else x * self.weight + self.bias


class GroupNorm:
    """Normalises (N, C, ...) inputs over groups of C // num_groups channels, with a per-channel affine."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        if num_channels % num_groups:
            raise InputError(f"num_channels {num_channels} must divide by num_groups {num_groups}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight: Tensor | None = _own(Tensor.ones(num_channels)) if affine else None
        self.bias: Tensor | None = _own(Tensor.zeros(num_channels)) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise InputError(f"GroupNorm over {self.num_channels} channels got an input of shape {x.shape}")
        x = x.reshape(x.shape[0], self.num_groups, -1).layernorm(axis=-1, eps=self.eps).reshape(x.shape)
        if self.weight is None:
            return x
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return x * self.weight.reshape(shape) + self.bias.reshape(shape)


class LayerNorm2d(LayerNorm):
    """LayerNorm over the channels of (N, C, H, W) inputs, at each position."""

    def __call__(self, x: Tensor) -> Tensor:
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class InstanceNorm:
    """Normalises each channel of each sample of (N, C, ...) inputs over its positions, with a per-channel affine
    (PyTorch's InstanceNorm with affine=True, without running statistics)."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True) -> None:
        self.num_features, self.eps = num_features, eps
        self.weight: Tensor | None = _own(Tensor.ones(num_features)) if affine else None
        self.bias: Tensor | None = _own(Tensor.zeros(num_features)) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 3 or x.shape[1] != self.num_features:
            raise InputError(f"InstanceNorm over {self.num_features} channels got an input of shape {x.shape}")
        x = x.reshape(x.shape[0], x.shape[1], -1).layernorm(axis=-1, eps=self.eps).reshape(x.shape)
        if self.weight is None:
            return x
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return x * self.weight.reshape(shape) + self.bias.reshape(shape)


class RMSNorm:
    """x / sqrt(mean(x**2, last axis) + eps) * weight, computed in float32 for low-precision inputs."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        self.eps = eps
        self.weight: Tensor | None = _own(Tensor.ones(dim)) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        xf = x.float()
        out = (xf * (xf.square().mean(-1, keepdim=True) + self.eps).rsqrt()).cast(x.dtype)
        return out if self.weight is None else out * self.weight


class Embedding:
    """A lookup table: integer indices of any shape -> rows of `weight` (vocab_size, embed_size)."""

    def __init__(self, vocab_size: int, embed_size: int) -> None:
        self.vocab_size, self.embed_size = vocab_size, embed_size
        # PyTorch's default: standard normal
        self.weight = Tensor.randn(vocab_size, embed_size)

    def __call__(self, idx: Tensor) -> Tensor:
        if dtypes.is_float(idx.dtype):
            raise KindError(f"Embedding needs integer indices, got {idx.dtype!r}")
        # a one-hot matmul: differentiable with the primitives autograd knows, and fused into one reduction, which
        # codegen lowers to one load per output (the arange is computed in the kernel, the ids are stored first)
        record_index_check(f"Embedding with {self.vocab_size} rows", idx, 0, self.vocab_size)
        arange = kernel_iota(Tensor, self.vocab_size, idx.dtype, idx.device)
        one_hot = stored(idx).unsqueeze(-1).eq(arange).cast(self.weight.dtype)
        return one_hot @ self.weight


class LSTMCell:
    """One step of an LSTM: (x, (h, c)) -> (h', c'), with PyTorch's gate order i, f, g, o and weight layout."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        self.hidden_size = hidden_size
        bound = 1 / math.sqrt(hidden_size)
        self.weight_ih = _uniform(4 * hidden_size, input_size, bound=bound)
        self.weight_hh = _uniform(4 * hidden_size, hidden_size, bound=bound)
        self.bias_ih: Tensor | None = _uniform(4 * hidden_size, bound=bound) if bias else None
        self.bias_hh: Tensor | None = _uniform(4 * hidden_size, bound=bound) if bias else None

    def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if hc is None:
            hc = (Tensor.zeros(x.shape[0], self.hidden_size), Tensor.zeros(x.shape[0], self.hidden_size))
        h, c = hc
        gates = x @ self.weight_ih.T + h @ self.weight_hh.T
        if self.bias_ih is not None and self.bias_hh is not None:
            gates = gates + self.bias_ih + self.bias_hh
        hs = self.hidden_size
        i, f, g, o = (gates[:, k * hs : (k + 1) * hs] for k in range(4))
        new_c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        new_h = o.sigmoid() * new_c.tanh()
        return new_h, new_c
