"""The PYTHON program text: rendering a linear program and parsing it back gives the same program, and the parser
reads literals only, never code."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyinterp_helpers import const, elementwise, end, glob, load, program, rng, store

from lazygrad_python import ProgramTextError, PythonCompiler, parse_program, render_program
from lazygrad_python.program_text import arg_text, dtype_text, parse_arg, parse_dtype
from lazygrad_uop import DType, Ops, UOp, dtypes
from lazygrad_uop.device import CompileError
from lazygrad_uop.dtype import DTYPES_DICT

ALL_DTYPES = [dtypes.void, *DTYPES_DICT.values()]


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=lambda d: d.name)
def test_every_dtype_vector_and_pointer_round_trips(dt: DType) -> None:
    forms = [dt] if dt == dtypes.void else [dt, dt.vec(4), dt.ptr(16), dt.ptr(-1), dt.ptr(8, local=True)]
    for form in forms:
        assert parse_dtype(dtype_text(form)) is form, dtype_text(form)


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


ARGS = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.sampled_from([*Ops])
    | st.sampled_from(ALL_DTYPES),
    lambda inner: st.lists(inner, max_size=4).map(tuple),
    max_leaves=12,
)


@given(ARGS)
def test_args_round_trip(arg: object) -> None:
    assert _same(parse_arg(arg_text(arg)), arg)


@pytest.mark.parametrize(
    "text", ["__import__('os').system('true')", "open('x')", "[1, 2]", "{'a': 1}", "x.y", "1 + 2", "-'a'", "lambda: 0"]
)
def test_parser_reads_literals_only(text: str) -> None:
    with pytest.raises(ProgramTextError):
        parse_arg(text)


def test_program_round_trips_with_its_args() -> None:
    out = glob(0, dtypes.float32, 4)
    r = rng(UOp.variable("n", 0, 4))
    special = UOp.special(4, "lidx0")
    local = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(4, local=True), arg="temp buf")
    value = load(out, r) + const(dtypes.float32, -math.inf) * const(dtypes.float32, -0.0)
    uops = program(special, local, r, store(out, r, value.maximum(const(dtypes.float32, math.nan))), end(r))
    uops.append(UOp(Ops.SINK, dtypes.void, (), arg="E_4"))
    text = render_program(uops)
    assert text.splitlines()[1] == "# kernel E_4"
    parsed = parse_program(text)
    assert len(parsed) == len(uops) - 1
    index = {u: i for i, u in enumerate(uops)}
    for u, x in zip(uops, parsed, strict=False):
        assert (x.op, x.dtype, x.src) == (u.op, u.dtype, tuple(index[s] for s in u.src))
        assert _same(x.arg, u.arg)


def test_compiler_reports_malformed_text_with_its_line() -> None:
    good = render_program(elementwise(Ops.NEG, dtypes.int32, [dtypes.int32], 4))
    n = len(parse_program(good))
    cases = {
        good.replace("NEG ", "FOO "): "unknown op 'FOO'",
        good.replace("   2 ", "   7 ", 1): "expected instruction number 2",
        good.replace("int32*[4]", "int33*[4]", 1): "unknown dtype 'int33\\*\\[4\\]'",
        good + f"{n} STORE void ({n},) None\n": "must refer to earlier instructions",
        good + f"{n} STORE void (1,2)\n": "expected 5 fields",
    }
    for text, message in cases.items():
        with pytest.raises(CompileError, match=message):
            PythonCompiler().compile(text)


def test_define_acc_may_name_the_later_range_it_reduces() -> None:
    out, inp = glob(0, dtypes.int32, 1), glob(1, dtypes.int32, 4)
    r = rng(4)
    acc = UOp(Ops.DEFINE_ACC, dtypes.int32, (const(dtypes.int32, 0), r), arg=(0,))
    upd = UOp(Ops.ASSIGN, dtypes.int32, (acc, acc + load(inp, r)))
    text = render_program(program(acc, r, upd, end(r), store(out, const(dtypes.int32, 0), upd)))
    parsed = parse_program(text)
    a = next(i for i, x in enumerate(parsed) if x.op is Ops.DEFINE_ACC)
    assert parsed[a].src[1] > a and parsed[parsed[a].src[1]].op is Ops.RANGE
    bad = text.replace(f"({parsed[a].src[0]},{parsed[a].src[1]})", f"({parsed[a].src[0]},{len(parsed) - 1})")
    with pytest.raises(ProgramTextError, match="must be RANGEs"):
        parse_program(bad)
