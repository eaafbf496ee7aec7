"""The default FMA tiles of matmul-like kernels on GPUs (`lazygrad_codegen.tiling`): operands that are padded
expressions stored by a kernel of their own (`WHERE(valid, LOAD, 0)`) are staged like plain loads, and the register
tile shrinks until the launch fills every compute unit (`fma_register_tile`). Checked on the PYTHON device, which
emulates the staged kernels, against torch and numpy, and on the launch sizes of the programs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from codegen_cases import check, run_python
from hypothesis import given, settings
from hypothesis import strategies as st_
from test_staging import TC_GPU, bmm, bmm_ast

from lazygrad_codegen import Kernel, Opt, OptOps, get_program, tiling
from lazygrad_codegen.kernel import AxisType
from lazygrad_codegen.kernel_ast import const, load, reduce, sink, st, store
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

py = pytest.importorskip("lazygrad_python")

RNG = np.random.default_rng(1414)


def _gpu(units: int):
    """A GPU-like PYTHON renderer (warps of 32, local memory) with `units` compute units."""
    return py.PythonRenderer(py.GPUTarget(name=f"FMA{units}", warp_size=32, compute_units=units))


@settings(max_examples=25, deadline=None)
@given(
    m=st_.sampled_from([128, 256, 512, 1024]),
    n=st_.sampled_from([128, 256, 512, 1024]),
    units=st_.integers(1, 160),
)
def test_register_tile_is_the_largest_that_fills_the_units(m: int, n: int, units: int) -> None:
    # on axes every tile divides: 8x8 outputs per thread while m*n/64 threads make 16 warps per unit, else 8x4, else
    # 4x4; where none does, the largest that makes FMA_MIN_THREADS_PER_UNIT threads per unit, else 4x4; the launch
    # has one thread per register tile of the output
    k = Kernel(bmm_ast(1, m, n, 64, dtypes.float32), _gpu(units))
    spec = get_program(k.ast, k.renderer)
    assert Opt(OptOps.STAGE) in spec.opts
    tiled = Kernel(k.ast, k.renderer).apply_opts(list(spec.opts))
    per_thread = tiled.lanes(AxisType.UPCAST)
    threads = math.prod(spec.global_size) * math.prod(spec.local_size)
    assert threads * per_thread == m * n
    want = units * tiling.FMA_WARPS_PER_UNIT * 32
    if m * n // 16 < want:  # none fills the units
        want = units * tiling.FMA_MIN_THREADS_PER_UNIT
    bigger = [t for t in (64, 32, 16) if t > per_thread]
    assert per_thread == 16 or m * n // per_thread >= want
    assert all(m * n // t < want for t in bigger)


def _conv_of_padded_expression(x_np: np.ndarray, w_np: np.ndarray, dtype, **conv: int):
    """conv2d of relu(x - mean(x) + 0.5) (not 0 at 0: the frontend pads it by a select, and it is stored by a kernel
    of its own) in `dtype`, its forward and gradients on the PYTHON device, and torch's in float64 from the same
    rounded inputs."""
    torch = pytest.importorskip("torch")
    from lazygrad import Tensor

    x, w = (Tensor(v, device="PYTHON").cast(dtype) for v in (x_np, w_np))
    x.requires_grad_()
    w.requires_grad_()
    out = ((x - x.mean((0, 2, 3), keepdim=True)) + 0.5).relu().conv2d(w, **conv)
    g_np = RNG.standard_normal(out.shape).astype(np.float32)
    dx, dw = out.gradient(x, w, gradient=Tensor(g_np, device="PYTHON").cast(dtype))
    tdt = torch.float32 if dtype == dtypes.float32 else torch.float16
    tx, tw = (torch.from_numpy(v).to(tdt).double().requires_grad_() for v in (x_np, w_np))
    t_out = torch.nn.functional.conv2d((tx - tx.mean((0, 2, 3), keepdim=True) + 0.5).relu(), tw, **conv)
    t_dx, t_dw = torch.autograd.grad(t_out, (tx, tw), torch.from_numpy(g_np).to(tdt).double())
    return (out, dx, dw), (t_out, t_dx, t_dw)


@pytest.mark.parametrize(
    ("shape", "conv", "dtype"),
    [
        ((2, 16, 5, 5), {"padding": 1}, dtypes.float32),
        ((1, 16, 7, 7), {"padding": 1, "stride": 2}, dtypes.float32),
        # tensor cores: the select sits under the cast to the accumulator's float
        ((2, 16, 5, 5), {"padding": 1}, dtypes.float16),
    ],
)
def test_padded_expression_convolution_is_staged_and_matches_torch(shape, conv, dtype) -> None:
    pytest.importorskip("lazygrad")
    from lazygrad import Tensor, engine
    from lazygrad_uop.config import Context
    from lazygrad_uop.registry import Device

    dev = Device["PYTHON"]
    before = dev.renderer
    engine._runners.clear()
    dev.use_renderer(TC_GPU)
    try:
        x_np = RNG.standard_normal(shape).astype(np.float32)
        w_np = (RNG.standard_normal((16, shape[1], 3, 3)) * 0.3).astype(np.float32)
        # read in NCHW by the direct kernels, which read the expression in place (channels-last, fp16 on tensor
        # cores, would store it padded first; the weight gradient over the window matrix would store its windows)
        with Context(CONV_CHANNELS_LAST=0, IM2COL_WEIGHT_GRADIENT=0):
            ours, torch_ = _conv_of_padded_expression(x_np, w_np, dtype, **conv)
        # the matmul-like kernels read the padded expression through its select (the expression stored on its own)
        # or stored padded (the select stored with it); either way they are staged, with no select left in their
        # inner loop
        staged = 0
        for si in Tensor.schedule(*ours):
            if si.ast.op is not Ops.SINK:
                continue
            k = Kernel(si.ast, TC_GPU)
            if tiling.staged_matmul(k):
                staged += 1
                k = tiling.without_padding_selects(k)
                assert k.staged and not any(u.op is Ops.WHERE for r in k.reduceops for u in r.src[0].toposort)
        assert staged >= 1
        tol = 1e-4 if dtype == dtypes.float32 else 2e-2
        for got, want in zip(ours, torch_, strict=True):
            want_np = want.detach().numpy()
            np.testing.assert_allclose(
                got.cast(dtypes.float32).numpy(), want_np, rtol=tol, atol=tol * np.abs(want_np).max()
            )
    finally:
        dev.use_renderer(before)
        engine._runners.clear()


def test_padded_load_select_is_dropped_only_where_it_selects_the_loads_own_validity() -> None:
    # WHERE(valid, LOAD, 0) with `valid` the load's own mask: the same values as the load; with another mask (here
    # the load is valid everywhere), the select stays. The first is staged by default, and BEAM's staged tiles of the
    # kernel with its select (`staged_tiles`: the select then runs on the staged values) compute the same
    rows, cols, n = 64, 20, 64
    padded = st(rows, cols).pad(((0, 0), (2, 2)))
    full = (rows, n, cols + 4)
    a = load(1, dtypes.float32, padded.reshape((rows, 1, cols + 4)).expand(full), size=rows * cols)
    b = load(2, dtypes.float32, st(1, n, cols + 4).expand(full))

    def valid(view) -> UOp:
        return UOp(Ops.CONST, dtypes.bool, (UOp(Ops.VIEW, arg=view),), True)

    zero = const(0.0, dtypes.float32, st(1, 1, 1).expand(full))
    mask = padded.reshape((rows, 1, cols + 4)).expand(full)
    same = sink(store(0, reduce(valid(mask).where(a, zero) * b, Ops.ADD, (2,)), st(rows, n, 1)))
    other_mask = st(rows, cols).pad(((0, 0), (1, 3))).reshape((rows, 1, cols + 4)).expand(full)
    other = sink(store(0, reduce(valid(other_mask).where(a, zero) * b, Ops.ADD, (2,)), st(rows, n, 1)))
    k_same, k_other = Kernel(same, TC_GPU), Kernel(other, TC_GPU)
    stripped = tiling.without_padding_selects(k_same)
    assert stripped is not k_same and not any(u.op is Ops.WHERE for u in stripped.ast.toposort)
    assert tiling.without_padding_selects(k_other) is k_other
    # numpy from the same inputs
    x, y = RNG.standard_normal((rows, cols)).astype(np.float32), RNG.standard_normal((n, cols + 4)).astype(np.float32)
    xp = np.pad(x, ((0, 0), (2, 2)))
    keep = np.zeros(cols + 4, bool)
    keep[1 : cols + 1] = True
    tiles = tiling.staged_tiles(k_same)
    assert tiles and not tiling.staged_tiles(k_other)
    for opts in (None, tiles[0].applied_opts, tiles[-1].applied_opts):
        out, spec = run_python(same, TC_GPU, opts, {1: x, 2: y})
        assert Opt(OptOps.STAGE) in spec.opts
        np.testing.assert_allclose(out[0].reshape(rows, n), xp @ y.T, rtol=1e-5, atol=1e-5)
    # the other select is no padded load: not staged, still right
    out, _ = run_python(other, TC_GPU, None, {1: x, 2: y})
    np.testing.assert_allclose(out[0].reshape(rows, n), (xp * keep) @ y.T, rtol=1e-5, atol=1e-5)


def test_small_fp32_matmul_spreads_over_the_units() -> None:
    # 256x256 on 32 units: no tile makes 16 warps per unit; 8x8 would make 32 threads per unit, 8x4 twice as many
    case = bmm(1, 256, 256, 32, dtypes.float32)
    out, spec = run_python(case.ast, _gpu(32), None, case.inputs)
    check(case, out, str(spec.opts))
    assert Opt(OptOps.STAGE) in spec.opts
    assert math.prod(spec.global_size) * math.prod(spec.local_size) == 256 * 256 // 32
