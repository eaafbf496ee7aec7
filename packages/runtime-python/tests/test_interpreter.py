"""Hand-built linear programs (in the format of packages/codegen/CONTRACT.md) run by the interpreter, checked
against numpy: elementwise kernels, loops and accumulators, gated memory access, variables, vectors, and warps of
threads with local memory and barriers."""

from __future__ import annotations

import numpy as np
import pytest
from pyinterp_helpers import compile_program, const, elementwise, end, glob, index, load, program, rng, run, store

from lazygrad_python import Interpreter, InterpreterError, parse_program, render_program
from lazygrad_python.tensor_cores import TensorCoreLayoutError
from lazygrad_uop import Ops, UOp, dtypes

RNG = np.random.default_rng(0)


def i32(v: int) -> UOp:
    return const(dtypes.int32, v)


def test_elementwise_add_rounds_to_float32() -> None:
    a, b = RNG.standard_normal(64).astype(np.float32), RNG.standard_normal(64).astype(np.float32)
    (out, _, _) = run(elementwise(Ops.ADD, dtypes.float32, [dtypes.float32] * 2, 64), np.zeros(64, np.float32), a, b)
    np.testing.assert_array_equal(out, a + b)


def test_nested_loops_with_strided_index_transpose() -> None:
    x = RNG.standard_normal((5, 7)).astype(np.float32)
    out, inp = glob(0, dtypes.float32, 35), glob(1, dtypes.float32, 35)
    r0, r1 = rng(5, 0), rng(7, 1)
    body = store(out, r1 * 5 + r0, load(inp, r0 * 7 + r1))
    (res, _) = run(program(r0, r1, body, end(r1), end(r0)), np.zeros(35, np.float32), x.ravel())
    np.testing.assert_array_equal(res.reshape(7, 5), x.T)


def test_reduce_with_accumulator_per_row() -> None:
    x = RNG.standard_normal((6, 9)).astype(np.float32)
    out, inp = glob(0, dtypes.float32, 6), glob(1, dtypes.float32, 54)
    r0, r1 = rng(6, 0), rng(9, 1)
    acc = UOp(Ops.DEFINE_ACC, dtypes.float32, (const(dtypes.float32, 0.0), r1), arg=(0,))
    upd = UOp(Ops.ASSIGN, dtypes.float32, (acc, acc + load(inp, r0 * 9 + r1)))
    uops = program(r0, acc, r1, upd, end(r1), store(out, r0, upd), end(r0))
    # the accumulator is declared inside the row loop and before the reduce loop: reset once per row
    assert uops.index(r0) < uops.index(acc) < uops.index(r1)
    (res, _) = run(uops, np.zeros(6, np.float32), x.ravel())
    ref = np.zeros(6, np.float32)
    for j in range(9):  # the same order of float32 additions
        ref = ref + x[:, j]
    np.testing.assert_array_equal(res, ref)


def test_matmul_with_max_accumulator_and_variable_size() -> None:
    n = UOp.variable("n", 1, 8)
    a = RNG.standard_normal((4, 8)).astype(np.float32)
    b = RNG.standard_normal((8, 3)).astype(np.float32)
    out, ga, gb = glob(0, dtypes.float32, 12), glob(1, dtypes.float32, 32), glob(2, dtypes.float32, 24)
    ri, rj, rk = rng(4, 0), rng(3, 1), UOp.range(n, 2)
    acc = UOp(Ops.DEFINE_ACC, dtypes.float32, (const(dtypes.float32, 0.0), rk), arg=(0,))
    mx = UOp(Ops.DEFINE_ACC, dtypes.float32, (const(dtypes.float32, -np.inf), rk), arg=(1,))
    prod = load(ga, ri * 8 + rk) * load(gb, rk * 3 + rj)
    upd = UOp(Ops.ASSIGN, dtypes.float32, (acc, acc + prod))
    upd_mx = UOp(Ops.ASSIGN, dtypes.float32, (mx, mx.maximum(prod)))
    both = store(out, ri * 3 + rj, upd + upd_mx)
    uops = program(n, ri, rj, acc, mx, rk, upd, upd_mx, end(rk), both, end(rj), end(ri))
    prg = compile_program(uops)
    for k in (8, 5, 1):
        (res, _, _) = run(prg, np.zeros(12, np.float32), a.ravel(), b.ravel(), vals=(k,))
        terms = a[:, None, :k] * b.T[None, :, :k]
        ref = np.zeros((4, 3), np.float32)
        for t in range(k):
            ref = ref + terms[..., t]
        np.testing.assert_array_equal(res.reshape(4, 3), ref + terms.max(-1))
    with pytest.raises(ValueError, match="outside its bounds"):
        run(prg, np.zeros(12, np.float32), a.ravel(), b.ravel(), vals=(9,))


