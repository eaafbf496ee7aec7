"""UPat, PatternMatcher and graph_rewrite: matching semantics, rule order, dispatch, fixed points, memoisation."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lazygrad_uop.config import Context
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.pattern import PatternMatcher, RewriteError, UPat, graph_rewrite
from lazygrad_uop.uop import UOp, eval_uop

x = UOp.variable("x", 0, 10)
y = UOp.variable("y", 0, 10)
c3 = UOp.const(dtypes.int32, 3)


def matches(p: UPat, u: UOp) -> list[dict[str, UOp]]:
    return p.match(u, {})


# *** UPat ***


def test_op_sets() -> None:
    p = UPat((Ops.ADD, Ops.MUL))
    assert matches(p, x + 1) and matches(p, x * 1) and not matches(p, x // 1) and not matches(p, x)
    assert matches(UPat(GroupOp.Binary), x % 2) and not matches(UPat(GroupOp.Binary), x)
    assert matches(UPat(Ops.DEFINE_VAR), x) and matches(UPat(), x) and matches(UPat(), x < 1)


def test_dtype() -> None:
    f = UOp.const(dtypes.float32, 1.0)
    assert matches(UPat(dtype=dtypes.int32), x) and not matches(UPat(dtype=dtypes.int32), f)
    assert matches(UPat(dtype=(dtypes.int32, dtypes.float32)), f)
    assert not matches(UPat(dtype=dtypes.int32), x.cast(dtypes.int64))
    v = UOp.const(dtypes.float32.vec(4), 1.0)
    assert matches(UPat(dtype=dtypes.float32), v)  # a scalar dtype also matches its vectors
    assert not matches(UPat(dtype=dtypes.float32.vec(2)), v)
    assert matches(UPat(dtype=dtypes.bool), x < 1)


def test_arg_equality_is_exact() -> None:
    one, true, fone = UOp.const(dtypes.int32, 1), UOp.const(dtypes.bool, True), UOp.const(dtypes.float32, 1.0)
    assert matches(UPat(arg=1), one) and not matches(UPat(arg=1), true) and not matches(UPat(arg=1), fone)
    assert matches(UPat(arg=True), true) and not matches(UPat(arg=True), one)
    assert matches(UPat(arg=1.0), fone) and not matches(UPat(arg=1.0), one)
    zero, negzero = UOp.const(dtypes.float32, 0.0), UOp.const(dtypes.float32, -0.0)
    assert matches(UPat.const(dtypes.float32, 0.0), zero) and not matches(UPat.const(dtypes.float32, 0.0), negzero)
    assert matches(UPat.const(None, -0.0), negzero) and not matches(UPat.const(None, -0.0), zero)
    assert matches(UPat(arg=("x", 0, 10)), x) and not matches(UPat(arg=("x", 0, 11)), x)
    assert not matches(UPat(arg=("x", 0.0, 10)), x)


def test_tuple_src_matches_in_order() -> None:
    p = UPat(Ops.ADD, src=(UPat(Ops.DEFINE_VAR, name="a"), UPat(Ops.CONST, name="b")))
    assert matches(p, x + 3) == [{"a": x, "b": c3}]
    assert matches(p, 3 + x) == []
    assert matches(UPat(Ops.ADD, src=(UPat(),)), x + 3) == []  # length must agree


def test_list_src_matches_any_permutation() -> None:
    p = UPat(Ops.ADD, src=[UPat(Ops.DEFINE_VAR, name="a"), UPat(Ops.CONST, name="b")])
    assert matches(p, x + 3) == [{"a": x, "b": c3}] and matches(p, 3 + x) == [{"a": x, "b": c3}]
    both = matches(UPat(Ops.ADD, src=[UPat.var("a"), UPat.var("b")]), x + y)
    assert sorted((d["a"].expr, d["b"].expr) for d in both) == [("x", "y"), ("y", "x")]
    # equal sources give one binding, not one per order
    assert matches(UPat(Ops.ADD, src=[UPat.var("a"), UPat.var("b")]), x + x) == [{"a": x, "b": x}]
    w = UOp(Ops.WHERE, dtypes.int32, (x < 1, x, y))
    assert len(matches(UPat(Ops.WHERE, src=[UPat.var("a"), UPat.var("b"), UPat(Ops.CMPLT, name="c")]), w)) == 2
    assert len(matches(UPat(Ops.WHERE, src=[UPat(), UPat(), UPat(Ops.CMPLT, name="c")]), w)) == 1


def test_single_upat_src_repeats() -> None:
    p = UPat(Ops.SINK, src=UPat(Ops.CONST))
    c = [UOp.const(dtypes.int32, i) for i in range(5)]
    assert matches(p, UOp(Ops.SINK, dtypes.void, tuple(c)))
    assert not matches(p, UOp(Ops.SINK, dtypes.void, (*c, x)))
    assert matches(p, UOp(Ops.SINK))  # every one of no sources matches
    same = UPat(Ops.SINK, src=UPat.var("v"))
    assert matches(same, UOp(Ops.SINK, dtypes.void, (x, x, x))) == [{"v": x}]
    assert not matches(same, UOp(Ops.SINK, dtypes.void, (x, x, y)))


def test_allow_any_len() -> None:
    sink = UOp(Ops.SINK, dtypes.void, (x, y, c3))
    assert not matches(UPat(Ops.SINK, src=(UPat.var("a"),)), sink)
    assert matches(UPat(Ops.SINK, src=(UPat.var("a"),), allow_any_len=True), sink) == [{"a": x}]
    assert matches(UPat(Ops.SINK, src=(UPat.var("a"), UPat.var("b")), allow_any_len=True), sink)
    short = UOp(Ops.SINK, dtypes.void, (x,))
    assert not matches(UPat(Ops.SINK, src=(UPat(), UPat()), allow_any_len=True), short)


def test_names_bind_consistently() -> None:
    p = UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a")))
    assert matches(p, x + x) == [{"a": x}] and matches(p, x + y) == []
    nested = UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("c"))), UPat.var("a")))
    assert matches(nested, (x + 3) * x) == [{"a": x, "c": c3}]
    assert matches(nested, (x + 3) * y) == []
    # a name bound by the caller is honoured too
    assert UPat.var("a").match(x, {"a": x}) == [{"a": x}] and UPat.var("a").match(y, {"a": x}) == []


def test_upat_helpers() -> None:
    a, b = UPat.var("a"), UPat.cvar("b")
    assert matches(a + b, x + 3) == [{"a": x, "b": c3}] == matches(a + b, 3 + x)
    assert matches(a * 3, x * 3) == [{"a": x}] and matches(a * 3, x * 4) == []
    assert matches(a // b, x // 3) and not matches(a // b, 3 // x)
    assert matches(a.where(b, UPat.var("z")), (x < 1).where(3, y)) == [{"a": x < 1, "b": c3, "z": y}]
    assert matches(a.cast(dtypes.int64), x.cast(dtypes.int64)) == [{"a": x}]
    assert matches(UPat(Ops.CONST).named("k"), c3) == [{"k": c3}]
    assert matches((a + b).named("s"), x + 3) == [{"a": x, "b": c3, "s": x + 3}]


# *** PatternMatcher ***


def test_first_non_none_result_wins() -> None:
    calls: list[str] = []

    def rule(tag: str, out: UOp | None):
        def f(v: UOp) -> UOp | None:
            calls.append(tag)
            return out

        return f

    pm = PatternMatcher(
        [
            (UPat(Ops.ADD, name="v"), rule("none", None)),
            (UPat(Ops.ADD, name="v"), rule("itself", x + 1)),  # returning the node itself means "no change"
            (UPat(Ops.ADD, name="v"), rule("first", y)),
            (UPat(Ops.ADD, name="v"), rule("second", c3)),
        ]
    )
    assert pm.rewrite(x + 1) is y and calls == ["none", "itself", "first"]
    assert pm.rewrite(x * 1) is None
    assert (pm + PatternMatcher([(UPat(Ops.MUL, name="v"), rule("mul", c3))])).rewrite(x * 1) is c3


def test_ctx_only_passed_to_functions_that_declare_it() -> None:
    seen: list = []
    pm = PatternMatcher(
        [
            (UPat(Ops.CONST, name="c"), lambda c: seen.append(("no ctx", c.arg))),
            (UPat(Ops.CONST, name="c"), lambda ctx, c: seen.append(("ctx", ctx, c.arg))),
        ]
    )
    assert pm.rewrite(c3, ctx="hello") is None
    assert seen == [("no ctx", 3), ("ctx", "hello", 3)]
    seen.clear()
    graph_rewrite(c3 + x, pm, ctx={"k": 1})
    assert ("ctx", {"k": 1}, 3) in seen


def test_dispatch_on_op_never_calls_other_rules() -> None:
    calls = Counter()

    def make(op: Ops):
        def f(v: UOp) -> None:
            calls[op] += 1

        return f

    other = [op for op in Ops if op not in (Ops.ADD, Ops.CONST, Ops.DEFINE_VAR)]
    rules = [(UPat(op, name="v"), make(op)) for op in other for _ in range(10)]
    assert len(rules) > 300
    pm = PatternMatcher([*rules, (UPat(Ops.ADD, name="v"), make(Ops.ADD))])
    graph_rewrite(x + 1, pm)
    assert calls == Counter({Ops.ADD: 1})


def test_dispatch_scales() -> None:
    # a complexity check, counted rather than timed: 500 rules on other ops are never tried on these nodes
    tried = 0

    def counting(v: UOp) -> None:
        nonlocal tried
        tried += 1

    rules = [(UPat(Ops.MUL if i % 2 else Ops.IDIV, name="v"), counting) for i in range(500)]
    pm = PatternMatcher(rules)
    u = x
    for i in range(2_000):
        u = u + i
    assert graph_rewrite(u, pm) is u
    assert tried == 0
    # and the same rules are tried on a node of their op: every MUL rule matches it, none rewrites it
    assert graph_rewrite(x * 3, pm) is x * 3 and tried == 250


# *** graph_rewrite ***


def fold_add(a: UOp, b: UOp) -> UOp:
    return a.const_like(a.arg + b.arg)


folding = PatternMatcher(
    [
        (UPat(Ops.ADD, src=(UPat.cvar("a"), UPat.cvar("b"))), fold_add),
        # its output is rewritable again: (v + a) + b -> v + (a + b) -> fold
        (
            UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(UPat.var("v"), UPat.cvar("a"))), UPat.cvar("b"))),
            lambda v, a, b: v + (a + b),
        ),
        (UPat(Ops.MUL, src=(UPat.var("v"), UPat.const(dtypes.int32, 2))), lambda v: v + v),
        (UPat(Ops.ADD, src=(UPat.var("v"), UPat.var("v"))), lambda v: v * 2 if v.op is not Ops.CONST else None),
    ]
)


def no_rule_applies(root: UOp, pm: PatternMatcher) -> bool:
    return all(pm.rewrite(n) is None for n in root.toposort)


def test_bottom_up_reaches_a_fixed_point() -> None:
    u = ((x + 1) + 2) + 3
    out = graph_rewrite(u, folding)
    assert out is x + 6 and no_rule_applies(out, folding)
    chain = UOp.const(dtypes.int32, 0)
    for i in range(1, 50):
        chain = chain + i
    assert graph_rewrite(chain, folding) is UOp.const(dtypes.int32, sum(range(50)))


@given(st.recursive(st.integers(-5, 5), lambda inner: st.tuples(inner, inner), max_leaves=20), st.integers(0, 10))
def test_folding_random_sums(tree, xv: int) -> None:
    def build(t) -> UOp:
        return x.const_like(t) if isinstance(t, int) else build(t[0]) + build(t[1])

    def total(t) -> int:
        return t if isinstance(t, int) else total(t[0]) + total(t[1])

    u = build(tree) + x
    out = graph_rewrite(u, folding)
    assert no_rule_applies(out, folding)
    assert out is x.const_like(total(tree)) + x
    assert eval_uop(out, {x: xv}) == total(tree) + xv


def test_a_rule_is_called_once_per_distinct_node() -> None:
    # a 200-deep diamond chain: 2**200 paths from the root, 601 distinct nodes (ADD, NEG, RECIP a level, and x)
    u = x
    for _ in range(200):
        u = UOp(Ops.ADD, dtypes.int32, (UOp(Ops.NEG, dtypes.int32, (u,)), UOp(Ops.RECIP, dtypes.int32, (u,))))
    seen = Counter()

    def count(v: UOp) -> None:
        seen[v] += 1

    assert graph_rewrite(u, PatternMatcher([(UPat(name="v"), count)])) is u
    assert len(seen) == len(u.toposort) == 601 and set(seen.values()) == {1}


def test_rewriting_a_diamond_chain_keeps_sharing() -> None:
    u = x
    for _ in range(200):
        u = UOp(Ops.ADD, dtypes.int32, (UOp(Ops.NEG, dtypes.int32, (u,)), UOp(Ops.RECIP, dtypes.int32, (u,))))
    calls = Counter()

    def neg_to_max(v: UOp, a: UOp) -> UOp:
        calls[v] += 1
        return a.maximum(0)

    out = graph_rewrite(u, PatternMatcher([(UPat(Ops.NEG, src=(UPat.var("a"),), name="v"), neg_to_max)]))
    assert len(out.toposort) == 200 * 3 + 2  # ADD, MAX, RECIP a level, x, and one 0 shared by every MAX
    assert not any(n.op is Ops.NEG for n in out.toposort)
    assert len(calls) == 200 and set(calls.values()) == {1}


def test_top_down_replaces_before_children_are_visited() -> None:
    visited: list[UOp] = []

    def visit(v: UOp) -> None:
        visited.append(v)

    pm = PatternMatcher(
        [
            (UPat(Ops.MUL, src=(UPat(), UPat()), name="v"), lambda v: UOp.const(dtypes.int32, 7)),
            (UPat((Ops.ADD, Ops.DEFINE_VAR), name="v"), visit),
        ]
    )
    u = (x + 1) * (y + 2) + 5
    assert graph_rewrite(u, pm, top_down=True) is UOp.const(dtypes.int32, 7) + 5
    assert x not in visited and y not in visited and (x + 1) not in visited
    visited.clear()
    assert graph_rewrite(u, pm) is UOp.const(dtypes.int32, 7) + 5
    assert x in visited and y in visited and (x + 1) in visited  # bottom-up rewrites the children first


def test_top_down_result_is_rewritten_again() -> None:
    # the replacement is itself offered to the rules (and its sources rewritten) until nothing applies
    pm = PatternMatcher(
        [
            (UPat(Ops.MUL, src=(UPat.var("a"), UPat.var("b"))), lambda a, b: a + b),
            (UPat(Ops.CONST, arg=1), lambda: UOp.const(dtypes.int32, 100)),
        ]
    )
    assert graph_rewrite((x * 1) * y, pm, top_down=True) is (x + UOp.const(dtypes.int32, 100)) + y


def test_deep_graphs_do_not_recurse() -> None:
    u = x
    for _ in range(20_000):
        u = u + 1
    assert graph_rewrite(u, folding) is x + 20_000
    assert graph_rewrite(u, PatternMatcher([])) is u
    rename = PatternMatcher([(UPat(Ops.DEFINE_VAR, arg=x.arg), lambda: y)])
    out = graph_rewrite(u, rename, top_down=True)
    assert len(out.toposort) == len(u.toposort) and eval_uop(out, {y: 4}) == 20_004


def test_cycle_of_rules_raises() -> None:
    a, b = UOp(Ops.NOOP, dtypes.void, (), "a"), UOp(Ops.NOOP, dtypes.void, (), "b")
    swap = PatternMatcher([(UPat(Ops.NOOP, arg="a"), lambda: b), (UPat(Ops.NOOP, arg="b"), lambda: a)])
    for top_down in (False, True):
        with pytest.raises(RewriteError, match="cycle"):
            graph_rewrite(UOp(Ops.SINK, dtypes.void, (a,)), swap, top_down=top_down, name="swap")
    # a rule that wraps its own match grows forever: the rebuilt node comes round again
    grow = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: v + 1)])
    with pytest.raises(RewriteError):
        graph_rewrite(x, grow)


def test_rewrite_limit() -> None:
    # fresh nodes forever (no node repeats): only the budget stops it
    count_up = PatternMatcher([(UPat(Ops.CONST, dtype=dtypes.int32, name="c"), lambda c: c.const_like(c.arg + 1))])
    for top_down in (False, True):
        with Context(REWRITE_LIMIT=500), pytest.raises(RewriteError, match="REWRITE_LIMIT"):
            graph_rewrite(c3, count_up, top_down=top_down)
    # the budget counts rewrites, not visits: a big graph that needs none is fine under a small limit
    u = x
    for _ in range(2_000):
        u = u * x
    with Context(REWRITE_LIMIT=10):
        assert graph_rewrite(u, count_up) is u and graph_rewrite(u, count_up, top_down=True) is u


# *** memo=True: results kept on the nodes for later calls ***


def counting_folding() -> tuple[PatternMatcher, Counter]:
    """`folding`'s rule in a fresh matcher (its own memo), counting the nodes it is called on."""
    calls: Counter = Counter()

    def fold(a: UOp, b: UOp, v: UOp) -> UOp:
        calls[v] += 1
        return a.const_like(a.arg + b.arg)

    pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.cvar("a"), UPat.cvar("b")), name="v"), fold)])
    return pm, calls


