"""`Ops`: the one operation enum shared by the three levels of the IR.

1. Tensor graph (built by the frontend): BUFFER, CONST, DEVICE, movement ops, ALU ops, REDUCE_AXIS,
   CAST, BITCAST, ASSIGN, COPY, CONTIGUOUS, DETACH, KERNEL, and MULTI (one value on several devices).
2. Kernel AST (emitted by the scheduler): SINK of STOREs; LOADs of DEFINE_GLOBALs indexed through VIEWs;
   ALU ops, REDUCE_AXIS, CONST, DEFINE_VAR.
3. Linear program (lowered by codegen, rendered by a Renderer): DEFINE_GLOBAL, DEFINE_LOCAL, DEFINE_VAR,
   DEFINE_ACC, SPECIAL, RANGE/END, IF/ENDIF, INDEX, LOAD, STORE, ASSIGN, BARRIER, VECTORIZE, GEP, WMMA, SHUFFLE_XOR,
   ASYNC_COPY/ASYNC_WAIT, LDMATRIX, WGMMA, MBARRIER_INIT/EXPECT/WAIT, TMA_LOAD, ALU ops.

The operand conventions of each op are documented in `OP_DOCS` so every package reads the same contract.
"""

from __future__ import annotations

from enum import Enum, auto


class Ops(Enum):
    """Every operation of the IR. Value order is the canonical sort order used by the symbolic engine."""

    # leaves / definitions
    SINK = auto()
    DEFINE_GLOBAL = auto()
    DEFINE_LOCAL = auto()
    DEFINE_VAR = auto()
    DEFINE_ACC = auto()
    SPECIAL = auto()
    RANGE = auto()
    CONST = auto()
    VCONST = auto()
    DEVICE = auto()
    BUFFER = auto()
    BIND = auto()
    UNIQUE = auto()
    NOOP = auto()

    # tensor graph
    KERNEL = auto()
    VIEW = auto()
    RESHAPE = auto()
    EXPAND = auto()
    PERMUTE = auto()
    PAD = auto()
    SHRINK = auto()
    FLIP = auto()
    COPY = auto()
    CONTIGUOUS = auto()
    DETACH = auto()
    ASSIGN = auto()
    REDUCE_AXIS = auto()
    MULTI = auto()

    # memory and control
    INDEX = auto()
    LOAD = auto()
    STORE = auto()
    BARRIER = auto()
    IF = auto()
    ENDIF = auto()
    END = auto()

    # vectors and tensor cores
    VECTORIZE = auto()
    GEP = auto()
    WMMA = auto()

    # threads of one warp
    SHUFFLE_XOR = auto()

    # unary
    CAST = auto()
    BITCAST = auto()
    EXP2 = auto()
    LOG2 = auto()
    SIN = auto()
    SQRT = auto()
    RECIP = auto()
    NEG = auto()
    TRUNC = auto()

    # binary
    ADD = auto()
    MUL = auto()
    IDIV = auto()
    MOD = auto()
    MAX = auto()
    CMPLT = auto()
    CMPNE = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    SHL = auto()
    SHR = auto()
    THREEFRY = auto()

    # ternary
    WHERE = auto()
    MULACC = auto()

    # asynchronous copies from global into local memory (last, so the ops above keep their sort order)
    ASYNC_COPY = auto()
    ASYNC_WAIT = auto()
    LDMATRIX = auto()
    WGMMA = auto()
    # the tensor memory accelerator's copies and the barriers that count their bytes (Hopper)
    MBARRIER_INIT = auto()
    MBARRIER_EXPECT = auto()
    MBARRIER_WAIT = auto()
    TMA_LOAD = auto()

    # Members are singletons compared by identity, so the identity hash agrees with equality; Enum's own hashes the
    # member's name in Python, a call that every `op in GroupOp.X` and op-keyed dict paid (about 4x slower).
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Ops.{self.name}"


