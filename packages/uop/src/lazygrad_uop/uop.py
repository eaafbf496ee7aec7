"""`UOp`: the one node type of the IR, immutable and interned."""

from __future__ import annotations

import itertools
import math
import struct
import weakref
from _weakref import _remove_dead_weakref
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from typing import Any, Union

from lazygrad_uop.dtype import ConstType, DType, dtypes
from lazygrad_uop.ops import GroupOp, Ops

sint = Union[int, "UOp"]  # a size that may be symbolic


def _arg_key(arg: Any) -> Any:
    """A hashable key that tells apart args Python calls equal: 0.0 and -0.0, 1 and 1.0 and True, every nan."""
    t = type(arg)
    # exact types first: this runs for every node built, and most args are None, small ints or tuples of them
    if t is int or t is bool:
        return (t, arg)
    if arg is None or t is str:
        return arg
    if t is float:
        return ("f", struct.pack("<d", arg))
    if t is tuple:
        for a in arg:
            if type(a) is not int:
                return (tuple, tuple(map(_arg_key, arg)))
        # ints only (GEP lanes, movement-op shapes): the tuple itself, under a tag no mixed tuple's key has
        return ("ints", arg)
    if isinstance(arg, float):
        return ("f", struct.pack("<d", arg))
    if isinstance(arg, (bool, int)):
        return (t, arg)
    if isinstance(arg, tuple):
        return (t, tuple(map(_arg_key, arg)))
    return arg


class _InternRef(weakref.ref):
    """A weak reference to an interned node that remembers the node's interning key, to drop it when the node dies."""

    __slots__ = ("key",)


# (op value, dtype, src, arg or its key, arg type) -> weak reference to the live node. A plain dict of weak references
# rather than a WeakValueDictionary: a lookup is one C-level dict get, and this is the hottest path of the stack
_INTERNED: dict[tuple, _InternRef] = {}


def _forget(
    ref: _InternRef,
    interned: dict[tuple, _InternRef] = _INTERNED,
    remove: Callable[[dict, Any], None] = _remove_dead_weakref,
) -> None:
    # the node died. Its key may already hold a newer node of the same fields, which must stay: the stdlib's atomic
    # helper (what WeakValueDictionary uses) deletes the entry only while it holds a dead reference. Both are bound as
    # defaults because nodes still die while the interpreter shuts down and clears this module's globals
    remove(interned, ref.key)


def _check_fields(op: Any, src: Any) -> None:
    if not isinstance(op, Ops):
        raise TypeError(f"UOp op must be an Ops member, got {op!r}")
    if type(src) is not tuple:
        raise TypeError(f"UOp src must be a tuple of UOps, got {src!r}")
    for s in src:
        if not isinstance(s, UOp):
            raise TypeError(f"UOp src must be a tuple of UOps, got {src!r}")


_CONST_VALUE = Ops.CONST._value_
_GEP_VALUE = Ops.GEP._value_
_NONE_TYPE = type(None)

# arg types whose equality already tells apart what interning must: with the arg's type in the key, 1 and True stay
# apart; floats (0.0 == -0.0, nan != nan) and containers need `_arg_key`
_PLAIN_ARGS = frozenset({int, bool, str, type(None)})


class _UOpInterner(type):
    """Builds each distinct (op, dtype, src, arg) once; while a node is alive, building it again returns it."""

    def __call__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        if type(op) is not Ops:
            _check_fields(op, src)
        t = type(arg)
        # the op by its int value: hashing the Enum member itself is a Python-level call on Python 3.11
        key = (op._value_, dtype, src, arg if t in _PLAIN_ARGS else _arg_key(arg), t)
        try:
            ref = _INTERNED.get(key)
        except TypeError:  # an unhashable src: say what is wrong with it
            _check_fields(op, src)
            raise
        if ref is not None and (found := ref()) is not None:
            return found
        return _new_node(op, dtype, src, arg, key)


def _new_node(op: Ops, dtype: DType, src: tuple[UOp, ...], arg: Any, key: tuple) -> UOp:
    """A new node filed under its interning `key`, which no live node has (the interner's, `alu`'s and `const`'s
    miss: they looked the key up already)."""
    # only a new node has its sources checked: a key with a bad src can't be found among nodes that passed
    if type(src) is not tuple:
        _check_fields(op, src)
    for s in src:
        if not isinstance(s, UOp):
            _check_fields(op, src)
    node = object.__new__(UOp)
    _set_op(node, op)
    _set_dtype(node, dtype)
    _set_src(node, src)
    _set_arg(node, arg)
    ref = _InternRef(node, _forget)
    ref.key = key
    _INTERNED[key] = ref
    return node


