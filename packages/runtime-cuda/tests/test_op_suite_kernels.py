"""Every kind of kernel the frontend's op suite produces renders for CUDA and compiles with NVRTC for sm_80 and sm_90,
and ptxas assembles its PTX. No GPU needed: the kernels are built from Tensor graphs (the op suite's operations over
its dtypes), scheduled, and turned into programs with the CUDA renderer; nothing runs.

Needs the lazygrad frontend (installed in `nox -s tests` and `nox -s cuda`, not in the package-alone session)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cuda_helpers import ARCHS, assemble, ptxas

from lazygrad_codegen import get_program
from lazygrad_cuda.compiler import nvrtc_compile
from lazygrad_cuda.renderer import CUDARenderer
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.registry import Device

lazygrad = pytest.importorskip("lazygrad", reason="builds kernels from Tensor graphs: needs the lazygrad frontend")
Tensor = lazygrad.Tensor

FLOATS = [dtypes.float32, dtypes.float16, dtypes.float64]
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint32]
ALL = [dtypes.bool, *INTS, *FLOATS]
CAST_DTYPES = [*ALL, dtypes.bfloat16]


def _t(*shape: int, dtype: DType = dtypes.float32) -> Tensor:
    return Tensor.empty(*shape, dtype=dtype, device="PYTHON")


def op_suite_graphs() -> Iterator[tuple[str, Callable[[], Tensor]]]:
    """(name, builder) for the operations of the op suite on its dtypes and kinds of shapes."""
    yield "full", lambda: Tensor.full((3, 4), 2.5, device="PYTHON")
    yield "arange", lambda: Tensor.arange(2, 20, 3, device="PYTHON")
    yield "eye", lambda: Tensor.eye(4, 5, device="PYTHON")
    for dt in [dtypes.float32, dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.float16]:
        yield (
            f"binary_{dt.name}",
            lambda dt=dt: (_t(3, 4, dtype=dt) + _t(1, 4, dtype=dt)) * _t(3, 1, dtype=dt) - _t(3, 4, dtype=dt),
        )
        yield f"min_max_{dt.name}", lambda dt=dt: _t(5, dtype=dt).maximum(_t(5, dtype=dt)).minimum(_t(5, dtype=dt))
    yield "div", lambda: _t(4, 3) / _t(4, 3)
    yield (
        "int_div_mod",
        lambda: (
            (_t(6, dtype=dtypes.int32) // _t(6, dtype=dtypes.int32))
            + (_t(6, dtype=dtypes.int32) % _t(6, dtype=dtypes.int32))
        ),
    )
    for dt in FLOATS:
        x = lambda dt=dt: _t(2, 3, dtype=dt)  # noqa: E731
        for name in ("exp", "log", "exp2", "log2", "sqrt", "sin", "cos", "relu", "sigmoid", "tanh", "abs"):
            yield f"{name}_{dt.name}", lambda x=x, name=name: getattr(x(), name)()
    for dt in ALL:
        yield (
            f"compare_{dt.name}",
            lambda dt=dt: (_t(4, dtype=dt) < _t(4, dtype=dt)).logical_and(_t(4, dtype=dt).eq(_t(4, dtype=dt))),
        )
    yield "where", lambda: _t(5, dtype=dtypes.bool).where(_t(5), 2.5)
    for src in CAST_DTYPES:
        for dst in CAST_DTYPES:
            if src != dst:
                yield f"cast_{src.name}_{dst.name}", lambda src=src, dst=dst: _t(3, dtype=src).cast(dst)
    yield (
        "movement",
        lambda: _t(2, 3, 4).permute(2, 0, 1).reshape(4, 6).pad(((1, 0), (0, 2))).shrink(((0, 4), (1, 7))).flip(0) + 1,
    )
    yield "expand", lambda: _t(3, 1).expand(3, 5) * 2
    yield "slicing", lambda: _t(6, 5)[1:5:2, ::-1] + 0
    for dt in [dtypes.float32, dtypes.int32, dtypes.uint8, dtypes.bool, dtypes.float16]:
        for op in ("sum", "max", "min"):
            yield f"{op}_{dt.name}", lambda dt=dt, op=op: getattr(_t(4, 5, dtype=dt), op)(axis=1)
            yield f"{op}_all_{dt.name}", lambda dt=dt, op=op: getattr(_t(4, 5, dtype=dt), op)()
    yield "mean", lambda: _t(4, 5).mean(axis=0)
    yield "reduce_of_view", lambda: _t(4, 6).permute(1, 0)[1:5].sum(axis=1)
    for dt in [dtypes.float32, dtypes.int32, dtypes.float16]:
        yield f"matmul_{dt.name}", lambda dt=dt: _t(2, 3, 4, dtype=dt) @ _t(4, 5, dtype=dt)
    for dt in [dtypes.float16, dtypes.bfloat16]:  # shapes the mma.sync tensor cores tile
        yield f"matmul_tc_{dt.name}", lambda dt=dt: _t(32, 64, dtype=dt) @ _t(64, 48, dtype=dt)
        yield f"matmul_tc_f32acc_{dt.name}", lambda dt=dt: _t(32, 64, dtype=dt).float() @ _t(64, 48, dtype=dt).float()
    yield "dot", lambda: _t(7).dot(_t(7))
    yield (
        "softmax",
        lambda: (
            lambda x: (
                (x - x.max(axis=1, keepdim=True)).exp()
                / (x - x.max(axis=1, keepdim=True)).exp().sum(axis=1, keepdim=True)
            )
        )(_t(3, 8)),
    )


def op_suite_sources() -> dict[str, str]:
    """The CUDA source of every distinct kernel the graphs schedule into, by kernel name."""
    renderer = CUDARenderer("sm_80")
    renderer.add_tensor_cores(Device.tensor_cores_for("CUDA", renderer))  # as the CUDA device gets them
    sources: dict[str, str] = {}
    for _name, build in op_suite_graphs():
        for si in build().schedule():
            if si.ast.op is Ops.SINK:
                spec = get_program(si.ast, renderer)
                sources.setdefault(spec.src, spec.name)
    return {name: src for src, name in sources.items()}


def _split(src: str) -> tuple[str, str]:
    """A kernel's source as (prelude, kernel function)."""
    at = src.index('extern "C" __global__')
    return src[:at], src[at:]


