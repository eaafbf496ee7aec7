"""The LLVM renderer's based addresses (`LLVMRenderer.based_addresses`, on for the CPU): an element `base + c` of a
buffer is a constant offset from one pointer per (buffer, base). Kernels reading strided, permuted and padded views,
with their lanes upcast and their reductions unrolled, run on the CPU against numpy and against the same kernel
rendered with an index per load."""

from __future__ import annotations

import re

import numpy as np
import pytest
from codegen_cases import cpu_device, run_device, transpose_pad
from hypothesis import given, settings
from hypothesis import strategies as hs

from lazygrad_codegen import KernelOptError, LLVMRenderer, Opt, OptOps, get_program
from lazygrad_codegen.kernel_ast import load, reduce, sink, st, store, strided
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops


def _renderers():
    device = cpu_device()
    based, indexed = type(device.renderer)(), type(device.renderer)()
    indexed.based_addresses = False
    assert based.based_addresses
    return device, based, indexed


def _view_of(flat: np.ndarray, shape, strides, offset, pad):
    """numpy's reading of the strided view (element strides) of `flat`, then zero padding."""
    itemsize = flat.itemsize
    view = np.lib.stride_tricks.as_strided(flat[offset:], shape, tuple(s * itemsize for s in strides))
    return np.pad(view, pad)


@settings(max_examples=25, deadline=None)
@given(
    rows=hs.integers(1, 9),
    cols=hs.integers(1, 19),
    strides=hs.tuples(hs.integers(0, 40), hs.integers(1, 5)),
    offset=hs.integers(0, 7),
    pad=hs.tuples(hs.integers(0, 2), hs.integers(0, 2), hs.integers(0, 3), hs.integers(0, 3)),
    transpose=hs.booleans(),
    reduce_cols=hs.booleans(),
    upcast=hs.sampled_from([0, 2, 4, 8, 16]),
    unroll=hs.sampled_from([0, 2, 4]),
)
def test_strided_padded_views_match_numpy(rows, cols, strides, offset, pad, transpose, reduce_cols, upcast, unroll):
    size = offset + (rows - 1) * strides[0] + (cols - 1) * strides[1] + 1
    flat = np.random.default_rng(rows * 31 + cols).standard_normal(size).astype(np.float32)
    pads = ((pad[0], pad[1]), (pad[2], pad[3]))
    view = strided((rows, cols), strides, offset).pad(pads)
    want = _view_of(flat, (rows, cols), strides, offset, pads)
    if transpose:
        view, want = view.permute((1, 0)), want.T
    out_rows, out_cols = want.shape
    value = load(1, dtypes.float32, view, size=size) * 2
    if reduce_cols:
        ast = sink(store(0, reduce(value, Ops.ADD, (1,)), st(out_rows, 1)))
        want = (want.astype(np.float64) * 2).sum(axis=1)
    else:
        ast = sink(store(0, value, st(out_rows, out_cols)))
        want = want.reshape(-1) * 2
    opts = []
    if upcast and out_rows % upcast == 0:
        opts.append(Opt(OptOps.UPCAST, 0, upcast))
    if unroll and reduce_cols and out_cols % unroll == 0:
        opts.append(Opt(OptOps.UNROLL, 0, unroll))
    device, based, indexed = _renderers()
    try:
        got, spec = run_device(ast, device, opts, {1: flat}, renderer=based)
    except KernelOptError:
        opts = []
        got, spec = run_device(ast, device, opts, {1: flat}, renderer=based)
    plain, _ = run_device(ast, device, opts, {1: flat}, renderer=indexed)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5, err_msg=spec.src)
    # the same numbers, bit for bit, as a load of the element at each index
    np.testing.assert_array_equal(got[0], plain[0])


def test_lanes_of_a_strided_view_are_offsets_from_one_pointer() -> None:
    # a transpose upcast by 8: every lane reads `base + row * 12`; the IR has one pointer to element `base` and
    # eight constant offsets from it, no add per lane
    rows, cols = 16, 12
    a = np.random.default_rng(3).standard_normal((rows, cols)).astype(np.float32)
    ast = sink(store(0, load(1, dtypes.float32, st(rows, cols).permute((1, 0))) * 2, st(cols, rows)))
    device, based, indexed = _renderers()
    opts = [Opt(OptOps.UPCAST, 1, 8)]
    got, spec = run_device(ast, device, opts, {1: a}, renderer=based)
    np.testing.assert_array_equal(got[0], (a.T * 2).reshape(-1))
    offsets = re.findall(r"getelementptr float, ptr %v\d+, i64 (\d+)", spec.src)
    assert sorted(int(o) for o in offsets) == [cols * k for k in range(1, 8)]
    assert len(re.findall(r"getelementptr float, ptr %data1, i32", spec.src)) == 1
    plain = get_program(ast, indexed, opts).src
    assert "getelementptr float, ptr %v" not in plain and len(re.findall(r"add nsw i32 %v\d+, 12\b", plain)) == 1


def test_gated_vectors_keep_their_indexes() -> None:
    # a padded transpose: the lanes of a vector with gated loads stay indexes from the buffer (LLVM's SLP vectoriser
    # makes a masked gather of those); the numbers are numpy's
    case = transpose_pad()
    device, based, _ = _renderers()
    got, spec = run_device(case.ast, device, [Opt(OptOps.UPCAST, 1, 8)], case.inputs, renderer=based)
    np.testing.assert_array_equal(got[0], case.expected[0].astype(np.float32))
    assert re.search(r"select i1 %v\d+, i32 %v\d+, i32 0", spec.src)
    assert not re.search(r"getelementptr float, ptr %data1, i32", spec.src)


@pytest.mark.parametrize("step", [2, 3])
def test_int64_indexes_address_from_a_base_too(step: int) -> None:
    # a view whose reach passes int32 is indexed in int64: the base pointer takes the i64 index, and LLVM accepts
    # the IR (compiled, not run: the buffer would be gigabytes)
    view = strided((4, 8), (2**31, step))
    ast = sink(store(0, load(1, dtypes.float32, view), st(4, 8)))
    _, based, _ = _renderers()
    spec = get_program(ast, based, [Opt(OptOps.UPCAST, 1, 8)])
    assert re.search(r"getelementptr float, ptr %data1, i64 %", spec.src)
    assert cpu_device().compiler.compile(spec.src)


def test_other_llvm_targets_index_every_load() -> None:
    # the setting is the CPU's: the renderer family's default (AMDGPU's) keeps an index per load
    assert not LLVMRenderer.based_addresses
    rows, cols = 16, 12
    ast = sink(store(0, load(1, dtypes.float32, st(rows, cols).permute((1, 0))), st(cols, rows)))
    src = get_program(ast, LLVMRenderer(), [Opt(OptOps.UPCAST, 1, 8)]).src
    assert "getelementptr float, ptr %v" not in src