@given(st.recursive(st.integers(-5, 5), lambda inner: st.tuples(inner, inner), max_leaves=20), st.integers(0, 10))
def test_memo_gives_what_a_plain_rewrite_gives(tree, xv: int) -> None:
    def build(t) -> UOp:
        return x.const_like(t) if isinstance(t, int) else build(t[0]) + build(t[1])

    def total(t) -> int:
        return t if isinstance(t, int) else total(t[0]) + total(t[1])

    pm, _ = counting_folding()
    u = build(tree) * x
    first = graph_rewrite(u, pm, memo=True)
    assert first is graph_rewrite(u, pm) and graph_rewrite(u, pm, memo=True) is first
    assert eval_uop(first, {x: xv}) == total(tree) * xv
    # a bigger graph holding the first: its memoised part is not offered to the rule again
    bigger = graph_rewrite(u + build(tree), pm, memo=True)
    assert eval_uop(bigger, {x: xv}) == total(tree) * xv + total(tree)


def test_memo_skips_a_subgraph_seen_before() -> None:
    pm, calls = counting_folding()
    one, two = x.const_like(1), x.const_like(2)
    inner = (one + two) * x
    assert graph_rewrite(inner, pm, memo=True) is x.const_like(3) * x
    assert calls[one + two] == 1
    # one + two and everything under inner are known: only the new ADD of constants meets the rule
    out = graph_rewrite(inner + (two + two), pm, memo=True)
    assert out is x.const_like(3) * x + 4
    assert calls[one + two] == 1 and calls[two + two] == 1
    # without memo the rule sees the shared part again
    graph_rewrite(inner + (two + two), pm)
    assert calls[one + two] == 2


