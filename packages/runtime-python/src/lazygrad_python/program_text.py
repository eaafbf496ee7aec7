"""The PYTHON device's source language: a linear program written one UOp per line, and its parser.

    # PYTHON linear program: index op dtype (sources) arg
       0 DEFINE_GLOBAL  float32*[16]   ()     0
       1 CONST          int32          ()     16
       2 RANGE          int32          (1,)   0
       3 INDEX          float32*[16]   (0,2)  None
       ...

Sources are the indices of earlier lines. Dtypes are written `float32`, `float32x4` (a vector), `float32*[16]` (a
pointer to 16 elements, -1 when unknown) and `float32*local[16]`. Args are Python literals, plus `inf`, `nan`,
`Ops.NAME`, dtype names and a TMA_LOAD's tensor map written as a call with keywords,
`TensorMap(dtype=float16, offset=0, dims=(70, 100), strides=(1, 72), box=(64, 8), swizzle=128)`; they are read back by
walking the parsed syntax tree, never by evaluating it.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, fields
from typing import Any

from lazygrad_uop.device import TensorMap
from lazygrad_uop.dtype import INVERSE_NAMES, DType, PtrDType
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

HEADER = "# PYTHON linear program: index op dtype (sources) arg"


class ProgramTextError(ValueError):
    """A PYTHON program text that can't be parsed; the message names the line."""


@dataclass(frozen=True)
class Instr:
    """One UOp of a linear program, with its sources as indices of earlier instructions."""

    op: Ops
    dtype: DType
    src: tuple[int, ...]
    arg: Any


# *** dtypes as text ***

_SCALARS: dict[str, DType] = {name: dt for dt, name in INVERSE_NAMES.items()}
_DTYPE_RE = re.compile(r"([a-z0-9]+?)(?:x(\d+))?(?:\*(local)?\[(-?\d+)\])?")


def dtype_text(dt: DType) -> str:
    """`dt` written as the program text writes it."""
    if isinstance(dt, PtrDType):
        if dt.v != 1:
            raise NotImplementedError(f"the PYTHON renderer can't write a vector of pointers ({dt!r})")
        return f"{dtype_text(dt.base)}*{'local' if dt.local else ''}[{dt.size}]"
    name = INVERSE_NAMES[dt.scalar()]
    return name if dt.count == 1 else f"{name}x{dt.count}"


def parse_dtype(text: str) -> DType:
    """The dtype `dtype_text` wrote as `text`."""
    m = _DTYPE_RE.fullmatch(text)
    if m is None or m.group(1) not in _SCALARS:
        raise ProgramTextError(f"unknown dtype {text!r}")
    name, count, local, size = m.groups()
    dt = _SCALARS[name].vec(int(count)) if count else _SCALARS[name]
    return dt.ptr(int(size), local=bool(local)) if size is not None else dt


# *** args as text ***

# the frozen dataclasses an arg may be, written as a call of their name with a keyword per field
_RECORDS: dict[str, type] = {"TensorMap": TensorMap}


def arg_text(arg: Any) -> str:
    """A UOp arg written as a literal the parser reads back to an equal value."""
    if arg is None or isinstance(arg, (bool, int, str)):
        return repr(arg)
    if isinstance(arg, float):
        if math.isnan(arg):
            return "nan"
        return repr(arg) if math.isfinite(arg) else ("inf" if arg > 0 else "-inf")
    if isinstance(arg, tuple):
        inner = ", ".join(arg_text(a) for a in arg)
        return f"({inner},)" if len(arg) == 1 else f"({inner})"
    if isinstance(arg, Ops):
        return f"Ops.{arg.name}"
    if isinstance(arg, DType) and not isinstance(arg, PtrDType):
        return dtype_text(arg)
    if type(arg) in _RECORDS.values():
        return f"{type(arg).__name__}({', '.join(f'{f.name}={arg_text(getattr(arg, f.name))}' for f in fields(arg))})"
    raise NotImplementedError(f"the PYTHON renderer can't write an arg of type {type(arg).__name__}: {arg!r}")


