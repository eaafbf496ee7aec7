"""Tensor cores, applied generically from their descriptions (`lazygrad_uop.device.TensorCore`).

A kernel qualifies when it is one sum of a product of two loads of the core's input dtype (possibly cast), into the
core's output dtype, with an output axis M that only the first load varies along, an output axis N that only the
second varies along, and a reduce axis K both vary along. The TC opt splits (padding first if allowed) a tile of the
core's M, N and K off those axes, as TC_M, TC_N and TC_K axes. Lowering then gives each of them, for each operand,
the coordinate the core's layout assigns to the thread and register (`coordinate`): thread `t` (a local index of
`threads` threads) loads register `r` of A from the element at (m, k) = layout_A(t, r), of B from layout_B(t, r),
and finds its result C[m][n] for (m, n) = layout_C(t, r) in register r of the WMMA's output. Everything else (more
output tiles per thread through UPCAST, more K tiles per loop step through UNROLL, LOCAL workgroups) composes with it.

A core that rounds its inputs (`TensorCore.input_mantissa_bits`: TF32 on NVIDIA GPUs) is taken only with `TF32=1`;
otherwise the TC opt skips it, as if the renderer did not have it, and float32 kernels stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lazygrad_uop.config import TF32
from lazygrad_uop.device import TensorCore
from lazygrad_uop.dtype import dtypes
from lazygrad_uop.ops import Ops
from lazygrad_uop.uop import UOp
from lazygrad_uop.views import ShapeTracker

if TYPE_CHECKING:
    from lazygrad_codegen.kernel import Kernel, Opt


@dataclass(frozen=True)
class Layout:
    """Which coordinate bit each bit of the thread index and of the register index selects (see `TensorCore`)."""

    thread_bits: tuple[str, ...]
    register_bits: tuple[str, ...]


def layouts(tc: TensorCore) -> tuple[Layout, Layout, Layout]:
    """The layouts of A, B and C of a tensor core description (those of A and B empty where the core reads them
    from local memory itself, `TensorCore.shared_operands`)."""
    if not tc.swizzle:
        raise ValueError(f"tensor core {tc} has no layout (swizzle); codegen can't place its elements")
    a, b, c = (Layout(tuple(t[0]), tuple(t[1])) if t else Layout((), ()) for t in tc.swizzle)
    return a, b, c


def coordinate(layout: Layout, dim: str, thread: UOp, register: int) -> UOp:
    """Coordinate `dim` ("m", "n" or "k") of the element that `thread` holds in `register` under `layout`."""
    value = sum(
        ((register >> rb) & 1) << int(name[1:]) for rb, name in enumerate(layout.register_bits) if name[0] == dim
    )
    out = UOp.const(dtypes.int32, value)
    for tb, name in enumerate(layout.thread_bits):
        if name and name[0] == dim:
            bit = (thread if tb == 0 else thread // (1 << tb)) % 2
            out = out + (bit if name == f"{dim}0" else bit * (1 << int(name[1:])))
    return out


def wmma_arg(tc: TensorCore) -> tuple:
    """The arg of a WMMA UOp: (name, dims (N, M, K), dtype_in, dtype_out, threads, elements_per_thread, layout), and
    the core's `input_mantissa_bits` after them where it rounds its inputs (a TF32 core)."""
    arg = (str(tc), tc.dims, tc.dtype_in, tc.dtype_out, tc.threads, tc.elements_per_thread, tc.swizzle)
    return arg if tc.input_mantissa_bits is None else (*arg, tc.input_mantissa_bits)


def allowed(tc: TensorCore) -> bool:
    """Whether the settings let kernels use `tc`: a core that rounds its inputs (TF32) only with `TF32=1`."""
    return tc.input_mantissa_bits is None or bool(TF32)


# *** matching a kernel ***


def _varies(st: ShapeTracker, axis: int) -> bool:
    if isinstance(st.shape[axis], int) and st.shape[axis] == 1:
        return False
    return st.real_strides(ignore_valid=True)[axis] != 0


def _operand_load(u: UOp, tc: TensorCore) -> UOp | None:
    # a round trip through a wider float and back (CAST(half, CAST(float, x)), as the frontend reads a half gradient)
    # gives x exactly
    if u.op is Ops.CAST and u.src[0].op is Ops.CAST and u.src[0].src[0].dtype == u.dtype:
        if dtypes.is_float(u.src[0].dtype) and u.src[0].dtype.itemsize > u.dtype.itemsize:
            u = u.src[0].src[0]
    if u.op is Ops.CAST:
        u = u.src[0]
    return u if u.op is Ops.LOAD and u.dtype == tc.dtype_in else None


@dataclass(frozen=True)
class TensorCoreMatch:
    """Kernel axes M, N, K for a tensor core, and the loads that give its A and B."""

    m: int
    n: int
    k: int
    a: UOp
    b: UOp


