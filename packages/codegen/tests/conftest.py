"""Fixtures: builders of kernel-AST nodes (`k`) and a runner of kernels through the system C compiler (`run_cc`).
Tests import the shared helpers (`codegen_cases`, `codegen_c`) by those unique names (pytest.ini's pythonpath)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from codegen_c import GridCRenderer, cc_available, run_c

from lazygrad_codegen import CRenderer, kernel_ast
from lazygrad_uop.uop import UOp


@pytest.fixture
def k() -> ModuleType:
    """The kernel-AST builders."""
    return kernel_ast


@pytest.fixture
def run_cc(tmp_path: Path) -> Callable[..., dict[int, np.ndarray]]:
    if not cc_available():
        pytest.skip("no C compiler (cc) on PATH to compile the C renderer's output")

    def go(ast: UOp, inputs: dict[int, np.ndarray], vals: tuple[int, ...] = (), grid: bool = False) -> dict:
        return run_c(tmp_path, ast, GridCRenderer() if grid else CRenderer(), inputs, vals)[0]

    return go
