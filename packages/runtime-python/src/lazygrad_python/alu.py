"""ALU ops over the threads of a warp: `alu_fn(op, dtype, src_dtypes)` gives a function from the operands' per-thread
value lists to the result's per-thread value list, with the exact semantics of the dtype (see `numerics`).

C semantics where C defines them: IDIV (integers only) truncates toward zero, MOD takes the dividend's sign (`fmod` on
floats), float MAX propagates nan like numpy.maximum, and bool arithmetic is logical (+ is or, * is and). Where C leaves
a result undefined the interpreter still gives one rather than raising, because both branches of a WHERE are computed
for every thread (`a // b` guarded by `b != 0` must not fail): integer division or remainder by zero gives 0, shifts
by a negative count or by the type's width or more give what numpy gives (0 for SHL and unsigned SHR, the sign for
signed SHR).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from typing import Any

from lazygrad_python.numerics import INF, NAN, normalizer
from lazygrad_uop.dtype import DType, dtypes
from lazygrad_uop.ops import Ops

ListFn = Callable[..., list[Any]]


# *** scalar functions with IEEE results where Python's math module raises ***


def _exp2(x: float) -> float:
    try:
        return 2.0**x
    except OverflowError:
        return INF


def _log2(x: float) -> float:
    if x > 0.0:
        return math.log2(x) if x != INF else INF
    return -INF if x == 0.0 else NAN  # log2(+-0) = -inf; negatives and nan give nan


def _sin(x: float) -> float:
    return math.sin(x) if math.isfinite(x) else NAN


def _sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0.0 else NAN  # sqrt(-0.0) = -0.0 takes the first branch; nan the second


def _recip(x: float) -> float:
    return 1.0 / x if x != 0.0 else math.copysign(INF, x)


def _trunc(x: float) -> float:
    return math.copysign(float(math.trunc(x)), x) if math.isfinite(x) else x  # trunc(-0.5) is -0.0


def _fmax(a: float, b: float) -> float:
    # numpy.maximum: a nan in either operand is the result
    return a if a >= b or a != a else b


def _imax(a: int, b: int) -> int:
    return a if a >= b else b


def _fmod(a: float, b: float) -> float:
    if b == 0.0 or not math.isfinite(a) or b != b:
        return NAN
    return math.fmod(a, b)


def _cdiv(a: int, b: int) -> int:
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _cmod(a: int, b: int) -> int:
    if b == 0:
        return 0
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


def _shl(bits: int) -> Callable[[int, int], int]:
    def shl(a: int, b: int) -> int:
        return a << b if 0 <= b < bits else 0

    return shl


def _shr(bits: int) -> Callable[[int, int], int]:
    def shr(a: int, b: int) -> int:
        # Python's >> is arithmetic, which is right for signed values; unsigned values are never negative
        return a >> b if 0 <= b < bits else (-1 if a < 0 else 0)

    return shr


def _mulacc(a: Any, b: Any, c: Any) -> Any:
    return a * b + c


# Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): the counter
# and the key are uint64 values whose low 32 bits are the first word; the result packs its two words the same way.
_M32 = 0xFFFFFFFF
_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
_PARITY = 0x1BD11BDA


def _threefry(x: int, key: int) -> int:
    k = (key & _M32, key >> 32)
    ks = (k[0], k[1], k[0] ^ k[1] ^ _PARITY)
    x0, x1 = ((x & _M32) + ks[0]) & _M32, ((x >> 32) + ks[1]) & _M32
    for block in range(5):
        for r in _ROTATIONS[4 * (block % 2) : 4 * (block % 2) + 4]:
            x0 = (x0 + x1) & _M32
            x1 = (((x1 << r) | (x1 >> (32 - r))) & _M32) ^ x0
        x0 = (x0 + ks[(block + 1) % 3]) & _M32
        x1 = (x1 + ks[(block + 2) % 3] + block + 1) & _M32
    return (x1 << 32) | x0


# *** which scalar function each op uses on each kind of dtype ***

_FLOAT = {
    Ops.ADD: operator.add,
    Ops.MUL: operator.mul,
    Ops.MOD: _fmod,
    Ops.MAX: _fmax,
    Ops.NEG: operator.neg,
    Ops.EXP2: _exp2,
    Ops.LOG2: _log2,
    Ops.SIN: _sin,
    Ops.SQRT: _sqrt,
    Ops.RECIP: _recip,
    Ops.TRUNC: _trunc,
    Ops.MULACC: _mulacc,
}
_INT = {
    Ops.ADD: operator.add,
    Ops.MUL: operator.mul,
    Ops.IDIV: _cdiv,
    Ops.MOD: _cmod,
    Ops.MAX: _imax,
    Ops.NEG: operator.neg,
    Ops.TRUNC: None,  # the identity on integers
    Ops.AND: operator.and_,
    Ops.OR: operator.or_,
    Ops.XOR: operator.xor,
    Ops.MULACC: _mulacc,
}
# bool arithmetic as on one-bit unsigned integers that saturate: + is or, * is and, max is or
_BOOL = {
    Ops.ADD: operator.or_,
    Ops.MUL: operator.and_,
    Ops.MAX: operator.or_,
    Ops.AND: operator.and_,
    Ops.OR: operator.or_,
    Ops.XOR: operator.xor,
    Ops.NEG: operator.not_,
    Ops.TRUNC: None,
}
# Ops whose results from in-range operands are in range already, so they skip the normalizer.
_CLOSED = frozenset({Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.MOD, Ops.TRUNC, Ops.SHR, Ops.NEG})


@functools.cache
def _table(dt: DType) -> dict[Ops, Any]:
    if dtypes.is_float(dt):
        return _FLOAT
    if dtypes.is_bool(dt):
        return _BOOL
    bits = 8 * dt.itemsize
    table = {**_INT, Ops.SHL: _shl(bits), Ops.SHR: _shr(bits)}
    if dt == dtypes.uint64:
        table[Ops.THREEFRY] = _threefry
    return table


def _scalar_alu(op: Ops, dt: DType, operand: DType) -> ListFn:
    if op is Ops.WHERE:
        return lambda c, x, y: [a if k else b for k, a, b in zip(c, x, y, strict=True)]
    if op is Ops.CMPLT:
        return lambda a, b: list(map(operator.lt, a, b))
    if op is Ops.CMPNE:
        return lambda a, b: list(map(operator.ne, a, b))
    table = _table(operand)
    if op not in table:
        raise NotImplementedError(f"the PYTHON interpreter has no {op} on {operand}")
    fn = table[op]
    if fn is None:
        return list
    # float NEG of an exact value is exact; integer NEG wraps (-INT_MIN) and must be normalized
    closed = (op in _CLOSED and not (op is Ops.NEG and dtypes.is_int(dt))) or dt == dtypes.float64
    norm = normalizer(dt)
    if closed:
        return lambda *srcs: list(map(fn, *srcs))
    return lambda *srcs: norm(map(fn, *srcs))


def _lanewise(fn: ListFn, count: int) -> ListFn:
    """A scalar list function applied to each lane of vector values (tuples); scalar operands broadcast."""

    def vec(*srcs: list[Any]) -> list[Any]:
        lanes = [fn(*(_lane(s, k) for s in srcs)) for k in range(count)]
        return list(zip(*lanes, strict=True))

    return vec


def _lane(vals: list[Any], k: int) -> list[Any]:
    return [v[k] for v in vals] if vals and isinstance(vals[0], tuple) else vals


def alu_fn(op: Ops, dtype: DType, src_dtypes: tuple[DType, ...]) -> ListFn:
    """The function computing `op` with result dtype `dtype` from operands of `src_dtypes`, over per-thread lists.

    Comparisons take their operand dtype from the sources; vectors (dtype.count > 1) work lane by lane.
    """
    operand = src_dtypes[-1] if op is Ops.WHERE else src_dtypes[0]
    fn = _scalar_alu(op, dtype.scalar(), operand.scalar())
    return _lanewise(fn, dtype.count) if dtype.count > 1 else fn
