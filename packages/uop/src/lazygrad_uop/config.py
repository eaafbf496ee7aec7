"""Runtime configuration: environment variables that can also be overridden in code with `Context`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, ClassVar


def getenv(key: str, default: Any = 0) -> Any:
    """Read environment variable `key`, converted to the type of `default` (int, float, bool or str)."""
    raw = os.environ.get(key)
    if raw is None:
        return default
    if isinstance(default, bool):
        return raw.strip().lower() not in ("", "0", "false", "no", "off")
    if isinstance(default, (int, float)):
        try:
            return type(default)(raw)
        except ValueError:
            raise ValueError(f"environment variable {key}={raw!r} must be a {type(default).__name__}") from None
    return raw


class ContextVar:
    """A named setting read once from the environment and overridable with `Context(NAME=value)`."""

    _registry: ClassVar[dict[str, ContextVar]] = {}

    def __init__(self, key: str, default: Any) -> None:
        if key in ContextVar._registry:
            raise ValueError(f"ContextVar {key!r} is defined twice")
        self.key, self.value = key, getenv(key, default)
        ContextVar._registry[key] = self

    @classmethod
    def get(cls, key: str) -> ContextVar:
        """The setting named `key`; unknown names raise KeyError listing the known ones."""
        if key not in cls._registry:
            raise KeyError(f"unknown setting {key!r}; known settings: {', '.join(sorted(cls._registry))}")
        return cls._registry[key]

    def __bool__(self) -> bool:
        return bool(self.value)

    def __ge__(self, x: int) -> bool:
        return self.value >= x

    def __gt__(self, x: int) -> bool:
        return self.value > x

    def __lt__(self, x: int) -> bool:
        return self.value < x

    def __le__(self, x: int) -> bool:
        return self.value <= x

    def __repr__(self) -> str:
        return f"ContextVar({self.key}={self.value!r})"


@contextlib.contextmanager
def Context(**overrides: Any) -> Iterator[None]:  # noqa: N802 - reads as a class at call sites, like tinygrad's
    """Temporarily override settings: `with Context(DEBUG=4, BEAM=2): ...` restores the old values on exit."""
    saved = {k: ContextVar.get(k).value for k in overrides}
    try:
        for k, v in overrides.items():
            ContextVar.get(k).value = v
        yield
    finally:
        for k, v in saved.items():
            ContextVar.get(k).value = v


DEBUG = ContextVar("DEBUG", 0)
BEAM = ContextVar("BEAM", 0)
NOOPT = ContextVar("NOOPT", 0)
JIT = ContextVar("JIT", 1)
DEV = ContextVar("DEV", "")
CACHELEVEL = ContextVar("CACHELEVEL", 2)
DISABLE_COMPILER_CACHE = ContextVar("DISABLE_COMPILER_CACHE", 0)
# 1 lets float32 matmuls and convolutions run on tensor cores that round their inputs to TF32 (10 mantissa bits,
# `TensorCore.input_mantissa_bits`), as torch's `allow_tf32` does: faster, about 3 decimal digits per input. 0 (the
# default) keeps float32 exact: such a core is never used. One setting for matmuls and convolutions alike: both are the
# same kernels here (a convolution is an implicit matmul), so there is nothing to tell them apart by.
TF32 = ContextVar("TF32", 0)
# 1 lets the default tiles and BEAM take tensor cores that read their operands from shared memory themselves
# (`TensorCore.shared_operands`: Hopper's wgmma on sm_90). 0 (the default) until an H100 has run them: their layouts
# are emulated on the PYTHON device and they compile for sm_90a, but no GPU has checked them yet. Named in opts (TC's
# select) they run either way. 2: the same, and their operands copied into shared memory by the tensor memory
# accelerator (TMA: one thread starts a copy of each tile, the others wait on a barrier that counts its bytes) where
# the operands are plain strided tensors it can describe (`lazygrad_uop.device.TensorMap`), cp.async elsewhere.
WGMMA = ContextVar("WGMMA", 0)
# threads that run one CPU kernel (the CPU device's), by default every core this process may use
CPU_THREADS = ContextVar(
    "CPU_THREADS", len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
)
