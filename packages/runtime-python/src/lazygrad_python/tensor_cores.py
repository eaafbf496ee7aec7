"""Tensor cores emulated from their descriptions: a `WMMA` UOp run on a warp's registers, and a `WGMMA` UOp, whose
group of threads reads A and B from local memory itself.

A WMMA's arg is `(name, (N, M, K), dtype_in, dtype_out, threads, (A, B, C elements per thread), layout)` with the
layout of `lazygrad_uop.device.TensorCore.swizzle`: for each operand, the coordinate bit each bit of the thread index
and of the register index selects. Each group of `threads` consecutive threads of the warp runs one instruction
together: their A registers are gathered into the M x K matrix A, their B registers into B (K x N), their C
registers into C (M x N), and each thread gets back its registers of C + A @ B. Products and sums are computed in
double precision and rounded to `dtype_out` once, as exact as a tensor core can be (hardware may round between
partial sums, so results match it to within the output dtype's rounding).

An arg with an eighth entry, `input_mantissa_bits` (`TensorCore.input_mantissa_bits`: 10 for NVIDIA's TF32), is a
core that rounds its float32 inputs first: every A and B value is rounded to that many mantissa bits, to nearest with
ties away from zero (`numerics.round_float32_mantissa`, as `cvt.rna.tf32.f32` does), before the products, which are
then exact in double precision.

The mapping is read from the layout here, independently of the code generator, so running a matmul through it checks
that codegen placed every element where the description says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lazygrad_python.numerics import normalizer, round_float32_mantissa
from lazygrad_uop.device import SharedMatrix
from lazygrad_uop.dtype import dtypes


class TensorCoreLayoutError(ValueError):
    """A WMMA arg whose layout does not describe a matrix operand (a bit named twice, missing, or unknown)."""


def _coords(layout: Sequence[Sequence[str]], dims: str, threads: int, registers: int) -> list[list[tuple[int, int]]]:
    """For each thread and register, the (row, column) of the element it holds; `dims` names the row and column
    coordinates ("mk" for A, "kn" for B, "mn" for C)."""
    thread_bits, register_bits = layout
    out = []
    for t in range(threads):
        row_col = []
        for r in range(registers):
            value = {dims[0]: 0, dims[1]: 0}
            for bits, index in ((thread_bits, t), (register_bits, r)):
                for b, name in enumerate(bits):
                    if not name:
                        continue
                    if name[0] not in value:
                        raise TensorCoreLayoutError(f"layout bit {name!r} is not a coordinate of a {dims} operand")
                    value[name[0]] |= ((index >> b) & 1) << int(name[1:])
            row_col.append((value[dims[0]], value[dims[1]]))
        out.append(row_col)
    return out


def wmma_function(arg: tuple[Any, ...]) -> Callable[[list[Any], list[Any], list[Any]], list[Any]]:
    """The function of one WMMA instruction over a warp: per-thread register tuples of A, B and C in, of the result
    out. The warp's width must be a multiple of the instruction's thread count."""
    try:
        _name, (n, m, k), dtype_in, dtype_out, threads, (per_a, per_b, per_c), (lay_a, lay_b, lay_c) = arg[:7]
        if len(arg) > 8:
            raise ValueError
    except (TypeError, ValueError):
        raise TensorCoreLayoutError(
            "a WMMA arg is (name, (N, M, K), dtype_in, dtype_out, threads, (A, B, C elements per thread), "
            f"(layout_A, layout_B, layout_C)[, input mantissa bits]), got {arg!r}"
        ) from None
    mantissa = arg[7] if len(arg) == 8 else None
    if mantissa is not None and dtype_in != dtypes.float32:
        raise ValueError(f"a WMMA that rounds its inputs to {mantissa} mantissa bits takes float32, not {dtype_in}")
    round_in = (lambda regs: regs) if mantissa is None else (lambda regs: round_float32_mantissa(regs, mantissa))
    coords_a = _coords(lay_a, "mk", threads, per_a)
    coords_b = _coords(lay_b, "kn", threads, per_b)
    coords_c = _coords(lay_c, "mn", threads, per_c)
    for coords, rows, cols, what in ((coords_a, m, k, "A"), (coords_b, k, n, "B"), (coords_c, m, n, "C")):
        held = {rc for per_thread in coords for rc in per_thread}
        if held != {(i, j) for i in range(rows) for j in range(cols)}:
            raise TensorCoreLayoutError(f"the layout of {what} does not cover its {rows} x {cols} elements")
    round_out = normalizer(dtype_out)

    def gather(regs: list[Any], coords: list[list[tuple[int, int]]], rows: int, cols: int, what: str) -> list[list]:
        mat: list[list[Any]] = [[None] * cols for _ in range(rows)]
        for t, per_thread in enumerate(coords):
            for r, (i, j) in enumerate(per_thread):
                v = regs[t][r]
                if mat[i][j] is not None and mat[i][j] != v and not (v != v and mat[i][j] != mat[i][j]):
                    raise ValueError(f"threads that should hold the same element {what}[{i}][{j}] disagree")
                mat[i][j] = v
        return mat

    def run(a_regs: list[Any], b_regs: list[Any], c_regs: list[Any]) -> list[Any]:
        width = len(c_regs)
        if width % threads:
            raise ValueError(f"a WMMA of {threads} threads needs a warp of a multiple of {threads}, got {width}")
        out: list[Any] = [None] * width
        for g in range(0, width, threads):
            a = gather([round_in(r) for r in a_regs[g : g + threads]], coords_a, m, k, "A")
            b = gather([round_in(r) for r in b_regs[g : g + threads]], coords_b, k, n, "B")
            c = gather(c_regs[g : g + threads], coords_c, m, n, "C")
            d = [[c[i][j] + sum(a[i][q] * b[q][j] for q in range(k)) for j in range(n)] for i in range(m)]
            for t in range(threads):
                out[g + t] = tuple(round_out([d[i][j] for i, j in coords_c[t]]))
        return out

    return run


def shared_wgmma_function(arg: tuple[Any, ...]) -> Callable[..., list[Any]]:
    """The function of one WGMMA instruction over a warp: (A's local memory, each thread's offset into it, B's,
    likewise, per-thread register tuples of C) in, per-thread tuples of the result out. Each group of `threads`
    consecutive threads runs one instruction: A (M x K) and B (K x N) are read from local memory at the offset its
    first thread gives (every thread of the group must give the same), each element where its `SharedMatrix`
    layout (the arg's last two entries, as (major, lbo, sbo, swizzle)) puts it: the hardware's reading of a wgmma
    descriptor, written here from the PTX ISA independently of the code generator's tiles. C is laid out by
    layout_C; products and sums in double precision, rounded to dtype_out once."""
    try:
        # (an eighth entry, the groups the hardware may leave running at a step's end, changes nothing here: each
        # instruction runs to completion when reached)
        (n, m, k), dtype_in, dtype_out, threads, lay_c, a_layout, b_layout = arg[:7]
        if len(arg) > 8:
            raise ValueError("too many entries")
        a_matrix, b_matrix = SharedMatrix(*a_layout), SharedMatrix(*b_layout)
    except (TypeError, ValueError) as exc:
        raise TensorCoreLayoutError(
            "a WGMMA arg is ((N, M, K), dtype_in, dtype_out, threads, layout_C, (major, lbo, sbo, swizzle) of A, "
            f"the same of B), got {arg!r}: {exc}"
        ) from None
    per_c = m * n // threads
    coords_c = _coords(lay_c, "mn", threads, per_c)
    if {rc for per_thread in coords_c for rc in per_thread} != {(i, j) for i in range(m) for j in range(n)}:
        raise TensorCoreLayoutError(f"the layout of C does not cover its {m} x {n} elements")
    item = dtype_in.itemsize
    round_out = normalizer(dtype_out)

    def element(mem: Any, matrix: SharedMatrix, start: int, mn: int, kk: int) -> Any:
        address = matrix.address(start * item, mn, kk, item)
        if address % item or address < 0:
            raise IndexError(f"element address {address} of local memory is not one of {dtype_in}")
        return mem[address // item]

    def run(a_mem: Any, a_offs: list[Any], b_mem: Any, b_offs: list[Any], c_regs: list[Any]) -> list[Any]:
        width = len(c_regs)
        if width % threads:
            raise ValueError(f"a WGMMA of {threads} threads needs a warp of a multiple of {threads}, got {width}")
        out: list[Any] = [None] * width
        for g in range(0, width, threads):
            starts = []
            for offs, what in ((a_offs, "A"), (b_offs, "B")):
                group = set(offs[g : g + threads])
                if len(group) != 1 or None in group:
                    raise ValueError(f"the threads of one instruction give different origins of {what}: {group}")
                (start,) = group
                if (start * item) % 16:
                    raise ValueError(f"the origin of {what} (element {start}) is not 16-byte aligned")
                starts.append(start)
            a = [[element(a_mem, a_matrix, starts[0], i, q) for q in range(k)] for i in range(m)]
            b = [[element(b_mem, b_matrix, starts[1], j, q) for j in range(n)] for q in range(k)]
            c: list[list[Any]] = [[None] * n for _ in range(m)]
            for t, per_thread in enumerate(coords_c):
                for r, (i, j) in enumerate(per_thread):
                    c[i][j] = c_regs[g + t][r]
            for t in range(threads):
                out[g + t] = tuple(
                    round_out([c[i][j] + sum(a[i][q] * b[q][j] for q in range(k)) for i, j in coords_c[t]])
                )
        return out

    return run
