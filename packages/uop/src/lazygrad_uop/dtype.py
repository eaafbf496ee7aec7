"""Data types: scalars, vectors and pointers, PyTorch's type promotion, and conversion to and from numpy."""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Any, Final

from lazygrad_uop.config import getenv

ConstType = float | int | bool


class DTypeError(TypeError, RuntimeError):
    """A dtype was used where it does not fit (unknown name, no numpy equivalent, an impossible promotion). Also a
    RuntimeError, which is what code written for PyTorch catches for dtype mismatches."""


@dataclass(frozen=True, eq=False)
class DType:
    """A scalar or vector element type. Interned: compare with `is` or `==`, both by identity."""

    priority: int  # position in the promotion order, also the canonical sort order
    itemsize: int  # bytes of one element (of the whole vector for vector types)
    name: str
    fmt: str | None  # struct format character, None where Python's struct has none (bfloat16, fp8)
    count: int  # vector width, 1 for scalars
    _scalar: DType | None = None

    @staticmethod
    def new(priority: int, itemsize: int, name: str, fmt: str | None) -> DType:
        """Make a scalar dtype. Only this module defines scalar dtypes."""
        return DType(priority, itemsize, name, fmt, 1)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_dtype_from_key, (self.key,))

    @property
    def key(self) -> tuple[Any, ...]:
        """What identifies this dtype across pickling."""
        return (self.scalar().name, self.count)

    def __repr__(self) -> str:
        return f"dtypes.{self.name}" if self.count == 1 else f"dtypes.{self.scalar().name}.vec({self.count})"

    def __lt__(self, other: DType) -> bool:
        return (self.priority, self.itemsize, self.name, self.count) < (
            other.priority,
            other.itemsize,
            other.name,
            other.count,
        )

    @property
    def base(self) -> DType:
        """The dtype itself; a pointer's element type for PtrDType."""
        return self

    @property
    def vcount(self) -> int:
        """The vector width of the value (a pointer's own width for PtrDType)."""
        return self.count

    @property
    def min(self) -> ConstType:
        """The smallest value of this type (-inf for floats): `dtypes.int8.min` is -128."""
        return dtypes.min(self)

    @property
    def max(self) -> ConstType:
        """The largest value of this type (inf for floats): `dtypes.uint16.max` is 65535."""
        return dtypes.max(self)

    def scalar(self) -> DType:
        """The element type of a vector, or the dtype itself."""
        return self._scalar if self._scalar is not None else self

    def vec(self, count: int) -> DType:
        """The vector of `count` elements of this scalar type."""
        if self.count != 1:
            raise DTypeError(f"can't make a vector of vector type {self}")
        if count < 1:
            raise DTypeError(f"vector width must be at least 1, got {count}")
        if count == 1 or self == dtypes.void:
            return self
        return _make_vec(self, count)

    def ptr(self, size: int = -1, local: bool = False) -> PtrDType:
        """A pointer to a buffer of `size` elements of this type (-1: unknown), global or local memory."""
        return _make_ptr(self, size, local)


@dataclass(frozen=True, eq=False)
class PtrDType(DType):
    """A pointer to `_base` elements in global or local memory; `v` > 1 for a vector of pointers."""

    _base: DType = None  # type: ignore[assignment]
    local: bool = False
    v: int = 1
    size: int = -1

    def __reduce__(self) -> tuple[Any, ...]:
        return (PtrDType._from_key, (self._base, self.local, self.v, self.size))

    @staticmethod
    def _from_key(base: DType, local: bool, v: int, size: int) -> PtrDType:
        p = base.ptr(size, local)
        return p if v == 1 else p.vec(v)

    @property
    def base(self) -> DType:
        return self._base

    @property
    def vcount(self) -> int:
        return self.v

    def vec(self, count: int) -> PtrDType:  # type: ignore[override]
        if self.v != 1:
            raise DTypeError(f"can't make a vector of vector pointer {self}")
        if count == 1:
            return self
        return _make_ptr_vec(self, count)

    def scalar(self) -> PtrDType:
        return self._base.ptr(self.size, self.local)

    def ptr(self, size: int = -1, local: bool = False) -> PtrDType:
        raise DTypeError("pointers to pointers are not supported")

    def __repr__(self) -> str:
        s = f"{self._base!r}.ptr({self.size}{', local=True' if self.local else ''})"
        return s if self.v == 1 else f"{s}.vec({self.v})"


