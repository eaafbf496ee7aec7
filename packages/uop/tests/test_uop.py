"""UOp: interning, immutability, graph walks, substitution, pickling, printing, evaluation and bounds.

Evaluation is checked against Python ints with C semantics written out here (truncating division, results wrapped to
the dtype through ctypes); bounds are checked as a property: every value a node takes lies within [vmin, vmax].
"""

from __future__ import annotations

import ctypes
import gc
import math
import pickle
import weakref
from collections import namedtuple
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp, eval_uop

CTYPES = {
    dtypes.int8: ctypes.c_int8,
    dtypes.uint8: ctypes.c_uint8,
    dtypes.int32: ctypes.c_int32,
    dtypes.uint32: ctypes.c_uint32,
    dtypes.int64: ctypes.c_int64,
    dtypes.uint64: ctypes.c_uint64,
}
INT_DTYPES = list(CTYPES)


def dtype_range(dt: DType) -> tuple[int, int]:
    """The range of an integer dtype, from its width (independent of dtypes.min/max)."""
    bits = 8 * dt.itemsize
    return (0, 2**bits - 1) if ctypes_unsigned(dt) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def ctypes_unsigned(dt: DType) -> bool:
    return CTYPES[dt](-1).value > 0


def wrap(v: int, dt: DType) -> int:
    return CTYPES[dt](v).value


# *** interning ***


def test_same_node_twice_is_the_same_object() -> None:
    x = UOp.variable("x", 0, 10)
    a = UOp(Ops.ADD, dtypes.int32, (x, UOp.const(dtypes.int32, 1)))
    b = UOp(Ops.ADD, dtypes.int32, (x, UOp.const(dtypes.int32, 1)))
    assert a is b and x + 1 is a and hash(a) == hash(b)
    assert UOp(Ops.SINK) is UOp(Ops.SINK, dtypes.void, (), None)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (0.0, -0.0),
        (1, True),
        (1, 1.0),
        (True, 1.0),
        (0, False),
        ((1, 2), (1.0, 2)),
        ((0.0,), (-0.0,)),
        ((1, 2), namedtuple("P", "a b")(1, 2)),
        ((1, 1), (1, True)),
        ((0,), (0.0,)),
        ((0.0, 1), (-0.0, 1)),
        (((1, 2),), ((1, 2.0),)),
        ("1", 1),
        (None, 0),
    ],
    ids=repr,
)
def test_args_that_python_calls_equal_make_different_nodes(a: Any, b: Any) -> None:
    ua, ub = UOp(Ops.NOOP, dtypes.void, (), a), UOp(Ops.NOOP, dtypes.void, (), b)
    assert ua is not ub
    assert type(ua.arg) is type(a) and type(ub.arg) is type(b)
    # and each is still interned
    assert UOp(Ops.NOOP, dtypes.void, (), a) is ua and UOp(Ops.NOOP, dtypes.void, (), b) is ub


def test_consts_of_distinct_values_and_dtypes_are_distinct() -> None:
    assert UOp.const(dtypes.float32, 0.0) is not UOp.const(dtypes.float32, -0.0)
    assert UOp.const(dtypes.int32, 1) is not UOp.const(dtypes.int64, 1)
    assert UOp.const(dtypes.int32, 1) is not UOp.const(dtypes.bool, True)
    nan = UOp.const(dtypes.float32, math.nan)
    assert nan is UOp.const(dtypes.float32, math.nan)  # same bits, same node, though nan != nan


