"""The op suite: every Tensor op on random shapes and dtypes, on each device, against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lazygrad import Tensor, dtypes
from lazygrad_uop.dtype import DType, to_numpy_dtype

FLOATS = [dtypes.float32, dtypes.float16, dtypes.float64]
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint32]
ALL = [dtypes.bool, *INTS, *FLOATS]

dims = st.integers(0, 5)
shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)
nonempty_shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


def rand_np(shape: tuple[int, ...], dt: DType, seed: int, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    """Random values that are exact in `dt`."""
    rng = np.random.default_rng(seed)
    npdt = to_numpy_dtype(dt)
    if dt == dtypes.bool:
        return rng.random(shape) < 0.5
    if dtypes.is_int(dt):
        lo = 0 if dtypes.is_unsigned(dt) else max(int(low), -100)
        return rng.integers(lo, max(int(high), 1) + 1, size=shape).astype(npdt)
    return rng.uniform(low, high, size=shape).astype(npdt)


def tol(dt: DType) -> dict[str, float]:
    """Tolerances per result dtype."""
    if dt == dtypes.float16:
        return {"rtol": 2e-3, "atol": 2e-3}
    if dt == dtypes.float32:
        return {"rtol": 2e-5, "atol": 1e-5}
    if dt == dtypes.float64:
        return {"rtol": 1e-12, "atol": 1e-12}
    return {"rtol": 0, "atol": 0}


def check(out: Tensor, ref: np.ndarray, **kw: float) -> None:
    """`out` equals numpy's `ref` in shape, dtype and value."""
    got = out.numpy()
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"shape {got.shape} != numpy's {ref.shape}"
    assert got.dtype == ref.dtype, f"dtype {got.dtype} != numpy's {ref.dtype}"
    np.testing.assert_allclose(got, ref, equal_nan=True, **(kw or tol(out.dtype)))


# *** creation ***


@given(shape=shapes, value=st.one_of(st.integers(-5, 5), st.floats(-4, 4, width=32), st.booleans()))
def test_full(device: str, shape: tuple[int, ...], value: float) -> None:
    t = Tensor.full(shape, value, device=device)
    check(t, np.full(shape, value, dtype=to_numpy_dtype(t.dtype)))


@given(shape=shapes)
def test_zeros_ones(device: str, shape: tuple[int, ...]) -> None:
    check(Tensor.zeros(*shape, device=device), np.zeros(shape, np.float32))
    check(Tensor.ones(shape, dtype=dtypes.int32, device=device), np.ones(shape, np.int32))


def test_from_python_and_numpy(device: str) -> None:
    check(Tensor([[1, 2], [3, 4]], device=device), np.array([[1, 2], [3, 4]], dtype=np.int32))
    check(Tensor([1.5, -2.0], device=device), np.array([1.5, -2.0], dtype=np.float32))
    check(Tensor([True, False], device=device), np.array([True, False]))
    arr = np.arange(12, dtype=np.int16).reshape(3, 4)
    check(Tensor(arr, device=device), arr)
    assert Tensor(3.5, device=device).item() == 3.5
    assert Tensor([[1, 2]], device=device).tolist() == [[1, 2]]


@given(start=st.integers(-10, 10), n=st.integers(0, 20), step=st.integers(1, 3))
def test_arange(device: str, start: int, n: int, step: int) -> None:
    check(Tensor.arange(start, start + n, step, device=device), np.arange(start, start + n, step, dtype=np.int32))
    check(Tensor.arange(n, dtype=dtypes.float32, device=device), np.arange(n, dtype=np.float32))


@given(n=st.integers(0, 6), m=st.integers(0, 6))
def test_eye(device: str, n: int, m: int) -> None:
    check(Tensor.eye(n, m, device=device), np.eye(n, m, dtype=np.float32))


def test_rand_range(device: str) -> None:
    Tensor.manual_seed(3)
    v = Tensor.rand(64, 8, device=device).numpy()
    assert v.shape == (64, 8) and v.dtype == np.float32 and (v >= 0).all() and (v < 1).all() and v.std() > 0.2


