"""`python -m lazygrad.device`: one entry per installed device, as the registry and the installed distributions
describe them."""

from __future__ import annotations

import importlib.metadata
import io
import subprocess
import sys

from lazygrad import Device, dtypes
from lazygrad.device import main


def test_lists_every_installed_device_with_its_package_and_version() -> None:
    out = io.StringIO()
    status = main(out)
    text = out.getvalue()
    heads = [line for line in text.splitlines() if not line.startswith(" ")]
    assert len(heads) == len(Device.installed())
    for name in Device.installed():
        spec = Device.spec(name)
        (head,) = [h for h in heads if h.split(":")[0].split(" ")[0] == name]
        assert spec.package in head and importlib.metadata.version(spec.package) in head
        assert ("(default)" in head) == (name == Device.DEFAULT)
    usable = [n for n in Device.installed() if Device.usable(n) is None]
    assert text.count("usable: yes") == len(usable)
    for name in set(Device.installed()) - set(usable):
        assert f"usable: no, {Device.usable(name)}" in text
    assert status == (0 if usable else 1)


def test_lists_renderers_and_tensor_cores() -> None:
    text = subprocess.run(
        [sys.executable, "-m", "lazygrad.device"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    for info in Device.list():
        for renderer, default in info.renderers:
            assert renderer + ("*" if default else "") in text
        for target, cores in info.tensor_cores.items():
            line = next(line for line in text.splitlines() if line.strip().startswith(f"{target}:"))
            for tc in cores:
                n, m, k = tc.dims
                names = {v: k for k, v in dtypes.fields().items()}
                # a core that rounds its inputs (TF32) says so, and which setting it needs
                bits = tc.input_mantissa_bits
                rounded = "" if bits is None else f" (rounded to {bits} mantissa bits, TF32=1)"
                assert f"{m}x{n}x{k} {names[tc.dtype_in]}{rounded}->{names[tc.dtype_out]}" in line
