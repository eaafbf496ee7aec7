"""The exceptions lazygrad raises for bad input, catchable both as Python's and as PyTorch's/tinygrad's choice.

Python code expects `ValueError` for a bad value, `TypeError` for a bad type and `IndexError` for an index out of
range; code written for PyTorch catches `RuntimeError` for the same mistakes (a shape mismatch in matmul, a bad
permutation), and `NotImplementedError` for an unknown padding mode. Each class here derives from both, so either
`except` clause catches it and the message stays the one that says what was wrong and how to fix it.

(The names have the length of the built-in names they stand for, `raise InputError(...)` where `raise
ValueError(...)` was, so that lines keep their layout.)
"""

from __future__ import annotations

__all__ = ["InputError", "KindError", "RangeError", "UnknownModeError"]


class InputError(ValueError, RuntimeError):
    """A bad value: shapes that don't fit together, a size, an axis or an option outside what is allowed."""


class KindError(TypeError, RuntimeError):
    """An argument of the wrong kind: a dtype an op doesn't take, an object that isn't a tensor or a number."""


class RangeError(IndexError, RuntimeError):
    """An index or a dimension outside the tensor."""


class UnknownModeError(InputError, NotImplementedError):
    """A mode (e.g. of padding) that lazygrad doesn't have: torch raises NotImplementedError for these."""
