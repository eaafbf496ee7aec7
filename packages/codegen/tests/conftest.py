"""Fixtures: builders of kernel-AST nodes (`k`) and a runner of kernels through the system C compiler (`run_cc`).
The test folder goes on sys.path so tests can import the shared helpers (`codegen_cases`, `codegen_c`) by those
unique names: the suite runs in importlib mode, which puts no test folder there."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lazygrad_codegen import CRenderer
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker

sys.path.insert(0, str(Path(__file__).parent))

from codegen_c import GridCRenderer, cc_available, run_c


class Kernels:
    """Builders of kernel-AST nodes."""

    @staticmethod
    def buf(slot: int, dtype: DType, size: int) -> UOp:
        return UOp(Ops.DEFINE_GLOBAL, dtype.ptr(size), arg=slot)

    @staticmethod
    def load(slot: int, dtype: DType, st: ShapeTracker, size: int | None = None) -> UOp:
        size = st.real_size() if size is None else size
        return UOp(Ops.LOAD, dtype, (Kernels.buf(slot, dtype, size), UOp(Ops.VIEW, arg=st)))

    @staticmethod
    def const(value: Any, dtype: DType, st: ShapeTracker) -> UOp:
        return UOp(Ops.CONST, dtype, (UOp(Ops.VIEW, arg=st),), dtypes.as_const(value, dtype))

    @staticmethod
    def store(slot: int, value: UOp, st: ShapeTracker, size: int | None = None) -> UOp:
        size = st.real_size() if size is None else size
        return UOp(Ops.STORE, dtypes.void, (Kernels.buf(slot, value.dtype, size), UOp(Ops.VIEW, arg=st), value))

    @staticmethod
    def reduce(x: UOp, op: Ops, axes: tuple[int, ...]) -> UOp:
        return UOp(Ops.REDUCE_AXIS, x.dtype, (x,), (op, axes))

    @staticmethod
    def sink(*stores: UOp) -> UOp:
        return UOp(Ops.SINK, dtypes.void, stores)

    @staticmethod
    def st(*shape: Any) -> ShapeTracker:
        return ShapeTracker.from_shape(shape)


@pytest.fixture
def k() -> type[Kernels]:
    return Kernels


@pytest.fixture
def run_cc(tmp_path: Path) -> Callable[..., dict[int, np.ndarray]]:
    if not cc_available():
        pytest.skip("no C compiler (cc) on PATH to compile the C renderer's output")

    def go(ast: UOp, inputs: dict[int, np.ndarray], vals: tuple[int, ...] = (), grid: bool = False) -> dict:
        return run_c(tmp_path, ast, GridCRenderer() if grid else CRenderer(), inputs, vals)[0]

    return go
