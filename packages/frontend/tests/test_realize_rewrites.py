"""After a realize, every live tensor that shares a realized subgraph reads its result: `_apply_becomes` finds the
tensors whose graphs hold a realized node (`_holding`) in one walk of the graphs new since its last look, and a dict
lookup for the others. Checked against the definition (a realized node in the tensor's toposort) and against numpy
over interleaved builds and realizes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lazygrad import Tensor
from lazygrad.tensor import _holding
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

OPS = ["add", "mul", "sub", "neg", "exp", "sum0", "tr", "max"]


def _apply(op: str, a: Tensor, b: Tensor) -> Tensor:
    if op == "add":
        return a + b
    if op == "mul":
        return a * b
    if op == "sub":
        return a - b
    if op == "neg":
        return -a
    if op == "exp":
        return (a * 0.1).exp()
    if op == "sum0":  # a reduction broadcast back: a node several kernels share
        return a + a.sum(0, keepdim=True)
    if op == "tr":
        return a.T
    return a.maximum(b)


def _reference(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return {
        "add": lambda: a + b,
        "mul": lambda: a * b,
        "sub": lambda: a - b,
        "neg": lambda: -a,
        "exp": lambda: np.exp(a * np.float32(0.1)),
        "sum0": lambda: a + a.sum(0, keepdims=True),
        "tr": lambda: a.T,
        "max": lambda: np.maximum(a, b),
    }[op]()


# (op, index of first operand, index of second operand, realize the new tensor now?)
steps = st.lists(
    st.tuples(st.sampled_from(OPS), st.integers(0, 1 << 16), st.integers(0, 1 << 16), st.booleans()),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(steps, st.integers(0, 1 << 16))
def test_interleaved_realizes_match_numpy(program: list[tuple[str, int, int, bool]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    vals = [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2)]
    live = [(Tensor(v), v) for v in vals]
    for op, i, j, now in program:
        (ta, na), (tb, nb) = live[i % len(live)], live[j % len(live)]
        live.append((_apply(op, ta, tb), _reference(op, na, nb)))
        if now:
            live[-1][0].realize()
    # every tensor, whatever realize rewrote it, still reads its own value
    for t, ref in live:
        np.testing.assert_allclose(t.numpy(), ref, rtol=1e-5, atol=1e-5)


def _by_definition(tensors: list[Tensor], keys: set[UOp]) -> list[Tensor]:
    return [t for t in tensors if any(k in t.uop.toposort for k in keys)]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(steps, st.lists(st.integers(0, 1 << 16), min_size=1, max_size=6), st.lists(st.integers(0, 1 << 16), max_size=6))
def test_holding_is_membership_in_the_toposort(
    program: list[tuple[str, int, int, bool]], first: list[int], second: list[int]
) -> None:
    live = [Tensor(np.ones((4, 4), np.float32)), Tensor(np.zeros((4, 4), np.float32))]
    for op, i, j, _ in program:
        live.append(_apply(op, live[i % len(live)], live[j % len(live)]))
    nodes = list(UOp(Ops.SINK, src=tuple(t.uop for t in live)).toposort)[:-1]
    # twice: the first looks at new graphs (one walk), the second at graphs it looked at before (their toposorts)
    for picks in (first, second):
        keys = {nodes[p % len(nodes)] for p in picks}
        got = _holding(live, keys)
        assert [id(t) for t in got] == [id(t) for t in _by_definition(live, keys)]
