"""Pattern matching over UOps: `UPat` describes a subgraph, `PatternMatcher` maps patterns to rewrite functions,
and `graph_rewrite` applies a matcher to a whole graph until nothing changes."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lazygrad_uop.config import ContextVar
from lazygrad_uop.dtype import DType
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp, _arg_key

REWRITE_LIMIT = ContextVar("REWRITE_LIMIT", 1_000_000)


class RewriteError(RuntimeError):
    """A rewrite did not reach a fixed point: some rules undo each other."""


class UPat:
    """A pattern over UOps.

    `op`, `dtype`: one value or a tuple of allowed values (None: any). `arg`: must equal (None: any).
    `src`: a tuple matches the sources in order; a list matches them in any order (for commutative ops);
    a single UPat matches every source. `name` binds the matched node for the rewrite function.
    `allow_any_len` lets a tuple `src` match the first sources of a longer list.
    """

    __slots__ = (
        "_argkey",
        "_needs",
        "_ops",
        "_perms",
        "_permute",
        "_repeat",
        "_single",
        "allow_any_len",
        "arg",
        "dtype",
        "name",
        "op",
        "src",
    )

    def __init__(
        self,
        op: Ops | tuple[Ops, ...] | frozenset[Ops] | None = None,
        dtype: DType | tuple[DType, ...] | None = None,
        src: tuple[UPat, ...] | list[UPat] | UPat | None = None,
        arg: Any = None,
        name: str | None = None,
        allow_any_len: bool = False,
    ) -> None:
        self.op: frozenset[Ops] | None = None if op is None else frozenset((op,) if isinstance(op, Ops) else op)
        self.dtype: frozenset[DType] | None = (
            None if dtype is None else frozenset((dtype,) if isinstance(dtype, DType) else dtype)
        )
        self.arg, self.name, self.allow_any_len = arg, name, allow_any_len
        self._permute = isinstance(src, list)
        self._repeat = isinstance(src, UPat)
        self.src: tuple[UPat, ...] | None = (src,) if isinstance(src, UPat) else (None if src is None else tuple(src))
        self._prepare()

    def _prepare(self) -> None:
        """Precompute what matching reads at every node: the ops as a tuple when there are few (`in` then compares
        identities, where a frozenset hashes the Enum member in Python), the arg's interning key (so 1 doesn't match
        True, nor 0.0 match -0.0, for value-sensitive rules), and whether the pattern can bind in at most one way (no
        any-order sources anywhere), which `_match1` handles."""
        self._ops: tuple[Ops, ...] | frozenset[Ops] | None = (
            None if self.op is None else tuple(self.op) if len(self.op) <= 4 else self.op
        )
        self._argkey = None if self.arg is None else _arg_key(self.arg)
        self._single: bool = not self._permute and all(p._single for p in self.src or ())
        self._perms = tuple(itertools.permutations(self.src)) if self._permute and self.src is not None else ()
        # for any-order sources: the ops (by value) that some source must have, to reject a node before trying orders
        self._needs = frozenset(
            next(iter(p.op))._value_ for p in self.src or () if self._permute and p.op is not None and len(p.op) == 1
        )

    @staticmethod
    def var(name: str | None = None, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        """Any node, bound to `name`."""
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        """Any constant, bound to `name`."""
        return UPat(Ops.CONST, dtype, name=name)

    @staticmethod
    def const(dtype: DType | tuple[DType, ...] | None, value: Any) -> UPat:
        """The constant `value`."""
        return UPat(Ops.CONST, dtype, arg=value)

    def named(self, name: str) -> UPat:
        """This pattern, binding the match to `name`."""
        p = UPat(self.op, self.dtype, None, self.arg, name, self.allow_any_len)
        p.src, p._permute, p._repeat = self.src, self._permute, self._repeat
        p._prepare()
        return p

    def _alu(self, op: Ops, *others: Any, commutative: bool = False) -> UPat:
        srcs = [self, *(o if isinstance(o, UPat) else UPat.const(None, o) for o in others)]
        return UPat(op, src=srcs if commutative else tuple(srcs))

    def __add__(self, x: Any) -> UPat:
        return self._alu(Ops.ADD, x, commutative=True)

    def __mul__(self, x: Any) -> UPat:
        return self._alu(Ops.MUL, x, commutative=True)

    def __floordiv__(self, x: Any) -> UPat:
        return self._alu(Ops.IDIV, x)

    def __mod__(self, x: Any) -> UPat:
        return self._alu(Ops.MOD, x)

    def __lt__(self, x: Any) -> UPat:
        return self._alu(Ops.CMPLT, x)

    def ne(self, x: Any) -> UPat:
        """Pattern for CMPNE."""
        return self._alu(Ops.CMPNE, x, commutative=True)

    def maximum(self, x: Any) -> UPat:
        """Pattern for MAX."""
        return self._alu(Ops.MAX, x, commutative=True)

    def __and__(self, x: Any) -> UPat:
        return self._alu(Ops.AND, x, commutative=True)

    def __or__(self, x: Any) -> UPat:
        return self._alu(Ops.OR, x, commutative=True)

    def where(self, x: Any, y: Any) -> UPat:
        """Pattern for WHERE."""
        return self._alu(Ops.WHERE, x, y)

    def cast(self, dtype: DType | None = None) -> UPat:
        """Pattern for CAST."""
        return UPat(Ops.CAST, dtype, (self,))

    def match(self, u: UOp, bound: dict[str, UOp]) -> list[dict[str, UOp]]:
        """Every binding of names under which `u` matches, extending `bound`."""
        if self._single:
            b = dict(bound)
            return [b] if self._match1(u, b) else []
        if self._ops is not None and u.op not in self._ops:
            return []
        if self.dtype is not None and u.dtype not in self.dtype and u.dtype.scalar() not in self.dtype:
            return []
        if self._argkey is not None and self._argkey != _arg_key(u.arg):
            return []
        if self.name is not None:
            if self.name in bound:
                return [bound] if bound[self.name] is u else []
            bound = {**bound, self.name: u}
        if self.src is None:
            return [bound]
        if self._repeat:
            return _match_seq([self.src[0]] * len(u.src), u.src, bound)
        if len(u.src) != len(self.src) and not (self.allow_any_len and len(u.src) >= len(self.src)):
            return []
        if self._permute:
            if self._needs and not self._needs.issubset([s.op._value_ for s in u.src]):
                return []
            out: list[dict[str, UOp]] = []
            for perm in self._perms:
                # equal sources (x + x) give the same binding from several orders: offer it to the rule once
                out.extend(b for b in _match_seq(perm, u.src, bound) if b not in out)
            return out
        return _match_seq(self.src, u.src, bound)

    def _match1(self, u: UOp, b: dict[str, UOp]) -> bool:
        """`match` for a pattern that binds in at most one way: True when `u` matches, with the names bound in `b`
        (which holds junk after a False). The same checks in the same order as `match`, without its lists."""
        if self._ops is not None and u.op not in self._ops:
            return False
        if self.dtype is not None and u.dtype not in self.dtype and u.dtype.scalar() not in self.dtype:
            return False
        if self._argkey is not None and self._argkey != _arg_key(u.arg):
            return False
        if (name := self.name) is not None:
            if name in b:
                return b[name] is u
            b[name] = u
        if (pats := self.src) is None:
            return True
        srcs = u.src
        if self._repeat:
            p = pats[0]
            for s in srcs:
                if not p._match1(s, b):
                    return False
            return True
        if len(srcs) != len(pats) and not (self.allow_any_len and len(srcs) >= len(pats)):
            return False
        for p, s in zip(pats, srcs):  # allow_any_len: sources past the patterns are not looked at
            if not p._match1(s, b):
                return False
        return True

    def __repr__(self) -> str:
        ops = "any" if self.op is None else "|".join(sorted(o.name for o in self.op))
        return f"UPat({ops}{', name=' + self.name if self.name else ''})"


def _match_seq(pats: Sequence[UPat], srcs: tuple[UOp, ...], bound: dict[str, UOp]) -> list[dict[str, UOp]]:
    results = [bound]
    for p, s in zip(pats, srcs, strict=False):  # allow_any_len: sources past the patterns are not looked at
        if p._single:
            extended = []
            for b in results:
                b2 = dict(b)
                if p._match1(s, b2):
                    extended.append(b2)
            results = extended
        else:
            results = [b2 for b in results for b2 in p.match(s, b)]
        if not results:
            break
    return results


class _NotCompiledError(Exception):
    """A pattern `_compile` leaves to `UPat._match1` (names bound inside a pattern every source must match)."""


def _compile(pat: UPat) -> Callable[[UOp], dict[str, UOp] | None] | None:
    """A function that does what `pat._match1` does on a node, with every check of the whole pattern written out in
    one Python function: the names it binds, or None where the node doesn't match. None for patterns it can't write
    out (any-order sources, or names under a repeated source), which keep the interpreted match.

    Matching is most of what a rewrite pass costs: the interpreted match makes a Python call for every pattern node
    it visits, this makes one per rule tried."""
    if not pat._single:
        return None
    lines: list[str] = []
    env: dict[str, Any] = {"_arg_key": _arg_key}
    bound: dict[str, str] = {}
    try:
        _emit(pat, "n0", lines, env, bound, [1])
    except _NotCompiledError:
        return None
    lines.append(f"    return {{{', '.join(f'{k!r}: {v}' for k, v in bound.items())}}}")
    code = "def match(n0):\n" + "\n".join(lines) + "\n"
    # the source is built above from the pattern alone
    exec(compile(code, f"<pattern {pat!r}>", "exec"), env)
    return env["match"]


def _emit(p: UPat, var: str, lines: list[str], env: dict[str, Any], bound: dict[str, str], serial: list[int]) -> None:
    """Append to `lines` the checks of `p` on the node in local `var`, in `UPat._match1`'s order."""
    k = serial[0]
    serial[0] += 1
    if p._ops is not None:
        if len(p._ops) == 1:
            env[f"OP{k}"] = next(iter(p._ops))
            lines.append(f"    if {var}.op is not OP{k}: return None")
        else:
            env[f"OPS{k}"] = p._ops
            lines.append(f"    if {var}.op not in OPS{k}: return None")
    if p.dtype is not None:
        env[f"DT{k}"] = p.dtype
        lines.append(f"    if {var}.dtype not in DT{k} and {var}.dtype.scalar() not in DT{k}: return None")
    if p._argkey is not None:
        env[f"ARG{k}"] = p.arg
        if type(p.arg) is int or type(p.arg) is bool:
            # _arg_key of an int or bool is (its exact type, the value)
            lines.append(f"    if type({var}.arg) is not type(ARG{k}) or {var}.arg != ARG{k}: return None")
        else:
            env[f"KEY{k}"] = p._argkey
            lines.append(f"    if _arg_key({var}.arg) != KEY{k}: return None")
    if p.name is not None:
        if p.name in bound:
            lines.append(f"    if {var} is not {bound[p.name]}: return None")
        else:
            bound[p.name] = var
    if p.src is None:
        return
    if p._repeat:
        sub = p.src[0]
        if any(q.name is not None for q in _walk(sub)):
            raise _NotCompiledError
        if (sub_match := _compile(sub)) is None:
            raise _NotCompiledError
        env[f"SUB{k}"] = sub_match
        lines.append(f"    for s in {var}.src:")
        lines.append(f"        if SUB{k}(s) is None: return None")
        return
    n = len(p.src)
    lines.append(f"    s{k} = {var}.src")
    lines.append(f"    if len(s{k}) {'<' if p.allow_any_len else '!='} {n}: return None")
    for i, q in enumerate(p.src):
        child = f"n{serial[0]}"
        lines.append(f"    {child} = s{k}[{i}]")
        _emit(q, child, lines, env, bound, serial)


