"""The renderer-only plugin: `CPU:C` renders with C and compiles with the system C compiler, and a device name with
the renderer means the same in `Tensor(..., device="CPU:C")` as in `DEV=CPU:C`. The conformance suite runs on it
with `pytest --pyargs lazygrad_testkit --lazygrad-device=CPU:C` (nox's tests session does)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest
from lazygrad_example_c_renderer import CCompiler, CPUCRenderer

from lazygrad_uop.registry import Device

lazygrad = pytest.importorskip("lazygrad")
if shutil.which(os.environ.get("CC", "cc")) is None:
    pytest.skip("no C compiler on PATH", allow_module_level=True)

PROGRAM = """
    import json
    import numpy as np
    from lazygrad import Tensor
    from lazygrad_uop.registry import Device

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = ((Tensor(x{device}) * 3 + 1).sum(axis=1)).numpy()
    dev = Device["CPU"]
    print(json.dumps({{"out": out.tolist(), "renderer": type(dev.renderer).__name__,
                      "compiler": type(dev.compiler).__name__}}))
"""


@pytest.fixture
def cpu_back_to_llvm() -> Iterator[None]:
    """Naming a renderer switches the CPU device for the rest of the process: switch it back afterwards."""
    yield
    Device["CPU:LLVM"]


def _run(device_arg: str, env: dict[str, str]) -> dict:
    code = textwrap.dedent(PROGRAM.format(device=device_arg))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_dev_and_device_name_mean_the_same() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DEV"}
    by_dev = _run("", {**env, "DEV": "CPU:C"})
    by_name = _run(', device="CPU:C"', env)
    plain = _run(', device="CPU"', env)
    want = (np.arange(12, dtype=np.float32).reshape(3, 4) * 3 + 1).sum(axis=1).tolist()
    assert by_dev == by_name == {"out": want, "renderer": "CPUCRenderer", "compiler": "CCompiler"}
    assert plain == {"out": want, "renderer": "CPURenderer", "compiler": "LLVMCompiler"}


def test_kernels_are_c_compiled_by_the_system_compiler(cpu_back_to_llvm: None) -> None:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    got = (lazygrad.Tensor(a, device="CPU:C") @ lazygrad.Tensor(b, device="CPU:C")).exp().numpy()
    dev = Device["CPU"]
    assert isinstance(dev.renderer, CPUCRenderer) and isinstance(dev.compiler, CCompiler)
    np.testing.assert_allclose(got, np.exp(a @ b), rtol=1e-5)


def test_a_compile_error_names_the_compiler() -> None:
    from lazygrad_uop.device import CompileError

    with pytest.raises(CompileError, match="rejected the kernel"):
        CCompiler().compile("int broken(")


def _edge_floats() -> np.ndarray:
    """float32 values around every rounding case of the 16-bit formats: random magnitudes over their whole range
    (subnormals included), ties, values just past the largest finite ones, zeros, infinities, NaN."""
    rng = np.random.default_rng(5)
    wide = (rng.standard_normal(4000) * np.exp2(rng.integers(-30, 20, 4000))).astype(np.float32)
    h = np.arange(0, 0x7C00, 37, dtype=np.uint16).view(np.float16).astype(np.float32)
    ties = (h[:-1] + (h[1:] - h[:-1]) / 2).astype(np.float32)  # halfway between half values (some exact ties)
    special = np.array([0.0, -0.0, 65504, 65519, 65520, 1e5, 6e-8, 3e-8, 2.9e-8, np.inf, -np.inf, 3.4e38], np.float32)
    return np.concatenate([wide, -wide, ties, special])


def test_float16_casts_round_as_numpy(cpu_back_to_llvm: None) -> None:
    x = _edge_floats()
    got = lazygrad.Tensor(x, device="CPU:C").cast(lazygrad.dtypes.float16)
    with np.errstate(over="ignore"):  # values past 65504 become inf, as they should
        want = x.astype(np.float16)
    np.testing.assert_array_equal(got.numpy(), want)
    # every float16 bit pattern reads back as numpy reads it, NaNs as NaN
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    back = lazygrad.Tensor(bits, device="CPU:C").cast(lazygrad.dtypes.float32).numpy()
    np.testing.assert_array_equal(back, bits.astype(np.float32))


def _bfloat16_reference(x: np.ndarray) -> np.ndarray:
    """float32 `x` rounded to bfloat16 (to nearest, ties to even), as float32: integer arithmetic on the bits."""
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), rounded)


def test_bfloat16_arithmetic_rounds_each_result(cpu_back_to_llvm: None) -> None:
    x = _edge_floats()
    y = np.random.default_rng(6).standard_normal(x.size).astype(np.float32)
    bf = lazygrad.dtypes.bfloat16
    a, b = lazygrad.Tensor(x, device="CPU:C").cast(bf), lazygrad.Tensor(y, device="CPU:C").cast(bf)
    np.testing.assert_array_equal(a.cast(lazygrad.dtypes.float32).numpy(), _bfloat16_reference(x))
    # a sum of two bfloat16 values computed in float32 is exact there, then rounded once
    with np.errstate(invalid="ignore", over="ignore"):
        want = _bfloat16_reference(_bfloat16_reference(x) + _bfloat16_reference(y))
    np.testing.assert_array_equal((a + b).cast(lazygrad.dtypes.float32).numpy(), want)