def test_zero_trip_loop_leaves_the_accumulator_at_its_initial_value() -> None:
    n = UOp.variable("n", 0, 4)
    out, inp = glob(0, dtypes.int32, 1), glob(1, dtypes.int32, 4)
    r = UOp.range(n, 0)
    acc = UOp(Ops.DEFINE_ACC, dtypes.int32, (i32(7), r), arg=(0,))
    upd = UOp(Ops.ASSIGN, dtypes.int32, (acc, acc + load(inp, r)))
    uops = program(n, acc, r, upd, end(r), store(out, i32(0), upd))
    data = np.array([1, 2, 3, 4], np.int32)
    assert run(uops, np.zeros(1, np.int32), data, vals=(0,))[0][0] == 7
    assert run(uops, np.zeros(1, np.int32), data, vals=(3,))[0][0] == 13


def test_gated_load_store_and_index_valid_pad_and_shift() -> None:
    # out[i] = in[i-2] for 2 <= i < 10 (else -1 from the gated load's alt); only even i are stored, plus a padded
    # read through INDEX valid, which loads 0 when invalid
    x = np.arange(1, 9, dtype=np.int32)
    out, pad, inp = glob(0, dtypes.int32, 12), glob(1, dtypes.int32, 12), glob(2, dtypes.int32, 8)
    r = rng(12)
    inside = (r < 10).alu(Ops.AND, (r < 2).logical_not())
    shifted = UOp(Ops.LOAD, dtypes.int32, (index(inp, r - 2), i32(-1), inside))
    even = (r % 2).ne(1)
    padded = UOp(Ops.LOAD, dtypes.int32, (index(inp, r - 2, inside),))
    uops = program(r, store(out, r, shifted, even), store(pad, r, padded), end(r))
    res, padres, _ = run(uops, np.full(12, 99, np.int32), np.full(12, 99, np.int32), x)
    ref = np.full(12, 99, np.int32)
    ref[0] = -1
    ref[2:10:2] = x[0:8:2]
    ref[10] = -1
    np.testing.assert_array_equal(res, ref)
    np.testing.assert_array_equal(padres, np.concatenate([[0, 0], x, [0, 0]]))


def test_store_through_invalid_index_is_skipped() -> None:
    out = glob(0, dtypes.float32, 4)
    r = rng(8)
    uops = program(r, UOp(Ops.STORE, dtypes.void, (index(out, r, r < 4), r.cast(dtypes.float32))), end(r))
    np.testing.assert_array_equal(run(uops, np.full(4, -1, np.float32))[0], [0, 1, 2, 3])


def test_if_endif_skips_the_block() -> None:
    out = glob(0, dtypes.int32, 6)
    r = rng(6)
    gate = UOp(Ops.IF, dtypes.void, ((r % 3).ne(0),))
    st = store(out, r, r * r)
    uops = program(r, gate, st, UOp(Ops.ENDIF, dtypes.void, (gate,)), end(r))
    np.testing.assert_array_equal(run(uops, np.full(6, -1, np.int32))[0], [-1, 1, 4, -1, 16, 25])


