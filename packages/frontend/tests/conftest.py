"""Shared fixtures: the op suite runs on every device given here, each checked against numpy; `compiles` records the
kernels compiled while a test runs; `load_example` imports a script of examples/ for the tests of the examples;
`emulated_gpu` makes the PYTHON device a GPU with warps, `tensor_core_gpu` one with CUDA's tensor cores."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings

import lazygrad.compiling
from lazygrad_uop.registry import Device

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

settings.register_profile("ops", max_examples=12, deadline=None, derandomize=True)
settings.load_profile("ops")

OP_DEVICES = ["CPU", "PYTHON", "CL", "CUDA"]


@pytest.fixture(params=OP_DEVICES, scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """Each device of the op suite, skipped where this machine can't run it."""
    why = Device.usable(request.param) if request.param in Device.installed() else "not installed"
    if why is not None:
        pytest.skip(f"{request.param} device unavailable: {why}")
    return request.param


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Every kernel AST compiled while the test runs (generated, or read back from the program cache)."""
    seen: list[object] = []
    real = lazygrad.compiling.cached_program

    def counting(ast, renderer, *args, **kwargs):
        seen.append(ast)
        return real(ast, renderer, *args, **kwargs)

    monkeypatch.setattr(lazygrad.compiling, "cached_program", counting)
    yield seen


@pytest.fixture(scope="session")
def load_example() -> object:
    """`load_example(name)`: examples/`name`.py as a module (the test skips where the checkout has no examples)."""

    def load(name: str) -> ModuleType:
        path = EXAMPLES / f"{name}.py"
        if not path.exists():
            pytest.skip(f"{path} is not in this checkout")
        spec = importlib.util.spec_from_file_location(f"{name}_example", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up by name while the class is built
        spec.loader.exec_module(module)
        return module

    return load


@contextmanager
def _rendering_for(target: Any) -> Iterator[str]:
    """The PYTHON device rendering for `target` (a `GPUTarget`), its renderer restored afterwards; the programs
    compiled meanwhile are forgotten before and after (runners are cached by kernel, not by renderer)."""
    from lazygrad import engine
    from lazygrad_python import PythonRenderer

    dev = Device["PYTHON"]
    renderer, compiler = dev.renderer, dev.compiler
    engine._runners.clear()
    dev.use_renderer(PythonRenderer(target))
    try:
        yield "PYTHON"
    finally:
        dev.use_renderer(renderer, compiler)
        engine._runners.clear()


@pytest.fixture
def emulated_gpu(request: pytest.FixtureRequest) -> Iterator[str]:
    """The PYTHON device rendering for a GPU (`GPUTarget`) with warps of `request.param` threads (0: no warp
    shuffles, local memory only), restored afterwards. Parametrize it indirectly with the warp sizes."""
    from lazygrad_python.device import GPUTarget

    with _rendering_for(GPUTarget(name=f"EMULATEDGPU{request.param}", warp_size=request.param)) as device:
        yield device


@pytest.fixture
def tensor_core_gpu() -> Iterator[str]:
    """The PYTHON device rendering for a GPU with warps of 32 and CUDA's sm_80 tensor cores, restored afterwards."""
    from lazygrad_python.device import GPUTarget

    cores = pytest.importorskip("lazygrad_cuda.tensor_cores")
    with _rendering_for(GPUTarget(name="TCGPU", tensor_cores=cores.TENSOR_CORES["sm_80"], warp_size=32)) as device:
        yield device


@pytest.fixture
def cuda_like_gpu() -> Iterator[str]:
    """The PYTHON device rendering for a GPU like CUDA's sm_80: warps of 32, its tensor cores, asynchronous copies
    (`cp.async`) and `ldmatrix`, restored afterwards."""
    from lazygrad_python.device import GPUTarget

    cores = pytest.importorskip("lazygrad_cuda.tensor_cores").TENSOR_CORES["sm_80"]
    with _rendering_for(
        GPUTarget(name="CUDALIKE", tensor_cores=cores, warp_size=32, async_copy=True, ldmatrix=True)
    ) as device:
        yield device


@pytest.fixture
def hopper_gpu() -> Iterator[str]:
    """The PYTHON device rendering for a GPU like CUDA's sm_90: its mma.sync and wgmma tensor cores, asynchronous
    copies, ldmatrix, the tensor memory accelerator, an H100's shared memory and CUDA's register budget, restored
    afterwards."""
    from lazygrad_python.device import GPUTarget

    cores = pytest.importorskip("lazygrad_cuda.tensor_cores").TENSOR_CORES["sm_90"]
    target = GPUTarget(
        name="HOPPER", tensor_cores=cores, warp_size=32, async_copy=True, ldmatrix=True, tma=True, shared_max=232448
    )
    with _rendering_for(target) as device:
        Device[device].renderer.max_upcast = 512
        yield device