@given(st.sampled_from([dtypes.float32, dtypes.int32, dtypes.bool, dtypes.float16]), st.integers(1, 20), st.booleans())
def test_lanes_are_the_interned_gep_nodes(dtype: DType, count: int, built_first: bool) -> None:
    # `lanes` files its nodes under the interner's own keys: whichever way a lane is built first, both ways give the
    # very node (with the GEP's fields), and a scalar is its own only lane
    v = UOp(Ops.VECTORIZE, dtype.vec(count), tuple(UOp.variable(f"l{i}", 0, 9).cast(dtype) for i in range(count)))
    v = v if count > 1 else v.src[0]
    by_call = [UOp(Ops.GEP, dtype, (v,), (i,)) for i in range(count)] if built_first and count > 1 else None
    lanes = v.lanes()
    if count == 1:
        assert lanes == (v,)
        return
    want = by_call or [UOp(Ops.GEP, dtype, (v,), (i,)) for i in range(count)]
    assert len(lanes) == count and all(a is b for a, b in zip(lanes, want))
    assert all((g.op, g.dtype, g.src, g.arg) == (Ops.GEP, dtype, (v,), (i,)) for i, g in enumerate(lanes))


def test_different_sources_make_different_nodes() -> None:
    x, y = UOp.variable("x", 0, 5), UOp.variable("y", 0, 5)
    assert x + y is not y + x and x + y is not x + x
    assert x + y is not UOp(Ops.ADD, dtypes.int64, (x, y))


def test_nodes_are_freed_when_unreferenced() -> None:
    x = UOp.variable("freed_x", 0, 9)
    y = x * 3 + 1
    refs = [weakref.ref(x), weakref.ref(y), weakref.ref(y.src[0])]
    del x, y
    assert all(r() is None for r in refs)  # plain reference counting frees them, no collection needed
    # a fresh build is a fresh object that the interner hands out again
    z = UOp.variable("freed_x", 0, 9)
    assert z is UOp.variable("freed_x", 0, 9)


def test_nodes_with_cached_walks_are_freed_too() -> None:
    # reference counting alone: a buffer a node keeps alive must be freed as soon as the last user goes, not
    # whenever the cycle collector next runs
    gc.disable()
    try:
        x = UOp.variable("freed_t", 0, 9)
        y = (x * 3 + 1) // 2
        _ = y.toposort, y.vmin, y.render(), y.parents()
        refs = [weakref.ref(x), weakref.ref(y)]
        del x, y, _
        assert all(r() is None for r in refs)
    finally:
        gc.enable()


# *** immutability and hashing ***


@pytest.mark.parametrize("field", ["op", "dtype", "src", "arg"])
def test_immutable(field: str) -> None:
    u = UOp.variable("x", 0, 10)
    with pytest.raises(AttributeError, match="immutable"):
        setattr(u, field, None)
    with pytest.raises(AttributeError, match="immutable"):
        delattr(u, field)
    assert u.op is Ops.DEFINE_VAR and u.arg == ("x", 0, 10)


def test_hash_and_eq_by_identity() -> None:
    x = UOp.variable("x", 0, 10)
    d = {x + 1: "a", x + 2: "b"}
    assert d[x + 1] == "a" and d[UOp(Ops.ADD, dtypes.int32, (x, x.const_like(2)))] == "b"
    assert (x + 1) == (x + 1) and (x + 1) != (x + 2)  # Python's ==/!= stay identity, not elementwise


# *** replace ***


def test_replace() -> None:
    x = UOp.variable("x", 0, 10)
    u = x + 1
    assert u.replace() is u and u.replace(op=Ops.ADD) is u
    assert u.replace(op=Ops.MUL) is x * 1
    assert u.replace(src=(x, x)) is x + x
    assert u.replace(dtype=dtypes.int64).dtype is dtypes.int64 and u.dtype is dtypes.int32
    c = UOp.const(dtypes.int32, 3)
    assert c.replace(arg=4) is UOp.const(dtypes.int32, 4)
    with pytest.raises(TypeError, match="unknown fields"):
        u.replace(name="y")


# *** toposort and parents ***