def test_vectorize_gep_and_vector_loads_and_stores() -> None:
    x = RNG.standard_normal(8).astype(np.float32)
    out, inp = glob(0, dtypes.float32, 8), glob(1, dtypes.float32, 8)
    r = rng(2)
    base = r * 4
    vec = load(inp, base, dtypes.float32.vec(4))
    rev = UOp(Ops.GEP, dtypes.float32.vec(4), (vec,), arg=(3, 2, 1, 0))
    doubled = rev + rev
    lane0 = UOp(Ops.GEP, dtypes.float32, (doubled,), arg=(0,))
    again = UOp(
        Ops.VECTORIZE,
        dtypes.float32.vec(4),
        tuple(UOp(Ops.GEP, dtypes.float32, (doubled,), arg=(k,)) for k in range(4)),
    )
    summed = again + UOp(Ops.VECTORIZE, dtypes.float32.vec(4), (lane0,) * 4)
    (res, _) = run(program(r, store(out, base, summed), end(r)), np.zeros(8, np.float32), x)
    ref = np.concatenate([2 * x[3::-1] + 2 * x[3], 2 * x[7:3:-1] + 2 * x[7]])
    np.testing.assert_array_equal(res, ref)


# *** warps: SPECIAL thread indices, local memory, barriers ***


@pytest.mark.parametrize("warp_size", [32, 4, 3, 1])
def test_workgroups_reverse_tiles_through_local_memory(warp_size: int) -> None:
    # 3 workgroups of 16 threads; each writes its element to local memory, waits at the barrier, then reads the
    # element of its mirror thread: a tile reversal that needs every warp's writes before any read
    tile, groups = 16, 3
    x = np.arange(tile * groups, dtype=np.float32) * 1.5
    out, inp = glob(0, dtypes.float32, tile * groups), glob(1, dtypes.float32, tile * groups)
    gid, lid = UOp.special(groups, "gidx0"), UOp.special(tile, "lidx0")
    lmem = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(tile, local=True), arg="temp")
    put = store(lmem, lid, load(inp, gid * tile + lid))
    barrier = UOp(Ops.BARRIER, dtypes.void, (put,))
    got = UOp(Ops.LOAD, dtypes.float32, (index(lmem, (tile - 1) - lid), barrier))
    uops = program(out, inp, lmem, gid, lid, put, barrier, store(out, gid * tile + lid, got))
    prg = Interpreter(parse_program(render_program(uops)), warp_size=warp_size)
    bufs = [memoryview(bytearray(tile * groups * 4)), memoryview(bytearray(x.tobytes()))]
    prg(bufs, global_size=(groups, 1, 1), local_size=(tile, 1, 1))
    np.testing.assert_array_equal(np.frombuffer(bytes(bufs[0]), np.float32), x.reshape(groups, tile)[:, ::-1].ravel())


def test_two_dimensional_specials_number_threads_x_fastest() -> None:
    out = glob(0, dtypes.int32, 2 * 3 * 4)
    gx, lx, ly = UOp.special(2, "gidx0"), UOp.special(3, "lidx0"), UOp.special(4, "lidx1")
    uops = program(store(out, gx * 12 + ly * 3 + lx, gx * 100 + ly * 10 + lx))
    prg = Interpreter(parse_program(render_program(uops)), warp_size=5)
    buf = memoryview(bytearray(24 * 4))
    prg([buf], global_size=(2, 1, 1), local_size=(3, 4, 1))
    ref = [g * 100 + y * 10 + x for g in range(2) for y in range(4) for x in range(3)]
    assert np.frombuffer(bytes(buf), np.int32).tolist() == ref


