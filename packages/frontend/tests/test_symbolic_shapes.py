"""Symbolic shapes: `Variable(...).bind(k)` in a shape, one compiled kernel for every k, inside and outside the JIT.
References are numpy on the same data."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from lazygrad import Tensor, TinyJit, Variable
from lazygrad_uop.ops import Ops
from lazygrad_uop.shape import resolve

RNG = np.random.default_rng(5)
VALUES = (3, 17, 1, 40, 8)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


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
        np.testing.assert_allclose((x * 2 + 1).sum(axis=0).numpy(), (a_np[:k] * 2 + 1).sum(0), rtol=1e-5, atol=1e-5)

    _each_value_compiles_nothing_new(run, compiles)


def test_elementwise_output_of_symbolic_shape(compiles: list[object]) -> None:
    n = Variable("n", 1, 40)
    a_np = _f32(40, 5)
    a = Tensor(a_np).realize()

    def run(k: int) -> None:
        out = (a.shrink(((0, n.bind(k)), None)).exp2() - 1).realize()
        assert out.shape[1] == 5 and out.shape[0].src[1].arg == k  # (n bound to k, 5)
        np.testing.assert_allclose(out.numpy(), np.exp2(a_np[:k]) - 1, rtol=1e-5, atol=1e-6)

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
        np.testing.assert_allclose((sym * sym).sum(axis=1).numpy(), (b_np * b_np).sum(1), rtol=1e-5, atol=1e-5)


def test_jit_with_a_bound_variable_argument(compiles: list[object]) -> None:
    n = Variable("n", 1, 40)
    a_np = _f32(40, 6)
    a = Tensor(a_np).realize()

    @TinyJit
    def f(x: Tensor, k: object) -> Tensor:
        return (a.shrink(((0, k), None)) * x).sum(axis=0).realize()

    def run(k: int) -> None:
        x_np = _f32(1, 6)
        np.testing.assert_allclose(f(Tensor(x_np), n.bind(k)).numpy(), (a_np[:k] * x_np).sum(0), rtol=1e-5, atol=1e-5)

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


# *** the Tensor API over symbolic dims: each op checked un-jitted and under TinyJit, one compile for all values ***

N = Variable("n", 1, 40)


def _to_max(t: Tensor) -> Tensor:
    """`t` with each symbolic dim padded to the largest value it can take, in a buffer of its own: a jitted
    function returns the tensors it captured, whose views keep the values bound at the capture."""
    return t.pad(tuple((0, int(d.vmax) - d) if not isinstance(d, int) else (0, 0) for d in t.shape)).contiguous()


def _check_each_value(
    build: Callable[[object], Tensor], ref: Callable[[int], np.ndarray], compiles: list[object], rtol: float = 1e-5
) -> None:
    """build(n bound to k) against ref(k) for every k of VALUES, un-jitted and under TinyJit (a result padded to
    its largest shape, of which the first ref(k).shape elements count); only the first value compiles."""
    jitted = TinyJit(lambda b: _to_max(build(b)).realize())

    def run(k: int) -> None:
        want = ref(k)
        out = build(N.bind(k))
        assert tuple(map(resolve, out.shape)) == want.shape
        np.testing.assert_allclose(out.numpy(), want, rtol=rtol, atol=1e-5)
        got = jitted(N.bind(k)).numpy()[tuple(slice(0, s) for s in want.shape)]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5)

    _each_value_compiles_nothing_new(run, compiles)
    assert jitted.cnt == len(VALUES)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


A_NP = _f32(40, 6)
A = Tensor(A_NP).realize()


def _np_layernorm(x: np.ndarray) -> np.ndarray:
    c = x - x.mean(-1, keepdims=True)
    return c / np.sqrt((c**2).mean(-1, keepdims=True) + 1e-5)


# name: (op on a (n, 6) tensor, the same on numpy)
_STATISTICS: dict[str, tuple[Callable, Callable]] = {
    "mean0": (lambda x: x.mean(0), lambda x: x.mean(0)),
    "mean_all": (lambda x: x.mean(), lambda x: np.array(x.mean())),
    "mean1": (lambda x: x.mean(1), lambda x: x.mean(1)),
    "var0": (lambda x: x.var(0, correction=0), lambda x: x.var(0)),
    "std0": (lambda x: x.std(0, correction=0), lambda x: x.std(0)),
    "var1": (lambda x: x.var(1), lambda x: x.var(1, ddof=1)),
    "softmax0": (lambda x: x.softmax(0), lambda x: _softmax(x, 0)),
    "softmax1": (lambda x: x.softmax(1), lambda x: _softmax(x, 1)),
    "log_softmax0": (lambda x: x.log_softmax(0), lambda x: np.log(_softmax(x, 0))),
    "logsumexp0": (lambda x: x.logsumexp(0), lambda x: np.log(np.exp(x).sum(0))),
    "layernorm_over_n": (lambda x: x.T.layernorm(), lambda x: _np_layernorm(x.T)),
    "layernorm_along_n": (lambda x: x.layernorm(), _np_layernorm),
}


@pytest.mark.parametrize("name", _STATISTICS)
def test_statistics_over_and_along_a_symbolic_dim(name: str, compiles: list[object]) -> None:
    """The count a mean divides by is symbolic when the reduced dim is: it follows the bound value in one kernel."""
    op, ref = _STATISTICS[name]
    _check_each_value(lambda b: op(A[:b]), lambda k: ref(A_NP[:k]), compiles, rtol=1e-4)


def test_slicing_with_bound_variables(compiles: list[object]) -> None:
    """t[:n], t[:, a:a + n], t[:, n] and negative positions on a symbolic dim, with two variables in one kernel."""
    off = Variable("off", 0, 10)
    c_np = _f32(6, 50)
    c = Tensor(c_np).realize()

    def build(b: object, o: object) -> Tensor:
        window = c[:, o : o + b]  # (6, n) at a symbolic offset
        rows = c.T[:b]  # (n, 6)
        return window * 2 + rows.T - window[:, -1:] + c[:, b][:, None] + rows[-1][:, None]

    def ref(k: int, j: int) -> np.ndarray:
        window, rows = c_np[:, j : j + k], c_np.T[:k]
        return window * 2 + rows.T - window[:, -1:] + c_np[:, k][:, None] + rows[-1][:, None]

    jitted = TinyJit(lambda b, o: _to_max(build(b, o)).realize())

    def run(k: int) -> None:
        want = ref(k, k % 11)
        np.testing.assert_allclose(build(N.bind(k), off.bind(k % 11)).numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(jitted(N.bind(k), off.bind(k % 11)).numpy()[:, :k], want, rtol=1e-5, atol=1e-6)

    _each_value_compiles_nothing_new(run, compiles)


B_NP, W_NP = _f32(40, 6), _f32(6, 5)
B, W = Tensor(B_NP).realize(), Tensor(W_NP).realize()


# name: (op on two (n, 6) tensors, the same on numpy)
_OPS: dict[str, tuple[Callable, Callable]] = {
    # elementwise and broadcasting between tensors of the same symbolic dim
    "broadcast": (
        lambda x, y: x * y[:, :1] + y.sum(1, keepdim=True) - x.max(0, keepdim=True),
        lambda x, y: x * y[:, :1] + y.sum(1, keepdims=True) - x.max(0, keepdims=True),
    ),
    "where": (lambda x, y: (x > 0).where(x, y.exp()), lambda x, y: np.where(x > 0, x, np.exp(y))),
    # matmul over a symbolic inner dim, with a symbolic outer dim, and both
    "matmul_inner": (lambda x, y: x.T @ y, lambda x, y: x.T @ y),
    "matmul_outer": (lambda x, y: x @ W, lambda x, y: x @ W_NP),
    "matmul_both": (lambda x, y: x @ y.T, lambda x, y: x @ y.T),
    "attention": (lambda x, y: (x @ y.T).softmax(-1) @ y, lambda x, y: _softmax(x @ y.T, -1) @ y),
    # joining along the symbolic dim (pieces at symbolic offsets) and across it
    "cat0": (lambda x, y: x.cat(B[:2], y * 2, dim=0), lambda x, y: np.concatenate([x, B_NP[:2], y * 2])),
    "cat1": (lambda x, y: x.cat(y, dim=1), lambda x, y: np.concatenate([x, y], 1)),
    "stack": (lambda x, y: Tensor.stack(x, y, dim=1), lambda x, y: np.stack([x, y], 1)),
    # expand to a symbolic size, pad a symbolic dim
    "expand": (lambda x, y: W[:1].expand(x.shape[0], 5) + x[:, :5], lambda x, y: W_NP[:1] + x[:, :5]),
    "pad_value": (
        lambda x, y: x.pad(((2, 1), (0, 3)), value=-1.0),
        lambda x, y: np.pad(x, ((2, 1), (0, 3)), constant_values=-1),
    ),
    "pad_exp": (lambda x, y: x.exp().pad(((1, 2), None)), lambda x, y: np.pad(np.exp(x), ((1, 2), (0, 0)))),
    # scans, arg-extremes and sorting along the symbolic dim, arange to a symbolic size, a triangle of n x n
    "cumsum": (lambda x, y: x.cumsum(0), lambda x, y: x.cumsum(0)),
    "cummax": (lambda x, y: x.cummax(0)[0], lambda x, y: np.maximum.accumulate(x, 0)),
    "argmax": (lambda x, y: x.argmax(0), lambda x, y: x.argmax(0)),
    "argmin": (lambda x, y: x.argmin(0), lambda x, y: x.argmin(0)),
    "sort": (lambda x, y: x.sort(0)[0], lambda x, y: np.sort(x, 0)),
    "arange": (
        lambda x, y: x + Tensor.arange(x.shape[0]).reshape(x.shape[0], 1),
        lambda x, y: x + np.arange(len(x))[:, None],
    ),
    "tril": (lambda x, y: (x @ y.T).tril(), lambda x, y: np.tril(x @ y.T)),
}


@pytest.mark.parametrize("name", _OPS)
def test_ops_on_a_symbolic_dim(name: str, compiles: list[object]) -> None:
    op, ref = _OPS[name]
    _check_each_value(lambda b: op(A[:b], B[:b]), lambda k: ref(A_NP[:k], B_NP[:k]), compiles, rtol=1e-4)


def test_setitem_through_a_symbolic_slice(compiles: list[object]) -> None:
    """t[a:a + n] = v writes n rows at a symbolic offset in place; the others keep their values."""
    off = Variable("off", 0, 10)
    ref = _f32(50, 3)
    t = Tensor(ref.copy()).realize()

    def run(k: int) -> None:
        o = k % 11
        t[off.bind(o) : off.bind(o) + N.bind(k)] = A[: N.bind(k), :3]
        ref[o : o + k] = A_NP[:k, :3]
        np.testing.assert_array_equal(t.numpy(), ref)

    _each_value_compiles_nothing_new(run, compiles)


# name: (op on a (n, 6) tensor, what its error says)
_UNSUPPORTED: dict[str, tuple[Callable, str]] = {
    "conv2d": (
        lambda x: x.reshape(1, 1, *x.shape).conv2d(Tensor.ones(1, 1, 2, 2)),
        r"conv2d needs int sizes.*dimension 2.*n in \[1, 40\]",
    ),
    "topk": (lambda x: x.topk(2, 0), "topk needs int sizes"),
    "split": (lambda x: x.split(2, 0), "split needs int sizes"),
    "step": (lambda x: x[::2], "needs step 1"),
    "tensor_index": (lambda x: x[Tensor([0, 1])], "indexing with a tensor.*dimension 0.*symbolic"),
    "reflect": (lambda x: x.pad(((1, 1), (0, 0)), mode="reflect"), "pad mode 'reflect'"),
    "reshape": (lambda x: x.reshape(-1), "reshape"),
}


@pytest.mark.parametrize("name", _UNSUPPORTED)
def test_ops_without_symbolic_support_say_so(name: str) -> None:
    op, message = _UNSUPPORTED[name]
    with pytest.raises((NotImplementedError, IndexError, ValueError), match=message):
        op(A[: N.bind(5)])


def test_views_must_fit_for_every_value_of_the_variable() -> None:
    """A kernel compiled for a variable runs for every value in its bounds (a JIT replay doesn't run the Python that
    checked the bound one), so a view that would read or write outside its buffer for some of them is refused
    where it is built, not found by a crash: here rows [0, n) of 40 rows with n up to 100."""
    wide = Variable("wide", 1, 100)
    for build in (lambda b: A.shrink(((0, b), None)), lambda b: A[:b], lambda b: A[b], lambda b: A[b - 1 : b + 1]):
        with pytest.raises((ValueError, IndexError), match="wide in \\[1, 100\\]"):
            build(wide.bind(5))
    with pytest.raises(ValueError, match="can be negative"):
        A.pad(((N.bind(3) - 5, 0), None))


def test_a_jitted_shrink_of_a_captured_tensor_stays_in_bounds() -> None:
    """The pattern that crashed: a jitted function shrinks a tensor it holds (a position table) by its argument;
    with the bounds of the variable within the table every replay reads inside it."""
    table_np = _f32(40, 4)
    table = Tensor(table_np).realize()
    f = TinyJit(lambda b: table[:b].sum(0).realize())
    for k in (*VALUES, 40, 2):
        np.testing.assert_allclose(f(N.bind(k)).numpy(), table_np[:k].sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_encoder_forward_over_a_symbolic_sequence_length(jit: bool, compiles: list[object]) -> None:
    """A BERT-like encoder block over the first n tokens of padded batches: token and position embeddings (rows by
    a tensor index and by a shrink), layernorms over the hidden dim, multi-head attention with q @ k^T over n,
    softmax over n with a padding mask, a feed-forward, and mean pooling over n, masked and not."""
    batch, hidden, heads, vocab = 2, 8, 2, 11
    hd = hidden // heads
    p_np = {
        "we": _f32(vocab, hidden),
        "pe": _f32(40, hidden),
        "qkv": _f32(hidden, 3 * hidden) * 0.5,
        "o": _f32(hidden, hidden) * 0.5,
        "ff": _f32(hidden, 16) * 0.5,
        "ff2": _f32(16, hidden) * 0.5,
    }
    p = {k: Tensor(v).realize() for k, v in p_np.items()}
    ids_np = RNG.integers(0, vocab, (batch, 40)).astype(np.int32)
    ids = Tensor(ids_np).realize()

    def forward(b: object, lengths: Tensor) -> tuple[Tensor, Tensor]:
        x = (ids[:, :b].embedding(p["we"]) + p["pe"].shrink(((0, b), None))).layernorm()
        qkv = (x @ p["qkv"]).reshape(batch, b, 3, heads, hd).permute(2, 0, 3, 1, 4)
        keep = Tensor.arange(b).reshape(1, b) < lengths.reshape(batch, 1)  # (batch, n): real tokens
        ctx = qkv[0].scaled_dot_product_attention(qkv[1], qkv[2], attn_mask=keep.reshape(batch, 1, 1, b))
        x = (ctx.transpose(1, 2).reshape(batch, b, hidden) @ p["o"] + x).layernorm()
        x = ((x @ p["ff"]).relu() @ p["ff2"] + x).layernorm()
        w = keep.unsqueeze(-1).float()
        return ((x * w).sum(1) / w.sum(1)).realize(), x.mean(1).realize()

    def reference(k: int, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = _np_layernorm(p_np["we"][ids_np[:, :k]] + p_np["pe"][:k])
        qkv = (x @ p_np["qkv"]).reshape(batch, k, 3, heads, hd).transpose(2, 0, 3, 1, 4)
        keep = np.arange(k)[None] < lengths[:, None]
        s = qkv[0] @ qkv[1].transpose(0, 1, 3, 2) / np.sqrt(hd)
        ctx = _softmax(np.where(keep[:, None, None], s, -np.inf), -1) @ qkv[2]
        x = _np_layernorm(ctx.transpose(0, 2, 1, 3).reshape(batch, k, hidden) @ p_np["o"] + x)
        x = _np_layernorm(np.maximum(x @ p_np["ff"], 0) @ p_np["ff2"] + x)
        w = keep[..., None].astype(np.float32)
        return (x * w).sum(1) / w.sum(1), x.mean(1)

    f = TinyJit(forward) if jit else forward

    def run(k: int) -> None:
        lengths = np.array([k, max(1, k - 2)], dtype=np.int32)
        for got, want in zip(f(N.bind(k), Tensor(lengths)), reference(k, lengths)):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)

    _each_value_compiles_nothing_new(run, compiles)


def test_jitted_result_of_symbolic_shape_takes_each_calls_size(compiles: list[object]) -> None:
    """A replay returns the result with this call's size: its view carries this call's variable value, not the
    capture's."""
    n = Variable("n", 1, 40)
    a_np = _f32(40, 3)
    a = Tensor(a_np).realize()

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * 2 + 1).relu()

    def run(k: int) -> None:
        out = f(a.shrink(((0, n.bind(k)), None)))
        assert out.shape[1] == 3 and out.numpy().shape == (k, 3)
        np.testing.assert_allclose(out.numpy(), np.maximum(a_np[:k] * 2 + 1, 0), rtol=1e-6)

    _each_value_compiles_nothing_new(run, compiles)


@pytest.mark.parametrize("emulated_gpu", [32], indirect=True)
def test_symbolic_launches_on_an_emulated_gpu(emulated_gpu: str, compiles: list[object]) -> None:
    """On a GPU a symbolic axis becomes a launch dimension of symbolic size, which the PYTHON device's program text
    writes as decided by the launch: an elementwise op, a transpose (its tiles along both axes) and a row sum over
    the first n rows, one kernel for every n."""
    n = Variable("n", 1, 40)
    a_np = _f32(40, 16)
    a = Tensor(a_np, device=emulated_gpu).realize()

    def run(k: int) -> None:
        x = a.shrink(((0, n.bind(k)), None))
        np.testing.assert_allclose((x * 2 + 1).numpy(), a_np[:k] * 2 + 1, rtol=1e-6)
        np.testing.assert_array_equal((x.T + 1).contiguous().numpy(), a_np[:k].T + 1)
        np.testing.assert_allclose(x.sum(axis=1).numpy(), a_np[:k].sum(1), rtol=1e-5, atol=1e-5)

    _each_value_compiles_nothing_new(run, compiles)
