"""Package exports imported on first use: what a device package's `__init__` uses so that importing it (as the
registry does, to load its plugin module) stays cheap, and a missing driver or library shows up as "device not
usable" rather than as a package that fails to import.

    __all__, __getattr__ = lazy_exports(__name__, {"CPUProgram": "lazygrad_cpu.program", ...})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """`__all__` and a module `__getattr__` for `package`: each name of `exports` (name -> the module defining it)
    is imported from its module when first asked for."""
    table = dict(exports)

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module-level hook Python looks up by this name
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return sorted(table), __getattr__