def matches(kernel: Kernel, tc: TensorCore) -> list[TensorCoreMatch]:
    """The ways `tc` can run the matmul of `kernel` (empty when the kernel is not one)."""
    from lazygrad_codegen.kernel import AxisType

    reduces = kernel.reduceops
    if len(reduces) != 1 or reduces[0].arg[0] is not Ops.ADD or reduces[0].dtype != tc.dtype_out:
        return []
    x = reduces[0].src[0]
    if x.op is Ops.CAST:
        x = x.src[0]
    if x.op is not Ops.MUL:
        return []
    loads = [_operand_load(s, tc) for s in x.src]
    if any(ld is None for ld in loads):
        return []
    out: list[TensorCoreMatch] = []
    globals_, reduce_axes = kernel.axes(AxisType.GLOBAL), kernel.axes(AxisType.REDUCE)
    for a, b in ((loads[0], loads[1]), (loads[1], loads[0])):
        assert a is not None and b is not None
        sa, sb = kernel.views[a.src[1]], kernel.views[b.src[1]]
        for m in globals_:
            for n in globals_:
                if m == n or not (_varies(sa, m) and not _varies(sb, m) and _varies(sb, n) and not _varies(sa, n)):
                    continue
                for k in reduce_axes:
                    if _varies(sa, k) and _varies(sb, k):
                        out.append(TensorCoreMatch(m, n, k, a, b))
    return out


def apply_tensor_core(kernel: Kernel, opt: Opt) -> None:
    """The TC opt: see the module docstring. Raises KernelOptError when no tensor core fits."""
    from lazygrad_codegen.kernel import AxisType, KernelOptError, check_reduce_padding

    r = kernel.renderer
    if not r.has_local or not kernel.use_locals:
        raise KernelOptError("tensor cores run on the threads of a workgroup: the renderer needs local dimensions")
    if not (isinstance(opt.arg, tuple) and len(opt.arg) == 2 and all(isinstance(v, int) for v in opt.arg)):
        raise KernelOptError(f"TC takes arg (select, pad), got {opt.arg!r}")
    select, pad = opt.arg
    cores = tuple(r.tensor_cores)
    if not cores:
        raise KernelOptError(f"{type(r).__name__} has no tensor cores")
    if not -1 <= select < len(cores):
        raise KernelOptError(f"tensor core {select} does not exist: the renderer has {len(cores)}")
    if select != -1 and not allowed(cores[select]):
        raise KernelOptError(f"tensor core {cores[select]} rounds float32 inputs to TF32: it needs the setting TF32=1")
    axis = opt.axis if opt.axis is not None else 0
    # a core that reads its operands from local memory is taken only when named: it needs STAGE and its own tiles
    for tc in [c for c in cores if not c.shared_operands] if select == -1 else (cores[select],):
        if not tc.swizzle or not allowed(tc):
            continue
        found = [mt for mt in matches(kernel, tc) if pad or _fits(kernel, mt, tc)]
        if axis >= len(found):
            continue
        mt = found[axis]
        n_dim, m_dim, k_dim = tc.dims
        for ax, dim in ((mt.m, m_dim), (mt.n, n_dim), (mt.k, k_dim)):
            size = kernel.full_shape[ax]
            if not isinstance(size, int):
                raise KernelOptError("tensor cores need int axis sizes")
            if size % dim:
                to = -(-size // dim) * dim
                if to > 2 * size:
                    raise KernelOptError(f"padding axis of {size} to {to} for the tensor core more than doubles it")
                if ax == mt.k:
                    check_reduce_padding(kernel)
                kernel.pad_axis(ax, to)
        splits = sorted(((mt.m, m_dim, AxisType.TC_M), (mt.n, n_dim, AxisType.TC_N), (mt.k, k_dim, AxisType.TC_K)))
        for ax, dim, kind in reversed(splits):
            size = kernel.full_shape[ax]
            kernel._reshape_axis(ax, (size // dim, dim), (kernel.axis_types[ax], kind))  # type: ignore[operator]
        kernel._squeeze()
        kernel._sort_axes()
        kernel.tensor_core, kernel.tc_operands = tc, (mt.a, mt.b)
        if tc.threads > r.max_workgroup_threads:
            raise KernelOptError(f"tensor core {tc} needs {tc.threads} threads, over the renderer's limit")
        return
    raise KernelOptError(f"no tensor core of {type(r).__name__} fits this kernel (match {axis}, select {select})")


def _fits(kernel: Kernel, mt: TensorCoreMatch, tc: TensorCore) -> bool:
    n_dim, m_dim, k_dim = tc.dims
    sizes = (kernel.full_shape[mt.m], kernel.full_shape[mt.n], kernel.full_shape[mt.k])
    return all(isinstance(s, int) and s % d == 0 for s, d in zip(sizes, (m_dim, n_dim, k_dim), strict=True))
