"""Lowering, linearization and ProgramSpec: loop structure and placement, accumulators, gated loads, kernel names,
estimates, DEBUG output, malformed ASTs; and the shape of the LLVM IR the LLVM renderer writes."""

from __future__ import annotations

import re

import pytest

from lazygrad_codegen import CRenderer, KernelASTError, LLVMRenderer, get_program
from lazygrad_uop.config import Context
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp, eval_uop


class HostLLVM(LLVMRenderer):
    device = "TESTCPU"


def _ops(spec) -> list[Ops]:
    return [u.op for u in spec.uops]


def _row_sum(k, rows: int = 8, cols: int = 16):
    x = k.load(1, dtypes.float32, k.st(rows, cols))
    bias = k.load(2, dtypes.float32, k.st(rows, 1))
    return k.sink(k.store(0, k.reduce(x, Ops.ADD, (1,)) + bias, k.st(rows, 1)))


def test_reduce_loop_structure_and_hoisting(k) -> None:
    spec = get_program(_row_sum(k), CRenderer())
    uops = spec.uops
    pos = {u: i for i, u in enumerate(uops)}
    ranges = [u for u in uops if u.op is Ops.RANGE]
    assert [r.src[0].arg for r in ranges] == [8, 16]
    outer, inner = ranges
    acc = next(u for u in uops if u.op is Ops.DEFINE_ACC)
    assign = next(u for u in uops if u.op is Ops.ASSIGN)
    ends = [u for u in uops if u.op is Ops.END]
    store = next(u for u in uops if u.op is Ops.STORE)
    bias_load = next(u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].arg == 2)
    # accumulator restarts per output element, before the loop it reduces over
    assert pos[outer] < pos[acc] < pos[inner] < pos[assign] < pos[ends[0]] < pos[store] < pos[ends[1]]
    assert [e.src[0] for e in ends] == [inner, outer]  # innermost first
    # loop-invariant work sits outside the reduce loop: the output address and the bias load
    assert not pos[inner] < pos[store.src[0]] < pos[ends[0]]
    assert not pos[inner] < pos[bias_load] < pos[ends[0]]
    assert acc.src[0].arg == 0.0 and acc.src[1:] == (inner,)
    assert uops[0].op is Ops.DEFINE_GLOBAL and uops[-1].op is Ops.SINK and uops[-1].arg == spec.name


def test_a_load_used_after_the_reduction_follows_its_loop(k) -> None:
    # the bias is read once the sum is done: loaded before the reduce loop it would be held in a register through it
    # (a weight gradient fused with its optimizer step held 64 such values per thread: 155 registers instead of 89)
    spec = get_program(_row_sum(k), CRenderer(), opts=[])
    pos = {u: i for i, u in enumerate(spec.uops)}
    inner = [u for u in spec.uops if u.op is Ops.RANGE][1]
    end = next(u for u in spec.uops if u.op is Ops.END and u.src[0] is inner)
    bias_load = next(u for u in spec.uops if u.op is Ops.LOAD and u.src[0].src[0].arg == 2)
    assert pos[end] < pos[bias_load]
    # what the loop needs still comes first: its accumulator
    acc = next(u for u in spec.uops if u.op is Ops.DEFINE_ACC)
    assert pos[acc] < pos[inner]


def test_outer_loops_outermost_reduce_innermost(k) -> None:
    x = k.load(1, dtypes.float32, k.st(3, 4, 5, 6))
    spec = get_program(k.sink(k.store(0, k.reduce(x, Ops.MAX, (0, 2)), k.st(1, 4, 1, 6))), CRenderer(), opts=[])
    ranges = [u for u in spec.uops if u.op is Ops.RANGE]
    # output axes (4 and 6) outermost, reduce axes (3 and 5) innermost, each in axis order
    assert [r.src[0].arg for r in ranges] == [4, 6, 3, 5]
    acc = next(u for u in spec.uops if u.op is Ops.DEFINE_ACC)
    assert acc.src[0].arg == float("-inf")