def test_divergent_loop_and_if_inside_a_warp() -> None:
    # thread t sums 0..t-1 (a trip count that differs per thread), only odd threads store
    out = glob(0, dtypes.int32, 8)
    lid = UOp.special(8, "lidx0")
    r = UOp.range(lid, 0)
    acc = UOp(Ops.DEFINE_ACC, dtypes.int32, (i32(0), r), arg=(0,))
    upd = UOp(Ops.ASSIGN, dtypes.int32, (acc, acc + r))
    gate = UOp(Ops.IF, dtypes.void, ((lid % 2).ne(0),))
    uops = program(acc, r, upd, end(r), gate, store(out, lid, upd), UOp(Ops.ENDIF, dtypes.void, (gate,)))
    (res,) = run(uops, np.full(8, -1, np.int32), local_size=(8, 1, 1))
    np.testing.assert_array_equal(res, [-1 if t % 2 == 0 else t * (t - 1) // 2 for t in range(8)])


def test_a_barrier_not_every_warp_reaches_is_an_error() -> None:
    lid = UOp.special(8, "lidx0")
    gate = UOp(Ops.IF, dtypes.void, (lid < 4,))
    barrier = UOp(Ops.BARRIER, dtypes.void, ())
    uops = program(gate, barrier, UOp(Ops.ENDIF, dtypes.void, (gate,)))
    prg = Interpreter(parse_program(render_program(uops)), warp_size=4)
    with pytest.raises(InterpreterError, match="BARRIER was reached by 1 of the 2"):
        prg([], local_size=(8, 1, 1))


def test_special_size_must_match_the_launch() -> None:
    out = glob(0, dtypes.int32, 4)
    uops = program(store(out, UOp.special(4, "gidx0"), i32(1)))
    with pytest.raises(ValueError, match="gidx0 has size 4 but the launch has 2"):
        run(uops, np.zeros(4, np.int32), global_size=(2, 1, 1))


# *** errors ***


def test_out_of_bounds_access_names_the_instruction() -> None:
    out = glob(0, dtypes.float32, 4)
    r = rng(5)
    with pytest.raises(InterpreterError, match=r"instruction \d+ \(STORE"):
        run(program(r, store(out, r, const(dtypes.float32, 1.0)), end(r)), np.zeros(4, np.float32))
    r2 = rng(2)
    with pytest.raises(InterpreterError, match="negative element index -1"):
        run(program(r2, store(out, r2, load(out, r2 - 1)), end(r2)), np.zeros(4, np.float32))


def test_malformed_wmma_and_unknown_specials() -> None:
    # WMMA itself is emulated from its layout (test_tensor_cores.py); an arg without one is refused up front
    a = const(dtypes.half.vec(2), (1.0, 2.0))
    wmma = UOp(Ops.WMMA, dtypes.float.vec(2), (a, a, const(dtypes.float.vec(2), (0.0, 0.0))), arg=("WMMA_x", (1, 1, 1)))
    with pytest.raises(TensorCoreLayoutError, match="a WMMA arg is"):
        compile_program(program(wmma))
    with pytest.raises(NotImplementedError, match="gidx0-2 and lidx0-2"):
        compile_program(program(store(glob(0, dtypes.int32, 1), UOp.special(1, "idx0"), i32(0))))


def test_wrong_number_of_buffers_or_values() -> None:
    prg = compile_program(elementwise(Ops.NEG, dtypes.int32, [dtypes.int32], 4))
    with pytest.raises(ValueError, match="takes 2 buffers, got 1"):
        prg(memoryview(bytearray(16)))
    with pytest.raises(ValueError, match="takes 0 variable values, got 1"):
        prg(memoryview(bytearray(16)), memoryview(bytearray(16)), vals=(3,))


def test_asynchronous_copies_land_at_the_wait_with_zeros_where_invalid() -> None:
    # 8 threads each start copying a float2 of the input into local memory (threads 6 and 7 with an invalid source,
    # which fills zeros); a read before ASYNC_WAIT still sees what was there (the initial zeros of local memory,
    # plus 7 written by a plain store), a read after the wait and a barrier sees the copied values
    n = 8
    x = np.arange(2 * n, dtype=np.float32) + 1
    out, inp = glob(0, dtypes.float32, 4 * n), glob(1, dtypes.float32, 2 * n)
    lid = UOp.special(n, "lidx0")
    lmem = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(2 * n, local=True), arg="stage")
    marked = store(lmem, lid * 2 + 1, UOp.const(dtypes.float32, 7.0))
    src = UOp(Ops.INDEX, inp.dtype, (inp, lid * 2, lid < 6))
    copy = UOp(Ops.ASYNC_COPY, dtypes.void, (index(lmem, lid * 2), src, marked), arg=2)
    before = UOp(Ops.LOAD, dtypes.float32, (index(lmem, lid * 2 + 1), copy))
    early = store(out, lid, before)
    wait = UOp(Ops.ASYNC_WAIT, dtypes.void, (copy, early))
    barrier = UOp(Ops.BARRIER, dtypes.void, (wait,))
    after = [UOp(Ops.LOAD, dtypes.float32, (index(lmem, ((n - 1) - lid) * 2 + k), barrier)) for k in range(2)]
    late = [store(out, n + lid * 2 + k, a) for k, a in enumerate(after)]
    uops = program(out, inp, lmem, lid, marked, copy, early, wait, barrier, *late)
    got = run(uops, np.zeros(4 * n, np.float32), x, local_size=(n, 1, 1))[0]
    np.testing.assert_array_equal(got[:n], np.full(n, 7.0))
    landed = np.where(np.repeat(np.arange(n) < 6, 2), x, 0).reshape(n, 2)[::-1].ravel()
    np.testing.assert_array_equal(got[n : 3 * n], landed)


def test_a_wait_lands_all_but_the_latest_groups_it_leaves_in_flight() -> None:
    # each thread copies A (one float) then B into local memory, a wait after each leaving one group in flight, then
    # a wait for all: after the first wait neither has landed, after the second A has and B not, after the third both
    n = 4
    x = np.arange(2 * n, dtype=np.float32) + 1
    out, inp = glob(0, dtypes.float32, 5 * n), glob(1, dtypes.float32, 2 * n)
    lid = UOp.special(n, "lidx0")
    lmem = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(2 * n, local=True), arg="stage")

    def copy(part: int, *deps: UOp) -> UOp:
        src = UOp(Ops.INDEX, inp.dtype, (inp, lid + part * n, UOp.const(dtypes.bool, True)))
        return UOp(Ops.ASYNC_COPY, dtypes.void, (index(lmem, lid + part * n), src, *deps), arg=1)

    def read(part: int, dep: UOp, slot: int) -> UOp:
        return store(out, lid + slot * n, UOp(Ops.LOAD, dtypes.float32, (index(lmem, lid + part * n), dep)))

    copy_a = copy(0)
    wait1 = UOp(Ops.ASYNC_WAIT, dtypes.void, (copy_a,), arg=1)
    a1 = read(0, wait1, 0)
    copy_b = copy(1, a1)
    wait2 = UOp(Ops.ASYNC_WAIT, dtypes.void, (copy_b,), arg=1)
    a2, b2 = read(0, wait2, 1), read(1, wait2, 2)
    wait3 = UOp(Ops.ASYNC_WAIT, dtypes.void, (a2, b2))
    a3, b3 = read(0, wait3, 3), read(1, wait3, 4)
    uops = program(out, inp, lmem, lid, copy_a, wait1, a1, copy_b, wait2, a2, b2, wait3, a3, b3)
    got = run(uops, np.full(5 * n, -1, np.float32), x, local_size=(n, 1, 1))[0].reshape(5, n)
    zeros = np.zeros(n, np.float32)
    for row, want in enumerate([zeros, x[:n], zeros, x[:n], x[n:]]):
        np.testing.assert_array_equal(got[row], want)


