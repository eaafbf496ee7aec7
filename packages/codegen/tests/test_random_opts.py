"""The main safety net of the optimiser: random valid opt sequences applied to kernels of every kind (elementwise,
broadcasts, padded and permuted views, reductions, matmuls, convolutions, integer math, several outputs) must give the
same results as numpy, on every backend: the PYTHON device pretending to be a GPU (workgroups, grouped reductions
through local memory, float4), the plain PYTHON device, the CPU device (LLVM vectors, threads) and the C renderer."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from codegen_c import cc_available, run_c
from codegen_cases import Case, all_cases, check, cpu_device, random_opts, run_device, run_python

from lazygrad_codegen import CRenderer, Kernel, OptOps

CASES = all_cases()


def _gpu_renderer():
    py = pytest.importorskip("lazygrad_python")
    return py.PythonRenderer(py.GPUTarget(local_max=(16, 16, 16), max_workgroup_threads=64, shared_max=4096))


def _sequences(case: Case, renderer, seed: int, count: int) -> list[list]:
    rng = random.Random(f"{case.name}-{seed}")
    return [random_opts(Kernel(case.ast, renderer), rng, rng.randint(1, 4)) for _ in range(count)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_unoptimised_kernels_match_numpy(case: Case) -> None:
    py = pytest.importorskip("lazygrad_python")
    check(case, run_python(case.ast, py.PythonRenderer(), [], case.inputs)[0], f"{case.name} NOOPT")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_random_opts_on_an_emulated_gpu(case: Case) -> None:
    renderer = _gpu_renderer()
    for opts in _sequences(case, renderer, 0, 6):
        check(case, run_python(case.ast, renderer, opts, case.inputs)[0], f"{case.name} {opts}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_random_opts_on_the_python_device(case: Case) -> None:
    py = pytest.importorskip("lazygrad_python")
    renderer = py.PythonRenderer()
    for opts in _sequences(case, renderer, 1, 3):
        check(case, run_python(case.ast, renderer, opts, case.inputs)[0], f"{case.name} {opts}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_random_opts_on_the_cpu(case: Case) -> None:
    device = cpu_device()
    for opts in _sequences(case, device.renderer, 2, 4):
        check(case, run_device(case.ast, device, opts, case.inputs)[0], f"{case.name} {opts}")


@pytest.mark.skipif(not cc_available(), reason="no C compiler (cc) on PATH")
@pytest.mark.parametrize("case", CASES[::2], ids=[c.name for c in CASES[::2]])
def test_random_opts_with_the_c_renderer(case: Case, tmp_path: Path) -> None:
    for opts in _sequences(case, CRenderer(), 3, 2):
        check(case, run_c(tmp_path, case.ast, CRenderer(), case.inputs, opts=opts)[0], f"{case.name} {opts}")


def test_the_sequences_cover_every_opt() -> None:
    renderer = _gpu_renderer()
    seen = Counter(o.op for case in CASES for opts in _sequences(case, renderer, 0, 6) for o in opts)
    expected = set(OptOps) - {OptOps.TC}  # tensor cores: runtime-python's test_tensor_cores.py
    assert expected <= set(seen), f"never drawn: {expected - set(seen)}"