def test_size_one_axes_get_no_loop(k) -> None:
    st = k.st(1, 7, 1)
    spec = get_program(k.sink(k.store(0, k.load(1, dtypes.int32, st), st)), CRenderer())
    assert [u.src[0].arg for u in spec.uops if u.op is Ops.RANGE] == [7]
    # a name already used in this process gets an n1, n2... suffix
    assert re.fullmatch(r"E_7(n\d+)?", spec.name), spec.name


def test_masked_load_is_gated_and_unmasked_is_not(k) -> None:
    padded = k.st(4).pad(((2, 2),))
    plain = k.st(8)
    ast = k.sink(k.store(0, k.load(1, dtypes.float32, padded, size=4) + k.load(2, dtypes.float32, plain), plain))
    loads = [u for u in get_program(ast, CRenderer()).uops if u.op is Ops.LOAD]
    gated = next(u for u in loads if u.src[0].src[0].arg == 1)
    ungated = next(u for u in loads if u.src[0].src[0].arg == 2)
    assert len(gated.src) == 3 and len(gated.src[0].src) == 3 and gated.src[2] is gated.src[0].src[2]
    assert gated.src[1].op is Ops.CONST and gated.src[1].arg == 0.0
    assert len(ungated.src) == 1 and len(ungated.src[0].src) == 2


def test_index_math_is_simplified(k) -> None:
    # a reshape of a contiguous buffer must index it with the plain loop variable, no divisions or remainders
    st = k.st(4, 6).reshape((24,))
    spec = get_program(k.sink(k.store(0, k.load(1, dtypes.float32, st), k.st(24))), CRenderer())
    assert not {Ops.IDIV, Ops.MOD} & set(_ops(spec))


def test_names(k) -> None:
    st = k.st(64, 32)
    a = k.sink(k.store(0, k.load(1, dtypes.float32, st) + 1.0, st))
    b = k.sink(k.store(0, k.load(1, dtypes.float32, st) * 2.0, st))
    first = get_program(a, CRenderer()).name
    assert first.startswith("E_64_32")
    assert get_program(a, CRenderer()).name == first  # the same kernel keeps its name
    second = get_program(b, CRenderer()).name
    assert second != first and second.startswith("E_64_32n")
    assert get_program(_row_sum(k, 64, 16), CRenderer()).name.startswith("r_64_16")


def test_program_spec_fields_and_estimates(k) -> None:
    spec = get_program(_row_sum(k), CRenderer())
    assert spec.device == "CPU"
    assert spec.globals == (0, 1, 2) and spec.outs == (0,) and spec.ins == (1, 2)
    assert spec.global_size == (1, 1, 1) and spec.local_size == (1, 1, 1) and spec.vars == ()
    # 8*16 accumulating adds, 8 bias adds; 8 + 128 + 8 floats moved
    assert spec.estimates.ops == 8 * 16 + 8
    assert spec.estimates.mem == (8 + 128 + 8) * 4


def test_vars_are_parameters_in_name_order(k) -> None:
    b, a = UOp.variable("b", 1, 8), UOp.variable("a", 1, 8)
    st = k.st(a, b)
    spec = get_program(k.sink(k.store(0, k.load(1, dtypes.float32, st, size=64), st, size=64)), CRenderer())
    assert [v.arg[0] for v in spec.vars] == ["a", "b"]
    assert "const int a, const int b)" in spec.src


def test_debug_levels(k, capsys) -> None:
    ast = _row_sum(k)
    with Context(DEBUG=4):
        spec = get_program(ast, CRenderer())
    out = capsys.readouterr().out
    assert spec.src.strip() in out and "UOp(" not in out
    with Context(DEBUG=5):
        get_program(ast, CRenderer())
    out = capsys.readouterr().out
    assert "UOp(Ops.SINK" in out and "DEFINE_ACC" not in out
    with Context(DEBUG=6):
        get_program(ast, CRenderer())
    assert "DEFINE_ACC" in capsys.readouterr().out
    with Context(DEBUG=0):
        get_program(ast, CRenderer())
    assert capsys.readouterr().out == ""