@st.composite
def random_dags(draw: st.DrawFn) -> list[UOp]:
    """Nodes built in order, each from earlier ones: a random DAG with sharing."""
    n = draw(st.integers(1, 40))
    tag = draw(st.integers(0, 10**6))
    nodes: list[UOp] = []
    for i in range(n):
        srcs = draw(st.lists(st.integers(0, i - 1), max_size=4)) if i else []
        nodes.append(UOp(Ops.NOOP, dtypes.void, tuple(nodes[j] for j in srcs), (tag, i)))
    return nodes


def reachable(root: UOp) -> set[UOp]:
    seen, todo = set(), [root]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.src)
    return seen


@given(random_dags())
def test_toposort_order(nodes: list[UOp]) -> None:
    root = nodes[-1]
    order = list(root.toposort)
    assert len(order) == len(set(order))
    assert set(order) == reachable(root)
    pos = {u: i for i, u in enumerate(order)}
    for u in order:
        assert all(pos[s] < pos[u] for s in u.src)
    assert order[-1] is root


def dfs_postorder(root: UOp) -> list[UOp]:
    """Sources before users, each node's sources visited in order: the order `toposort` promises."""
    out: list[UOp] = []
    seen: set[UOp] = set()

    def visit(n: UOp) -> None:
        if n not in seen:
            seen.add(n)
            for s in n.src:
                visit(s)
            out.append(n)

    visit(root)
    return out


@given(random_dags(), st.data())
def test_toposort_is_the_same_with_walks_cached_below(nodes: list[UOp], data: st.DataObject) -> None:
    # nodes that already know their own walk are reused by the walks above them; the order must not change
    for i in data.draw(st.lists(st.integers(0, len(nodes) - 1), max_size=6)):
        _ = nodes[i].toposort
    assert list(nodes[-1].toposort) == dfs_postorder(nodes[-1])
    assert list(reversed(nodes[-1].toposort)) == dfs_postorder(nodes[-1])[::-1]


def test_toposort_built_says_which_walks_are_cached() -> None:
    x = UOp.variable("toposort_built_x", 0, 10)  # a name no other test uses: none of these nodes exists yet
    mid = x * 3
    top = (mid + 1) * mid
    assert not top.toposort_built and not mid.toposort_built
    assert list(top.toposort)[-1] is top
    # the walk is cached on the node asked, not on the nodes under it (it reuses theirs when they have one)
    assert top.toposort_built and not mid.toposort_built
    _ = mid.toposort
    assert mid.toposort_built


@given(random_dags())
def test_parents(nodes: list[UOp]) -> None:
    root = nodes[-1]
    users = root.parents()
    assert set(users) == reachable(root)
    for n in users:
        assert set(users[n]) == {u for u in reachable(root) if n in u.src}


def test_toposort_deep_graph() -> None:
    x = UOp.variable("x", 0, 10)
    u = x
    for _ in range(20_000):
        u = u + 1
    order = list(u.toposort)
    assert len(order) == 20_002 and order[-1] is u and order[0] is x


# *** substitute ***


def test_substitute_replaces_every_occurrence_and_keeps_sharing() -> None:
    x, y, z = UOp.variable("x", 0, 10), UOp.variable("y", 0, 10), UOp.variable("z", 0, 10)
    shared = x * y
    root = (shared + shared * 2) // (shared + x)
    out = root.substitute({x: z})
    assert x not in out.toposort and y in out.toposort and z in out.toposort
    new_shared = z * y
    assert out is (new_shared + new_shared * 2) // (new_shared + z)
    # the shared product appears once in the result, used three times
    assert sum(1 for n in out.toposort for s in n.src if s is new_shared) == 3
    assert len(out.toposort) == len(root.toposort)


def test_substitute_is_simultaneous() -> None:
    a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 10)
    assert (a + b * 2).substitute({a: b, b: a}) is b + a * 2
    assert a.substitute({a: a + 1}) is a + 1
    assert (a * 3).substitute({a: a * 3}) is (a * 3) * 3
    # the outermost key wins: what it replaced is not searched
    assert ((a + b) * 2).substitute({a + b: a, a: b}) is a * 2


