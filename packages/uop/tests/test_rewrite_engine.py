"""The fast paths of the rewrite engine against a straightforward one written here: patterns compiled to Python
functions (`pattern._compile`) against a recursive matcher, `PatternMatcher.rewrite` against trying the rules in order,
and `graph_rewrite` against a recursive bottom-up rewrite. Random patterns, random graphs, and the real symbolic rules;
the results must be the very same nodes."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lazygrad_uop import Ops, PatternMatcher, UOp, UPat, dtypes, graph_rewrite
from lazygrad_uop.pattern import _compile, _walk, mark_fixed_points
from lazygrad_uop.symbolic import symbolic
from lazygrad_uop.uop import _arg_key

# *** the reference: matching and rewriting as the docstrings of UPat and graph_rewrite say, nothing cached ***


def ref_match(p: UPat, u: UOp, bound: dict[str, UOp]) -> list[dict[str, UOp]]:
    """Every binding under which `u` matches `p`, extending `bound`, in the order of the sources' permutations."""
    if p.op is not None and u.op not in p.op:
        return []
    if p.dtype is not None and u.dtype not in p.dtype and u.dtype.scalar() not in p.dtype:
        return []
    if p.arg is not None and _arg_key(p.arg) != _arg_key(u.arg):
        return []
    if p.name is not None:
        if p.name in bound:
            return [bound] if bound[p.name] is u else []
        bound = {**bound, p.name: u}
    if p.src is None:
        return [bound]
    if p._repeat:
        orders = [(p.src[0],) * len(u.src)]
    elif len(u.src) != len(p.src) and not (p.allow_any_len and len(u.src) >= len(p.src)):
        return []
    else:
        orders = list(itertools.permutations(p.src)) if p._permute else [p.src]
    out: list[dict[str, UOp]] = []
    for pats in orders:
        results = [bound]
        for q, s in zip(pats, u.src):
            results = [b2 for b in results for b2 in ref_match(q, s, b)]
        out.extend(b for b in results if b not in out)
    return out


def ref_rewrite(rules: list[tuple[UPat, Any]], u: UOp) -> UOp | None:
    """The first result of a rule, in rule order, that is neither None nor `u`."""
    for pat, fxn in rules:
        for b in ref_match(pat, u, {}):
            if (ret := fxn(**b)) is not None and ret is not u:
                return ret
    return None


def ref_graph_rewrite(root: UOp, rules: list[tuple[UPat, Any]]) -> UOp:
    """Sources first, then the node until no rule applies, then what a rule returned, the same way."""
    done: dict[UOp, UOp] = {}

    def go(u: UOp) -> UOp:
        if u in done:
            return done[u]
        src = tuple(go(s) for s in u.src)
        n = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
        if (new := ref_rewrite(rules, n)) is None:
            done[u] = n
            done.setdefault(n, n)
        else:
            done[u] = go(new)
        return done[u]

    return go(root)


# *** random patterns and graphs ***

x = UOp.variable("x", 0, 20)
y = UOp.variable("y", -8, 8)
LEAVES = [x, y, *(UOp.const(dtypes.int32, v) for v in (-1, 0, 1, 2, 3, 7, 16))]
BINARY = [Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.AND, Ops.XOR, Ops.CMPLT, Ops.CMPNE]


