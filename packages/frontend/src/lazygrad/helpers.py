"""The helpers tinygrad programs import from `tinygrad.helpers`, so that porting one changes only its imports:
`getenv`, `Context`, `colored`, `Timing`, `trange`/`tqdm` (tqdm's own, when it is installed) and `GlobalCounters`.

`Context` takes lazygrad's settings (`DEBUG`, `BEAM`, `JIT`, ...) and `TRAINING`, which does what `Tensor.train()`
does: `with Context(TRAINING=1):` is `with Tensor.train():`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from lazygrad.counters import GlobalCounters
from lazygrad.errors import InputError
from lazygrad_uop.config import Context as _SettingsContext
from lazygrad_uop.config import getenv

__all__ = ["Context", "GlobalCounters", "Timing", "colored", "getenv", "tqdm", "trange"]

_COLORS = ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white")


def colored(text: str, color: str | None, background: bool = False) -> str:
    """`text` wrapped in the ANSI escape codes of `color` (one of black red green yellow blue magenta cyan white;
    upper case for the bright variant; None: unchanged), as foreground or with background=True as background."""
    if color is None:
        return text
    if color.lower() not in _COLORS:
        raise InputError(f"unknown color {color!r}; use one of {', '.join(_COLORS)} (upper case for bright)")
    code = _COLORS.index(color.lower()) + (60 if color.isupper() else 0) + (40 if background else 30)
    return f"\u001b[{code}m{text}\u001b[0m"


class Timing(contextlib.ContextDecorator):
    """`with Timing("step "):` prints how long the block took: the prefix, the time in ms (or in the unit that
    `on_exit`'s text follows) and, if given, `on_exit(nanoseconds)`'s text. enabled=False prints nothing."""

    def __init__(self, prefix: str = "", on_exit: Callable[[int], str] | None = None, enabled: bool = True) -> None:
        self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled
        self.st = 0

    def __enter__(self) -> Timing:
        self.st = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.et = time.perf_counter_ns() - self.st
        if self.enabled:
            print(f"{self.prefix}{self.et * 1e-6:6.2f} ms" + (self.on_exit(self.et) if self.on_exit else ""))


@contextlib.contextmanager
def Context(**settings: Any) -> Iterator[None]:  # noqa: N802 - reads as a class at call sites, like tinygrad's
    """Temporarily override settings, restoring them on exit: `with Context(DEBUG=2, BEAM=4):`. `TRAINING=1` (or
    0) switches `Tensor.training` for the block as `Tensor.train()` (or `Tensor.train(False)`) does."""
    from lazygrad.tensor import Tensor  # the tensor module imports the engine, which imports this package's counters

    training = settings.pop("TRAINING", None)
    with contextlib.ExitStack() as stack:
        if training is not None:
            stack.enter_context(Tensor.train(bool(training)))
        stack.enter_context(_SettingsContext(**settings))
        yield


try:
    from tqdm import tqdm, trange
except ImportError:  # tqdm is optional: only programs that draw progress bars need it

    def _no_tqdm(*args: Any, **kwargs: Any) -> Any:
        raise ImportError("lazygrad.helpers.tqdm/trange wrap the tqdm package: `pip install tqdm`")

    tqdm = trange = _no_tqdm
