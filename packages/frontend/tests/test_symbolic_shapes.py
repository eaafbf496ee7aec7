"""Symbolic shapes: `Variable(...).bind(k)` in a shape, one compiled kernel for every k, inside and outside the JIT.
References are numpy on the same data."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

import lazygrad.engine
from lazygrad import Tensor, TinyJit, Variable

RNG = np.random.default_rng(5)
VALUES = (3, 17, 1, 40, 8)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Every kernel AST compiled while the test runs."""
    seen: list[object] = []
    real = lazygrad.engine.get_program

    def counting(ast, renderer, *args, **kwargs):
        seen.append(ast)
        return real(ast, renderer, *args, **kwargs)

    monkeypatch.setattr(lazygrad.engine, "get_program", counting)
    yield seen


def _each_value_compiles_nothing_new(run: Callable[[int], None], compiles: list[object]) -> None:
    run(VALUES[0])
    before = len(compiles)
    for k in VALUES[1:]:
        run(k)
    assert len(compiles) == before, "a new bound value compiled a new kernel"


def test_shrink_by_a_variable_then_reduce(compiles: list[object]) -> None:
    n = Variable("n", 1, 40)
    a_np = _f32(40, 16)
    a = Tensor(a_np).realize()

    def run(k: int) -> None:
        x = a.shrink(((0, n.bind(k)), None))
        np.testing.assert_allclose((x * 2 + 1).sum(axis=0).numpy(), (a_np[:k] * 2 + 1).sum(0), rtol=1e-5)

    _each_value_compiles_nothing_new(run, compiles)


def test_elementwise_output_of_symbolic_shape(compiles: list[object]) -> None:
    n = Variable("n", 1, 40)
    a_np = _f32(40, 5)
    a = Tensor(a_np).realize()

    def run(k: int) -> None:
        out = (a.shrink(((0, n.bind(k)), None)).exp2() - 1).realize()
        assert out.shape[1] == 5 and out.shape[0].src[1].arg == k  # (n bound to k, 5)
        np.testing.assert_allclose(out.numpy(), np.exp2(a_np[:k]) - 1, rtol=1e-5)

    _each_value_compiles_nothing_new(run, compiles)


def test_attention_over_a_growing_cache(compiles: list[object]) -> None:
    """A reduction whose length is the variable (softmax over the first k keys), as in decoding with a KV cache."""
    n = Variable("n", 1, 40)
    k_np, v_np, q_np = _f32(40, 8), _f32(40, 8), _f32(2, 8)
    keys, vals, q = (Tensor(x).realize() for x in (k_np, v_np, q_np))

    def run(k: int) -> None:
        kv = n.bind(k)
        out = (q @ keys.shrink(((0, kv), None)).T).softmax(-1) @ vals.shrink(((0, kv), None))
        s = q_np @ k_np[:k].T
        p = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(out.numpy(), (p / p.sum(-1, keepdims=True)) @ v_np[:k], rtol=1e-4, atol=1e-6)

    _each_value_compiles_nothing_new(run, compiles)


def test_reshape_to_a_bound_shape_and_back() -> None:
    n = Variable("n", 1, 12)
    for k in (2, 7, 12):
        b_np = _f32(3, k)
        sym = Tensor(b_np).reshape(3, n.bind(k))
        assert sym.shape[0] == 3 and sym.shape[1].op.name == "BIND"
        np.testing.assert_allclose(((sym + 1) * 2).reshape(3, k).numpy(), (b_np + 1) * 2, rtol=1e-6)
        np.testing.assert_allclose((sym * sym).sum(axis=1).numpy(), (b_np * b_np).sum(1), rtol=1e-5)


def test_jit_with_a_bound_variable_argument(compiles: list[object]) -> None:
    n = Variable("n", 1, 40)
    a_np = _f32(40, 6)
    a = Tensor(a_np).realize()

    @TinyJit
    def f(x: Tensor, k: object) -> Tensor:
        return (a.shrink(((0, k), None)) * x).sum(axis=0).realize()

    def run(k: int) -> None:
        x_np = _f32(1, 6)
        np.testing.assert_allclose(f(Tensor(x_np), n.bind(k)).numpy(), (a_np[:k] * x_np).sum(0), rtol=1e-5)

    _each_value_compiles_nothing_new(run, compiles)
    run(VALUES[-1])
    assert f.cnt == len(VALUES) + 1 and len(f.jit_cache) == 1


def test_jit_with_an_input_of_symbolic_shape(compiles: list[object]) -> None:
    n = Variable("n", 1, 40)
    a_np = _f32(40, 4)
    a = Tensor(a_np).realize()

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x.relu() * 3).sum(axis=0).realize()

    def run(k: int) -> None:
        np.testing.assert_allclose(
            f(a.shrink(((0, n.bind(k)), None))).numpy(), (np.maximum(a_np[:k], 0) * 3).sum(0), rtol=1e-5
        )

    _each_value_compiles_nothing_new(run, compiles)


def test_bind_out_of_range_and_bad_reshape_raise() -> None:
    n = Variable("n", 1, 10)
    with pytest.raises(ValueError, match="outside its bounds"):
        n.bind(11)
    with pytest.raises(ValueError, match="reshape"):
        Tensor(_f32(3, 4)).reshape(3, n.bind(5))
    with pytest.raises(ValueError, match="shrink"):
        Tensor(_f32(4, 4)).shrink(((0, n.bind(6)), None))