@st.composite
def int_graph(draw: Any, depth: int = 4) -> UOp:
    """A random int32 expression (with a bool comparison and a WHERE now and then), sharing its leaves."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(LEAVES))
    op = draw(st.sampled_from([*BINARY, Ops.WHERE]))
    a, b = draw(int_graph(depth - 1)), draw(int_graph(depth - 1))
    if op is Ops.WHERE:
        return (a < b).where(a, draw(int_graph(depth - 1)))
    if op in (Ops.CMPLT, Ops.CMPNE):
        return (a < b if op is Ops.CMPLT else a.ne(b)).where(a, b)
    return a.alu(op, b)


names = st.sampled_from([None, None, "a", "b"])
ops = st.sampled_from([None, Ops.ADD, Ops.MUL, Ops.CONST, Ops.DEFINE_VAR, (Ops.ADD, Ops.MUL), (Ops.CMPLT, Ops.WHERE)])
pat_dtypes = st.sampled_from([None, None, dtypes.int32, dtypes.bool, (dtypes.int32, dtypes.float32)])
args = st.sampled_from([None, None, None, 0, 1, 2, True, 1.0])


def patterns(max_leaves: int = 6) -> st.SearchStrategy[UPat]:
    """Random patterns: op sets, dtypes, args, repeated names, fixed, any-length and repeated sources."""
    leaf = st.builds(UPat, ops, pat_dtypes, st.none(), args, names)

    def extend(inner: st.SearchStrategy[UPat]) -> st.SearchStrategy[UPat]:
        fixed = st.builds(
            lambda op, dt, src, name, any_len: UPat(op, dt, tuple(src), None, name, any_len),
            ops,
            pat_dtypes,
            st.lists(inner, min_size=1, max_size=3),
            names,
            st.booleans(),
        )
        repeat = st.builds(lambda op, sub: UPat(op, src=sub), ops, inner)
        return fixed | repeat

    return st.recursive(leaf, extend, max_leaves=max_leaves)


# *** properties ***


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns(), int_graph())
# a name bound twice, args that Python calls equal (1, True, 1.0), any-length and repeated sources
@example(UPat(Ops.ADD, src=(UPat(name="a"), UPat(name="a"))), (x + y) + (x + x))
@example(UPat(Ops.WHERE, src=(UPat(Ops.CMPLT), UPat(name="a")), allow_any_len=True), (x < 1).where(x, y) + 1)
@example(UPat(src=(UPat(), UPat(arg=1))), (x + x.const_like(1)).alu(Ops.MUL, x.const_like(True).cast(dtypes.int32)))
@example(UPat(src=UPat(Ops.CONST, arg=1.0)), x.alu(Ops.MUL, x.const_like(1)) + x.const_like(1))
def test_compiled_pattern_matches_like_the_reference(pat: UPat, u: UOp) -> None:
    # the pattern and each pattern under it, on every node of the graph
    for p in _walk(pat):
        compiled = _compile(p)
        for n in u.toposort:
            want = ref_match(p, n, {})
            if compiled is None:  # any-order sources, or names under a repeated source: the interpreted match runs
                assert p.match(n, {}) == want
                continue
            got = compiled(n)
            assert (got is None) == (not want), f"{p} on {n.render()}"
            if got is not None:
                assert len(want) == 1 and got.keys() == want[0].keys()
                assert all(got[k] is want[0][k] for k in got)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(patterns(4), min_size=1, max_size=6), int_graph())
def test_matcher_rewrites_like_trying_each_rule_in_order(pats: list[UPat], u: UOp) -> None:
    # each rule returns a node naming the rule and the binding, or None for some bindings: the first non-None wins
    def rule(i: int) -> Any:
        def fxn(**b: UOp) -> UOp | None:
            if len(b) % 2 == 1 and i % 2 == 0:
                return None
            return UOp(Ops.NOOP, dtypes.void, tuple(b[k] for k in sorted(b)), i)

        return fxn

    rules = [(p, rule(i)) for i, p in enumerate(pats)]
    pm = PatternMatcher(rules)
    for n in u.toposort:
        assert pm.rewrite(n) is ref_rewrite(rules, n)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(int_graph(5))
def test_symbolic_graph_rewrite_is_the_reference_rewrite(u: UOp) -> None:
    # the same nodes, not just equal values: the fast paths must not change what the rules see or build
    assert graph_rewrite(u, symbolic) is ref_graph_rewrite(u, symbolic.rules)


def test_the_symbolic_rules_are_compiled() -> None:
    # the fast path is the one taken: every rule binding one way has its compiled function
    entries = [e for per_op in symbolic._by_value for e in per_op]
    assert entries and all((e[3] is not None) == e[0]._single for e in entries)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(int_graph(5), st.data())
def test_nodes_marked_fixed_are_taken_as_they_are(u: UOp, data: st.DataObject) -> None:
    # a rule set that would rewrite every addition: a node marked as a fixed point (with everything under it) is left
    # alone by memo=True rewrites with that matcher and context, and by nothing else
    pm = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: UOp(Ops.NOOP, dtypes.int32, x.src, "add"))])
    nodes = list(u.toposort)
    marked = data.draw(st.sampled_from(nodes))
    mark_fixed_points(pm, "marked", [marked])
    rules = [(UPat(Ops.ADD, name="x"), lambda x: UOp(Ops.NOOP, dtypes.int32, x.src, "add"))]
    # the reference: the marked node replaced by itself before rewriting (a placeholder no rule matches stands in)
    hole = UOp.variable("marked-placeholder", 0, 0)
    want = ref_graph_rewrite(u.substitute({marked: hole}), rules).substitute({hole: marked})
    assert graph_rewrite(u, pm, ctx="marked", memo=True) is want
    # other contexts, and rewrites without the memo, walk every node as before
    assert graph_rewrite(u, pm, ctx="other", memo=True) is ref_graph_rewrite(u, rules)
    assert graph_rewrite(u, pm, ctx="marked") is ref_graph_rewrite(u, rules)
