"""Symbolic shapes: `Variable(...).bind(k)` in a shape, one compiled kernel for every k, inside and outside the JIT.
References are numpy on the same data."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

import lazygrad.engine
from lazygrad import Tensor, TinyJit, Variable
from lazygrad_uop.ops import Ops

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


def test_a_window_at_a_symbolic_offset_has_an_int_size(compiles: list[object]) -> None:
    """shrink((n, n + 3)) is 3 long whatever n is: an int size that means, layernorms and matmuls take as is."""
    n = Variable("n", 1, 40)
    a_np, w_np = _f32(43, 6), _f32(6, 4)
    a, w = Tensor(a_np).realize(), Tensor(w_np).realize()

    def run(k: int) -> None:
        x = a.shrink(((n.bind(k), n.bind(k) + 3), None))
        assert x.shape == (3, 6)
        win = a_np[k : k + 3]
        centered = win - win.mean(-1, keepdims=True)
        ref = centered / np.sqrt((centered**2).mean(-1, keepdims=True) + 1e-5) @ w_np
        np.testing.assert_allclose((x.layernorm() @ w).numpy(), ref, rtol=1e-4, atol=1e-5)

    _each_value_compiles_nothing_new(run, compiles)


def test_assign_into_a_shrink_at_a_symbolic_offset(compiles: list[object]) -> None:
    """Writing rows k, k+1 of a realized buffer in place (a KV cache update): the other rows keep their values."""
    n = Variable("n", 1, 40)
    ref = _f32(42, 2, 3)
    cache = Tensor(ref.copy()).realize()

    def run(k: int) -> None:
        new = _f32(2, 2, 3)
        cache.shrink(((n.bind(k), n.bind(k) + 2), None, None)).assign(Tensor(new)).realize()
        ref[k : k + 2] = new
        np.testing.assert_array_equal(cache.numpy(), ref)

    _each_value_compiles_nothing_new(run, compiles)


def test_multi_head_attention_over_a_written_cache(compiles: list[object]) -> None:
    """A decode step as a transformer runs it: write one position's keys and values into a (2, S, heads, dim) cache
    at position k, then attend with every head over the first k + 1 positions (transposed views of the shrunk
    cache), under the JIT."""
    n = Variable("n", 1, 40)
    heads, dim = 3, 4
    ref = _f32(2, 41, heads, dim)
    cache = Tensor(ref.copy()).realize()

    @TinyJit
    def step(q: Tensor, kv: Tensor, pos: object) -> Tensor:
        cache.shrink((None, (pos, pos + 1), None, None)).assign(kv).realize()
        keys, vals = (cache[i].shrink(((0, pos + 1), None, None)).transpose(0, 1) for i in (0, 1))
        return q.transpose(0, 1).scaled_dot_product_attention(keys, vals).realize()

    def run(k: int) -> None:
        q_np, kv_np = _f32(1, heads, dim), _f32(2, 1, heads, dim)
        out = step(Tensor(q_np), Tensor(kv_np), n.bind(k)).numpy()
        ref[:, k : k + 1] = kv_np
        keys, vals = ref[0, : k + 1].transpose(1, 0, 2), ref[1, : k + 1].transpose(1, 0, 2)
        s = q_np.transpose(1, 0, 2) @ keys.transpose(0, 2, 1) / np.sqrt(dim)
        p = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(out, (p / p.sum(-1, keepdims=True)) @ vals, rtol=1e-4, atol=1e-6)

    _each_value_compiles_nothing_new(run, compiles)
    assert step.cnt == len(VALUES)


def test_matmul_over_a_transposed_window_indexes_it_with_one_view(compiles: list[object]) -> None:
    """q @ keys^T with keys a transposed shrink of a cache: matmul's reshapes add size-1 dims around the symbolic
    one, which must stay one view of the cache (an index without division by the symbolic size), not a stack."""
    n = Variable("n", 1, 40)
    c_np, q_np = _f32(41, 3, 4), _f32(3, 2, 4)
    cache, q = Tensor(c_np).realize(), Tensor(q_np).realize()

    def run(k: int) -> None:
        keys = cache.shrink(((0, n.bind(k)), None, None)).transpose(0, 1)  # (3, k, 4)
        out = (q @ keys.transpose(1, 2)).numpy()
        np.testing.assert_allclose(out, q_np @ c_np[:k].transpose(1, 2, 0), rtol=1e-5, atol=1e-6)

    _each_value_compiles_nothing_new(run, compiles)
    trackers = [u.arg for ast in compiles for u in ast.toposort if u.op is Ops.VIEW]
    assert trackers and all(len(st.views) == 1 for st in trackers), trackers