class _Cached:
    """`functools.cached_property` without its lock (Python 3.11 takes one at every first read): the value goes into
    the node's __dict__, where later reads find it before this descriptor is asked. Bounds and walks are computed once
    for each of the hundreds of thousands of nodes a model's compile builds."""

    __slots__ = ("func", "name")

    def __init__(self, func: Callable[[Any], Any]) -> None:
        self.func, self.name = func, func.__name__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value


class Toposort(Set["UOp"]):
    """The nodes of a graph in dependency order, its root last: iterate, `len`, `in`, `reversed`, set operations.
    Built on the root's cached list of the nodes under it, so making one is cheap."""

    __slots__ = ("_below", "_root")

    def __init__(self, root: UOp) -> None:
        self._root, self._below = root, root._below

    def __contains__(self, node: object) -> bool:
        return node is self._root or node in self._below

    # C-level chains rather than generators: every pass over a graph iterates one of these
    def __iter__(self) -> Iterator[UOp]:
        return itertools.chain(self._below, (self._root,))

    def __reversed__(self) -> Iterator[UOp]:
        return itertools.chain((self._root,), reversed(self._below))

    def __len__(self) -> int:
        return len(self._below) + 1


class UOp(metaclass=_UOpInterner):
    """One node `(op, dtype, src, arg)`. Identical nodes are the same object: compare and hash by identity."""

    __slots__ = ("__dict__", "__weakref__", "arg", "dtype", "op", "src")
    op: Ops
    dtype: DType
    src: tuple[UOp, ...]
    arg: Any

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("op", "dtype", "src", "arg"):
            raise AttributeError(f"UOp is immutable: can't set {name}; use .replace({name}=...)")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name in ("op", "dtype", "src", "arg"):
            raise AttributeError(f"UOp is immutable: can't delete {name}")
        object.__delattr__(self, name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (UOp, (self.op, self.dtype, self.src, self.arg))

    # *** graph structure ***

    def replace(self, **kwargs: Any) -> UOp:
        """This node with some of op, dtype, src, arg changed (the same object when nothing changes)."""
        if not kwargs.keys() <= _FIELDS:  # a comparison, no set built: codegen replaces fields of most nodes it lowers
            raise TypeError(f"UOp.replace got unknown fields {sorted(kwargs.keys() - _FIELDS)}")
        return UOp(
            kwargs.get("op", self.op),
            kwargs.get("dtype", self.dtype),
            kwargs.get("src", self.src),
            kwargs.get("arg", self.arg),
        )

    @_Cached
    def _below(self) -> dict[UOp, None]:
        # every node under this one, sources first, without this one: caching a dict that held the node itself
        # would make a reference cycle, so a node (and a buffer it keeps alive) would wait for the cycle collector
        # depth first with a stack of source iterators: `nodes[i]` is the node whose sources `iters[i + 1]` walks
        order: dict[UOp, None] = {}
        iters = [iter(self.src)]
        nodes: list[UOp] = []
        while iters:
            for s in iters[-1]:
                if s in order:
                    continue
                if not s.src:
                    order[s] = None
                elif (below := s.__dict__.get("_below")) is not None:
                    # a node that already knows its walk: its nodes not yet here, in its order, are exactly what
                    # walking it would add (what is already here came with all of its own sources)
                    order.update(below)
                    order[s] = None
                else:
                    nodes.append(s)
                    iters.append(iter(s.src))
                    break
            else:
                iters.pop()
                if nodes:
                    order[nodes.pop()] = None
        return order

    @property
    def toposort(self) -> Toposort:
        """Every node of the graph under this one, each after all of its sources (an ordered set, this node last)."""
        return Toposort(self)

    @property
    def toposort_built(self) -> bool:
        """Whether this node's toposort is built already (it is cached on the node): asking for it then costs nothing,
        where building it costs a walk of the graph."""
        return "_below" in self.__dict__

    def parents(self) -> dict[UOp, list[UOp]]:
        """For every node under this one, the nodes that use it as a source."""
        users: dict[UOp, list[UOp]] = {u: [] for u in self.toposort}
        for u in self.toposort:
            for s in u.src:
                users[s].append(u)
        return users

    def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
        """This graph with every occurrence of each key of `mapping` replaced by its value.

        All at once: a value is not searched for keys, so `{x: x + 1}` and swaps `{a: b, b: a}` are fine.
        """
        # not a graph_rewrite: that rewrites what a rule returns again, which would loop on {x: x + 1}
        # `changed` holds only the nodes that change, so an untouched subgraph is kept as it is, without rebuilding
        # (and re-interning) its nodes, at the cost of one C-level disjointness test a node
        changed: dict[UOp, UOp] = {}
        changed_nodes = changed.keys()  # a live view: sees what the loop adds
        for n in self.toposort:
            if n in mapping:
                if mapping[n] is not n:
                    changed[n] = mapping[n]
            elif n.src and not changed_nodes.isdisjoint(n.src):
                changed[n] = UOp(n.op, n.dtype, tuple([changed.get(s, s) for s in n.src]), n.arg)
        return changed.get(self, self)

    def __iter__(self) -> Iterator[UOp]:
        raise TypeError("UOp is not iterable; use .src or .toposort")

    def __bool__(self) -> bool:
        if self.op is Ops.CONST:
            return bool(self.arg)
        raise TypeError(f"the truth value of a symbolic {self.op} is unknown; compare its vmin/vmax instead")

    def __repr__(self) -> str:
        return pretty_print(self)

    # *** constructors ***

    @staticmethod
    def const(dtype: DType, value: ConstType) -> UOp:
        """A constant of `dtype`; vector dtypes broadcast a scalar value to every lane."""
        # an int that already fits a scalar int dtype is its own constant: skip the conversion (most constants are)
        if (
            type(value) is int
            and (r := _INT_RANGES[dtype] if dtype in _INT_RANGES else _int_range(dtype))
            and r[0] <= value <= r[1]
        ):
            # a constant straight from the intern table, by the key the interner files it under (or made and filed
            # under it): skips the metaclass call, and codegen builds about a million of these for a ResNet's first step
            key = (_CONST_VALUE, dtype, (), value, int)
            ref = _INTERNED.get(key)
            if ref is not None and (found := ref()) is not None:
                return found
            return _new_node(Ops.CONST, dtype, (), value, key)
        if type(value) is bool and dtype is dtypes.bool:
            return UOp(Ops.CONST, dtype, (), value)
        if isinstance(value, UOp):
            raise TypeError("UOp.const takes a Python value, got a UOp")
        if dtype.count > 1:
            return UOp(Ops.VECTORIZE, dtype, (UOp.const(dtype.scalar(), value),) * dtype.count)
        return UOp(Ops.CONST, dtype, (), dtypes.as_const(value, dtype))

    def const_like(self, value: ConstType) -> UOp:
        """A constant with this node's dtype."""
        return UOp.const(self.dtype, value)

    @staticmethod
    def variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.int32) -> UOp:
        """A named integer variable bounded to [min_val, max_val]."""
        if min_val > max_val:
            raise ValueError(f"variable {name!r} has min {min_val} > max {max_val}")
        return UOp(Ops.DEFINE_VAR, dtype, arg=(name, min_val, max_val))

    @staticmethod
    def range(end: int | UOp, axis: int, dtype: DType = dtypes.int32) -> UOp:
        """A loop index running from 0 to end-1."""
        return UOp(Ops.RANGE, dtype, (UOp.const(dtype, end) if isinstance(end, int) else end,), axis)

    @staticmethod
    def special(size: int, name: str) -> UOp:
        """A hardware thread index, e.g. `UOp.special(64, 'gidx0')`."""
        return UOp(Ops.SPECIAL, dtypes.int32, arg=(name, size))

    def bind(self, value: int) -> UOp:
        """This variable bound to a value: behaves as the variable, carries the value to run time."""
        if self.op is not Ops.DEFINE_VAR:
            raise TypeError(f"only variables can be bound, not {self.op}")
        name, lo, hi = self.arg
        if not lo <= value <= hi:
            raise ValueError(f"can't bind {name}={value}: outside its bounds [{lo}, {hi}]")
        return UOp(Ops.BIND, self.dtype, (self, self.const_like(value)))

    def unbind(self) -> tuple[UOp, int]:
        """The variable of a BIND and its value."""
        if self.op is not Ops.BIND:
            raise TypeError(f"unbind needs a BIND, got {self.op}")
        return self.src[0], self.src[1].arg

    @property
    def expr(self) -> str:
        """The name of a variable."""
        if self.op is not Ops.DEFINE_VAR:
            raise TypeError(f"only variables have names, not {self.op}")
        return self.arg[0]

    # *** arithmetic: builds graphs, simplifies nothing (see symbolic.py) ***

    def alu(self, op: Ops, *src: UOp) -> UOp:
        """Apply ALU op `op` to this node and `src`; comparisons give bool."""
        operands = (self, *src)
        out = dtypes.bool.vec(self.dtype.count) if op in _COMPARISONS else operands[-1 if op is Ops.WHERE else 0].dtype
        # the interner's lookup and, for a new node, its construction, without building the key twice; anything odd
        # goes the long way, which says what is wrong
        if type(op) is not Ops:
            return UOp(op, out, operands)
        key = (op._value_, out, operands, None, _NONE_TYPE)
        try:
            ref = _INTERNED.get(key)
        except TypeError:  # an unhashable operand
            return UOp(op, out, operands)
        if ref is not None and (found := ref()) is not None:
            return found
        return _new_node(op, out, operands, None, key)

    def lanes(self) -> tuple[UOp, ...]:
        """Each lane of this vector as a scalar node of its own, `GEP(self, (i,))` for lane i (the node itself for a
        scalar)."""
        count = self.dtype.count
        if count == 1:
            return (self,)
        # straight from the intern table by the key the interner files these under, as `alu` does: cutting a model's
        # vectors to the renderer's width takes hundreds of thousands of lanes
        scalar, src, out = self.dtype.scalar(), (self,), []
        for i in range(count):
            arg = (i,)
            key = (_GEP_VALUE, scalar, src, ("ints", arg), tuple)
            ref = _INTERNED.get(key)
            if ref is None or (found := ref()) is None:
                found = _new_node(Ops.GEP, scalar, src, arg, key)
            out.append(found)
        return tuple(out)

    def ufix(self, x: Any) -> UOp:
        """`x` as a UOp of this node's dtype (Python scalars become constants)."""
        return x if isinstance(x, UOp) else self.const_like(x)

    def cast(self, dtype: DType) -> UOp:
        """This value converted to `dtype` (no-op when already of it)."""
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    def bitcast(self, dtype: DType) -> UOp:
        """This value's bits reinterpreted as `dtype`."""
        return UOp(Ops.BITCAST, dtype, (self,))

    # the operators turn a Python scalar into a constant as `ufix` does, written out: they build most of a graph's nodes

    def __add__(self, x: Any) -> UOp:
        return self.alu(Ops.ADD, x if isinstance(x, UOp) else UOp.const(self.dtype, x))

    def __radd__(self, x: Any) -> UOp:
        return self.ufix(x).alu(Ops.ADD, self)

    def __sub__(self, x: Any) -> UOp:
        return self.alu(Ops.ADD, -self.ufix(x))

    def __rsub__(self, x: Any) -> UOp:
        return self.ufix(x).alu(Ops.ADD, -self)

    def __mul__(self, x: Any) -> UOp:
        return self.alu(Ops.MUL, x if isinstance(x, UOp) else UOp.const(self.dtype, x))

    def __rmul__(self, x: Any) -> UOp:
        return self.ufix(x).alu(Ops.MUL, self)

    def __neg__(self) -> UOp:
        if dtypes.is_bool(self.dtype):
            raise TypeError("can't negate a bool; use logical_not()")
        return self.alu(Ops.MUL, self.const_like(-1))

    def __floordiv__(self, x: Any) -> UOp:
        return self.alu(Ops.IDIV, x if isinstance(x, UOp) else UOp.const(self.dtype, x))

    def __rfloordiv__(self, x: Any) -> UOp:
        return self.ufix(x).alu(Ops.IDIV, self)

    def __mod__(self, x: Any) -> UOp:
        return self.alu(Ops.MOD, x if isinstance(x, UOp) else UOp.const(self.dtype, x))

    def __rmod__(self, x: Any) -> UOp:
        return self.ufix(x).alu(Ops.MOD, self)

    def __truediv__(self, x: Any) -> UOp:
        if not dtypes.is_float(self.dtype):
            raise TypeError(f"true division needs a float dtype, got {self.dtype}; use // for integers")
        return self.alu(Ops.MUL, self.ufix(x).alu(Ops.RECIP))

    def __lt__(self, x: Any) -> UOp:
        return self.alu(Ops.CMPLT, x if isinstance(x, UOp) else UOp.const(self.dtype, x))

    def __gt__(self, x: Any) -> UOp:
        return self.ufix(x).alu(Ops.CMPLT, self)

    def __le__(self, x: Any) -> UOp:
        return (self > x).logical_not()

    def __ge__(self, x: Any) -> UOp:
        return (self < x).logical_not()

    def ne(self, x: Any) -> UOp:
        """Elementwise `!=` (Python's `!=` stays identity so UOps can be dict keys)."""
        return self.alu(Ops.CMPNE, x if isinstance(x, UOp) else UOp.const(self.dtype, x))

    def eq(self, x: Any) -> UOp:
        """Elementwise `==`."""
        return self.ne(x).logical_not()

    def logical_not(self) -> UOp:
        """Boolean negation."""
        return self.ne(True)

    def __and__(self, x: Any) -> UOp:
        return self.alu(Ops.AND, x if isinstance(x, UOp) else UOp.const(self.dtype, x))

    def __rand__(self, x: Any) -> UOp:
        return self.ufix(x).alu(Ops.AND, self)

    def __or__(self, x: Any) -> UOp:
        return self.alu(Ops.OR, x if isinstance(x, UOp) else UOp.const(self.dtype, x))

    def __ror__(self, x: Any) -> UOp:
        return self.ufix(x).alu(Ops.OR, self)

    def __xor__(self, x: Any) -> UOp:
        return self.alu(Ops.XOR, x if isinstance(x, UOp) else UOp.const(self.dtype, x))

    def __rxor__(self, x: Any) -> UOp:
        return self.ufix(x).alu(Ops.XOR, self)

    def __lshift__(self, x: Any) -> UOp:
        return self.alu(Ops.SHL, self.ufix(x))

    def __rshift__(self, x: Any) -> UOp:
        return self.alu(Ops.SHR, self.ufix(x))

    def maximum(self, x: Any) -> UOp:
        """Elementwise max."""
        return self.alu(Ops.MAX, self.ufix(x))

    def minimum(self, x: Any) -> UOp:
        """Elementwise min: -max(-a, -b) for floats, ~max(~a, ~b) for ints, a & b for bools."""
        if dtypes.is_float(self.dtype):
            return -((-self).maximum(-self.ufix(x)))
        if dtypes.is_bool(self.dtype):
            return self & x
        # negation wraps (-0 is 0 for unsigned, -INT_MIN is INT_MIN); bitwise not reverses the order exactly
        return (self ^ -1).maximum(self.ufix(x) ^ -1) ^ -1

    def where(self, x: Any, y: Any) -> UOp:
        """`x` where this bool is true, else `y`."""
        if isinstance(x, UOp):
            return self.alu(Ops.WHERE, x, x.ufix(y))
        if isinstance(y, UOp):
            return self.alu(Ops.WHERE, y.ufix(x), y)
        raise TypeError("where needs at least one UOp branch to give the result a dtype")

    # *** bounds ***

    @_Cached
    def _min_max(self) -> tuple[ConstType, ConstType]:
        # settle the sources' bounds deepest first with a stack: recursing through vmin overflows at a few
        # hundred levels
        stack = [s for s in self.src if "_min_max" not in s.__dict__]
        while stack:
            pending = [s for s in stack[-1].src if "_min_max" not in s.__dict__]
            if pending:
                stack.extend(pending)
            else:
                stack.pop()._min_max  # noqa: B018 - computed for its cache
        lo, hi = _bounds(self)
        if (r := _int_range(self.dtype.scalar())) is not None and (lo < r[0] or hi > r[1]):
            # the value wraps around the dtype's range, so a bound outside it says nothing
            return r
        return lo, hi

    @property
    def vmin(self) -> ConstType:
        """A lower bound of every value this node can take."""
        return self._min_max[0]

    @property
    def vmax(self) -> ConstType:
        """An upper bound of every value this node can take."""
        return self._min_max[1]

    # *** simplification hooks (implemented in symbolic.py) ***

    def simplify(self) -> UOp:
        """The graph rewritten by the symbolic engine."""
        from lazygrad_uop.symbolic import simplify

        return simplify(self)

    def ssimplify(self) -> int | UOp:
        """The simplified value as a Python int when it folds to a constant, else the simplified UOp."""
        s = self.simplify()
        return s.arg if s.op is Ops.CONST else s

    def render(self) -> str:
        """A compact infix rendering of an expression, for messages and debugging."""
        return render_expr(self)