def test_memo_is_per_matcher_and_context() -> None:
    def shift(ctx: int, v: UOp) -> UOp:
        return v.const_like(v.arg + ctx)

    pm = PatternMatcher([(UPat(Ops.CONST, dtype=dtypes.int32, arg=3, name="v"), shift)])
    u = UOp(Ops.SINK, dtypes.void, (UOp(Ops.NOOP, dtypes.void, (c3,)),))
    results = {ctx: graph_rewrite(u, pm, ctx=ctx, memo=True) for ctx in (0, 2, 5)}
    # each ctx's result is its own (a stale entry from another ctx would give the wrong constant)
    assert results[0] is u
    assert results[2].src[0].src[0] is UOp.const(dtypes.int32, 5)
    assert results[5].src[0].src[0] is UOp.const(dtypes.int32, 8)
    # another matcher with the same rule keeps its own results
    other = PatternMatcher([(UPat(Ops.CONST, dtype=dtypes.int32, arg=3, name="v"), lambda v: v.const_like(30))])
    assert graph_rewrite(c3, other, memo=True) is UOp.const(dtypes.int32, 30)
    assert graph_rewrite(c3, pm, ctx=2, memo=True) is UOp.const(dtypes.int32, 5)


def test_memo_needs_a_hashable_context_and_bottom_up() -> None:
    with pytest.raises(TypeError, match="hashable ctx"):
        graph_rewrite(x + 1, folding, ctx=set(), memo=True)
    with pytest.raises(ValueError, match="bottom-up"):
        graph_rewrite(x + 1, folding, top_down=True, memo=True)


def test_memo_after_a_failed_rewrite_keeps_nothing() -> None:
    a, b = UOp(Ops.NOOP, dtypes.void, (), "a"), UOp(Ops.NOOP, dtypes.void, (), "b")
    swap = PatternMatcher([(UPat(Ops.NOOP, arg="a"), lambda: b), (UPat(Ops.NOOP, arg="b"), lambda: a)])
    root = UOp(Ops.SINK, dtypes.void, (a,))
    for _ in range(2):  # the second call fails the same way: nothing of the first was remembered
        with pytest.raises(RewriteError, match="cycle"):
            graph_rewrite(root, swap, memo=True)
