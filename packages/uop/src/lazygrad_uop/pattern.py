"""Pattern matching over UOps: `UPat` describes a subgraph, `PatternMatcher` maps patterns to rewrite functions,
and `graph_rewrite` applies a matcher to a whole graph until nothing changes."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence
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

    __slots__ = ("_permute", "_repeat", "allow_any_len", "arg", "dtype", "name", "op", "src")

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
        if self.op is not None and u.op not in self.op:
            return []
        if self.dtype is not None and u.dtype not in self.dtype and u.dtype.scalar() not in self.dtype:
            return []
        if self.arg is not None and not _arg_equal(self.arg, u.arg):
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
            out: list[dict[str, UOp]] = []
            for perm in itertools.permutations(self.src):
                # equal sources (x + x) give the same binding from several orders: offer it to the rule once
                out.extend(b for b in _match_seq(perm, u.src, bound) if b not in out)
            return out
        return _match_seq(self.src, u.src, bound)

    def __repr__(self) -> str:
        ops = "any" if self.op is None else "|".join(sorted(o.name for o in self.op))
        return f"UPat({ops}{', name=' + self.name if self.name else ''})"


def _arg_equal(want: Any, have: Any) -> bool:
    # the interning key: 1 must not match True, and 0.0 must not match -0.0 for value-sensitive rules
    return _arg_key(want) == _arg_key(have)


def _match_seq(pats: Sequence[UPat], srcs: tuple[UOp, ...], bound: dict[str, UOp]) -> list[dict[str, UOp]]:
    results = [bound]
    for p, s in zip(pats, srcs, strict=False):  # allow_any_len: sources past the patterns are not looked at
        results = [b2 for b in results for b2 in p.match(s, b)]
        if not results:
            break
    return results


Rule = tuple[UPat, Callable[..., UOp | None]]


class PatternMatcher:
    """An ordered list of (UPat, function) rules; `rewrite(u)` returns the first non-None result.

    Rules are indexed by root op, so a node is only tried against rules that can match its op. The function gets
    the names bound by the pattern as keyword arguments, and `ctx` when it declares a parameter of that name.
    """

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        self._by_op: dict[Ops, list[tuple[UPat, Callable[..., UOp | None], bool]]] = {op: [] for op in Ops}
        for pat, fxn in self.rules:
            wants_ctx = "ctx" in inspect.signature(fxn).parameters
            for op in pat.op if pat.op is not None else Ops:
                self._by_op[op].append((pat, fxn, wants_ctx))

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        """The result of the first rule that matches `u` and returns something other than None."""
        for pat, fxn, wants_ctx in self._by_op[u.op]:
            for bound in pat.match(u, {}):
                ret = fxn(ctx=ctx, **bound) if wants_ctx else fxn(**bound)
                if ret is not None and ret is not u:
                    return ret
        return None


def graph_rewrite(
    root: UOp, pm: PatternMatcher, ctx: Any = None, top_down: bool = False, name: str | None = None
) -> UOp:
    """Rewrite the graph under `root` with `pm` until no rule applies anywhere (a fixed point).

    Bottom-up (default): a node's sources are rewritten first, then the node itself, again and again until no rule
    applies; what a rule returns is rewritten in the same way. With `top_down=True` each node is also offered to
    the rules before its sources, so a rule can replace a subgraph without it being rewritten first.
    Every distinct node is rewritten once (memoised); the walk is iterative, so deep graphs are fine.
    """
    done: dict[UOp, UOp] = {}
    in_progress: set[UOp] = set()
    budget = REWRITE_LIMIT.value
    # stack entries: (node, stage, pending) — stage 0: enter, 1: sources done, 2: node became `pending`
    stack: list[tuple[UOp, int, UOp | None]] = [(root, 0, None)]
    while stack:
        node, stage, pending = stack.pop()
        if stage == 0:
            if node in done:
                continue
            if node in in_progress:
                raise RewriteError(f"graph_rewrite{' ' + name if name else ''}: rules rewrite {node.op} in a cycle")
            in_progress.add(node)
            if not top_down or (new := pm.rewrite(node, ctx)) is None:
                stack.append((node, 1, None))
                stack.extend((s, 0, None) for s in reversed(node.src) if s not in done)
                continue
        elif stage == 1:
            new_src = tuple(done[s] for s in node.src)
            rebuilt = node if new_src == node.src else node.replace(src=new_src)
            if (new := pm.rewrite(rebuilt, ctx)) is None:
                done[node] = rebuilt
                in_progress.discard(node)
                if rebuilt is not node and rebuilt not in done:
                    done[rebuilt] = rebuilt
                continue
        else:
            assert pending is not None
            done[node] = done[pending]
            in_progress.discard(node)
            continue
        # a rule fired: `node` becomes whatever `new` rewrites to. Only fired rules count against the budget, so a
        # big graph that needs no rewriting is no sign of a loop, while rules that grow the graph forever are stopped
        budget -= 1
        if budget < 0:
            raise RewriteError(f"graph_rewrite{' ' + name if name else ''} exceeded REWRITE_LIMIT rewrites")
        stack.append((node, 2, new))
        stack.append((new, 0, None))
    return done[root]