# dtypes are interned through these caches, always called with positional arguments: functools.cache keys
# vec(4) and vec(count=4) apart, which would make two distinct (and so unequal) float4 types
@functools.cache
def _make_vec(scalar: DType, count: int) -> DType:
    return DType(scalar.priority, scalar.itemsize * count, f"{scalar.name}{count}", None, count, scalar)


@functools.cache
def _make_ptr(base: DType, size: int, local: bool) -> PtrDType:
    return PtrDType(base.priority, base.itemsize, base.name, base.fmt, base.count, None, base, local, 1, size)


@functools.cache
def _make_ptr_vec(p: PtrDType, count: int) -> PtrDType:
    return PtrDType(p.priority, p.itemsize, p.name, p.fmt, p.count, None, p._base, p.local, count, p.size)


class dtypes:  # noqa: N801 - used like a module namespace, as in tinygrad and torch
    """All dtypes, and questions about them."""

    void: Final[DType] = DType.new(-1, 0, "void", None)
    bool: Final[DType] = DType.new(0, 1, "bool", "?")
    int8: Final[DType] = DType.new(1, 1, "char", "b")
    uint8: Final[DType] = DType.new(2, 1, "unsigned char", "B")
    int16: Final[DType] = DType.new(3, 2, "short", "h")
    uint16: Final[DType] = DType.new(4, 2, "unsigned short", "H")
    int32: Final[DType] = DType.new(5, 4, "int", "i")
    uint32: Final[DType] = DType.new(6, 4, "unsigned int", "I")
    int64: Final[DType] = DType.new(7, 8, "long", "q")
    uint64: Final[DType] = DType.new(8, 8, "unsigned long", "Q")
    fp8e4m3: Final[DType] = DType.new(9, 1, "float8_e4m3", None)
    fp8e5m2: Final[DType] = DType.new(10, 1, "float8_e5m2", None)
    float16: Final[DType] = DType.new(11, 2, "half", "e")
    bfloat16: Final[DType] = DType.new(12, 2, "__bf16", None)
    float32: Final[DType] = DType.new(13, 4, "float", "f")
    float64: Final[DType] = DType.new(14, 8, "double", "d")

    # aliases
    half = float16
    float = float32
    double = float64
    char = int8
    uchar = uint8
    short = int16
    ushort = uint16
    int = int32
    uint = uint32
    long = int64
    ulong = uint64

    default_float: DType = float32
    default_int: DType = int32

    @staticmethod
    def is_float(x: DType) -> bool:
        """True for floating-point types (fp8 included), scalar or vector."""
        return x.scalar() in _FLOATS

    @staticmethod
    def is_int(x: DType) -> bool:
        """True for signed and unsigned integer types (not bool)."""
        return x.scalar() in _INTS

    @staticmethod
    def is_unsigned(x: DType) -> bool:
        """True for unsigned integer types."""
        return x.scalar() in _UINTS

    @staticmethod
    def is_bool(x: DType) -> bool:
        """True for bool, scalar or vector."""
        return x.scalar() == dtypes.bool

    @staticmethod
    def from_py(x: Any) -> DType:
        """The dtype of a Python value or nested list, as torch.tensor would choose it (ints: dtypes.default_int)."""
        if isinstance(x, bool):
            return dtypes.bool
        if isinstance(x, int):
            return dtypes.default_int
        if isinstance(x, float):
            return dtypes.default_float
        if isinstance(x, (list, tuple)):
            return max((dtypes.from_py(v) for v in x), default=dtypes.default_float)
        raise DTypeError(f"can't infer a dtype from {type(x).__name__} value {x!r}")

    @staticmethod
    def as_const(val: Any, dtype: DType) -> ConstType | tuple[ConstType, ...]:
        """`val` converted to the Python type that represents `dtype` (wrapping integers as the hardware does)."""
        if isinstance(val, tuple):
            if len(val) != dtype.count:
                raise DTypeError(f"a {dtype} constant needs {dtype.count} values, got {len(val)}")
            return tuple(dtypes.as_const(v, dtype.scalar()) for v in val)  # type: ignore[misc]
        if dtypes.is_int(dtype):
            v = int(val)
            bits = 8 * dtype.scalar().itemsize
            v &= (1 << bits) - 1
            return v - (1 << bits) if not dtypes.is_unsigned(dtype) and v >= 1 << (bits - 1) else v
        if dtype.scalar() == dtypes.bool:
            return bool(val)
        v = float(val)
        fmt = dtype.scalar().fmt
        if fmt in ("e", "f") and math.isfinite(v):
            # round to the narrower float through struct; a value past its largest finite one becomes inf
            try:
                return struct.unpack(fmt, struct.pack(fmt, v))[0]
            except OverflowError:
                return math.copysign(math.inf, v)
        return v

    @staticmethod
    def min(dtype: DType) -> ConstType:
        """The smallest value of `dtype` (-inf for floats)."""
        if dtypes.is_int(dtype):
            return 0 if dtypes.is_unsigned(dtype) else -(2 ** (dtype.scalar().itemsize * 8 - 1))
        return False if dtype.scalar() == dtypes.bool else -math.inf

    @staticmethod
    def max(dtype: DType) -> ConstType:
        """The largest value of `dtype` (inf for floats)."""
        if dtypes.is_int(dtype):
            bits = dtype.scalar().itemsize * 8
            return 2**bits - 1 if dtypes.is_unsigned(dtype) else 2 ** (bits - 1) - 1
        return True if dtype.scalar() == dtypes.bool else math.inf

    @staticmethod
    def finfo(dtype: DType) -> tuple[int, int]:
        """(exponent bits, mantissa bits) of a float type."""
        if dtype.scalar() not in _FINFO:
            raise DTypeError(f"{dtype} is not a floating-point type")
        return _FINFO[dtype.scalar()]

    @staticmethod
    def fields() -> dict[str, DType]:
        """Every scalar dtype by its canonical name (e.g. 'float32', 'int8')."""
        return dict(_BY_NAME)