def test_substitute_noop_and_deep() -> None:
    a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 10)
    u = a
    for _ in range(20_000):
        u = u + 1
    assert u.substitute({}) is u and u.substitute({b: a}) is u
    out = u.substitute({a: b})
    assert eval_uop(out, {b: 5}) == 20_005


@given(st.integers(-50, 50), st.integers(-50, 50))
def test_substitute_then_eval_is_eval_at_the_substituted_value(av: int, bv: int) -> None:
    a, b = UOp.variable("a", -50, 50), UOp.variable("b", -50, 50)
    expr = (a * a + b) % 7 + a // 3
    repl = b * 2 - 1
    assert eval_uop(expr.substitute({a: repl}), {b: bv}) == eval_uop(expr, {a: eval_uop(repl, {b: bv}), b: bv})
    assert eval_uop(expr, {a: av, b: bv}) == eval_uop(expr.substitute({a: a.const_like(av)}), {b: bv})


# *** pickling ***


def test_pickle_round_trip_is_the_same_node() -> None:
    x = UOp.variable("x", 0, 10)
    c = UOp.const(dtypes.float32, -0.0)
    shared = x * 2
    root = UOp(Ops.SINK, dtypes.void, (shared + shared, (shared < 5).where(shared, x), c.cast(dtypes.int32)))
    for proto in (2, pickle.HIGHEST_PROTOCOL):
        assert pickle.loads(pickle.dumps(root, proto)) is root
        assert pickle.loads(pickle.dumps(c, proto)) is c
    out_root, out_x = pickle.loads(pickle.dumps((root, x)))
    assert out_root is root and out_x is x


def test_pickle_into_a_fresh_interner_rebuilds_the_graph() -> None:
    blob = pickle.dumps((UOp.variable("pk", 0, 3) + 7) * UOp.variable("pk", 0, 3))
    gc.collect()
    out = pickle.loads(blob)
    x = UOp.variable("pk", 0, 3)
    assert out is (x + 7) * x


# *** printing ***


def test_repr_names_a_shared_node_once() -> None:
    x = UOp.variable("x", 0, 10)
    shared = x * 3
    root = UOp(Ops.SINK, dtypes.void, (shared + 1, shared + 2))
    text = repr(root)
    assert text.count("x0:=") == 1
    assert text.count("Ops.MUL") == 1  # printed once, then referred to by name
    assert text.count("x0") == 2
    definition, use = text.index("x0:="), text.rindex("x0")
    assert definition < use
    assert text.count("Ops.DEFINE_VAR") == 1  # under the shared node, so printed once with it
    assert "Ops.SINK" in text.splitlines()[0]


def test_repr_balanced_and_mentions_every_node() -> None:
    x, y = UOp.variable("x", 0, 10), UOp.variable("y", 0, 10)
    root = (x + y) * (x + 2)
    text = repr(root)
    assert text.count("(") == text.count(")")
    assert text.count("UOp(") == len(root.toposort)  # every distinct node printed once; x then by its name
    assert text.count("x0:=") == 1 and text.count("x0") == 2
    assert "'x'" in text and "'y'" in text


def test_repr_deep_graph() -> None:
    u = UOp.variable("x", 0, 10)
    for i in range(10_000):
        u = u + i
    text = repr(u)
    assert text.count("Ops.ADD") == 10_000 and text.count("(") == text.count(")")


