"""The Kernel view and each OptOp: what it does to the kernel's axes, and the specific error when it does not fit the
kernel or the renderer's limits (register budget, local sizes, threads per workgroup, shared memory)."""

from __future__ import annotations

import pytest
from codegen_cases import column_sum, conv2d, elementwise, full_sum_and_max, load, matmul, reduce, row_reduce, sink, st
from codegen_cases import store as store_

from lazygrad_codegen import AxisType, CRenderer, Kernel, KernelASTError, KernelOptError, LLVMRenderer, Opt, OptOps
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp

U, R, L, G, GT, P, S, N, TC = (
    OptOps.UPCAST,
    OptOps.UNROLL,
    OptOps.LOCAL,
    OptOps.GROUP,
    OptOps.GROUPTOP,
    OptOps.PADTO,
    OptOps.SWAP,
    OptOps.NOLOCALS,
    OptOps.TC,
)


class GPU(CRenderer):
    """Limits of a small GPU, for checking opts (kernels are not rendered)."""

    device = "TESTGPU"
    has_local = True
    has_shared = True
    local_max = (16, 16, 16)
    max_workgroup_threads = 64
    shared_max = 1024
    max_upcast = 32


def test_kernel_view_drops_size_one_axes_sorts_and_merges() -> None:
    x = load(1, dtypes.float32, st(4, 1, 8, 6))
    red = reduce(x, Ops.ADD, (0,))
    k = Kernel(sink(store_(0, red, st(1, 1, 8, 6))), CRenderer())
    # the output axes first (8 and 6 merged into 48: contiguous in every view), then the reduce axis
    assert k.full_shape == (48, 4)
    assert k.axis_types == [AxisType.GLOBAL, AxisType.REDUCE]
    assert k.colored_shape() == "48g 4r"


def test_upcast_unroll_local_group_shapes() -> None:
    k = Kernel(matmul(16, 24, 32).ast, GPU())
    assert k.colored_shape() == "16g 24g 32r"
    k.apply_opt(Opt(U, 1, 4))
    assert k.colored_shape() == "16g 6g 4u 32r"
    k.apply_opt(Opt(L, 0, 4))
    assert k.colored_shape() == "4g 6g 4l 4u 32r"
    k.apply_opt(Opt(GT, 0, 8))
    assert k.colored_shape() == "4g 6g 4l 4u 8G 4r"
    k.apply_opt(Opt(R, 0, 2))
    assert k.colored_shape() == "4g 6g 4l 4u 8G 2r 2ur"
    assert k.applied_opts == [Opt(U, 1, 4), Opt(L, 0, 4), Opt(GT, 0, 8), Opt(R, 0, 2)]


def test_whole_axis_amounts_and_swap() -> None:
    k = Kernel(matmul(16, 24, 8).ast, CRenderer())
    k.apply_opt(Opt(R, 0, 0))  # the whole reduce axis unrolled: no reduce loop left
    assert k.colored_shape() == "16g 24g 8ur"
    k.apply_opt(Opt(S, 0, 1))
    assert k.colored_shape() == "24g 16g 8ur"
    k.apply_opt(Opt(U, 0, 0))
    assert k.colored_shape() == "16g 24u 8ur"


def test_padto_masks_a_global_axis() -> None:
    k = Kernel(elementwise(90).ast, CRenderer())
    k.apply_opt(Opt(P, 0, 32))
    assert k.full_shape == (96,)
    assert all(st.views[-1].mask is not None for st in k.views.values())


@pytest.mark.parametrize(
    ("opt", "message"),
    [
        (Opt(U, 5, 2), "UPCAST axis 5 does not exist"),
        (Opt(U, 0, 5), "does not divide the axis size"),
        (Opt(U, 0, 1), "changes nothing"),
        (Opt(U, 0, -2), "non-negative int"),
        (Opt(R, 1, 2), "UNROLL axis 1 does not exist"),
        (Opt(L, 0, 2), "needs local dimensions"),
        (Opt(G, 0, 2), "needs local dimensions"),
        (Opt(N), "no local dimensions to turn off"),
        (Opt(S, 1, 0), "axis < arg"),
        (Opt(P, 0, 1), "at least 2"),
        (Opt(TC, 0, (-1, 0)), "local dimensions"),
    ],
    ids=lambda x: str(x),
)
def test_invalid_opts_raise_a_specific_error(opt: Opt, message: str) -> None:
    k = Kernel(matmul(16, 24, 32).ast, CRenderer())
    before = (k.full_shape, list(k.axis_types), dict(k.views))
    with pytest.raises(KernelOptError, match=message):
        k.apply_opt(opt)
    assert (k.full_shape, k.axis_types, k.views) == before and k.applied_opts == []


def test_register_budget() -> None:
    k = Kernel(matmul(16, 24, 32).ast, GPU())
    k.apply_opt(Opt(U, 0, 16))
    with pytest.raises(KernelOptError, match=r"register budget \(max_upcast=32\)"):
        k.apply_opt(Opt(U, 0, 4))
    k.apply_opt(Opt(R, 0, 2))  # 16 x 2 = 32 still fits