_FLOATS = frozenset({dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64})
_UINTS = frozenset({dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64})
_INTS = _UINTS | {dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64}
_FINFO = {
    dtypes.fp8e4m3: (4, 3),
    dtypes.fp8e5m2: (5, 2),
    dtypes.float16: (5, 10),
    dtypes.bfloat16: (8, 7),
    dtypes.float32: (8, 23),
    dtypes.float64: (11, 52),
}
_BY_NAME: dict[str, DType] = {
    "bool": dtypes.bool,
    "int8": dtypes.int8,
    "uint8": dtypes.uint8,
    "int16": dtypes.int16,
    "uint16": dtypes.uint16,
    "int32": dtypes.int32,
    "uint32": dtypes.uint32,
    "int64": dtypes.int64,
    "uint64": dtypes.uint64,
    "fp8e4m3": dtypes.fp8e4m3,
    "fp8e5m2": dtypes.fp8e5m2,
    "float16": dtypes.float16,
    "bfloat16": dtypes.bfloat16,
    "float32": dtypes.float32,
    "float64": dtypes.float64,
}
INVERSE_NAMES: dict[DType, str] = {v: k for k, v in _BY_NAME.items()} | {dtypes.void: "void"}
DTYPES_DICT: dict[str, DType] = dict(_BY_NAME)


def _dtype_from_key(key: tuple[str, int]) -> DType:
    name, count = key
    base = dtypes.void if name == "void" else next(d for d in _BY_NAME.values() if d.name == name)
    return base.vec(count)


def to_dtype(x: DType | str) -> DType:
    """A dtype from a dtype or its name ('float32', 'half', 'int', ...)."""
    if isinstance(x, DType):
        return x
    attr = getattr(dtypes, str(x), None)
    if isinstance(attr, DType):
        return attr
    raise DTypeError(f"unknown dtype {x!r}; known dtypes: {', '.join(_BY_NAME)}")


