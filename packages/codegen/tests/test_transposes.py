"""Coalescing on GPUs: the offline measure of it (`memory_traffic.sector_use`, the share of the bytes in the 32-byte
sectors a warp touches that it uses) against sector counts worked out by hand from the arrays' strides, and the
default opts of GPU transposes (`heuristic._transpose_tiles`): what they make of an NCHW to channels-last copy, a
padded one and a matrix transpose by that measure on the CUDA renderer, and that random permuted and padded copies
under them compute what numpy does on an emulated GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest
from codegen_cases import run_python
from hypothesis import given, settings
from hypothesis import strategies as st_

from lazygrad_codegen import Opt, OptOps, get_program
from lazygrad_codegen.kernel_ast import load, sink, st, store, strided
from lazygrad_codegen.memory_traffic import SECTOR_BYTES, sector_use
from lazygrad_uop.dtype import dtypes, to_numpy_dtype
from lazygrad_uop.ops import Ops

py = pytest.importorskip("lazygrad_python")
GPU = py.PythonRenderer(py.GPUTarget(name="COALESCEGPU", warp_size=32))


def _copy(shape, strides, dtype=dtypes.float32, offset=0):
    """out (contiguous, `shape`) = the input read through `strides`."""
    size = max(offset + sum((s - 1) * abs(d) for s, d in zip(shape, strides, strict=True)) + 1, 1)
    return sink(store(0, load(1, dtype, strided(shape, strides, offset), size=size), st(*shape)))


def _sector_share(accesses: list[list[int]]) -> float:
    """By hand: bytes used over bytes of the sectors touched, each list the byte addresses of one buffer's accesses."""
    used = sum(len(set(a)) for a in accesses)
    return used / sum(SECTOR_BYTES * len({b // SECTOR_BYTES for b in a}) for a in accesses)


def test_a_coalesced_copy_uses_every_byte_of_its_sectors() -> None:
    spec = get_program(_copy((4096,), (1,)), GPU, [Opt(OptOps.LOCAL, 0, 32)])
    assert sector_use(spec.uops, spec.global_size, spec.local_size) == 1.0


def test_a_transpose_with_lanes_along_the_output_reads_a_sector_per_lane() -> None:
    # out[i, j] = x[j, i], float32, 32 lanes along j: the warp stores 128 neighbouring bytes and loads 4 bytes from
    # each of 32 rows 256 elements apart
    n = 256
    spec = get_program(_copy((n, n), (1, n)), GPU, [Opt(OptOps.LOCAL, 1, 32)])
    loads = [b for lane in range(32) for b in range(4 * lane * n, 4 * lane * n + 4)]
    stores = list(range(128))
    # the middle workgroup is row 128, columns 128..159 (offsets common to every lane shift no sector boundary)
    assert sector_use(spec.uops, spec.global_size, spec.local_size) == pytest.approx(_sector_share([loads, stores]))
    assert _sector_share([loads, stores]) == pytest.approx(256 / (32 * 32 + 128))


def test_accesses_whose_gate_fails_touch_nothing() -> None:
    # 40 elements padded to a workgroup of 64 lanes: the middle workgroup is the first (of one), its lanes 40..63
    # gated off; the warp's first 32 lanes all in range use whole sectors
    spec = get_program(_copy((40,), (1,)), GPU, [Opt(OptOps.PADTO, 0, 64), Opt(OptOps.LOCAL, 0, 64)])
    assert sector_use(spec.uops, spec.global_size, spec.local_size) == 1.0
    with pytest.raises(ValueError, match="must be ints"):
        from lazygrad_uop.uop import UOp

        sector_use(spec.uops, (UOp.variable("n", 1, 8), 1, 1), (32, 1, 1))


# *** the default opts of transposes ***

cuda = pytest.importorskip("lazygrad_cuda.renderer")
cores = pytest.importorskip("lazygrad_cuda.tensor_cores")
CUDA = cuda.CUDARenderer("sm_90", cores.TENSOR_CORES["sm_90"])


def _nchw_to_nhwc(n, c, h, w, pad, dtype):
    """(N, H + 2 pad, W + 2 pad, C) from an (N, C, H, W) input padded with zeros, as conv2d's channels-last copy."""
    hp, wp = h + 2 * pad, w + 2 * pad
    view = st(n, c, h, w).pad(((0, 0), (0, 0), (pad, pad), (pad, pad))).permute((0, 2, 3, 1))
    return sink(store(0, load(1, dtype, view, size=n * c * h * w), st(n, hp, wp, c)))


@pytest.mark.parametrize(
    ("shape", "pad", "dtype", "least"),
    [
        ((64, 64, 56, 56), 0, dtypes.float16, 1.0),
        ((64, 64, 56, 56), 1, dtypes.float16, 0.6),  # 58 pixels padded to 64, the row's sectors shifted by one
        ((64, 64, 56, 56), 1, dtypes.float32, 0.6),
        ((64, 512, 7, 7), 0, dtypes.float32, 0.6),
    ],
)
def test_channels_last_copies_read_and_write_whole_sectors(shape, pad, dtype, least) -> None:
    spec = get_program(_nchw_to_nhwc(*shape, pad, dtype), CUDA)
    assert sector_use(spec.uops, spec.global_size, spec.local_size) >= least
    # 256 threads a workgroup where the axes allow (as an elementwise kernel's), each warp over both axes
    assert math.prod(spec.local_size) >= 128


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.float32])
def test_matrix_transposes_read_and_write_whole_sectors(dtype) -> None:
    spec = get_program(_copy((4096, 4096), (1, 4096), dtype), CUDA)
    assert sector_use(spec.uops, spec.global_size, spec.local_size) == 1.0 and math.prod(spec.local_size) == 256
    # the lanes along the output alone, as before: a sector per lane read
    along = get_program(_copy((4096, 4096), (1, 4096), dtype), CUDA, [Opt(OptOps.LOCAL, 1, 256)])
    assert sector_use(along.uops, along.global_size, along.local_size) < 0.25


def test_a_broadcast_statistic_is_no_transpose() -> None:
    # softmax's last kernel reads each row's statistic (contiguous along the rows) broadcast along the columns: its
    # lanes stay along the columns, no tile of rows
    n = 1024
    x = load(1, dtypes.float32, st(n, n))
    m = load(2, dtypes.float32, strided((n, n), (1, 0)), size=n)
    spec = get_program(sink(store(0, x - m, st(n, n))), CUDA)
    assert not any(o.op is OptOps.UPCAST and o.axis == 0 for o in spec.opts)
    assert sector_use(spec.uops, spec.global_size, spec.local_size) >= 0.9


# *** what they compute ***


@settings(max_examples=25, deadline=None)
@given(
    shape=st_.lists(st_.integers(1, 12), min_size=2, max_size=4),
    data=st_.data(),
    dtype=st_.sampled_from([dtypes.float32, dtypes.float16]),
)
def test_permuted_and_padded_copies_match_numpy_on_an_emulated_gpu(shape, data, dtype) -> None:
    order = data.draw(st_.permutations(range(len(shape))))
    pads = [tuple(data.draw(st_.integers(0, 2)) for _ in range(2)) for _ in shape]
    view = st(*shape).pad(tuple(pads)).permute(tuple(order))
    out_shape = tuple(shape[i] + sum(pads[i]) for i in order)
    ast = sink(store(0, load(1, dtype, view, size=math.prod(shape)), st(*out_shape)))
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(to_numpy_dtype(dtype))
    want = np.pad(x, pads).transpose(order)
    spec = get_program(ast, GPU)
    assert not any(u.op is Ops.DEFINE_LOCAL for u in spec.uops)
    out, _ = run_python(ast, GPU, list(spec.opts), {1: x})
    np.testing.assert_array_equal(out[0].reshape(out_shape), want)


def test_a_lookup_gated_by_loaded_indices_leaves_those_reads_out() -> None:
    # an embedding lookup (nn.Embedding: a selection codegen lowers to one read of the table, gated by the loaded id):
    # where that read falls is data, so only the ids' loads and the stores are measured (both coalesced), and the gate
    # read from memory raises nothing
    from lazygrad import Context, Tensor
    from lazygrad.nn import Embedding
    from lazygrad_uop.registry import Device

    dev = Device["PYTHON"]
    before = dev.renderer
    dev.use_renderer(GPU)
    try:
        emb = Embedding(1000, 64)
        emb.weight = Tensor.empty(1000, 64, device="PYTHON")
        # no range check of the (never written) ids: it would be left pending for whatever reads a tensor next
        with Context(INDEX_CHECKS=0):
            (item,) = emb(Tensor.empty(4, 64, dtype=dtypes.int32, device="PYTHON")).schedule()
        spec = get_program(item.ast, GPU)
    finally:
        dev.use_renderer(before)
    gated = [u for u in spec.uops if u.op is Ops.LOAD and len(u.src[0].src) == 3]
    assert any(n.op is Ops.LOAD for u in gated for n in u.src[0].src[2].toposort), "no read gated by a loaded id"
    assert sector_use(spec.uops, spec.global_size, spec.local_size) == 1.0