def test_threads_per_workgroup_and_local_max() -> None:
    k = Kernel(matmul(32, 32, 32).ast, GPU())
    with pytest.raises(KernelOptError, match="local_max"):
        k.apply_opt(Opt(L, 0, 32))
    k.apply_opt(Opt(L, 0, 16))
    with pytest.raises(KernelOptError, match="128 threads per workgroup is over"):
        k.apply_opt(Opt(L, 1, 8))


def test_shared_memory_limit_for_grouped_reductions() -> None:
    class WideGPU(GPU):
        local_max = (64, 64, 64)

    k = Kernel(row_reduce(Ops.ADD, 8, 512).ast, WideGPU())
    k.apply_opt(Opt(U, 0, 8))
    # 8 outputs per thread x 64 threads x 4 bytes = 2048 bytes of shared memory, over 1024
    with pytest.raises(KernelOptError, match="2048 bytes of shared memory"):
        k.apply_opt(Opt(GT, 0, 64))
    k.apply_opt(Opt(GT, 0, 32))


def test_nolocals_before_locals_only() -> None:
    k = Kernel(matmul(16, 16, 16).ast, GPU())
    k.apply_opt(Opt(L, 0, 4))
    with pytest.raises(KernelOptError, match="NOLOCALS must come before"):
        k.apply_opt(Opt(N))
    k2 = Kernel(matmul(16, 16, 16).ast, GPU())
    k2.apply_opt(Opt(N))
    with pytest.raises(KernelOptError, match="after NOLOCALS"):
        k2.apply_opt(Opt(L, 0, 4))


def test_group_needs_shared_memory_and_a_reduction() -> None:
    class NoShared(GPU):
        has_shared = False

    with pytest.raises(KernelOptError, match="no shared memory"):
        Kernel(column_sum().ast, NoShared()).apply_opt(Opt(G, 0, 4))
    with pytest.raises(KernelOptError, match="GROUP axis 0 does not exist"):
        Kernel(elementwise().ast, GPU()).apply_opt(Opt(G, 0, 4))


def test_padding_a_reduce_axis_masks_it_where_zeros_would_change_the_result() -> None:
    n = 30
    x = load(1, dtypes.float32, st(4, n))
    fine = sink(store_(0, reduce(x * x, Ops.ADD, (1,)), st(4, 1)))
    k = Kernel(fine, CRenderer())
    k.apply_opt(Opt(P, 1, 32))
    assert k.full_shape == (4, 32) and k.reduce_mask is None  # zeros add nothing: no mask
    # exp2(0) = 1 and max(0, x) = 0 would count: the padded elements get the reduction's identity instead
    exp = sink(store_(0, reduce(x.alu(Ops.EXP2), Ops.ADD, (1,)), st(4, 1)))
    maximum = sink(store_(0, reduce(x, Ops.MAX, (1,)), st(4, 1)))
    for ast in (exp, maximum):
        k = Kernel(ast, CRenderer())
        k.apply_opt(Opt(P, 1, 32))
        assert k.reduce_mask is not None and k.views[k.reduce_mask].shape == (4, 32)
    with pytest.raises(KernelOptError, match="more than double"):
        Kernel(fine, CRenderer()).apply_opt(Opt(P, 0, 16))


def test_symbolic_axes_are_not_split() -> None:
    v = UOp.variable("n", 1, 64)
    x = load(1, dtypes.float32, st(v, 8), size=512)
    k = Kernel(sink(store_(0, x, st(v, 8))), LLVMRenderer())
    assert not isinstance(k.full_shape[0], int)
    with pytest.raises(KernelOptError, match="symbolic"):
        k.apply_opt(Opt(U, 0, 2))
    k.apply_opt(Opt(U, 1, 8))


def test_tensor_core_errors() -> None:
    with pytest.raises(KernelOptError, match="has no tensor cores"):
        Kernel(matmul().ast, GPU()).apply_opt(Opt(TC, 0, (-1, 0)))
    k = Kernel(matmul().ast, GPU())
    k.apply_opt(Opt(U, 0, 2))
    with pytest.raises(KernelOptError, match="TC must be the first opt"):
        k.apply_opt(Opt(TC, 0, (-1, 0)))


def test_opts_on_kernels_with_several_outputs_and_reductions() -> None:
    k = Kernel(full_sum_and_max().ast, CRenderer())
    assert len(k.reduceops) == 2
    k.apply_opt(Opt(R, 0, 16))
    assert k.colored_shape() == "16r 16ur"
    k = Kernel(conv2d().ast, CRenderer())
    assert k.colored_shape() == "4g 6g 6g 3r 3r 3r"
    k.apply_opt(Opt(R, 2, 0))
    k.apply_opt(Opt(R, 1, 0))
    assert k.colored_shape() == "4g 6g 6g 3r 3ur 3ur"


def test_views_that_break_the_contract_are_reported() -> None:
    x = load(1, dtypes.float32, st(4, 8))
    # above the reduction every view must have the output shape (4, 1)
    bad = sink(store_(0, reduce(x, Ops.ADD, (1,)) + load(2, dtypes.float32, st(8, 4).permute((1, 0))), st(4, 1)))
    with pytest.raises(KernelASTError):
        Kernel(bad, CRenderer())
