"""The interpreter of linear programs: runs a kernel's UOps for every thread of a launch, a warp at a time.

Execution model, as on a GPU:
- A launch is `global_size` workgroups of `local_size` threads. `SPECIAL` gidx<d> is the workgroup's index along d,
  lidx<d> the thread's index inside its workgroup (x varies fastest when threads are numbered).
- The threads of a workgroup are cut into warps of `warp_size` consecutive threads. A warp runs in lockstep: every
  UOp's value is a list with one value per thread of the warp (vectors are tuples of lanes). Divergence (`IF`, loops
  whose trip count differs between threads) is handled with an active-thread mask: inactive threads neither load,
  store nor update accumulators.
- `SHUFFLE_XOR` exchanges values between the threads of one warp: thread t (its lane: its index in the warp) gets
  the value of thread t XOR offset. Every thread of the warp must be active, as a full-mask `__shfl_xor_sync` needs.
- `DEFINE_LOCAL` memory is shared by the workgroup's warps. `BARRIER` stops a warp until every warp of its workgroup
  reaches the same barrier, so a workgroup of several warps runs them one after another from barrier to barrier.
- `TMA_LOAD` (Hopper's tensor memory accelerator) copies a box of a tensor into local memory and counts its bytes
  against an mbarrier (`MBARRIER_INIT`, `MBARRIER_EXPECT`, `MBARRIER_WAIT`), whose state the workgroup's warps share.
  The copy is queued on its barrier and lands only when a wait needs it (the latest the hardware may land it), so a
  program that reads the box before waiting for its phase sees the old contents (a warp that runs after the first
  wait sees it landed, as it may on hardware). A wait that can't complete (arrivals still missing, or other than the
  announced bytes landed) raises at once where the hardware would spin, forever or until another warp arrives: warps
  run one after another between BARRIERs here, and the kernels this interpreter runs never need another warp to make
  progress inside one such interval.
- Loops jump the program counter: `END` goes back to the instruction after its `RANGE` while the counter is below the
  end. `ASSIGN` writes its `DEFINE_ACC` in place, so reading either node after the loop gives the accumulator, even
  when the loop ran zero times.

Before running, each instruction becomes a small closure (a "step") with its register numbers and the dtype-specific
function it applies already bound, so the inner loop does no dictionary lookups. Instructions that hold a value
fixed for the whole warp (constants, buffers, variables, thread indices) are not steps: their registers are filled
when the warp starts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from lazygrad_python.alu import alu_fn
from lazygrad_python.numerics import bitcaster, caster, memory, memory_bytes, to_value, zero
from lazygrad_python.program_text import Instr
from lazygrad_python.tensor_cores import shared_wgmma_function, wmma_function
from lazygrad_uop.device import TensorMap
from lazygrad_uop.dtype import DType, PtrDType, dtypes
from lazygrad_uop.ops import GroupOp, Ops

WARP_SIZE = 32
"""Threads per warp, as on NVIDIA GPUs, Apple's SIMD groups and AMD's wave32."""

_BARRIER = -1  # what a step returns to stop its warp at a barrier
_SPECIAL_NAMES = {f"{kind}{d}": (kind, d) for kind in ("gidx", "lidx") for d in range(3)}

# The ops whose value is fixed for a whole warp: filled in when the warp starts, never stepped.
_FIXED = frozenset({Ops.CONST, Ops.VCONST, Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.SPECIAL, Ops.DEFINE_LOCAL})
# Ops that execute nothing.
_NOTHING = frozenset({Ops.SINK, Ops.NOOP})

Step = Callable[[list[Any], "_Warp"], int | None]


class InterpreterError(RuntimeError):
    """A program failed while running (an out-of-bounds access, a barrier not every warp reaches, ...); the message
    names the UOp."""


class _Warp:
    """The state of one warp: registers (one per instruction), program counter, and the active-thread mask (None
    when every thread is active; a list of bools otherwise, never all true)."""

    __slots__ = ("groups", "mask", "mbarriers", "pc", "pending", "regs")

    def __init__(self, regs: list[Any], mbarriers: dict[tuple[int, int], _Mbarrier]) -> None:
        self.regs, self.pc, self.mask = regs, 0, None
        # the workgroup's mbarriers (shared by its warps), by (DEFINE_LOCAL, element)
        self.mbarriers = mbarriers
        # ASYNC_COPYs started since the last ASYNC_WAIT: (local memory, global memory, [(dst, src or None) per
        # thread], n); then the groups an ASYNC_WAIT made of them and let stay in flight, oldest first
        self.pending: list[tuple[Any, Any, list[tuple[int, int | None]], int]] = []
        self.groups: list[list[tuple[Any, Any, list[tuple[int, int | None]], int]]] = []


class _Mbarrier:
    """One mbarrier of a workgroup: its phase, the arrivals the phase still waits for (of `arrivals`), the bytes
    announced for it (MBARRIER_EXPECT) and landed in it, and the TMA_LOAD copies counted against it that have not
    landed yet: (local memory's bytes, global memory's bytes, [(zero bytes, source start, source end) per box row:
    the row's in-bounds bytes and where they go in it], the byte address of each 16-byte piece of the box in local
    memory, bytes)."""

    __slots__ = ("arrivals", "copies", "expected", "landed", "name", "pending", "phase")

    def __init__(self, name: str, arrivals: int) -> None:
        self.name, self.arrivals, self.pending = name, arrivals, arrivals
        self.phase = self.expected = self.landed = 0
        self.copies: list[tuple[memoryview, memoryview, list[tuple[int, int, int]], list[int], int]] = []

    def __str__(self) -> str:
        flying = f", {sum(c[-1] for c in self.copies)} more in flight" if self.copies else ""
        return (
            f"{self.name} in phase {self.phase} ({self.pending} of {self.arrivals} arrivals left, {self.expected} "
            f"bytes expected, {self.landed} landed{flying})"
        )

    def land(self) -> None:
        """Land every queued copy: bit-exact bytes, zeros where the box reaches past the tensor."""
        for dst, src, rows, pieces, n in self.copies:
            row = n // len(rows)
            box = b"".join((bytes(zeros) + src[a:b]).ljust(row, b"\0") for zeros, a, b in rows)
            for k, d in enumerate(pieces):
                dst[d : d + 16] = box[16 * k : 16 * k + 16]
            self.landed += n
        self.copies = []

    def complete(self) -> None:
        """Start the next phase."""
        self.phase, self.pending, self.expected, self.landed = self.phase + 1, self.arrivals, 0, 0


def _tma_copy(tmap: TensorMap, dst: memoryview, src: memoryview, start: int, coords: list[int]) -> tuple[Any, ...]:
    """A TMA_LOAD of the box of `tmap` at `coords` from the global bytes `src` to the local bytes `dst` from byte
    `start` on, as `_Mbarrier.copies` holds it."""
    if start < 0 or start % 128:
        raise InterpreterError(f"the box's destination, local byte {start}, is not 128-byte aligned")
    item, (width, *outer) = tmap.dtype.itemsize, tmap.box
    rows = []
    for b in itertools.product(*(range(n) for n in reversed(outer))):
        # the row's in-bounds run along the innermost dim (zeros around it), none where an outer coordinate is out
        base = tmap.element((0, *(c + k for c, k in zip(coords[1:], reversed(b), strict=True))))
        lo, hi = max(-coords[0], 0), min(width, tmap.dims[0] - coords[0])
        if base is None or hi <= lo:
            rows.append((0, 0, 0))
            continue
        first = (base + coords[0] + lo) * item
        if first + (hi - lo) * item > len(src):
            raise InterpreterError(f"the box at {tuple(coords)} reads past the end of the tensor's {len(src)} bytes")
        rows.append((lo * item, first, first + (hi - lo) * item))
    n = tmap.box_bytes
    pieces = [tmap.destination(start, p) for p in range(0, n // item, 16 // item)]
    if max(pieces) + 16 > len(dst):
        raise InterpreterError(
            f"the box of {n} bytes from local byte {start} (swizzled by {tmap.swizzle}) leaves the DEFINE_LOCAL's "
            f"{len(dst)} bytes"
        )
    return dst, src, rows, pieces, n


def _oob(offset: int) -> Any:
    raise IndexError(f"negative element index {offset}")


class Interpreter:
    """A linear program made ready to run. Call it with buffers (memoryviews of bytes, in parameter order), the
    launch sizes and the values of the program's variables."""

    def __init__(self, instrs: Sequence[Instr], warp_size: int = WARP_SIZE) -> None:
        if warp_size < 1:
            raise ValueError(f"warp_size must be positive, got {warp_size}")
        self.instrs = list(instrs)
        # a tensor core's threads run in one warp: widen the warp to the widest WMMA of the program (AMD's 64)
        wmma_threads = [
            x.arg[4] for x in self.instrs if x.op is Ops.WMMA and isinstance(x.arg, tuple) and len(x.arg) in (7, 8)
        ] + [x.arg[3] for x in self.instrs if x.op is Ops.WGMMA and isinstance(x.arg, tuple) and len(x.arg) in (7, 8)]
        self.warp_size = max(warp_size, *wmma_threads) if wmma_threads else warp_size
        ins = self.instrs
        self.globals = sorted((i for i, x in enumerate(ins) if x.op is Ops.DEFINE_GLOBAL), key=lambda i: ins[i].arg)
        self.vars = [i for i, x in enumerate(ins) if x.op is Ops.DEFINE_VAR]
        self.specials = [i for i, x in enumerate(ins) if x.op is Ops.SPECIAL]
        self.locals = [i for i, x in enumerate(ins) if x.op is Ops.DEFINE_LOCAL]
        for i in self.specials:
            if not (isinstance(ins[i].arg, tuple) and ins[i].arg[0] in _SPECIAL_NAMES):
                raise NotImplementedError(f"SPECIAL {ins[i].arg!r}: the PYTHON interpreter knows gidx0-2 and lidx0-2")
        # Which register each instruction's value lives in: its own, except for aliases that copy nothing.
        self.reg = list(range(len(ins)))
        for i, x in enumerate(ins):
            if x.op is Ops.ASSIGN:
                if ins[x.src[0]].op is not Ops.DEFINE_ACC:
                    raise NotImplementedError(f"ASSIGN {i}: the PYTHON interpreter assigns only to a DEFINE_ACC")
                self.reg[i] = self.reg[x.src[0]]
            elif x.op is Ops.INDEX and len(x.src) == 2:
                self.reg[i] = self.reg[x.src[1]]
        self.closers: dict[int, list[int]] = {}  # RANGE/IF index -> the END/ENDIF instructions that close it
        for j, x in enumerate(ins):
            if x.op in GroupOp.BlockEnd and x.src:
                self.closers.setdefault(x.src[0], []).append(j)
        stepped = [i for i, x in enumerate(ins) if not self._needs_no_step(x)]
        self.pos = {i: p for p, i in enumerate(stepped)}  # instruction index -> step number
        self.step_instr = stepped
        self.steps: list[Step] = [self._build(i) for i in stepped]
        self._fixed_cache: dict[int, list[Any]] = {}

    @staticmethod
    def _needs_no_step(x: Instr) -> bool:
        return x.op in _FIXED or x.op in _NOTHING or (x.op is Ops.INDEX and len(x.src) == 2)

    # *** building steps ***

    def _build(self, i: int) -> Step:
        x = self.instrs[i]
        builder = _BUILDERS.get(x.op)
        if builder is None:
            if x.op in GroupOp.ALU:
                return self._alu(i, x)
            raise NotImplementedError(f"the PYTHON interpreter can't run {x.op} (instruction {i})")
        return builder(self, i, x)

    def _srcs(self, x: Instr) -> list[int]:
        return [self.reg[s] for s in x.src]

    def _alu(self, i: int, x: Instr) -> Step:
        fn = alu_fn(x.op, x.dtype, tuple(self.instrs[s].dtype for s in x.src))
        r, srcs = self.reg[i], self._srcs(x)
        if len(srcs) == 1:
            (a,) = srcs

            def unary(regs: list[Any], w: _Warp) -> None:
                regs[r] = fn(regs[a])

            return unary
        if len(srcs) == 2:
            a, b = srcs

            def binary(regs: list[Any], w: _Warp) -> None:
                regs[r] = fn(regs[a], regs[b])

            return binary
        a, b, c = srcs

        def ternary(regs: list[Any], w: _Warp) -> None:
            regs[r] = fn(regs[a], regs[b], regs[c])

        return ternary

    def _wmma(self, i: int, x: Instr) -> Step:
        # the tensor core's whole group of threads must run it: no thread of the warp may be masked off
        fn = wmma_function(x.arg)
        r, (a, b, c) = self.reg[i], self._srcs(x)

        def wmma(regs: list[Any], w: _Warp) -> None:
            if w.mask is not None:
                raise InterpreterError(f"WMMA {i} runs on a warp where some threads are inactive")
            regs[r] = fn(regs[a], regs[b], regs[c])

        return wmma

    def _shuffle_xor(self, i: int, x: Instr) -> Step:
        offset = x.arg
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 1 or offset & (offset - 1):
            raise ValueError(f"SHUFFLE_XOR {i}: the offset must be a positive power of two, got {offset!r}")
        if offset >= self.warp_size:
            raise ValueError(f"SHUFFLE_XOR {i}: offset {offset} leaves a warp of {self.warp_size} threads")
        if self.instrs[x.src[0]].dtype.count != 1:
            raise ValueError(f"SHUFFLE_XOR {i}: shuffles scalars, got {self.instrs[x.src[0]].dtype!r}")
        r, (a,) = self.reg[i], self._srcs(x)

        def shuffle_xor(regs: list[Any], w: _Warp) -> None:
            if w.mask is not None:
                raise InterpreterError(f"SHUFFLE_XOR {i} runs on a warp where some threads are inactive")
            vals = regs[a]
            n = len(vals)
            if n % (2 * offset):
                # a partial warp (the workgroup's last) lacks the partner of some of its lanes
                raise InterpreterError(f"SHUFFLE_XOR {i}: offset {offset} in a warp of only {n} threads")
            regs[r] = [vals[t ^ offset] for t in range(n)]

        return shuffle_xor

    def _convert(self, i: int, x: Instr) -> Step:
        src = self.instrs[x.src[0]].dtype
        if x.op is Ops.BITCAST:
            fn = bitcaster(src, x.dtype)
        elif x.dtype.count > 1:
            lane_fn = caster(src, x.dtype)
            fn = lambda vals: list(zip(*(lane_fn([v[k] for v in vals]) for k in range(x.dtype.count)), strict=True))  # noqa: E731
        else:
            fn = caster(src, x.dtype)
        r, (a,) = self.reg[i], self._srcs(x)

        def convert(regs: list[Any], w: _Warp) -> None:
            regs[r] = fn(regs[a])

        return convert

    def _vectorize(self, i: int, x: Instr) -> Step:
        r, srcs = self.reg[i], self._srcs(x)

        def vectorize(regs: list[Any], w: _Warp) -> None:
            regs[r] = list(zip(*[regs[s] for s in srcs], strict=True))

        return vectorize

    def _gep(self, i: int, x: Instr) -> Step:
        r, (a,) = self.reg[i], self._srcs(x)
        lanes = x.arg if isinstance(x.arg, tuple) else (x.arg,)
        if self.instrs[x.src[0]].dtype.count == 1:
            if any(k != 0 for k in lanes):
                raise ValueError(f"GEP {i}: lanes {lanes} of a scalar")
            fn: Callable[[list[Any]], list[Any]] = (
                list if len(lanes) == 1 else (lambda vals: [(v,) * len(lanes) for v in vals])
            )
        elif len(lanes) == 1:
            (k,) = lanes
            fn = lambda vals: [v[k] for v in vals]  # noqa: E731
        else:
            fn = lambda vals: [tuple(v[k] for k in lanes) for v in vals]  # noqa: E731

        def gep(regs: list[Any], w: _Warp) -> None:
            regs[r] = fn(regs[a])

        return gep

    def _index(self, i: int, x: Instr) -> Step:
        # only INDEX with a valid operand is a step: invalid threads get the offset None, which loads skip and
        # stores ignore
        r, (_, idx, valid) = self.reg[i], self._srcs(x)

        def index(regs: list[Any], w: _Warp) -> None:
            regs[r] = [o if v else None for o, v in zip(regs[idx], regs[valid], strict=True)]

        return index

    def _memory_operands(self, i: int, x: Instr) -> tuple[int, int, int]:
        """The registers of the buffer and the offsets of a LOAD's or STORE's INDEX, and how many scalar elements
        one step of the index moves (more than one for a pointer to vectors)."""
        ptr = self.instrs[x.src[0]]
        if ptr.op is not Ops.INDEX:
            raise NotImplementedError(f"{x.op} {i}: the PYTHON interpreter loads and stores only through an INDEX")
        buf = self.instrs[ptr.src[0]]
        if buf.op not in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL) or not isinstance(buf.dtype, PtrDType):
            raise NotImplementedError(f"{x.op} {i}: INDEX {x.src[0]} must index a DEFINE_GLOBAL or DEFINE_LOCAL")
        return self.reg[ptr.src[0]], self.reg[x.src[0]], buf.dtype.base.count

    def _load(self, i: int, x: Instr) -> Step:
        buf, off, stride = self._memory_operands(i, x)
        r, count = self.reg[i], x.dtype.count
        gated = len(x.src) == 3
        alt_r, gate_r = (self.reg[x.src[1]], self.reg[x.src[2]]) if gated else (-1, -1)
        zero_value = zero(x.dtype)
        if count == 1 and stride == 1:
            read: Callable[[Any, int], Any] = lambda mem, o: mem[o] if o >= 0 else _oob(o)  # noqa: E731
        else:
            lanes = range(count)
            read = lambda mem, o: tuple(mem[o * stride + k] if o >= 0 else _oob(o) for k in lanes)  # noqa: E731

        if not gated and count == 1 and stride == 1:

            def load_plain(regs: list[Any], w: _Warp) -> None:
                mem, mask = regs[buf], w.mask
                if mask is None:
                    regs[r] = [(mem[o] if o >= 0 else _oob(o)) if o is not None else zero_value for o in regs[off]]
                else:
                    regs[r] = [
                        read(mem, o) if m and o is not None else zero_value
                        for o, m in zip(regs[off], mask, strict=True)
                    ]

            return load_plain

        def load(regs: list[Any], w: _Warp) -> None:
            mem, offs = regs[buf], regs[off]
            mask = itertools.repeat(True) if w.mask is None else w.mask
            gates = regs[gate_r] if gated else itertools.repeat(True)
            alts = regs[alt_r] if gated else itertools.repeat(zero_value)
            regs[r] = [
                read(mem, o) if g and m and o is not None else a
                for o, g, m, a in zip(offs, gates, mask, alts, strict=False)
            ]

        return load

    def _store(self, i: int, x: Instr) -> Step:
        buf, off, stride = self._memory_operands(i, x)
        val_r = self.reg[x.src[1]]
        gate_r = self.reg[x.src[2]] if len(x.src) == 3 else -1
        count = self.instrs[x.src[1]].dtype.count
        lanes = range(count)

        def store(regs: list[Any], w: _Warp) -> None:
            mem, offs, vals = regs[buf], regs[off], regs[val_r]
            mask = w.mask
            gates = regs[gate_r] if gate_r >= 0 else None
            for t, o in enumerate(offs):
                if o is None or (mask is not None and not mask[t]) or (gates is not None and not gates[t]):
                    continue
                if o < 0:
                    _oob(o)
                if count == 1:
                    mem[o * stride] = vals[t]
                else:
                    for k in lanes:
                        mem[o * stride + k] = vals[t][k]

        return store

    def _define_acc(self, i: int, x: Instr) -> Step:
        r, init = self.reg[i], self.reg[x.src[0]]

        def define_acc(regs: list[Any], w: _Warp) -> None:
            regs[r] = regs[init]

        return define_acc

    def _assign(self, i: int, x: Instr) -> Step:
        r, new = self.reg[i], self.reg[x.src[1]]

        def assign(regs: list[Any], w: _Warp) -> None:
            mask = w.mask
            if mask is None:
                regs[r] = regs[new]
            else:
                regs[r] = [n if m else old for n, old, m in zip(regs[new], regs[r], mask, strict=True)]

        return assign

    def _closer(self, i: int, close: Ops) -> int:
        found = self.closers.get(i, [])
        if len(found) != 1 or self.instrs[found[0]].op is not close:
            raise ValueError(f"{self.instrs[i].op} {i} needs exactly one {close}, found {len(found)}")
        return found[0]

    def _range(self, i: int, x: Instr) -> Step:
        end_i = self._closer(i, Ops.END)
        r, end_r, state = self.reg[i], self.reg[x.src[0]], self.reg[end_i]
        after = self.pos[end_i] + 1

        def range_(regs: list[Any], w: _Warp) -> int | None:
            ends = regs[end_r]
            first = ends[0]
            if ends.count(first) == len(ends):  # the same trip count for every thread: no masking
                if first <= 0:
                    return after
                regs[state] = first
                regs[r] = [0] * len(ends)
                return None
            outer = w.mask
            active = [e > 0 for e in ends] if outer is None else [e > 0 and m for e, m in zip(ends, outer, strict=True)]
            if not any(active):
                return after
            regs[state] = (ends, outer)
            regs[r] = [0] * len(ends)
            w.mask = None if all(active) else active
            return None

        return range_

    def _end(self, i: int, x: Instr) -> Step:
        range_i = x.src[0]
        if self.instrs[range_i].op is not Ops.RANGE:
            raise ValueError(f"END {i} must close a RANGE, not {self.instrs[range_i].op}")
        r, state, body = self.reg[range_i], self.reg[i], self.pos[range_i] + 1

        def end(regs: list[Any], w: _Warp) -> int | None:
            st = regs[state]
            if type(st) is int:
                c = regs[r][0] + 1
                if c < st:
                    regs[r] = [c] * len(regs[r])
                    return body
                return None
            ends, outer = st
            counters = [c + 1 for c in regs[r]]
            regs[r] = counters
            if outer is None:
                active = [c < e for c, e in zip(counters, ends, strict=True)]
            else:
                active = [c < e and m for c, e, m in zip(counters, ends, outer, strict=True)]
            if any(active):
                w.mask = None if all(active) else active
                return body
            w.mask = outer
            return None

        return end

    def _if(self, i: int, x: Instr) -> Step:
        endif_i = self._closer(i, Ops.ENDIF)
        saved, gate = self.reg[i], self.reg[x.src[0]]
        after = self.pos[endif_i] + 1

        def if_(regs: list[Any], w: _Warp) -> int | None:
            outer = w.mask
            active = regs[gate] if outer is None else [g and m for g, m in zip(regs[gate], outer, strict=True)]
            if not any(active):
                return after
            regs[saved] = outer
            w.mask = None if all(active) else list(active)
            return None

        return if_

    def _endif(self, i: int, x: Instr) -> Step:
        saved = self.reg[x.src[0]]

        def endif(regs: list[Any], w: _Warp) -> None:
            w.mask = regs[saved]

        return endif

    def _async_copy(self, i: int, x: Instr) -> Step:
        # the copy is queued and lands at the thread's next ASYNC_WAIT, the latest the hardware may land it: a read
        # of the destination before the wait sees the old contents, as it may on hardware
        dst_buf, dst_off, dst_stride = self._memory_operands(i, Instr(Ops.STORE, x.dtype, x.src[:1], None))
        src_buf, src_off, src_stride = self._memory_operands(i, Instr(Ops.LOAD, x.dtype, x.src[1:2], None))
        n = int(x.arg)

        def async_copy(regs: list[Any], w: _Warp) -> None:
            mask = w.mask
            pairs = [
                (d * dst_stride, None if o is None else o * src_stride)
                for t, (d, o) in enumerate(zip(regs[dst_off], regs[src_off], strict=True))
                if d is not None and (mask is None or mask[t])
            ]
            w.pending.append((regs[dst_buf], regs[src_buf], pairs, n))

        return async_copy

    def _async_wait(self, i: int, x: Instr) -> Step:
        # the copies since the last wait become one group; the oldest groups land until `in_flight` are left, which
        # land at a later wait (the latest the hardware may land them: reading them earlier sees old contents)
        in_flight = int(x.arg or 0)

        def async_wait(regs: list[Any], w: _Warp) -> None:
            w.groups.append(w.pending)
            w.pending = []
            while len(w.groups) > in_flight:
                for dst, src, pairs, n in w.groups.pop(0):
                    for d, o in pairs:
                        for k in range(n):
                            # a copy whose global INDEX is not valid writes zeros
                            dst[d + k] = src[o + k] if o is not None else 0

        return async_wait

    def _ldmatrix(self, i: int, x: Instr) -> Step:
        # ldmatrix.sync.aligned.m8n8: the rows' addresses come from the first 8 * matrices threads of the warp, and
        # every element lands in the lane the PTX ISA's fragment layout gives it
        matrices, trans = x.arg
        if matrices not in (1, 2, 4) or x.dtype.count != 2 * matrices or x.dtype.scalar().itemsize != 2:
            raise ValueError(f"LDMATRIX {i}: {matrices} matrices of 16-bit elements can't fill a {x.dtype!r}")
        buf, off, stride = self._memory_operands(i, Instr(Ops.LOAD, x.dtype, x.src[:1], None))
        if stride != 1 or self.instrs[self.instrs[x.src[0]].src[0]].op is not Ops.DEFINE_LOCAL:
            raise ValueError(f"LDMATRIX {i} reads scalar elements of local memory")
        r = self.reg[i]

        def ldmatrix(regs: list[Any], w: _Warp) -> None:
            if w.mask is not None:
                raise InterpreterError(f"LDMATRIX {i} runs on a warp where some threads are inactive")
            mem, rows = regs[buf], regs[off]
            if len(rows) != WARP_SIZE:
                raise InterpreterError(f"LDMATRIX {i} runs on a partial warp of {len(rows)} threads")
            for row in rows[: 8 * matrices]:
                if row is None or row < 0 or row % 8:
                    raise InterpreterError(f"LDMATRIX {i}: row address {row} is not 16-byte aligned in local memory")
            out = []
            for lane in range(WARP_SIZE):
                g, t = divmod(lane, 4)
                vals = []
                for m in range(matrices):
                    for c in (2 * t, 2 * t + 1):
                        vals.append(mem[rows[8 * m + c] + g] if trans else mem[rows[8 * m + g] + c])
                out.append(tuple(vals))
            regs[r] = out

        return ldmatrix

    def _wgmma(self, i: int, x: Instr) -> Step:
        # a group of threads reads A and B from local memory at the addresses its first thread gives, each by its
        # `SharedMatrix` layout (the PTX ISA's wgmma descriptors); C comes and goes in registers by layout_C
        fn = shared_wgmma_function(x.arg)
        a_buf, a_off, _ = self._memory_operands(i, Instr(Ops.LOAD, x.dtype, x.src[:1], None))
        b_buf, b_off, _ = self._memory_operands(i, Instr(Ops.LOAD, x.dtype, x.src[1:2], None))
        for src in x.src[:2]:
            if self.instrs[self.instrs[src].src[0]].op is not Ops.DEFINE_LOCAL:
                raise ValueError(f"WGMMA {i} reads its operands from local memory (an INDEX into a DEFINE_LOCAL)")
        r, c = self.reg[i], self.reg[x.src[2]]

        def wgmma(regs: list[Any], w: _Warp) -> None:
            if w.mask is not None:
                raise InterpreterError(f"WGMMA {i} runs on a warp where some threads are inactive")
            try:
                regs[r] = fn(regs[a_buf], regs[a_off], regs[b_buf], regs[b_off], regs[c])
            except (IndexError, ValueError) as exc:
                raise InterpreterError(f"WGMMA {i}: {exc}") from None

        return wgmma

    def _mbarrier(self, i: int, x: Instr) -> Callable[[list[Any], int], tuple[int, int]]:
        """The function giving the key (DEFINE_LOCAL, element) of thread t's mbarrier in an MBARRIER_* op or a
        TMA_LOAD (its INDEX: the first source, a TMA_LOAD's third)."""
        k = 2 if x.op is Ops.TMA_LOAD else 0
        ptr = self.instrs[x.src[k]]
        buf = self.instrs[ptr.src[0]] if ptr.op is Ops.INDEX else None
        if buf is None or buf.op is not Ops.DEFINE_LOCAL or buf.dtype.base != dtypes.uint64:
            raise ValueError(f"{x.op.name} {i}: its barrier must be an INDEX into a DEFINE_LOCAL of uint64")
        local, off, size = ptr.src[0], self.reg[x.src[k]], buf.dtype.size

        def where(regs: list[Any], t: int) -> tuple[int, int]:
            o = regs[off][t]
            if o is None or not 0 <= o < size:
                raise InterpreterError(f"mbarrier {o} is outside DEFINE_LOCAL {local}, which holds {size}")
            return local, o

        return where

    def _mbarrier_init(self, i: int, x: Instr) -> Step:
        arrivals = x.arg
        if not isinstance(arrivals, int) or isinstance(arrivals, bool) or not 0 < arrivals < 1 << 20:
            raise ValueError(f"MBARRIER_INIT {i}: its arg, the arrivals, is an int from 1 to 2**20 - 1: {arrivals!r}")
        where, gate = self._mbarrier(i, x), self.reg[x.src[1]]

        def mbarrier_init(regs: list[Any], w: _Warp) -> None:
            for t in _gated(regs[gate], w.mask):
                local, o = key = where(regs, t)
                old = w.mbarriers.get(key)
                if old is not None and (old.copies or old.expected or old.pending != old.arrivals):
                    raise InterpreterError(f"MBARRIER_INIT of {old}, in the middle of a phase")
                w.mbarriers[key] = _Mbarrier(f"mbarrier {o} of DEFINE_LOCAL {local}", arrivals)

        return mbarrier_init

    def _mbarrier_expect(self, i: int, x: Instr) -> Step:
        n = x.arg
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < 1 << 20:
            raise ValueError(f"MBARRIER_EXPECT {i}: its arg, the bytes, is an int from 0 to 2**20 - 1, not {n!r}")
        where, gate = self._mbarrier(i, x), self.reg[x.src[1]]

        def mbarrier_expect(regs: list[Any], w: _Warp) -> None:
            for t in _gated(regs[gate], w.mask):
                bar = _initialized(w, where(regs, t))
                if not bar.pending:
                    raise InterpreterError(
                        f"an arrival at {bar}, which has all its arrivals: one too many, or one for the next phase "
                        "before any thread waited for this one"
                    )
                bar.expected += n
                bar.pending -= 1
                if not bar.pending and not bar.copies and bar.expected == bar.landed:
                    bar.complete()  # nothing to land: the phase completes at its last arrival, as on hardware

        return mbarrier_expect

    def _mbarrier_wait(self, i: int, x: Instr) -> Step:
        # the phase lands its copies only here, when a thread needs them; a wait for the other parity returns at once
        where, parity = self._mbarrier(i, x), self.reg[x.src[1]]

        def mbarrier_wait(regs: list[Any], w: _Warp) -> None:
            mask = w.mask
            for t, p in enumerate(regs[parity]):
                if mask is not None and not mask[t]:
                    continue
                bar = _initialized(w, where(regs, t))
                if p not in (0, 1):
                    raise InterpreterError(f"a wait on {bar} for parity {p}, not 0 or 1")
                if bar.phase % 2 != p:
                    continue  # the phase before the current one, of parity p, has completed
                if bar.pending:
                    raise InterpreterError(f"a wait on {bar} would hang: no thread arrived for the missing arrivals")
                bar.land()
                if bar.expected != bar.landed:
                    raise InterpreterError(f"a wait on {bar} would hang: other than the announced bytes landed")
                bar.complete()

        return mbarrier_wait

    def _tma_load(self, i: int, x: Instr) -> Step:
        tmap = x.arg
        if not isinstance(tmap, TensorMap):
            raise ValueError(f"TMA_LOAD {i}: its arg is a TensorMap, not {tmap!r}")
        rank = len(tmap.dims)
        dst = self.instrs[x.src[0]]
        if len(x.src) < 4 + rank or dst.op is not Ops.INDEX or self.instrs[dst.src[0]].op is not Ops.DEFINE_LOCAL:
            raise ValueError(
                f"TMA_LOAD {i} takes an INDEX into a DEFINE_LOCAL, a DEFINE_GLOBAL, a barrier, a gate and {rank} "
                f"coordinates (then ordering deps), got {[self.instrs[s].op.name for s in x.src]}"
            )
        if self.instrs[x.src[1]].op is not Ops.DEFINE_GLOBAL:
            raise ValueError(f"TMA_LOAD {i}: its tensor must be a DEFINE_GLOBAL, not {self.instrs[x.src[1]].op}")
        where, gate, item = self._mbarrier(i, x), self.reg[x.src[3]], self.instrs[dst.src[0]].dtype.base.itemsize
        dst_buf, dst_off, src_buf = self.reg[dst.src[0]], self.reg[x.src[0]], self.reg[x.src[1]]
        coords = [self.reg[c] for c in x.src[4 : 4 + rank]]

        def tma_load(regs: list[Any], w: _Warp) -> None:
            for t in _gated(regs[gate], w.mask):
                bar, d = _initialized(w, where(regs, t)), regs[dst_off][t]
                if d is None:
                    raise InterpreterError("the destination INDEX of a TMA_LOAD is not valid")
                local, tensor = memory_bytes(regs[dst_buf]), memory_bytes(regs[src_buf])
                bar.copies.append(_tma_copy(tmap, local, tensor, d * item, [regs[c][t] for c in coords]))

        return tma_load

    def _barrier(self, i: int, x: Instr) -> Step:
        def barrier(regs: list[Any], w: _Warp) -> int:
            return _BARRIER

        return barrier

    # *** running ***

    def __call__(
        self,
        bufs: Sequence[memoryview],
        global_size: Sequence[int] = (1, 1, 1),
        local_size: Sequence[int] = (1, 1, 1),
        vals: Sequence[int] = (),
    ) -> None:
        """Run the program on `bufs` (one per DEFINE_GLOBAL, in slot order) for `global_size` workgroups of
        `local_size` threads, with `vals` for its DEFINE_VARs in order."""
        ins = self.instrs
        if len(bufs) != len(self.globals):
            raise ValueError(f"the program takes {len(self.globals)} buffers, got {len(bufs)}")
        if len(vals) != len(self.vars):
            raise ValueError(f"the program takes {len(self.vars)} variable values, got {len(vals)}")
        for i, v in zip(self.vars, vals, strict=True):
            name, lo, hi = ins[i].arg
            if not lo <= v <= hi:
                raise ValueError(f"variable {name}={v} is outside its bounds [{lo}, {hi}]")
        gsize, lsize = _dims(global_size, "global_size"), _dims(local_size, "local_size")
        for i in self.specials:
            name, size = ins[i].arg
            kind, d = _SPECIAL_NAMES[name]
            launched = (gsize if kind == "gidx" else lsize)[d]
            if size is not None and launched != size:
                raise ValueError(f"SPECIAL {name} has size {size} but the launch has {launched} along that axis")
        mems = {i: memory(ins[i].dtype.base, buf) for i, buf in zip(self.globals, bufs, strict=True)}
        n_threads = math.prod(lsize)
        lids = [(t % lsize[0], t // lsize[0] % lsize[1], t // (lsize[0] * lsize[1])) for t in range(n_threads)]
        warps_lids = [lids[k : k + self.warp_size] for k in range(0, n_threads, self.warp_size)]
        for gz, gy, gx in itertools.product(range(gsize[2]), range(gsize[1]), range(gsize[0])):
            shared = {i: self._new_local(ins[i].dtype) for i in self.locals}
            mbarriers: dict[tuple[int, int], _Mbarrier] = {}
            warps = [self._new_warp(wl, (gx, gy, gz), mems, shared, vals, mbarriers) for wl in warps_lids]
            self._run_workgroup(warps)
            for bar in mbarriers.values():
                if bar.copies:
                    # on hardware they would write local memory that the next workgroup may already use
                    raise InterpreterError(
                        f"workgroup {(gx, gy, gz)} finished with TMA_LOAD copies to {bar} in flight: no thread waited"
                    )

    def _new_local(self, dt: DType) -> Any:
        if not isinstance(dt, PtrDType) or dt.size < 0:
            raise ValueError(f"DEFINE_LOCAL needs a pointer dtype with a known size, got {dt!r}")
        return memory(dt.base, memoryview(bytearray(max(dt.size, 1) * dt.base.itemsize)))

    def _fixed(self, width: int) -> list[Any]:
        """Registers holding the program's constants for a warp of `width` threads (shared: values are never
        mutated, only replaced)."""
        if width not in self._fixed_cache:
            regs: list[Any] = [None] * len(self.instrs)
            for i, x in enumerate(self.instrs):
                if x.op is Ops.CONST or x.op is Ops.VCONST:
                    regs[i] = [_const_value(x)] * width
            self._fixed_cache[width] = regs
        return self._fixed_cache[width]

    def _new_warp(
        self,
        lids: list[tuple[int, int, int]],
        gid: tuple[int, int, int],
        mems: dict[int, Any],
        shared: dict[int, Any],
        vals: Sequence[int],
        mbarriers: dict[tuple[int, int], _Mbarrier],
    ) -> _Warp:
        width = len(lids)
        regs = list(self._fixed(width))
        for i, mem in itertools.chain(mems.items(), shared.items()):
            regs[i] = mem
        for i, v in zip(self.vars, vals, strict=True):
            regs[i] = [v] * width
        for i in self.specials:
            kind, d = _SPECIAL_NAMES[self.instrs[i].arg[0]]
            regs[i] = [gid[d]] * width if kind == "gidx" else [lid[d] for lid in lids]
        return _Warp(regs, mbarriers)

    def _run_workgroup(self, warps: list[_Warp]) -> None:
        pending = warps
        while pending:
            stopped = [w for w in pending if not self._run(w)]
            if stopped and len(stopped) != len(pending):
                raise InterpreterError(
                    f"a BARRIER was reached by {len(stopped)} of the {len(pending)} running warps of a workgroup; "
                    "the others finished, so the barrier would never open"
                )
            if len({w.pc for w in stopped}) > 1:
                raise InterpreterError("warps of one workgroup wait at different BARRIERs")
            pending = stopped

    def _run(self, w: _Warp) -> bool:
        """Run warp `w` until it finishes (True) or stops at a barrier (False)."""
        steps, regs, pc = self.steps, w.regs, w.pc
        n = len(steps)
        try:
            while pc < n:
                nxt = steps[pc](regs, w)
                if nxt is None:
                    pc += 1
                elif nxt >= 0:
                    pc = nxt
                else:
                    w.pc = pc + 1
                    return False
        except Exception as exc:
            i = self.step_instr[pc]
            x = self.instrs[i]
            raise InterpreterError(f"instruction {i} ({x.op.name} {x.dtype!r}) failed: {exc}") from exc
        w.pc = pc
        return True


def _dims(size: Sequence[int], what: str) -> tuple[int, int, int]:
    dims = tuple(size) + (1,) * (3 - len(size))
    if len(dims) != 3 or any(not isinstance(d, int) or d < 1 for d in dims):
        raise ValueError(f"{what} must be up to three positive ints, got {size!r}")
    return dims  # type: ignore[return-value]


def _gated(gates: list[Any], mask: list[bool] | None) -> list[int]:
    """The threads of a warp that run a gated op: the active ones whose gate is true."""
    return [t for t, g in enumerate(gates) if g and (mask is None or mask[t])]


def _initialized(w: _Warp, key: tuple[int, int]) -> _Mbarrier:
    """The mbarrier at `key` of the warp's workgroup, which an MBARRIER_INIT must have set up."""
    bar = w.mbarriers.get(key)
    if bar is None:
        raise InterpreterError(f"mbarrier {key[1]} of DEFINE_LOCAL {key[0]} is used before an MBARRIER_INIT")
    return bar


def _const_value(x: Instr) -> Any:
    scalar = x.dtype.scalar()
    if x.dtype.count == 1:
        return to_value(scalar, x.arg)
    args = x.arg if isinstance(x.arg, tuple) else (x.arg,) * x.dtype.count
    return tuple(to_value(scalar, a) for a in args)


_BUILDERS: dict[Ops, Callable[[Interpreter, int, Instr], Step]] = {
    Ops.CAST: Interpreter._convert,
    Ops.BITCAST: Interpreter._convert,
    Ops.VECTORIZE: Interpreter._vectorize,
    Ops.GEP: Interpreter._gep,
    Ops.INDEX: Interpreter._index,
    Ops.LOAD: Interpreter._load,
    Ops.STORE: Interpreter._store,
    Ops.DEFINE_ACC: Interpreter._define_acc,
    Ops.ASSIGN: Interpreter._assign,
    Ops.RANGE: Interpreter._range,
    Ops.END: Interpreter._end,
    Ops.IF: Interpreter._if,
    Ops.ENDIF: Interpreter._endif,
    Ops.BARRIER: Interpreter._barrier,
    Ops.ASYNC_COPY: Interpreter._async_copy,
    Ops.ASYNC_WAIT: Interpreter._async_wait,
    Ops.LDMATRIX: Interpreter._ldmatrix,
    Ops.WMMA: Interpreter._wmma,
    Ops.WGMMA: Interpreter._wgmma,
    Ops.SHUFFLE_XOR: Interpreter._shuffle_xor,
    Ops.MBARRIER_INIT: Interpreter._mbarrier_init,
    Ops.MBARRIER_EXPECT: Interpreter._mbarrier_expect,
    Ops.MBARRIER_WAIT: Interpreter._mbarrier_wait,
    Ops.TMA_LOAD: Interpreter._tma_load,
}