class GroupOp:
    """Sets of ops that rules and passes treat alike."""

    Unary = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.NEG, Ops.TRUNC})
    Binary = frozenset(
        {Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
        | {Ops.SHL, Ops.SHR, Ops.THREEFRY}
    )
    Ternary = frozenset({Ops.WHERE, Ops.MULACC})
    ALU = Unary | Binary | Ternary
    Elementwise = ALU | {Ops.CAST, Ops.BITCAST}
    Movement = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.PAD, Ops.SHRINK, Ops.FLIP})
    Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR})
    Associative = frozenset({Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.MAX})
    Comparison = frozenset({Ops.CMPLT, Ops.CMPNE})
    # ops where f(x, 0) == x, so masked-out (zero) inputs leave the result unchanged
    IdempotentZero = frozenset({Ops.ADD, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR})
    Defines = frozenset({Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.DEFINE_VAR, Ops.DEFINE_ACC})
    Block = frozenset({Ops.RANGE, Ops.IF})
    BlockEnd = frozenset({Ops.END, Ops.ENDIF})


OP_DOCS: dict[Ops, str] = {
    Ops.SINK: "src: the outputs (STOREs in a kernel AST, anything in a tensor graph); arg: KernelInfo or None",
    Ops.BUFFER: "tensor graph: src=(UNIQUE, DEVICE); arg=size in elements; dtype=element dtype",
    Ops.DEVICE: "arg: canonical device name, e.g. 'CPU'",
    Ops.UNIQUE: "arg: an int that makes a BUFFER distinct from every other",
    Ops.CONST: "arg: the Python value; in a tensor graph src=(VIEW,) gives it a shape",
    Ops.VIEW: "arg: a ShapeTracker; src=(x,) applies it to x, or () inside a kernel AST for CONST",
    Ops.KERNEL: "src: per parameter slot the BUFFER or the ASSIGN that writes it (outputs first), then ordering deps;"
    " arg: Kernel(ast, n_outputs, n_slots)",
    Ops.ASSIGN: "tensor graph: src=(target BUFFER view, value); linear: src=(DEFINE_ACC, new value)",
    Ops.REDUCE_AXIS: "src=(x,); arg=(Ops.ADD|Ops.MAX|Ops.MUL, axes tuple)",
    Ops.COPY: "src=(DEVICE, x): x copied to the device",
    Ops.MULTI: "tensor graph: src=one node per device (each on its own device, all of one shape and dtype); arg=the"
    " axis they are concatenated along (sharded), or None: each holds the whole value (replicated)",
    Ops.DEFINE_GLOBAL: "dtype=PtrDType; arg=parameter slot index",
    Ops.DEFINE_LOCAL: "dtype=PtrDType(local=True); arg=name",
    Ops.DEFINE_VAR: "dtype=int; arg=(name, min, max)",
    Ops.DEFINE_ACC: "src=(initial value, *RANGEs it accumulates over); arg=(accumulator number,)",
    Ops.SPECIAL: "dtype=int; arg=(name, size): a hardware index, e.g. ('gidx0', 64) or ('lidx1', 16), or the CPU's"
    " ('core0', n): the outermost parallel axis, run over a [start, end) range per thread",
    Ops.RANGE: "dtype=int; src=(end,); arg=axis number: loops from 0 to end-1",
    Ops.END: "src=(RANGE,): closes that loop",
    Ops.IF: "src=(gate,); ENDIF src=(IF,)",
    Ops.INDEX: "src=(DEFINE_GLOBAL|DEFINE_LOCAL, index[, valid]): the address of one element",
    Ops.LOAD: "kernel AST: src=(DEFINE_GLOBAL, VIEW); linear: src=(INDEX[, alt, gate]) or (INDEX, barrier)",
    Ops.STORE: "kernel AST: src=(DEFINE_GLOBAL, VIEW, value); linear: src=(INDEX, value[, gate])",
    Ops.VECTORIZE: "src: scalars that form one vector value",
    Ops.GEP: "src=(vector,); arg=tuple of lane numbers",
    Ops.WMMA: "src=(A, B, C) vectors; arg=(name, (N, M, K), dtype_in, dtype_out, threads,"
    " (A, B, C elements per thread), layout[, input mantissa bits]): one tensor-core instruction, laid out as"
    " TensorCore.swizzle says; the eighth entry, where there is one, is TensorCore.input_mantissa_bits",
    Ops.SHUFFLE_XOR: "src=(x,) a scalar; arg=offset, a power of two below the renderer's warp_size: the value of x in"
    " the thread of the same warp whose lane is this thread's lane XOR offset (lane: the thread's linear index in its"
    " workgroup, x fastest, modulo warp_size); every thread of the warp runs it together, none masked off"
    " (CUDA __shfl_xor_sync, Metal simd_shuffle_xor)",
    Ops.ASYNC_COPY: "src=(INDEX into a DEFINE_LOCAL, INDEX into a DEFINE_GLOBAL[, ordering deps]); arg=elements:"
    " starts copying that many consecutive elements, zeros where the global INDEX's valid is false; the copy lands"
    " no later than the thread's next ASYNC_WAIT, and nothing may read or write its destination before then"
    " (CUDA cp.async, renderers with has_async_copy)",
    Ops.ASYNC_WAIT: "src: ordering deps (the copies it must follow in program order, a RANGE to run in a loop);"
    " arg=groups left in flight (None or 0: none): makes the ASYNC_COPYs this thread started since its last ASYNC_WAIT"
    " one group and waits until all but the latest `arg` groups have landed; a BARRIER after it makes them visible to"
    " the workgroup",
    Ops.LDMATRIX: "src=(INDEX into a DEFINE_LOCAL of 16-bit elements[, ordering deps]); arg=(matrices, trans): a"
    " warp loads that many (1, 2 or 4) 8x8 matrices, thread t giving the address of row t % 8 of matrix t // 8 (8"
    " consecutive elements, 16-byte aligned); lane l gets 2 elements per matrix i, at lanes 2i and 2i+1: row l // 4,"
    " columns 2(l % 4) and 2(l % 4) + 1, or with trans those of the transposed matrix; every thread of the warp runs it"
    " together (CUDA ldmatrix.sync.aligned.m8n8, renderers with has_ldmatrix)",
    Ops.WGMMA: "src=(INDEX into a DEFINE_LOCAL: A's origin, INDEX into a DEFINE_LOCAL: B's origin, C vector[, ordering"
    " deps]); arg=((N, M, K), dtype_in, dtype_out, threads, layout_C, A's shared layout, B's shared layout): one"
    " tensor-core instruction whose A (M x K) and B (K x N) the hardware reads from local memory itself, each from"
    " its origin by a shared layout (major, leading byte offset, stride byte offset, swizzle bytes) as the PTX ISA's"
    " wgmma matrix descriptors say (`lazygrad_uop.device.SharedMatrix`); C and the result are laid out by layout_C"
    " (TensorCore.swizzle's third entry); every thread of the group of `threads` consecutive threads runs it together"
    " (CUDA wgmma.mma_async on sm_90a)",
    Ops.MBARRIER_INIT: "src=(INDEX into a DEFINE_LOCAL of uint64: the barrier, gate[, ordering deps]); arg=arrivals:"
    " the threads whose gate is true (one) set the barrier to its phase 0, which completes once `arrivals` threads"
    " have arrived and every byte they announced has landed (CUDA mbarrier.init, renderers with has_tma)",
    Ops.MBARRIER_EXPECT: "src=(INDEX of a barrier, gate[, ordering deps]); arg=bytes: the threads whose gate is true"
    " arrive at the barrier's current phase and announce `bytes` more that TMA_LOADs will land in it (CUDA"
    " mbarrier.arrive.expect_tx)",
    Ops.MBARRIER_WAIT: "src=(INDEX of a barrier, parity (int)[, ordering deps]): the thread waits until the barrier's"
    " phase of that parity (0 for its phases 0, 2, 4 ...) has completed; what the TMA_LOADs of that phase wrote is"
    " then visible to it (CUDA mbarrier.try_wait.parity in a loop)",
    Ops.TMA_LOAD: "src=(INDEX into a DEFINE_LOCAL: the box's first element, DEFINE_GLOBAL: the tensor, INDEX of a"
    " barrier, gate, one int coordinate per dim of the map, innermost first[, ordering deps]); arg=TensorMap: the"
    " threads whose gate is true start copying the map's box at those coordinates into local memory (zeros where it"
    " reaches past the tensor, rows swizzled by the map's swizzle) and count its bytes against the barrier's current"
    " phase (CUDA cp.async.bulk.tensor, renderers with has_tma)",
}