def test_render() -> None:
    x, y = UOp.variable("x", 0, 10), UOp.variable("y", 0, 10)
    assert ((x + 1) * y // 2).render() == "(((x+1)*y)//2)"
    assert x.maximum(y).render() == "max(x, y)"
    assert UOp.range(8, 1).render() == "ridx1"


# *** evaluation against Python ints with C semantics ***


def c_div(a: int, b: int) -> int:
    return math.trunc(Fraction(a, b))  # C truncates toward zero


def c_mod(a: int, b: int) -> int:
    return a - b * c_div(a, b)


INT_BINOPS: dict[str, tuple[Any, Any]] = {
    # name: (how the UOp is built, the reference on Python ints before wrapping)
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "idiv": (lambda a, b: a // b, c_div),
    "mod": (lambda a, b: a % b, c_mod),
    "max": (lambda a, b: a.maximum(b), max),
    "min": (lambda a, b: a.minimum(b), min),
    "and": (lambda a, b: a & b, lambda a, b: a & b),
    "or": (lambda a, b: a | b, lambda a, b: a | b),
    "xor": (lambda a, b: a ^ b, lambda a, b: a ^ b),
}
BOOL_OPS: dict[str, tuple[Any, Any]] = {
    "lt": (lambda a, b: a < b, lambda a, b: a < b),
    "gt": (lambda a, b: a > b, lambda a, b: a > b),
    "le": (lambda a, b: a <= b, lambda a, b: a <= b),
    "ge": (lambda a, b: a >= b, lambda a, b: a >= b),
    "ne": (lambda a, b: a.ne(b), lambda a, b: a != b),
    "eq": (lambda a, b: a.eq(b), lambda a, b: a == b),
}
N_VARS = 3


def int_trees(max_leaves: int = 12) -> st.SearchStrategy:
    consts = st.one_of(st.integers(-8, 8), st.integers(-(2**64), 2**64))
    leaf = st.one_of(st.tuples(st.just("var"), st.integers(0, N_VARS - 1)), st.tuples(st.just("const"), consts))

    def extend(inner: st.SearchStrategy) -> st.SearchStrategy:
        cond = st.one_of(
            st.tuples(st.sampled_from(sorted(BOOL_OPS)), inner, inner),
            st.tuples(st.sampled_from(sorted(BOOL_OPS)), inner, st.integers(-8, 8)),
        )
        cond = st.one_of(cond, st.tuples(st.sampled_from(["band", "bor"]), cond, cond), st.tuples(st.just("not"), cond))
        return st.one_of(
            st.tuples(st.sampled_from(sorted(INT_BINOPS)), inner, inner),
            st.tuples(st.sampled_from(["radd", "rsub", "rmul"]), st.integers(-8, 8), inner),
            st.tuples(st.just("neg"), inner),
            st.tuples(st.sampled_from(["shl", "shr"]), inner, st.integers(0, 7)),
            st.tuples(st.just("where"), cond, inner, inner),
        )

    return st.recursive(leaf, extend, max_leaves=max_leaves)


def build(t: tuple, vs: list[UOp]) -> UOp:
    k = t[0]
    if k == "var":
        return vs[t[1]]
    if k == "const":
        return vs[0].const_like(t[1])
    if k in BOOL_OPS:
        return BOOL_OPS[k][0](build(t[1], vs), t[2] if isinstance(t[2], int) else build(t[2], vs))
    if k == "band":
        return build(t[1], vs) & build(t[2], vs)
    if k == "bor":
        return build(t[1], vs) | build(t[2], vs)
    if k == "not":
        return build(t[1], vs).logical_not()
    if k == "radd":
        return t[1] + build(t[2], vs)
    if k == "rsub":
        return t[1] - build(t[2], vs)
    if k == "rmul":
        return t[1] * build(t[2], vs)
    if k == "neg":
        return -build(t[1], vs)
    if k == "shl":
        return build(t[1], vs) << t[2]
    if k == "shr":
        return build(t[1], vs) >> t[2]
    if k == "where":
        return build(t[1], vs).where(build(t[2], vs), build(t[3], vs))
    return INT_BINOPS[k][0](build(t[1], vs), build(t[2], vs))


def reference(t: tuple, vals: list[int], dt: DType) -> int | bool:
    """The value in C: every integer result wrapped to `dt`; both sides of a select evaluated (as eval_uop does)."""
    k = t[0]
    if k == "var":
        return vals[t[1]]
    if k == "const":
        return wrap(t[1], dt)
    if k in BOOL_OPS:
        b = wrap(t[2], dt) if isinstance(t[2], int) else reference(t[2], vals, dt)
        return BOOL_OPS[k][1](reference(t[1], vals, dt), b)
    if k == "band":
        return reference(t[1], vals, dt) & reference(t[2], vals, dt)
    if k == "bor":
        return reference(t[1], vals, dt) | reference(t[2], vals, dt)
    if k == "not":
        return not reference(t[1], vals, dt)
    if k == "radd":
        return wrap(wrap(t[1], dt) + reference(t[2], vals, dt), dt)
    if k == "rsub":
        return wrap(wrap(t[1], dt) - reference(t[2], vals, dt), dt)
    if k == "rmul":
        return wrap(wrap(t[1], dt) * reference(t[2], vals, dt), dt)
    if k == "neg":
        return wrap(-reference(t[1], vals, dt), dt)
    if k == "shl":
        return wrap(reference(t[1], vals, dt) << t[2], dt)
    if k == "shr":
        return wrap(reference(t[1], vals, dt) >> t[2], dt)
    if k == "where":
        c, x, y = (reference(s, vals, dt) for s in t[1:])
        return x if c else y
    return wrap(INT_BINOPS[k][1](reference(t[1], vals, dt), reference(t[2], vals, dt)), dt)


def make_vars(dt: DType, bounds: list[tuple[int, int]]) -> list[UOp]:
    return [UOp.variable(f"v{i}", lo, hi, dt) for i, (lo, hi) in enumerate(bounds)]


@st.composite
def points(draw: st.DrawFn, dt: DType) -> tuple[list[tuple[int, int]], list[int]]:
    """Random variable bounds inside the dtype's range and a point inside them, biased to small and extreme."""
    lo_d, hi_d = dtype_range(dt)
    edge = st.sampled_from([lo_d, lo_d + 1, hi_d - 1, hi_d, 0, 1, -1])
    val = st.one_of(st.integers(-8, 8), st.integers(lo_d, hi_d), edge).map(lambda v: min(max(v, lo_d), hi_d))
    bounds, vals = [], []
    for _ in range(N_VARS):
        a, b = sorted((draw(val), draw(val)))
        bounds.append((a, b))
        vals.append(draw(st.one_of(st.integers(a, b), st.sampled_from([a, b]))))
    return bounds, vals


@settings(max_examples=400, deadline=None)
@given(st.data(), st.sampled_from(INT_DTYPES), int_trees())
def test_eval_matches_c_semantics(data: st.DataObject, dt: DType, tree: tuple) -> None:
    bounds, vals = data.draw(points(dt))
    vs = make_vars(dt, bounds)
    u = build(tree, vs)
    env = dict(zip(vs, vals, strict=True))
    try:
        want = reference(tree, vals, dt)
    except ZeroDivisionError:
        with pytest.raises(ZeroDivisionError):
            eval_uop(u, env)
        return
    got = eval_uop(u, env)
    assert got == want and type(got) is type(want)


@settings(max_examples=400, deadline=None)
@given(st.data(), st.sampled_from(INT_DTYPES), int_trees())
def test_bounds_are_sound(data: st.DataObject, dt: DType, tree: tuple) -> None:
    bounds, vals = data.draw(points(dt))
    vs = make_vars(dt, bounds)
    u = build(tree, vs)
    env = dict(zip(vs, vals, strict=True))
    checked = 0
    for n in u.toposort:
        try:
            v = eval_uop(n, env)
        except ZeroDivisionError:
            continue
        assert n.vmin <= v <= n.vmax, f"{n.render()} = {v} outside [{n.vmin}, {n.vmax}] at {vals}"
        checked += 1
    assume(checked > 0)


@pytest.mark.parametrize("dt", INT_DTYPES)
def test_bounds_stay_in_the_dtype(dt: DType) -> None:
    lo, hi = dtype_range(dt)
    x = UOp.variable("x", lo, hi, dt)
    for u in (x + 1, x * 2, -x, x - 1, x << 3, x // -1, x % -7, x.cast(dtypes.int8), (x < 0).cast(dt)):
        ulo, uhi = dtype_range(u.dtype)
        assert ulo <= u.vmin <= u.vmax <= uhi


def test_bounds_exact_cases() -> None:
    x = UOp.variable("x", -3, 10)
    assert (x.vmin, x.vmax) == (-3, 10)
    assert ((x + 5).vmin, (x + 5).vmax) == (2, 15)
    assert ((x * -2).vmin, (x * -2).vmax) == (-20, 6)
    assert ((x % 4).vmin, (x % 4).vmax) == (-3, 3)
    assert ((x // 4).vmin, (x // 4).vmax) == (0, 2)  # C: -3 // 4 == 0
    assert (x.minimum(5).vmin, x.minimum(5).vmax) == (-3, 5)
    assert (x.maximum(5).vmin, x.maximum(5).vmax) == (5, 10)
    r = UOp.range(16, 0)
    assert (r.vmin, r.vmax) == (0, 15)
    assert ((x < 11).vmin, (x < 11).vmax) == (True, True)
    assert ((x < -3).vmin, (x < -3).vmax) == (False, False)
    assert (UOp.special(64, "gidx0").vmin, UOp.special(64, "gidx0").vmax) == (0, 63)
    assert (x.bind(4).vmin, x.bind(4).vmax) == (-3, 10)
    u = UOp.variable("u", 0, 10, dtypes.uint32)
    assert (u.minimum(5).vmin, u.minimum(5).vmax) == (0, 5)


def test_minimum_at_the_ends_of_the_range() -> None:
    for dt in INT_DTYPES:
        lo, hi = dtype_range(dt)
        a, b = UOp.variable("a", lo, hi, dt), UOp.variable("b", lo, hi, dt)
        for av, bv in [(lo, hi), (hi, lo), (0, 5), (5, 0), (lo, lo + 1), (hi - 1, hi)]:
            assert eval_uop(a.minimum(b), {a: av, b: bv}) == min(av, bv)
    p, q = UOp.variable("p", 0, 1, dtypes.bool), UOp.variable("q", 0, 1, dtypes.bool)
    for pv in (False, True):
        for qv in (False, True):
            assert eval_uop(p.minimum(q), {p: pv, q: qv}) is (pv and qv)
    f = UOp.variable("f", 0, 1, dtypes.float32)
    assert eval_uop(f.minimum(-2.5), {f: 1.0}) == -2.5


def test_bounds_deep_graph() -> None:
    x = UOp.variable("x", 0, 10)
    u = x
    for _ in range(20_000):
        u = u + 1
    assert (u.vmin, u.vmax) == (20_000, 20_010)
    assert eval_uop(u, {x: 3}) == 20_003


def test_eval_floats_and_casts() -> None:
    f = UOp.variable("f", 0, 1, dtypes.float32)  # eval_uop takes any value for a variable
    assert eval_uop(f * 2.0 + 1.0, {f: 0.25}) == 1.5
    assert eval_uop(f.cast(dtypes.int32), {f: -2.75}) == -2  # C truncates float -> int
    assert eval_uop((f / 4.0), {f: 1.0}) == 0.25
    assert eval_uop(f.alu(Ops.RECIP), {f: -0.0}) == -math.inf
    i = UOp.variable("i", 0, 1000)
    assert eval_uop(i.cast(dtypes.uint8), {i: 300}) == 44
    assert eval_uop(i.cast(dtypes.bool), {i: 2}) is True
    assert eval_uop(i.cast(dtypes.float32), {i: 3}) == 3.0


def test_eval_errors() -> None:
    x = UOp.variable("x", 0, 10)
    with pytest.raises(KeyError, match="x"):
        eval_uop(x + 1)
    assert eval_uop(x.bind(3) + 1) == 4
    assert eval_uop(x.bind(3) * x) == 9  # a bound variable has its value everywhere in the graph
    assert eval_uop(x.bind(3) + 1, {x: 5}) == 4  # the BIND's own value is what it evaluates to


# *** operator dtype rules ***


def test_operator_dtypes() -> None:
    x = UOp.variable("x", 0, 10)
    f = UOp.const(dtypes.float16, 1.5)
    for cmp in (x < 3, x > 3, x <= 3, x >= 3, x.ne(3), x.eq(3), 3 < x):
        assert cmp.dtype is dtypes.bool
    assert (f < 2.0).dtype is dtypes.bool
    v = UOp.const(dtypes.float32.vec(4), 1.0)
    assert (v < v).dtype is dtypes.bool.vec(4)
    assert (x + 1).dtype is dtypes.int32 and (2 * x).dtype is dtypes.int32 and (f * 2).dtype is dtypes.float16
    assert (x < 3).where(f, 0.5).dtype is dtypes.float16 and (x < 3).where(0.5, f).dtype is dtypes.float16
    assert x.cast(dtypes.int32) is x and x.cast(dtypes.int64).dtype is dtypes.int64
    assert (1 - x).src[0].arg == 1 and (7 // x).src[0].arg == 7 and (7 % x).src[0].arg == 7


def test_constants_take_the_dtype() -> None:
    u8 = UOp.variable("b", 0, 255, dtypes.uint8)
    assert (u8 + 300).src[1].arg == 44
    assert (u8 - 1).src[1].src[1].arg == 255  # -1 wraps in an unsigned dtype
    assert type(UOp.const(dtypes.float32, 1).arg) is float and type(UOp.const(dtypes.int32, 1.9).arg) is int
    assert UOp.const(dtypes.float32, 0.1).arg == Fraction(13421773, 134217728)  # 0.1 rounded to float32
    v = UOp.const(dtypes.int32.vec(3), 7)
    assert v.op is Ops.VECTORIZE and all(s is UOp.const(dtypes.int32, 7) for s in v.src)


# *** errors ***


def test_clear_errors() -> None:
    x = UOp.variable("x", 0, 10)
    with pytest.raises(TypeError, match="truth value"):
        bool(x < 3)
    with pytest.raises(TypeError, match="truth value"):
        if x:
            pass
    assert bool(UOp.const(dtypes.int32, 2)) is True and bool(UOp.const(dtypes.int32, 0)) is False
    with pytest.raises(ValueError, match=r"x=11.*\[0, 10\]"):
        x.bind(11)
    with pytest.raises(ValueError, match="x=-1"):
        x.bind(-1)
    with pytest.raises(TypeError, match="only variables"):
        (x + 1).bind(1)
    with pytest.raises(TypeError, match="unbind needs a BIND"):
        x.unbind()
    assert x.bind(4).unbind() == (x, 4)
    with pytest.raises(ValueError, match="min 5 > max 4"):
        UOp.variable("y", 5, 4)
    with pytest.raises(TypeError, match="not iterable"):
        list(x)
    with pytest.raises(TypeError, match="true division"):
        _ = x / 2
    with pytest.raises(TypeError, match="negate a bool"):
        _ = -(x < 2)
    with pytest.raises(TypeError, match="tuple of UOps"):
        UOp(Ops.ADD, dtypes.int32, [x, x])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tuple of UOps"):
        UOp(Ops.ADD, dtypes.int32, (x, 1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Ops member"):
        UOp("ADD", dtypes.int32, (x, x))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Python value"):
        UOp.const(dtypes.int32, x)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="at least one UOp"):
        (x < 2).where(1, 2)
    with pytest.raises(TypeError, match="only variables have names"):
        _ = (x + 1).expr
    assert x.expr == "x"
