"""The kinds of kernels the op suite produces, as lazy Tensor graphs to schedule and compile without running them:
each operation over its dtypes and kinds of shapes (broadcasts, reductions over one axis and over all, views,
matmuls, tensor-core-sized matmuls). For a device package checking that its renderer and compiler take every kernel
(the AMD and CUDA packages compile these without a GPU).

    for name, build in kernel_graphs():
        for si in build().schedule(): ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from lazygrad_testkit.dtypes import ALL, CAST_DTYPES, FLOATS, UNARY
from lazygrad_uop.dtype import DType, dtypes


def kernel_graphs(device: str = "PYTHON") -> Iterator[tuple[str, Callable[[], Any]]]:
    """(name, builder) pairs; each builder returns a lazy Tensor on `device` (the kernel ASTs don't depend on it:
    PYTHON, which every installation can have, is the default)."""
    from lazygrad import Tensor

    def t(*shape: int, dtype: DType = dtypes.float32) -> Any:
        return Tensor.empty(*shape, dtype=dtype, device=device)

    yield "full", lambda: Tensor.full((3, 4), 2.5, device=device)
    yield "arange", lambda: Tensor.arange(2, 20, 3, device=device)
    yield "eye", lambda: Tensor.eye(4, 5, device=device)
    for dt in [dtypes.float32, dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.float16]:
        yield (
            f"binary_{dt.name}",
            lambda dt=dt: (t(3, 4, dtype=dt) + t(1, 4, dtype=dt)) * t(3, 1, dtype=dt) - t(3, 4, dtype=dt),
        )
        yield f"min_max_{dt.name}", lambda dt=dt: t(5, dtype=dt).maximum(t(5, dtype=dt)).minimum(t(5, dtype=dt))
    yield "div", lambda: t(4, 3) / t(4, 3)
    yield "int_div", lambda: t(6, dtype=dtypes.int32) / t(6, dtype=dtypes.int32)
    yield (
        "int_floordiv_mod",
        lambda: (
            (t(6, dtype=dtypes.int32) // t(6, dtype=dtypes.int32))
            + (t(6, dtype=dtypes.int32) % t(6, dtype=dtypes.int32))
        ),
    )
    for dt in FLOATS:
        for name in UNARY:
            yield f"{name}_{dt.name}", lambda dt=dt, name=name: getattr(t(2, 3, dtype=dt), name)()
    for dt in ALL:
        yield (
            f"compare_{dt.name}",
            lambda dt=dt: (t(4, dtype=dt) < t(4, dtype=dt)) != (t(4, dtype=dt) == t(4, dtype=dt)),
        )
    yield "where", lambda: t(5, dtype=dtypes.bool).where(t(5), 2.5)
    for src in CAST_DTYPES:
        for dst in CAST_DTYPES:
            if src != dst:
                yield f"cast_{src.name}_{dst.name}", lambda src=src, dst=dst: t(3, dtype=src).cast(dst)
    yield (
        "movement",
        lambda: t(2, 3, 4).permute(2, 0, 1).reshape(4, 6).pad(((1, 0), (0, 2))).shrink(((0, 4), (1, 7))).flip(0) + 1,
    )
    yield "shrink_expand", lambda: t(6, 5).shrink(((1, 5), (0, 3))) * t(1, 3).expand(4, 3)
    yield "slicing", lambda: t(6, 5)[1:5:2, ::-1] + 0
    for dt in [dtypes.float32, dtypes.int32, dtypes.uint8, dtypes.bool, dtypes.float16]:
        for op in ("sum", "max", "min"):
            yield f"{op}_{dt.name}", lambda dt=dt, op=op: getattr(t(4, 5, dtype=dt), op)(axis=1)
            yield f"{op}_all_{dt.name}", lambda dt=dt, op=op: getattr(t(40, 50, dtype=dt), op)()
    yield "mean", lambda: t(4, 5).mean(axis=0)
    yield "reduce_of_view", lambda: t(4, 6).permute(1, 0)[1:5].sum(axis=1)
    for dt in [dtypes.float32, dtypes.int32, dtypes.float16]:
        yield f"matmul_{dt.name}", lambda dt=dt: t(2, 3, 4, dtype=dt) @ t(4, 5, dtype=dt)
        yield f"matmul_big_{dt.name}", lambda dt=dt: t(64, 64, dtype=dt) @ t(64, 64, dtype=dt)
    for dt in [dtypes.float16, dtypes.bfloat16]:  # shapes that tensor cores tile
        yield f"matmul_tc_{dt.name}", lambda dt=dt: t(32, 64, dtype=dt) @ t(64, 48, dtype=dt)
        yield f"matmul_tc_f32acc_{dt.name}", lambda dt=dt: t(32, 64, dtype=dt).float() @ t(64, 48, dtype=dt).float()
    yield "dot", lambda: t(7).dot(t(7))
    yield "softmax", lambda: t(3, 8).softmax(axis=1)