def test_every_op_suite_kernel_compiles_for_sm80_and_sm90(tmp_path: Path) -> None:
    sources = op_suite_sources()
    assert len(sources) > 150, f"expected the op suite's variety of kernels, got {len(sources)}"
    assert any("mma.sync" in src for src in sources.values()), "no kernel used the tensor cores"
    # Kernels with the same prelude are compiled together, as one translation unit per prelude: each kernel still
    # sees exactly its own prelude, and NVRTC and ptxas start a few times instead of hundreds. A unit that fails is
    # compiled kernel by kernel to name the culprits.
    units: dict[str, dict[str, str]] = {}
    for name, src in sources.items():
        prelude, kernel = _split(src)
        units.setdefault(prelude, {})[name] = kernel
    failures = []
    for n, (prelude, kernels) in enumerate(units.items()):
        for arch in ARCHS:
            try:
                out = nvrtc_compile(prelude + "\n".join(kernels.values()), arch, f"unit{n}")
                if ptxas()[0] is not None:
                    assemble(out.ptx, arch, tmp_path, f"unit{n}")
            except (AssertionError, Exception):  # noqa: BLE001 - find which kernels fail, report them all
                for name, kernel in kernels.items():
                    try:
                        out = nvrtc_compile(prelude + kernel, arch, name)
                        if ptxas()[0] is not None:
                            assemble(out.ptx, arch, tmp_path, name)
                    except (AssertionError, Exception) as exc:  # noqa: BLE001
                        failures.append(f"{name} ({arch}): {exc}")
    assert not failures, "\n\n".join(failures[:5]) + f"\n\n{len(failures)} of {2 * len(sources)} compilations failed"