# the interner fills a new node's fields through their slot descriptors, past UOp.__setattr__'s immutability guard
_set_op, _set_dtype, _set_src, _set_arg = (UOp.__dict__[f].__set__ for f in ("op", "dtype", "src", "arg"))
_FIELDS = frozenset({"op", "dtype", "src", "arg"})
# a tuple, not GroupOp's frozenset: `in` on two members compares identities, where a set would hash the Enum member
# in Python
_COMPARISONS = tuple(GroupOp.Comparison)
_RANGES: dict[DType, tuple[ConstType, ConstType]] = {}


def _dtype_range(dt: DType) -> tuple[ConstType, ConstType]:
    """(dtypes.min, dtypes.max) of a scalar dtype, memoised: bounds ask for it at every node."""
    if (r := _RANGES.get(dt)) is None:
        r = _RANGES[dt] = (dtypes.min(dt), dtypes.max(dt))
    return r


_INT_RANGES: dict[DType, tuple[int, int] | None] = {}


def _int_range(dt: DType) -> tuple[int, int] | None:
    """The range of a scalar integer dtype, None for any other dtype (memoised)."""
    try:
        return _INT_RANGES[dt]
    except KeyError:
        r = _INT_RANGES[dt] = _dtype_range(dt) if dt.count == 1 and dtypes.is_int(dt) else None  # type: ignore[assignment]
        return r