def _walk(p: UPat) -> list[UPat]:
    """`p` and every pattern under it."""
    out, stack = [], [p]
    while stack:
        q = stack.pop()
        out.append(q)
        stack.extend(q.src or ())
    return out


Rule = tuple[UPat, Callable[..., UOp | None]]


class PatternMatcher:
    """An ordered list of (UPat, function) rules; `rewrite(u)` returns the first non-None result.

    Rules are indexed by root op, so a node is only tried against rules that can match its op. The function gets
    the names bound by the pattern as keyword arguments, and `ctx` when it declares a parameter of that name.
    """

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        # graph_rewrite(memo=True): the node attribute each ctx's results are kept under
        self._memo_attrs: dict[Any, str] = {}
        # indexed by the op's int value, not by the op: hashing an Enum member is a Python-level call on Python 3.11
        self._by_value: list[list[tuple[UPat, Callable[..., UOp | None], bool, Callable | None]]] = [
            [] for _ in range(max(op._value_ for op in Ops) + 1)
        ]
        for pat, fxn in self.rules:
            wants_ctx = "ctx" in inspect.signature(fxn).parameters
            # the index already picked the op: match a copy that doesn't check it again
            root = UPat(None, pat.dtype, None, pat.arg, pat.name, pat.allow_any_len)
            root.src, root._permute, root._repeat = pat.src, pat._permute, pat._repeat
            root._prepare()
            match = _compile(root)
            for op in pat.op if pat.op is not None else Ops:
                self._by_value[op._value_].append((root, fxn, wants_ctx, match))

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        """The result of the first rule that matches `u` and returns something other than None."""
        for pat, fxn, wants_ctx, match in self._by_value[u.op._value_]:
            if match is not None:
                if (bound := match(u)) is None:
                    continue
                ret = fxn(ctx=ctx, **bound) if wants_ctx else fxn(**bound)
                if ret is not None and ret is not u:
                    return ret
                continue
            if pat._single:
                bound = {}
                if not pat._match1(u, bound):
                    continue
                ret = fxn(ctx=ctx, **bound) if wants_ctx else fxn(**bound)
                if ret is not None and ret is not u:
                    return ret
                continue
            for bound in pat.match(u, {}):
                ret = fxn(ctx=ctx, **bound) if wants_ctx else fxn(**bound)
                if ret is not None and ret is not u:
                    return ret
        return None


