"""lazygrad: a deep learning framework with a lazy PyTorch-style Tensor, fused kernels and pluggable backends."""

from lazygrad.tensor import Tensor
from lazygrad_uop.config import Context, getenv
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.registry import Device

__version__ = "0.1.0"

__all__ = ["Context", "Device", "Tensor", "dtypes", "getenv"]
