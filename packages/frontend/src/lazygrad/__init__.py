"""lazygrad: a deep learning framework with a lazy PyTorch-style Tensor, fused kernels and pluggable backends."""

from lazygrad import nn
from lazygrad.counters import GlobalCounters
from lazygrad.helpers import Context, getenv
from lazygrad.jit import JitError, TinyJit
from lazygrad.tensor import Tensor, no_grad
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.registry import Device
from lazygrad_uop.uop import UOp

__version__ = "0.14.1"

# `Variable("n", 1, 1024).bind(k)` in a shape lets one compiled kernel serve every k in [1, 1024]
Variable = UOp.variable


__all__ = [
    "Context",
    "Device",
    "GlobalCounters",
    "JitError",
    "Tensor",
    "TinyJit",
    "Variable",
    "dtypes",
    "getenv",
    "nn",
    "no_grad",
]