def _memo_attr(pm: PatternMatcher, ctx: Any) -> str:
    """The name under which nodes keep what `pm` with `ctx` rewrites them to (one name per matcher and context)."""
    key = (type(ctx), ctx)  # 1 and True are different contexts
    try:
        return pm._memo_attrs[key]
    except KeyError:
        pass
    except TypeError as exc:
        raise TypeError(f"graph_rewrite(memo=True) needs a hashable ctx, got {type(ctx).__name__}") from exc
    return pm._memo_attrs.setdefault(key, f"_rewritten_{next(_MEMO_SERIAL)}")


_MEMO_SERIAL = itertools.count()
# what a node's memo entry holds when the node is its own result: storing the node itself would make a reference
# cycle, leaving every such node to the cycle collector
_FIXED = True


def mark_fixed_points(pm: PatternMatcher, ctx: Any, nodes: Iterable[UOp]) -> None:
    """Record that each of `nodes`, and every node under it, is a fixed point of `pm` with `ctx` (no rule applies
    there): `graph_rewrite(..., memo=True)` with them then takes each node as it is, without walking under it.

    For a rule that builds a result it knows to be final (the chunks of a cut vector, made of nodes already
    rewritten by the same canonical constructors the rules apply), where walking it would only confirm that. The
    claim must be true whatever graph the nodes later appear in; a false one leaves nodes unrewritten."""
    attr = _memo_attr(pm, ctx)
    for u in nodes:
        u.__dict__.setdefault(attr, _FIXED)


