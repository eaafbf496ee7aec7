"""The example device: installed, the registry finds it by its entry point and Tensors run on it; the conformance
suite runs on it with `pytest --pyargs lazygrad_testkit --lazygrad-device=CDEV` (nox's tests session does)."""

from __future__ import annotations

import numpy as np
import pytest

from lazygrad_uop.registry import Device

if (WHY := Device.usable("CDEV")) is not None:
    pytest.skip(f"CDEV is not usable here: {WHY}", allow_module_level=True)


def test_the_registry_finds_the_device_through_its_entry_point() -> None:
    assert "CDEV" in Device.installed() and Device.spec("CDEV").package == "lazygrad-example-c-device"
    assert [r.name for r in Device.renderers("CDEV")] == ["C"]


def test_a_matmul_runs_on_it() -> None:
    lazygrad = pytest.importorskip("lazygrad")
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 3)).astype(np.float32)
    got = (lazygrad.Tensor(a, device="CDEV") @ lazygrad.Tensor(b, device="CDEV")).relu().numpy()
    np.testing.assert_allclose(got, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)


def test_a_compile_error_names_the_compiler_and_shows_the_source() -> None:
    from lazygrad_example_c_device.device import CDevCompiler

    from lazygrad_uop.device import CompileError

    with pytest.raises(CompileError, match=r"rejected the kernel:(.|\n)*not C at all"):
        CDevCompiler().compile("not C at all")