@pytest.mark.parametrize(("matrices", "trans"), [(4, False), (4, True), (2, True), (1, False)])
def test_ldmatrix_hands_each_lane_the_ptx_fragment_of_rows_at_addresses_the_threads_give(matrices, trans) -> None:
    # local memory holds 64 rows of 8 halves at a padded stride of 16 (512 halves); thread t gives the address of
    # row t % 8 of matrix t // 8, read from a table of shuffled rows; per the PTX ISA, lane l then holds elements
    # (l // 4, 2 (l % 4)) and (l // 4, 2 (l % 4) + 1) of each matrix, or of its transpose with .trans
    n, size = 32, 512
    x = RNG.permutation(size).astype(np.float16)  # distinct integers, exact in fp16
    rows = RNG.permutation(size // 16)[:n].astype(np.int32) * 16 + RNG.integers(0, 2, n).astype(np.int32) * 8
    out, inp, table = glob(0, dtypes.float16, 2 * matrices * n), glob(1, dtypes.float16, size), glob(2, dtypes.int32, n)
    lid = UOp.special(n, "lidx0")
    lmem = UOp(Ops.DEFINE_LOCAL, dtypes.float16.ptr(size, local=True), arg="tile")
    fills = [store(lmem, lid + k * n, load(inp, lid + k * n)) for k in range(size // n)]
    barrier = UOp(Ops.BARRIER, dtypes.void, tuple(fills))
    address = load(table, lid)
    frag = UOp(Ops.LDMATRIX, dtypes.float16.vec(2 * matrices), (index(lmem, address), barrier), (matrices, trans))
    outs = [
        store(out, lid * 2 * matrices + j, UOp(Ops.GEP, dtypes.float16, (frag,), (j,))) for j in range(2 * matrices)
    ]
    uops = program(out, inp, table, lmem, lid, *fills, barrier, address, frag, *outs)
    got = run(uops, np.zeros(2 * matrices * n, np.float16), x, rows, local_size=(n, 1, 1))[0].reshape(n, matrices, 2)
    for i in range(matrices):
        mat = np.stack([x[rows[8 * i + r] : rows[8 * i + r] + 8] for r in range(8)])
        if trans:
            mat = mat.T
        for lane in range(n):
            np.testing.assert_array_equal(got[lane, i], mat[lane // 4, 2 * (lane % 4) : 2 * (lane % 4) + 2])


def _ldmatrix_program(n: int, row: int) -> list[UOp]:
    # n threads, thread t giving row address t * row + 4 ... or t * row: 4 elements past alignment when `row` is odd
    inp, out = glob(1, dtypes.float16, 256), glob(0, dtypes.float16, 8 * n)
    lid = UOp.special(n, "lidx0")
    lmem = UOp(Ops.DEFINE_LOCAL, dtypes.float16.ptr(512, local=True), arg="tile")
    frag = UOp(Ops.LDMATRIX, dtypes.float16.vec(8), (index(lmem, lid * 8 + 4 * (row % 2)),), (4, False))
    outs = [store(out, lid * 8 + j, UOp(Ops.GEP, dtypes.float16, (frag,), (j,))) for j in range(8)]
    return program(out, inp, lmem, lid, frag, *outs)


def test_ldmatrix_refuses_unaligned_rows_and_partial_warps() -> None:
    with pytest.raises(InterpreterError, match="16-byte aligned"):
        run(_ldmatrix_program(32, 1), np.zeros(256, np.float16), np.zeros(256, np.float16), local_size=(32, 1, 1))
    with pytest.raises(InterpreterError, match="partial warp"):
        run(_ldmatrix_program(16, 0), np.zeros(128, np.float16), np.zeros(256, np.float16), local_size=(16, 1, 1))
    # aligned rows in a full warp run
    run(_ldmatrix_program(32, 0), np.zeros(256, np.float16), np.zeros(256, np.float16), local_size=(32, 1, 1))