def parse_arg(text: str) -> Any:
    """The value `arg_text` wrote as `text`."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ProgramTextError(f"can't parse arg {text!r}: {exc.msg}") from None
    return _literal(tree.body, text)


def _literal(node: ast.AST, text: str) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (bool, int, float, str))):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e, text) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand, text)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    if isinstance(node, ast.Name):
        if node.id in ("inf", "nan"):
            return math.inf if node.id == "inf" else math.nan
        try:
            return parse_dtype(node.id)
        except ProgramTextError:
            pass
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Ops":
        if node.attr in Ops.__members__:
            return Ops[node.attr]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _RECORDS and not node.args:
        if all(k.arg is not None for k in node.keywords):
            kwargs = {k.arg: _literal(k.value, text) for k in node.keywords}
            try:
                return _RECORDS[node.func.id](**kwargs)
            except (AttributeError, TypeError, ValueError) as exc:  # the dataclass's own checks of the fields
                raise ProgramTextError(f"arg {text!r} is no valid {node.func.id}: {exc}") from None
    raise ProgramTextError(f"arg {text!r} holds {ast.unparse(node)!r}, which is not a literal the PYTHON device reads")


# *** whole programs ***


def render_program(uops: list[UOp]) -> str:
    """The text of the linear program `uops`. A trailing SINK runs nothing and is left out; the kernel name codegen
    puts in its arg becomes a comment."""
    lines = [HEADER]
    if uops and uops[-1].op is Ops.SINK:
        if isinstance(uops[-1].arg, str):
            lines.append(f"# kernel {uops[-1].arg}")
        uops = uops[:-1]
    index = {u: i for i, u in enumerate(uops)}
    for i, u in enumerate(uops):
        if u.op is Ops.SINK:
            raise NotImplementedError("the PYTHON renderer takes a SINK only as the last UOp of a linear program")
        missing = [s for s in u.src if s not in index]
        if missing:
            raise ValueError(f"UOp {i} ({u.op}) has a source that is not in the linear program: {missing[0].op}")
        src = "(" + ",".join(str(index[s]) for s in u.src) + ("," if len(u.src) == 1 else "") + ")"
        arg = u.arg
        if u.op is Ops.SPECIAL and not isinstance(arg[1], int):
            # a launch dimension of symbolic size (a batch bound at run time): the launch decides it
            arg = (arg[0], None)
        lines.append(f"{i:>4} {u.op.name:<14} {dtype_text(u.dtype):<16} {src:<12} {arg_text(arg)}")
    return "\n".join(lines) + "\n"


def parse_program(text: str) -> list[Instr]:
    """The instructions of a program text, checked: known ops, dtypes and literal args, lines numbered in order,
    sources that refer to earlier lines (except a DEFINE_ACC's RANGEs, which it is placed before)."""
    instrs: list[Instr] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            instrs.append(_parse_line(line, len(instrs)))
        except ProgramTextError as exc:
            raise ProgramTextError(f"line {lineno}: {exc}: {line.strip()!r}") from None
    for i, x in enumerate(instrs):
        if x.op is Ops.DEFINE_ACC and any(s >= len(instrs) or instrs[s].op is not Ops.RANGE for s in x.src[1:]):
            raise ProgramTextError(f"instruction {i}: DEFINE_ACC sources after the first must be RANGEs")
    return instrs


def _parse_line(line: str, expected: int) -> Instr:
    parts = line.split(None, 4)
    if len(parts) != 5:
        raise ProgramTextError("expected 5 fields: index op dtype (sources) arg")
    index, op, dt, src, arg = parts
    if not index.isdigit() or int(index) != expected:
        raise ProgramTextError(f"expected instruction number {expected}")
    if op not in Ops.__members__:
        raise ProgramTextError(f"unknown op {op!r}")
    if not (src.startswith("(") and src.endswith(")")):
        raise ProgramTextError(f"sources must be written (i,j,...), got {src!r}")
    try:
        sources = tuple(int(s) for s in src[1:-1].split(",") if s)
    except ValueError:
        raise ProgramTextError(f"sources must be instruction numbers, got {src!r}") from None
    values = sources[:1] if op == "DEFINE_ACC" else sources
    if any(s < 0 for s in sources) or any(s >= expected for s in values):
        raise ProgramTextError(f"sources {src} must refer to earlier instructions")
    return Instr(Ops[op], parse_dtype(dt), sources, parse_arg(arg))
