"""`python -m lazygrad.device`: the installed devices, as `Device.list()` describes them.

For each device: the package that provides it and its version, whether it is usable here (or why not), which one
is the default, its renderers (the default marked *) and the shapes of its tensor cores per target architecture.
"""

from __future__ import annotations

import sys
from typing import TextIO

from lazygrad_uop.device import TensorCore
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.registry import Device, DeviceInfo

__all__ = ["describe", "main"]


def _dtype_name(dt: DType) -> str:
    """The name users write (float16, bfloat16), not the C type a renderer writes (half, __bf16)."""
    return next((name for name, d in dtypes.fields().items() if d == dt), dt.name)


def _core(tc: TensorCore) -> str:
    n, m, k = tc.dims
    # a core that rounds its inputs (TF32) says so: it is used only with TF32=1
    rounded = "" if tc.input_mantissa_bits is None else f" (rounded to {tc.input_mantissa_bits} mantissa bits, TF32=1)"
    return f"{m}x{n}x{k} {_dtype_name(tc.dtype_in)}{rounded}->{_dtype_name(tc.dtype_out)}"


def describe(info: DeviceInfo) -> list[str]:
    """The lines that describe one device."""
    head = f"{info.name}{' (default)' if info.default else ''}: {info.package} {info.version or '(not installed)'}"
    lines = [head, f"  usable: {'yes' if info.usable is None else 'no, ' + info.usable}"]
    renderers = ", ".join(name + ("*" if default else "") for name, default in info.renderers)
    lines.append(f"  renderers: {renderers or 'none registered'}")
    if info.tensor_cores:
        lines.append("  tensor cores (M x N x K, inputs->accumulator):")
        for target, cores in sorted(info.tensor_cores.items()):
            lines.append(f"    {target}: {', '.join(sorted({_core(tc) for tc in cores}))}")
    else:
        lines.append("  tensor cores: none")
    return lines


def main(out: TextIO = sys.stdout) -> int:
    """Print every installed device; the exit status is 0 when at least one is usable."""
    infos = Device.list()
    for info in infos:
        print("\n".join(describe(info)), file=out)
    if not infos:
        print("no lazygrad device is installed; install one, e.g. `pip install lazygrad-runtime-cpu`", file=out)
    return 0 if any(i.usable is None for i in infos) else 1


if __name__ == "__main__":
    sys.exit(main())
