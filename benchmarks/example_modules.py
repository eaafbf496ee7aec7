"""The scripts under examples/ as importable modules, for benchmarks that time the examples' own models.

Imports nothing of lazygrad, so a benchmark can load it before setting what must be set before lazygrad is imported
(its cache directory, for one)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example(name: str) -> ModuleType:
    """examples/`name`.py as a module."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