def test_malformed_asts(k) -> None:
    with pytest.raises(KernelASTError, match="SINK of one or more STOREs"):
        get_program(k.sink(), CRenderer())
    a = k.store(0, k.load(1, dtypes.float32, k.st(4)), k.st(4))
    b = k.store(2, k.load(3, dtypes.float32, k.st(5)), k.st(5))
    with pytest.raises(KernelASTError, match="same shape"):
        get_program(k.sink(a, b), CRenderer())
    red = k.reduce(k.load(1, dtypes.float32, k.st(4, 4)), Ops.ADD, (1,))
    with pytest.raises(KernelASTError, match="gives"):
        get_program(k.sink(k.store(0, red, k.st(4, 4))), CRenderer())


def test_unknown_ops_raise_not_implemented(k) -> None:
    st = k.st(4)
    x = k.load(1, dtypes.uint32, st)
    ast = k.sink(k.store(0, x.alu(Ops.THREEFRY, x), st))
    with pytest.raises(NotImplementedError, match="THREEFRY"):
        get_program(ast, CRenderer())
    with pytest.raises(NotImplementedError, match="THREEFRY"):
        get_program(ast, HostLLVM())


# *** LLVM IR ***


def test_llvm_ir_shape(k) -> None:
    st = k.st(16)
    x = k.load(1, dtypes.float32, st.pad(((4, 0),)).shrink(((0, 16),)), size=16)
    ast = k.sink(
        k.store(0, k.reduce(x, Ops.ADD, (0,)), k.st(1)),
        k.store(2, k.reduce(x, Ops.MAX, (0,)), k.st(1)),
    )
    src = get_program(ast, HostLLVM(), opts=[]).src
    assert "fadd reassoc contract float" in src  # the accumulation may be vectorised
    assert "@llvm.maximum.f32" in src  # NaN-propagating max, as numpy
    assert "select i1" in src  # the gated load reads a safe address when masked
    assert "alloca float" in src and "phi i32" in src


def test_llvm_bool_in_memory_is_a_byte(k) -> None:
    st = k.st(4)
    src = get_program(k.sink(k.store(0, k.load(1, dtypes.bool, st).logical_not(), st)), HostLLVM(), opts=[]).src
    assert "load i8" in src and "icmp ne i8" in src and "zext i1" in src and "store i8" in src


def test_llvm_ir_parses_for_every_dtype(k) -> None:
    llvm = pytest.importorskip("llvmlite.binding")
    st = k.st(5)
    for dt in [
        dtypes.bool,
        dtypes.int8,
        dtypes.uint16,
        dtypes.int32,
        dtypes.uint64,
        dtypes.float16,
        dtypes.bfloat16,
        dtypes.float32,
        dtypes.float64,
    ]:
        x = k.load(1, dt, st)
        value = x.maximum(x) if not dtypes.is_bool(dt) else x | x
        ast = k.sink(k.store(0, value, st), k.store(2, x.cast(dtypes.float32), st), k.store(3, x < x, st))
        llvm.parse_assembly(get_program(ast, HostLLVM()).src).verify()


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_symbolic_estimates_are_folded_and_equal_the_concrete_ones(k, rows: int) -> None:
    # a kernel over a variable number of columns: its estimates are one small expression (a jitted replay evaluates
    # them at every launch), equal for each value to the estimates of the same kernel compiled for that size
    def kernel(cols):
        # four ALU ops per element in the loop (x*x + x*3 summed), one per row after it
        x = k.load(1, dtypes.float32, k.st(rows, cols))
        bias = k.load(2, dtypes.float32, k.st(rows, 1))
        return k.sink(k.store(0, k.reduce(x * x + x * 3.0, Ops.ADD, (1,)) + bias, k.st(rows, 1)))

    n = UOp.variable("n", 1, 300)
    ops = get_program(kernel(n), CRenderer(), []).estimates.ops
    assert isinstance(ops, UOp) and len(ops.toposort) <= 6, ops.render()
    for value in (2, 17, 300):  # unoptimized on both sides: the same loops (a length-1 axis would fold away)
        assert eval_uop(ops, {n: value}) == get_program(kernel(value), CRenderer(), []).estimates.ops
