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
