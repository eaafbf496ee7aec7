"""lazygrad-uop: the shared IR of lazygrad (UOp, Ops, dtypes, pattern matcher, symbolic engine, shape views),
the device interfaces and the plugin registry that every other lazygrad package builds on."""

from lazygrad_uop.config import BEAM, DEBUG, DEV, NOOPT, Context, ContextVar, getenv
from lazygrad_uop.dtype import DType, DTypeError, PtrDType, dtypes, least_upper_dtype, least_upper_float
from lazygrad_uop.ops import GroupOp, Ops
from lazygrad_uop.pattern import PatternMatcher, RewriteError, UPat, graph_rewrite
from lazygrad_uop.uop import UOp, sint

__version__ = "0.24.0"

__all__ = [
    "BEAM",
    "DEBUG",
    "DEV",
    "NOOPT",
    "Context",
    "ContextVar",
    "DType",
    "DTypeError",
    "GroupOp",
    "Ops",
    "PatternMatcher",
    "PtrDType",
    "RewriteError",
    "UOp",
    "UPat",
    "dtypes",
    "getenv",
    "graph_rewrite",
    "least_upper_dtype",
    "least_upper_float",
    "sint",
]