def graph_rewrite(
    root: UOp,
    pm: PatternMatcher,
    ctx: Any = None,
    top_down: bool = False,
    name: str | None = None,
    memo: bool = False,
) -> UOp:
    """Rewrite the graph under `root` with `pm` until no rule applies anywhere (a fixed point).

    Bottom-up (default): a node's sources are rewritten first, then the node itself, again and again until no rule
    applies; what a rule returns is rewritten in the same way. With `top_down=True` each node is also offered to
    the rules before its sources, so a rule can replace a subgraph without it being rewritten first.
    Every distinct node is rewritten once (memoised); the walk is iterative, so deep graphs are fine.

    `memo=True` also remembers, on each node, what it rewrote to, for later calls with the same matcher and `ctx`
    (which must be hashable): a subgraph seen before (a kernel's index arithmetic shared with another kernel, or a
    graph already simplified by an earlier pass) costs one lookup. Only for rules whose result depends on nothing but
    the node and `ctx` (no state in `ctx`, no settings read while rewriting); bottom-up only.
    """
    if memo and top_down:
        raise ValueError("graph_rewrite: memo=True works bottom-up only; pass top_down=False or memo=False")
    attr = _memo_attr(pm, ctx) if memo else None
    done: dict[UOp, UOp] = {}
    in_progress: set[UOp] = set()
    budget = REWRITE_LIMIT.value
    rewrite, by_value = pm.rewrite, pm._by_value
    # stack entries: a UOp to enter, or (node, pending): `node`'s sources are done (pending None), or `node` became
    # `pending`. Entering by the bare node lets the sources go on the stack with one C-level extend, no tuple each
    stack: list[UOp | tuple[UOp, UOp | None]] = [root]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        item = pop()
        if type(item) is not tuple:
            node = item
            if node in done:
                continue
            if attr is not None and (known := node.__dict__.get(attr)) is not None:
                done[node] = node if known is _FIXED else known
                continue
            if node in in_progress:
                raise RewriteError(f"graph_rewrite{' ' + name if name else ''}: rules rewrite {node.op} in a cycle")
            if top_down and by_value[node.op._value_]:
                in_progress.add(node)
                if (new := rewrite(node, ctx)) is not None:
                    push((node, new))
                    push(new)
                    budget -= 1
                    if budget < 0:
                        raise RewriteError(f"graph_rewrite{' ' + name if name else ''} exceeded REWRITE_LIMIT rewrites")
                    continue
            if src := node.src:
                # sources come off the stack in order; one done by then is skipped where it is entered
                in_progress.add(node)
                push((node, None))
                extend(reversed(src))
                continue
            # a node without sources is its own rebuilt node: rewrite it here rather than through the stack
            rebuilt = node
        else:
            node, pending = item
            if pending is not None:
                done[node] = done[pending]
                in_progress.discard(node)
                continue
            src = node.src
            new_src = tuple(map(done.__getitem__, src))
            rebuilt = node if new_src == src else UOp(node.op, node.dtype, new_src, node.arg)
        # most nodes have an op no rule is about: skip the call
        if not by_value[rebuilt.op._value_] or (new := rewrite(rebuilt, ctx)) is None:
            done[node] = rebuilt
            in_progress.discard(node)
            if rebuilt is not node and rebuilt not in done:
                done[rebuilt] = rebuilt
            continue
        # a rule fired: `node` becomes whatever `new` rewrites to. Only fired rules count against the budget, so a
        # big graph that needs no rewriting is no sign of a loop, while rules that grow the graph forever are stopped
        budget -= 1
        if budget < 0:
            raise RewriteError(f"graph_rewrite{' ' + name if name else ''} exceeded REWRITE_LIMIT rewrites")
        in_progress.add(node)
        push((node, new))
        push(new)
    if attr is not None:
        for node, out in done.items():
            node.__dict__[attr] = _FIXED if out is node else out
    return done[root]