def test_empty(device: str) -> None:
    t = Tensor.empty(2, 3, device=device)
    assert t.shape == (2, 3) and t.numpy().shape == (2, 3)


# *** elementwise ***

BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "maximum": (lambda a, b: a.maximum(b), np.maximum),
    "minimum": (lambda a, b: a.minimum(b), np.minimum),
}


def broadcast_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast: a shape and a copy with some dims set to 1 or dropped in front."""
    shape = draw(shapes)
    other = tuple(1 if draw(st.booleans()) else d for d in shape)
    other = other[draw(st.integers(0, len(other))) :]
    return (shape, other) if draw(st.booleans()) else (other, shape)


pairs = st.composite(broadcast_pair)()


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.float16])
@given(sh=pairs, seed=st.integers(0, 2**16))
def test_binary(device: str, name: str, dt: DType, sh: tuple, seed: int) -> None:
    if name == "sub" and dtypes.is_unsigned(dt):
        return  # numpy wraps too, but keep the suite about signed semantics; uint wrap is tested in test_int_wrap
    f, g = BINARY[name]
    a, b = rand_np(sh[0], dt, seed), rand_np(sh[1], dt, seed + 1)
    check(f(Tensor(a, device=device), Tensor(b, device=device)), g(a, b))


@given(sh=pairs, seed=st.integers(0, 2**16))
def test_div(device: str, sh: tuple, seed: int) -> None:
    a, b = rand_np(sh[0], dtypes.float32, seed), rand_np(sh[1], dtypes.float32, seed + 1, 0.5, 3)
    check(Tensor(a, device=device) / Tensor(b, device=device), a / b)
    ai, bi = rand_np(sh[0], dtypes.int32, seed), rand_np(sh[1], dtypes.int32, seed + 1, 1, 5)
    check(Tensor(ai, device=device) / Tensor(bi, device=device), (ai / bi).astype(np.float32))
    check(Tensor(ai, device=device) // Tensor(bi, device=device), ai // bi)
    check(Tensor(-ai, device=device) // Tensor(bi, device=device), -ai // bi)
    check(Tensor(ai, device=device) % Tensor(-bi, device=device), ai % -bi)


def test_int_wrap(device: str) -> None:
    a = np.array([250, 3, 128], dtype=np.uint8)
    check(Tensor(a, device=device) + Tensor(a, device=device), a + a)
    b = np.array([2**31 - 1, -(2**31)], dtype=np.int32)
    check(Tensor(b, device=device) + 1, b + np.int32(1))


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.float64])
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_unary_math(device: str, dt: DType, shape: tuple[int, ...], seed: int) -> None:
    x = rand_np(shape, dt, seed)
    pos = np.abs(x) + np.asarray(0.1, dtype=x.dtype)
    t, tp = Tensor(x, device=device), Tensor(pos, device=device)
    k = tol(dt) if dt != dtypes.float32 else {"rtol": 1e-5, "atol": 1e-5}
    check(t.exp(), np.exp(x), **k)
    check(tp.log(), np.log(pos), **k)
    check(t.exp2(), np.exp2(x), **k)
    check(tp.log2(), np.log2(pos), **k)
    check(tp.sqrt(), np.sqrt(pos), **k)
    check(t.sin(), np.sin(x), **k)
    check(t.cos(), np.cos(x), **k)
    check(t.relu(), np.maximum(x, 0), **k)
    check(t.sigmoid(), (1 / (1 + np.exp(-x.astype(np.float64)))).astype(x.dtype), **k)
    check(
        t.tanh(), np.tanh(x), **{"rtol": 1e-3, "atol": 1e-3} if dt == dtypes.float16 else {"rtol": 1e-5, "atol": 2e-6}
    )
    check(-t, -x)
    check(t.abs(), np.abs(x))


def test_math_edge_values(device: str) -> None:
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan], dtype=np.float32)
    t = Tensor(x, device=device)
    with np.errstate(all="ignore"):
        check(t.log2(), np.log2(x))
        check(t.sqrt(), np.sqrt(x))
        check(t.exp2(), np.exp2(x))
        check(t.relu(), np.maximum(x, 0))
        check(t.maximum(Tensor(np.zeros(7, np.float32), device=device)), np.maximum(x, 0))


@pytest.mark.parametrize("dt", ALL)
@given(sh=pairs, seed=st.integers(0, 2**16))
def test_comparisons(device: str, dt: DType, sh: tuple, seed: int) -> None:
    a, b = rand_np(sh[0], dt, seed), rand_np(sh[1], dt, seed + 1)
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    check(ta < tb, a < b)
    check(ta <= tb, a <= b)
    check(ta > tb, a > b)
    check(ta >= tb, a >= b)
    check(ta == tb, a == b)
    check(ta != tb, a != b)


@given(sh=pairs, seed=st.integers(0, 2**16))
def test_where(device: str, sh: tuple, seed: int) -> None:
    c = rand_np(sh[0], dtypes.bool, seed)
    a = rand_np(sh[1], dtypes.float32, seed + 1)
    check(Tensor(c, device=device).where(Tensor(a, device=device), 2.5), np.where(c, a, np.float32(2.5)))
    check(Tensor(c, device=device).where(-1, Tensor(a, device=device)), np.where(c, np.float32(-1), a))


CAST_DTYPES = [
    dtypes.bool,
    dtypes.int8,
    dtypes.uint8,
    dtypes.int16,
    dtypes.int32,
    dtypes.int64,
    dtypes.float16,
    dtypes.float32,
    dtypes.float64,
]


@pytest.mark.parametrize("src", CAST_DTYPES)
@pytest.mark.parametrize("dst", CAST_DTYPES)
def test_cast(device: str, src: DType, dst: DType) -> None:
    x = rand_np((3, 5), src, 7, -100, 100)
    if dtypes.is_float(src) and dtypes.is_unsigned(dst):
        x = np.abs(x)  # float -> unsigned of a negative value is undefined in C and numpy alike
    if dtypes.is_float(src) and dtypes.is_int(dst):
        info = np.iinfo(to_numpy_dtype(dst))
        x = np.clip(x, info.min, info.max).astype(x.dtype)
    with np.errstate(all="ignore"):
        ref = x.astype(to_numpy_dtype(dst))
    check(Tensor(x, device=device).cast(dst), ref)


def test_promotion(device: str) -> None:
    a = Tensor(np.array([1, 2], np.int8), device=device)
    b = Tensor(np.array([3, 4], np.uint8), device=device)
    assert (a + b).dtype == dtypes.int16
    assert (a + 1.5).dtype == dtypes.float32
    assert (Tensor([1.0], device=device).half() + 1).dtype == dtypes.float16
    check(a + b, np.array([4, 6], np.int16))


# *** movement ***


@given(shape=nonempty_shapes, seed=st.integers(0, 2**16), data=st.data())
def test_movement_chain(device: str, shape: tuple[int, ...], seed: int, data: st.DataObject) -> None:
    x = rand_np(shape, dtypes.float32, seed)
    t, r = Tensor(x, device=device), x
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["permute", "flip", "pad", "shrink", "reshape", "expand", "transpose"]))
        nd = r.ndim
        if kind == "permute" and nd:
            order = data.draw(st.permutations(range(nd)))
            t, r = t.permute(order), r.transpose(order)
        elif kind == "transpose" and nd >= 2:
            t, r = t.transpose(0, -1), np.swapaxes(r, 0, -1)
        elif kind == "flip" and nd:
            ax = data.draw(st.integers(0, nd - 1))
            t, r = t.flip(ax), np.flip(r, ax)
        elif kind == "pad":
            p = [(data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in range(nd)]
            t, r = t.pad(p), np.pad(r, p)
        elif kind == "shrink":
            box = []
            for d in r.shape:
                b = data.draw(st.integers(0, d))
                box.append((b, data.draw(st.integers(b, d))))
            t, r = t.shrink(box), r[tuple(slice(b, e) for b, e in box)]
        elif kind == "reshape":
            t, r = t.reshape(-1), r.reshape(-1)
            if r.size and r.size % 2 == 0:
                t, r = t.reshape(2, -1), r.reshape(2, -1)
        elif kind == "expand":
            t, r = t.unsqueeze(0).expand(2, *r.shape), np.broadcast_to(r[None], (2, *r.shape))
    check(t, np.ascontiguousarray(r))
    check(t * 2 + 1, r * np.float32(2) + np.float32(1))


@given(shape=nonempty_shapes, seed=st.integers(0, 2**16), data=st.data())
def test_basic_slicing(device: str, shape: tuple[int, ...], seed: int, data: st.DataObject) -> None:
    x = rand_np(shape, dtypes.int32, seed)
    idx = []
    for d in shape:
        if data.draw(st.booleans()):
            idx.append(data.draw(st.integers(-d, d - 1)))
        else:
            start = data.draw(st.one_of(st.none(), st.integers(-d - 1, d + 1)))
            stop = data.draw(st.one_of(st.none(), st.integers(-d - 1, d + 1)))
            step = data.draw(st.sampled_from([None, 1, 2, 3, -1, -2]))
            idx.append(slice(start, stop, step))
    if data.draw(st.booleans()):
        idx.insert(data.draw(st.integers(0, len(idx))), None)
    check(Tensor(x, device=device)[tuple(idx)], x[tuple(idx)])
    check(Tensor(x, device=device)[..., 0], x[..., 0])


# *** reductions ***


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int32, dtypes.uint8, dtypes.bool, dtypes.float16])
@given(shape=shapes, seed=st.integers(0, 2**16), data=st.data())
def test_reduce(device: str, op: str, dt: DType, shape: tuple[int, ...], seed: int, data: st.DataObject) -> None:
    x = rand_np(shape, dt, seed)
    nd = len(shape)
    axis = data.draw(
        st.one_of(
            st.none(),
            st.integers(-nd, nd - 1) if nd else st.none(),
            st.lists(st.integers(0, max(nd - 1, 0)), unique=True, max_size=nd).map(tuple) if nd else st.none(),
        )
    )
    keepdim = data.draw(st.booleans())
    t = Tensor(x, device=device)
    axes = tuple(range(nd)) if axis is None else (axis,) if isinstance(axis, int) else axis
    empty = any(shape[a] == 0 for a in axes) or (x.size == 0 and axis is None)
    if op in ("max", "min") and empty:
        with pytest.raises(ValueError):
            getattr(t, op)(axis, keepdim).numpy()
        return
    if op == "sum":
        # torch's rule: bools and ints sum to int64
        ref = x.sum(axis=axis, keepdims=keepdim, dtype=np.int64 if not dtypes.is_float(dt) else None)
        check(t.sum(axis, keepdim), ref, **({"rtol": 5e-3, "atol": 5e-2} if dt == dtypes.float16 else {}))
    elif op == "mean":
        if dt == dtypes.bool:
            return
        with np.errstate(all="ignore"):
            ref = (
                x.astype(np.float64)
                .mean(axis=axis, keepdims=keepdim)
                .astype(np.float16 if dt == dtypes.float16 else np.float32)
            )
        check(
            t.mean(axis, keepdim),
            ref,
            **({"rtol": 5e-3, "atol": 5e-3} if dt == dtypes.float16 else {"rtol": 1e-5, "atol": 1e-5}),
        )
    else:
        check(getattr(t, op)(axis, keepdim), getattr(x, op)(axis=axis, keepdims=keepdim))


@given(shape=nonempty_shapes, seed=st.integers(0, 2**16))
def test_reduce_of_view(device: str, shape: tuple[int, ...], seed: int) -> None:
    x = rand_np(shape, dtypes.float32, seed)
    t = Tensor(x, device=device).flip(0).permute(tuple(range(len(shape)))[::-1])
    r = np.flip(x, 0).transpose(tuple(range(len(shape)))[::-1])
    check(t.sum(0), r.sum(0), rtol=1e-5, atol=1e-5)
    check((t * 2 + 1).max(-1, keepdim=True), (r * 2 + 1).max(-1, keepdims=True))


# *** matmul ***


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int32, dtypes.float16])
@given(
    n=st.integers(1, 6),
    k=st.integers(0, 6),
    m=st.integers(1, 6),
    batch=st.sampled_from([(), (2,), (1, 3)]),
    seed=st.integers(0, 2**16),
)
def test_matmul(device: str, dt: DType, n: int, k: int, m: int, batch: tuple[int, ...], seed: int) -> None:
    a, b = rand_np((*batch, n, k), dt, seed), rand_np((k, m), dt, seed + 1)
    ref = (a.astype(np.float64) @ b.astype(np.float64)).astype(a.dtype) if dtypes.is_float(dt) else a @ b
    check(
        Tensor(a, device=device) @ Tensor(b, device=device),
        ref,
        **(
            {"rtol": 1e-2, "atol": 1e-2}
            if dt == dtypes.float16
            else {"rtol": 1e-5, "atol": 1e-5}
            if dt == dtypes.float32
            else {}
        ),
    )


def test_dot_vectors(device: str) -> None:
    a, b = rand_np((5,), dtypes.float32, 1), rand_np((5,), dtypes.float32, 2)
    check(Tensor(a, device=device).dot(Tensor(b, device=device)), np.dot(a, b), rtol=1e-5, atol=1e-5)
    m = rand_np((5, 3), dtypes.float32, 3)
    check(Tensor(a, device=device) @ Tensor(m, device=device), a @ m, rtol=1e-5, atol=1e-5)
    check(Tensor(m.T.copy(), device=device) @ Tensor(a, device=device), m.T @ a, rtol=1e-5, atol=1e-5)


def test_softmax_chain(device: str) -> None:
    x = rand_np((4, 7), dtypes.float32, 5)
    t = Tensor(x, device=device)
    e = (t - t.max(-1, keepdim=True)).exp()
    out = e / e.sum(-1, keepdim=True)
    ex = np.exp(x - x.max(-1, keepdims=True))
    check(out, ex / ex.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


# *** errors ***


def test_bad_input_errors(device: str) -> None:
    t = Tensor.ones(2, 3, device=device)
    with pytest.raises(ValueError, match="reshape"):
        t.reshape(4, 2)
    with pytest.raises(ValueError, match="broadcast"):
        t + Tensor.ones(3, 2, device=device)
    with pytest.raises(ValueError, match="line up"):
        t @ Tensor.ones(2, 3, device=device)
    with pytest.raises(IndexError):
        t[5]
    with pytest.raises(ValueError, match="expand"):
        t.expand(4, 3)
    with pytest.raises(ValueError, match="one element"):
        t.item()
    assert math.isclose(Tensor.ones(1, device=device).item(), 1.0)


@pytest.mark.parametrize(
    "sa,sb",
    [((2, 3, 4), (2, 4, 5)), ((4,), (2, 4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4,))],
)
def test_batched_matmul_broadcasts_like_numpy(device: str, sa: tuple, sb: tuple) -> None:
    a, b = rand_np(sa, dtypes.float32, 1), rand_np(sb, dtypes.float32, 2)
    check(Tensor(a, device=device) @ Tensor(b, device=device), a @ b, rtol=1e-5, atol=1e-5)


def test_comparisons_with_nan(device: str) -> None:
    a = np.array([1.0, np.nan, 2.0, np.nan, 3.0], np.float32)
    b = np.array([1.0, 1.0, np.nan, np.nan, 2.0], np.float32)
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    for got, ref in [(ta <= tb, a <= b), (ta >= tb, a >= b), (ta < tb, a < b), (ta > tb, a > b)]:
        check(got, ref)
    check(ta == tb, a == b)
    check(ta != tb, a != b)
