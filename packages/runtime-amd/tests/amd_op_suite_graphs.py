"""The kinds of kernels the frontend's op suite produces, as Tensor graphs to schedule without running: each op of
the suite over its dtypes and its kinds of shapes (broadcasts, reductions over one axis and all, views, matmuls)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from lazygrad_uop.dtype import DType, dtypes

FLOATS = [dtypes.float32, dtypes.float16, dtypes.float64]
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint32]
ALL = [dtypes.bool, *INTS, *FLOATS]
UNARY = ("exp", "log", "exp2", "log2", "sqrt", "sin", "cos", "relu", "sigmoid", "tanh", "abs", "neg")


def graphs(tensor: type) -> Iterator[tuple[str, Callable[[], object]]]:
    """(name, builder) pairs; `tensor` is lazygrad's Tensor class. Builders make lazy tensors on the PYTHON
    device, which every installation has (the kernel ASTs don't depend on the device)."""

    def t(*shape: int, dtype: DType = dtypes.float32) -> object:
        return tensor.empty(*shape, dtype=dtype, device="PYTHON")

    yield "full", lambda: tensor.full((3, 4), 2.5, device="PYTHON")
    yield "arange", lambda: tensor.arange(2, 20, 3, device="PYTHON")
    yield "eye", lambda: tensor.eye(4, 5, device="PYTHON")
    for dt in [dtypes.float32, dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.float16]:
        yield f"binary_{dt.name}", lambda dt=dt: (t(3, 4, dtype=dt) + t(1, 4, dtype=dt)) * t(3, 1, dtype=dt)
        yield f"sub_max_{dt.name}", lambda dt=dt: (t(5, dtype=dt) - t(5, dtype=dt)).maximum(t(5, dtype=dt))
    yield "div", lambda: t(4, 3) / t(4, 3)
    yield "int_div", lambda: t(6, dtype=dtypes.int32) / t(6, dtype=dtypes.int32)
    yield (
        "floordiv_mod",
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
    for src in [*ALL, dtypes.bfloat16]:
        for dst in [*ALL, dtypes.bfloat16]:
            if src != dst:
                yield f"cast_{src.name}_{dst.name}", lambda src=src, dst=dst: t(3, dtype=src).cast(dst)
    yield "movement", lambda: t(2, 3, 4).permute(2, 0, 1).reshape(4, 6).pad(((1, 0), (0, 2))).flip(0) + 1
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
    yield "dot", lambda: t(7).dot(t(7))
    yield "softmax", lambda: t(3, 8).softmax(axis=1)