# PyTorch's promotion as a join on this graph: an edge a -> b means every a value is representable as b,
# or (int -> float) that torch's category rule prefers b. The join is the least common upper bound.
# Every int promotes to every float, so the floats need a least element for joins to be unique (and so
# associative): int64 | uint64 is fp8e4m3, below fp8e5m2. torch promotes neither fp8 nor uint64 with int64.
_PROMO_LATTICE: dict[DType, tuple[DType, ...]] = {
    dtypes.bool: (dtypes.int8, dtypes.uint8),
    dtypes.int8: (dtypes.int16,),
    dtypes.int16: (dtypes.int32,),
    dtypes.int32: (dtypes.int64,),
    dtypes.int64: (dtypes.fp8e4m3,),
    dtypes.uint8: (dtypes.int16, dtypes.uint16),
    dtypes.uint16: (dtypes.int32, dtypes.uint32),
    dtypes.uint32: (dtypes.int64, dtypes.uint64),
    dtypes.uint64: (dtypes.fp8e4m3,),
    dtypes.fp8e4m3: (dtypes.fp8e5m2,),
    dtypes.fp8e5m2: (dtypes.float16, dtypes.bfloat16),
    dtypes.float16: (dtypes.float32,),
    dtypes.bfloat16: (dtypes.float32,),
    dtypes.float32: (dtypes.float64,),
    dtypes.float64: (),
}


@functools.cache
def _upper_set(d: DType) -> frozenset[DType]:
    return frozenset({d}).union(*(_upper_set(u) for u in _PROMO_LATTICE[d]))


def _join(a: DType, b: DType) -> DType:
    common = _upper_set(a) & _upper_set(b)
    least = [c for c in common if common <= _upper_set(c)]
    assert len(least) == 1, f"promotion graph is not a lattice at {a}, {b}"
    return least[0]


def least_upper_dtype(*ds: DType) -> DType:
    """The dtype PyTorch promotes a binary op on these (scalar) dtypes to, e.g. int8 and uint8 -> int16."""
    if not ds:
        raise DTypeError("least_upper_dtype needs at least one dtype")
    for d in ds:
        if d.scalar() not in _PROMO_LATTICE:
            raise DTypeError(f"{d} takes no part in type promotion")
    return functools.reduce(_join, (d.scalar() for d in ds))


def least_upper_float(dt: DType) -> DType:
    """`dt` if it is a float type, else the default float (what true division and exp promote ints to)."""
    return dt if dtypes.is_float(dt) else least_upper_dtype(dt, dtypes.default_float)


def sum_dtype(dt: DType) -> DType:
    """The type sums of `dt` values accumulate in: float32 for the 16-bit floats (as torch does), else `dt`."""
    return dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt


_NUMPY_NAMES = {d: n for n, d in _BY_NAME.items() if d not in (dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2)}


def to_numpy_dtype(dt: DType) -> Any:
    """The numpy dtype of `dt`; bfloat16 and fp8 have none and raise DTypeError (cast to float32 first)."""
    import numpy as np  # numpy is the frontend's dependency, not this package's: import it only when asked

    if dt.scalar() not in _NUMPY_NAMES:
        raise DTypeError(f"numpy has no {dt.scalar()!r}; cast to dtypes.float32 before converting to numpy")
    return np.dtype(_NUMPY_NAMES[dt.scalar()])


def from_numpy_dtype(npdt: Any) -> DType:
    """The dtype of a numpy dtype (or anything `numpy.dtype()` accepts)."""
    import numpy as np

    try:
        name = np.dtype(npdt).name
    except TypeError:
        name = str(npdt)
    if name not in _BY_NAME or name in ("fp8e4m3", "fp8e5m2", "bfloat16"):
        raise DTypeError(
            f"numpy dtype {name!r} has no lazygrad equivalent; supported: {', '.join(_NUMPY_NAMES.values())}"
        )
    return _BY_NAME[name]


def _default_from_env(key: str, fallback: DType, check: Any) -> DType:
    name = getenv(key, "")
    if not name:
        return fallback
    d = to_dtype(name)
    if not check(d):
        raise DTypeError(f"{key}={name} is not a valid choice for {key.lower()}")
    return d


dtypes.default_float = _default_from_env("DEFAULT_FLOAT", dtypes.float32, dtypes.is_float)
dtypes.default_int = _default_from_env("DEFAULT_INT", dtypes.int32, dtypes.is_int)