# *** bounds ***


def _cdiv(a: int, b: int) -> int:
    """C's integer division: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _cmod(a: int, b: int) -> int:
    """C's remainder: takes the sign of the dividend."""
    return a - b * _cdiv(a, b)


# Bounds of a node from its op and its sources' bounds. Each rule gets the node, its sources' (vmin, vmax) pairs,
# its scalar dtype and that dtype's full range (what a rule returns when it knows nothing), and is only asked when
# every source's vmin is an int or bool. Looked up by the op's int value: one list index per node, where a chain of
# `is` tests cost one comparison per op tried before the node's own.
Bounds = tuple[ConstType, ConstType]


def _bounds_add(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    (a0, a1), (b0, b1) = mm[0], mm[1]
    return a0 + b0, a1 + b1


def _bounds_mul(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    (a0, a1), (b0, b1) = mm[0], mm[1]
    vals = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
    return min(vals), max(vals)


def _bounds_max(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    (a0, a1), (b0, b1) = mm[0], mm[1]
    return max(a0, b0), max(a1, b1)


def _bounds_neg(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    return -mm[0][1], -mm[0][0]


def _bounds_mod(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    (a0, a1), (d0, d1) = mm[0], mm[1]
    if d0 > 0 or d1 < 0:  # C's remainder: |r| < |d|, with the dividend's sign
        m = max(abs(d0), abs(d1)) - 1
        return (0 if a0 >= 0 else max(-m, a0)), (0 if a1 <= 0 else min(m, a1))
    return full


def _bounds_idiv(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    (a0, a1), (d0, d1) = mm[0], mm[1]
    if d0 > 0 or d1 < 0:
        vals = [_cdiv(x, y) for x in (a0, a1) for y in (d0, d1)]
        return min(vals), max(vals)
    return full


def _bounds_cmplt(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    (a0, a1), (b0, b1) = mm[0], mm[1]
    if a1 < b0:
        return True, True
    if a0 >= b1:
        return False, False
    return False, True


def _bounds_cmpne(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    (a0, a1), (b0, b1) = mm[0], mm[1]
    if a1 < b0 or a0 > b1:
        return True, True
    if a0 == a1 == b0 == b1:
        return False, False
    return False, True


def _bounds_where(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    (c0, c1), (x0, x1), (y0, y1) = mm
    if c0 == c1:
        return (x0, x1) if c0 else (y0, y1)
    return min(x0, y0), max(x1, y1)


def _bounds_and(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    (a0, a1), (b0, b1) = mm[0], mm[1]
    if dt is dtypes.bool:
        return a0 and b0, a1 and b1
    if a0 >= 0 and b0 >= 0:
        return 0, min(a1, b1)
    return full


def _bounds_or(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    if dt is dtypes.bool:
        (a0, a1), (b0, b1) = mm[0], mm[1]
        return a0 or b0, a1 or b1
    return full


def _bounds_shift(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    a0, a1 = mm[0]
    b = u.src[1]
    if b.op is Ops.CONST and a0 >= 0 and b.arg >= 0:
        return (a0 << b.arg, a1 << b.arg) if u.op is Ops.SHL else (a0 >> b.arg, a1 >> b.arg)
    return full


def _bounds_xor(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    b = u.src[1]
    if dtypes.is_int(dt) and b.op is Ops.CONST and b.arg == dtypes.as_const(-1, dt):
        # x ^ all-ones is bitwise not, which reverses the order of the dtype's values
        return dtypes.as_const(~mm[0][1], dt), dtypes.as_const(~mm[0][0], dt)
    return full


def _bounds_cast(u: UOp, mm: list[Bounds], dt: DType, full: Bounds) -> Bounds:
    if dtypes.is_int(dt) or dt is dtypes.bool:
        # a value outside the target's range wraps (or becomes True), so only a source that fits keeps its bounds
        a0, a1 = mm[0]
        return (a0, a1) if full[0] <= a0 and a1 <= full[1] else full
    return full


_ALU_BOUNDS: list[Callable[[UOp, list[Bounds], DType, Bounds], Bounds] | None] = [None] * (
    max(op._value_ for op in Ops) + 1
)
for _op, _rule in (
    (Ops.ADD, _bounds_add),
    (Ops.MUL, _bounds_mul),
    (Ops.MAX, _bounds_max),
    (Ops.NEG, _bounds_neg),
    (Ops.MOD, _bounds_mod),
    (Ops.IDIV, _bounds_idiv),
    (Ops.CMPLT, _bounds_cmplt),
    (Ops.CMPNE, _bounds_cmpne),
    (Ops.WHERE, _bounds_where),
    (Ops.AND, _bounds_and),
    (Ops.OR, _bounds_or),
    (Ops.SHL, _bounds_shift),
    (Ops.SHR, _bounds_shift),
    (Ops.XOR, _bounds_xor),
    (Ops.CAST, _bounds_cast),
):
    _ALU_BOUNDS[_op._value_] = _rule


def _bounds(u: UOp) -> Bounds:
    op = u.op
    if op is Ops.CONST:
        return u.arg, u.arg
    if op is Ops.DEFINE_VAR:
        return u.arg[1], u.arg[2]
    if op is Ops.BIND:
        return u.src[0].vmin, u.src[0].vmax
    if op is Ops.RANGE:
        return 0, max(0, u.src[0].vmax - 1)
    if op is Ops.SPECIAL:
        return 0, u.arg[1] - 1 if isinstance(u.arg[1], int) else u.arg[1].vmax - 1
    src = u.src
    if op is Ops.VECTORIZE and src:
        return min(s.vmin for s in src), max(s.vmax for s in src)
    dt = u.dtype.scalar()
    full = _dtype_range(dt)
    if not src:
        return full
    mm = [s._min_max for s in src]
    for lo, _ in mm:
        if not isinstance(lo, (int, bool)):
            return full
    rule = _ALU_BOUNDS[op._value_]
    return full if rule is None else rule(u, mm, dt, full)


# *** evaluation: the meaning of an integer expression, in Python ints ***


def eval_uop(u: UOp, env: Mapping[UOp, int] | None = None) -> ConstType:
    """The value of a scalar expression with the variables of `env` substituted, with C semantics for // and %."""
    # a BIND gives its variable a value, also where the variable appears bare; `env` overrides that
    env = {**{b.src[0]: b.src[1].arg for b in u.toposort if b.op is Ops.BIND}, **(env or {})}
    vals: dict[UOp, Any] = {}
    for n in u.toposort:
        if n in env:
            vals[n] = env[n]
            continue
        s = [vals[x] for x in n.src]
        if n.op is Ops.CONST:
            vals[n] = n.arg
        elif n.op in (Ops.DEFINE_VAR, Ops.RANGE, Ops.SPECIAL):
            raise KeyError(f"no value given for {n.render()}")
        elif n.op is Ops.BIND:
            vals[n] = s[1]
        elif n.op in _EVAL:
            vals[n] = eval_alu(n.op, n.dtype, s)
        else:
            raise NotImplementedError(f"eval_uop has no meaning for {n.op}")
    return vals[u]


def eval_alu(op: Ops, dtype: DType, operands: Sequence[Any]) -> ConstType:
    """ALU op `op` on Python values as a node of `dtype` computes it: C semantics for // and %, the result wrapped
    (ints) or rounded (floats) to a scalar `dtype`. One step of `eval_uop`."""
    v = _EVAL[op](*operands)
    return dtypes.as_const(v, dtype) if dtype.count == 1 and dtype != dtypes.void else v


def _trunc(x: float) -> float:
    return float(math.trunc(x)) if math.isfinite(x) else x


_EVAL: dict[Ops, Callable[..., Any]] = {
    Ops.ADD: lambda a, b: a + b,
    Ops.MUL: lambda a, b: a * b,
    Ops.NEG: lambda a: -a,
    Ops.IDIV: _cdiv,
    Ops.MOD: _cmod,
    Ops.MAX: max,
    Ops.CMPLT: lambda a, b: a < b,
    Ops.CMPNE: lambda a, b: a != b,
    Ops.AND: lambda a, b: a & b,
    Ops.OR: lambda a, b: a | b,
    Ops.XOR: lambda a, b: a ^ b,
    Ops.SHL: lambda a, b: a << b,
    Ops.SHR: lambda a, b: a >> b,
    Ops.WHERE: lambda c, x, y: x if c else y,
    Ops.CAST: lambda a: a,
    Ops.RECIP: lambda a: 1 / a if a != 0 else math.copysign(math.inf, a),
    Ops.SQRT: lambda a: math.sqrt(a) if a >= 0 else math.nan,
    Ops.TRUNC: _trunc,
    Ops.MULACC: lambda a, b, c: a * b + c,
}


def int_evaluator(u: UOp) -> Callable[[Mapping[UOp, int]], ConstType]:
    """`eval_uop(u, env)` as a function of `env` compiled once per expression (cached): the same values, wrapping
    and errors (KeyError for a variable without a value), for an expression whose nodes are all scalar integers and
    bools; other expressions get `eval_uop` itself. A jitted replay evaluates its kernels' launch sizes and cost
    estimates this way for every call."""
    if (fn := _EVALUATORS.get(u)) is None:
        fn = _EVALUATORS[u] = _compile_int(u)
    return fn


_EVALUATORS: weakref.WeakKeyDictionary[UOp, Callable[[Mapping[UOp, int]], ConstType]] = weakref.WeakKeyDictionary()


def _compile_int(u: UOp) -> Callable[[Mapping[UOp, int]], ConstType]:
    nodes = u.toposort
    plain = all(
        n.dtype.count == 1 and (dtypes.is_int(n.dtype) or n.dtype == dtypes.bool) and (n.op in _EVAL or n.op in _LEAVES)
        for n in nodes
    )
    if not plain:
        return lambda env: eval_uop(u, env)
    binds = {b.src[0]: b.src[1].arg for b in nodes if b.op is Ops.BIND}
    slot = {n: i for i, n in enumerate(nodes)}
    names: dict[str, Any] = {"binds": binds}
    lines = ["def run(env):"]
    for i, n in enumerate(nodes):
        args = ", ".join(f"v{slot[x]}" for x in n.src)
        if n.op is Ops.CONST:
            names[f"c{i}"] = n.arg
            expr = f"c{i}"
        elif n.op is Ops.BIND:
            expr = f"v{slot[n.src[1]]}"
        elif n.op in (Ops.DEFINE_VAR, Ops.RANGE, Ops.SPECIAL):
            # a value from env, else from a BIND of the variable in the expression, as eval_uop gives it
            names[f"n{i}"] = n
            expr = f"env[n{i}] if n{i} in env else binds[n{i}]"
        else:
            names[f"f{i}"] = _EVAL[n.op]
            if n.dtype == dtypes.bool:
                expr = f"bool(f{i}({args}))"
            else:
                bits = 8 * n.dtype.itemsize
                top = 1 << (bits - 1)
                # dtypes.as_const's wrap: the low `bits` bits, signed where the type is
                wrap = f"(f{i}({args}) & {(1 << bits) - 1})"
                expr = wrap if dtypes.is_unsigned(n.dtype) else f"(({wrap} ^ {top}) - {top})"
        lines.append(f"    v{i} = {expr}")
    lines.append(f"    return v{slot[u]}")
    # the source is built above from the expression's own nodes: constants and functions come in by name
    exec("\n".join(lines), names)
    run = names["run"]
    inner = frozenset(n for n in nodes if n.op not in _LEAVES)

    def evaluate(env: Mapping[UOp, int]) -> ConstType:
        if not inner.isdisjoint(env):
            return eval_uop(u, env)  # a value given for a node inside the expression: eval_uop takes it as is
        try:
            return run(env)
        except KeyError:
            return eval_uop(u, env)  # eval_uop's own error, naming the variable

    return evaluate


_LEAVES = (Ops.CONST, Ops.BIND, Ops.DEFINE_VAR, Ops.RANGE, Ops.SPECIAL)

# *** printing ***

_INFIX = {
    Ops.ADD: "+",
    Ops.MUL: "*",
    Ops.IDIV: "//",
    Ops.MOD: "%",
    Ops.CMPLT: "<",
    Ops.CMPNE: "!=",
    Ops.AND: "&",
    Ops.OR: "|",
    Ops.XOR: "^",
    Ops.SHL: "<<",
    Ops.SHR: ">>",
}


def render_expr(u: UOp) -> str:
    """Infix text of an expression: variables by name, ranges as ridx<axis>, other nodes by op."""
    out: dict[UOp, str] = {}
    for n in u.toposort:
        s = [out[x] for x in n.src]
        if n.op is Ops.CONST:
            out[n] = repr(n.arg)
        elif n.op is Ops.DEFINE_VAR:
            out[n] = n.arg[0]
        elif n.op is Ops.BIND:
            out[n] = f"{s[0]}={s[1]}"
        elif n.op is Ops.RANGE:
            out[n] = f"ridx{n.arg}"
        elif n.op is Ops.SPECIAL:
            out[n] = n.arg[0]
        elif n.op in _INFIX:
            out[n] = f"({s[0]}{_INFIX[n.op]}{s[1]})"
        elif n.op is Ops.MAX:
            out[n] = f"max({s[0]}, {s[1]})"
        elif n.op is Ops.WHERE:
            out[n] = f"({s[1]} if {s[0]} else {s[2]})"
        else:
            out[n] = f"{n.op.name.lower()}({', '.join(s)})"
    return out[u]


def pretty_print(root: UOp) -> str:
    """The graph as nested `UOp(...)` text; a node used more than once is named `xN:=` once and then by name."""
    uses: dict[UOp, int] = {}
    for n in root.toposort:
        for s in n.src:
            uses[s] = uses.get(s, 0) + 1
    names: dict[UOp, str] = {}
    lines: list[str] = []
    # iterative depth-first print so deep graphs don't hit the recursion limit
    stack: list[tuple[UOp | None, int, str]] = [(root, 0, "")]
    while stack:
        node, depth, suffix = stack.pop()
        pad = "  " * depth
        if node is None:
            lines[-1] += suffix
            continue
        if node in names:
            lines.append(f"{pad}{names[node]}{suffix}")
            continue
        prefix = ""
        if uses.get(node, 0) > 1:
            names[node] = f"x{len(names)}"
            prefix = f"{names[node]}:="
        head = f"{pad}{prefix}UOp({node.op}, {node.dtype!r}, arg={node.arg!r}"
        if not node.src:
            lines.append(f"{head}, src=()){suffix}")
            continue
        lines.append(f"{head}, src=(")
        stack.append((None, depth, f")){suffix}"))
        for s in reversed(node.src):
            stack.append((s, depth + 1, ","))
    return "\n".join(lines)
