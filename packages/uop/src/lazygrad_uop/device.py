"""The device interfaces every backend implements: memory (`Allocator`, `Buffer`), compilation (`Compiler`),
execution (`Program`), code generation targets (`Renderer`, `TensorCore`) and the bundle of them (`CompiledDevice`).

A device package subclasses these and hands a `CompiledDevice` to the registry through its plugin hooks.
"""

from __future__ import annotations

import abc
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lazygrad_uop.config import DISABLE_COMPILER_CACHE
from lazygrad_uop.diskcache import diskcache_get, diskcache_put
from lazygrad_uop.dtype import DType, dtypes

if TYPE_CHECKING:
    from lazygrad_uop.uop import UOp


@dataclass(frozen=True)
class BufferSpec:
    """How a buffer's memory is allocated. The defaults are ordinary device memory, recycled through the LRU cache.

    uncached: memory the device must not cache (e.g. for buffers shared with another agent).
    cpu_access: memory the host can map and read directly.
    host: memory that lives on the host (pinned staging memory for transfers).
    nolru: when freed, return the memory to the device at once instead of keeping it for reuse.
    """

    uncached: bool = False
    cpu_access: bool = False
    host: bool = False
    nolru: bool = False


class Allocator(abc.ABC):
    """Device memory. Subclasses implement the underscored primitives; callers use the public methods, which check
    their arguments so that a backend never sees a nonsense size.

    A handle is whatever the backend uses to name an allocation (a pointer, a driver object, a bytearray).
    """

    offset_alignment: int = 1
    """The bytes a sub-buffer's offset (`_offset`) must be a multiple of (OpenCL: the device's base address
    alignment); the memory planner places views at multiples of it."""

    def alloc(self, size: int, options: BufferSpec | None = None) -> Any:
        """Allocate `size` bytes and return the backend's handle for them."""
        return self._alloc(_check_size(size), options if options is not None else BufferSpec())

    def free(self, handle: Any, size: int, options: BufferSpec | None = None) -> None:
        """Give back memory that `alloc(size, options)` returned."""
        self._free(handle, options if options is not None else BufferSpec())

    def copyin(self, dest: Any, src: memoryview) -> None:
        """Copy the bytes of host memory `src` into device memory `dest`."""
        self._copyin(dest, _as_bytes(src, "copyin source"))

    def copyout(self, dest: memoryview, src: Any) -> None:
        """Copy device memory `src` into the writable host memory `dest`, which fixes how many bytes are copied."""
        view = _as_bytes(dest, "copyout destination")
        if view.readonly:
            raise ValueError("copyout destination is read-only; pass a writable memoryview (e.g. of a bytearray)")
        self._copyout(view, src)

    @abc.abstractmethod
    def _alloc(self, size: int, options: BufferSpec) -> Any: ...

    @abc.abstractmethod
    def _free(self, handle: Any, options: BufferSpec) -> None: ...

    @abc.abstractmethod
    def _copyin(self, dest: Any, src: memoryview) -> None: ...

    @abc.abstractmethod
    def _copyout(self, dest: memoryview, src: Any) -> None: ...

    def _transfer(
        self, dest: Any, src: Any, size: int, src_device: CompiledDevice, dest_device: CompiledDevice
    ) -> None:
        """Copy `size` bytes between two devices of this kind without going through the host (optional)."""
        raise NotImplementedError(f"{type(self).__name__} can't transfer between devices; copy through the host")

    _as_buffer: Callable[[Any], memoryview] | None = None
    """Optional, for devices whose memory the host can address (the CPU, PYTHON): a method returning the handle's
    bytes as a writable memoryview shared with the device memory, so that reading a tensor needs no copy. None where
    the device has no such memory; the frontend then copies out."""

    shares_host_memory: bool = False
    """True for allocators whose handles are host memory of this process that compiled kernels take by address (the
    CPU's): a kernel on one device of this kind can then read another's buffers in place, with no copy between them.
    `lazygrad_uop.registry.shares_host_memory` asks it of two devices; the scheduler reads a copy between two such
    devices in place (lazygrad_scheduler.placement)."""

    def _offset(self, handle: Any, size: int, offset: int) -> Any:
        """A handle for the `size` bytes at byte `offset` of `handle`, sharing its memory (optional)."""
        raise NotImplementedError(f"{type(self).__name__} does not support sub-buffers (views with an offset)")


class LRUAllocator(Allocator):
    """An allocator that keeps freed memory to hand out again for the next allocation of the same size and options,
    since asking a device driver for memory is slow. When an allocation fails for lack of memory, the kept memory is
    released and the allocation is tried once more.
    """

    # Backends whose driver reports exhaustion with another exception extend this.
    oom_errors: ClassVar[tuple[type[BaseException], ...]] = (MemoryError,)

    def __init__(self) -> None:
        self.cache: defaultdict[tuple[int, BufferSpec], list[Any]] = defaultdict(list)

    def alloc(self, size: int, options: BufferSpec | None = None) -> Any:
        """Allocate `size` bytes, reusing freed memory of the same size and options when there is some."""
        size, options = _check_size(size), options if options is not None else BufferSpec()
        if kept := self.cache.get((size, options)):
            return kept.pop()
        try:
            return self._alloc(size, options)
        except self.oom_errors:
            self.free_cache()
            return self._alloc(size, options)

    def free(self, handle: Any, size: int, options: BufferSpec | None = None) -> None:
        """Keep `handle` for reuse, or give it back to the device at once if its options say `nolru`."""
        options = options if options is not None else BufferSpec()
        if options.nolru:
            self._free(handle, options)
        else:
            self.cache[(size, options)].append(handle)

    def free_cache(self) -> None:
        """Give every kept allocation back to the device."""
        for (_, options), handles in self.cache.items():
            for handle in handles:
                self._free(handle, options)
        self.cache.clear()


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"allocation size must be a positive number of bytes, got {size!r}")
    return size


def _as_bytes(mem: memoryview | bytes | bytearray, what: str) -> memoryview:
    view = memoryview(mem)
    if not view.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous memory")
    # A flat byte view, so that backends only ever see byte counts, whatever format the caller's memory had.
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class MemoryUse:
    """Bytes of device memory that allocated buffers hold, per device, and the most held at once since the last
    `reset_peak`. Counts what `Buffer.allocate` obtained from an allocator (a view or caller-owned memory adds
    nothing), so memory kept in an allocator's LRU cache for reuse is not counted."""

    used: ClassVar[dict[str, int]] = {}
    peak: ClassVar[dict[str, int]] = {}

    @classmethod
    def change(cls, device: str, nbytes: int) -> None:
        """Record `nbytes` more (or, negative, fewer) bytes held on `device`."""
        now = cls.used[device] = cls.used.get(device, 0) + nbytes
        if now > cls.peak.get(device, 0):
            cls.peak[device] = now

    @classmethod
    def reset_peak(cls) -> None:
        """Start measuring the peak again from what is held now."""
        cls.peak = dict(cls.used)


class Buffer:
    """`size` elements of `dtype` on a device, or a view of part of another buffer (`base`, at byte `offset`).

    Memory is obtained lazily with `allocate()` from the device's allocator and returned to it (usually to its LRU
    cache) by `deallocate()` or when the buffer is garbage collected.
    """

    def __init__(
        self,
        device: str,
        size: int,
        dtype: DType,
        options: BufferSpec | None = None,
        base: Buffer | None = None,
        offset: int = 0,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"buffer size must be a non-negative number of elements, got {size!r}")
        self.device, self.size, self.dtype = device, size, dtype
        self.options = options if options is not None else BufferSpec()
        self.base, self.offset = base, offset
        if base is not None:
            if base.base is not None:
                raise ValueError("a buffer view's base must be a buffer, not another view; use the view's base")
            if base.device != device:
                raise ValueError(f"a view on {device} can't have its base on {base.device}")
            if offset < 0 or offset + self.nbytes > base.nbytes:
                raise ValueError(
                    f"view of {self.nbytes} bytes at offset {offset} doesn't fit in its base of {base.nbytes} bytes"
                )
        elif offset != 0:
            raise ValueError("only a view (a buffer with a base) can have an offset")
        self._handle: Any = None
        self._owned = False
        self.allocator: Allocator | None = None

    @property
    def nbytes(self) -> int:
        """Size of the buffer in bytes."""
        return self.size * self.dtype.itemsize

    @property
    def is_allocated(self) -> bool:
        """Whether the buffer has device memory."""
        return self._handle is not None

    @property
    def handle(self) -> Any:
        """The allocator's handle for this buffer's memory."""
        if self._handle is None:
            raise RuntimeError(f"{self!r} is not allocated; call allocate() first")
        return self._handle

    def allocate(self, opaque: Any = None) -> Buffer:
        """Give the buffer device memory: `opaque`, an existing handle the caller keeps ownership of, or a new
        allocation. A view allocates its base first and takes a handle to its part of it."""
        if self._handle is not None:
            raise RuntimeError(f"{self!r} is already allocated")
        from lazygrad_uop.registry import Device  # the registry imports this module

        self.allocator = Device[self.device].allocator
        if self.base is not None:
            if not self.base.is_allocated:
                self.base.allocate()
            self._handle = self.allocator._offset(self.base.handle, self.nbytes, self.offset)
        elif opaque is not None:
            self._handle = opaque
        else:
            # An empty buffer still gets a real (one byte) allocation, so every allocated buffer has a valid handle.
            self._handle, self._owned = self.allocator.alloc(max(self.nbytes, 1), self.options), True
            MemoryUse.change(self.device, self.nbytes)
        return self

    def deallocate(self) -> None:
        """Give the buffer's memory back to its allocator (if it allocated it) and forget it."""
        if self._handle is None:
            raise RuntimeError(f"{self!r} is not allocated")
        if self._owned:
            assert self.allocator is not None
            self.allocator.free(self._handle, max(self.nbytes, 1), self.options)
            MemoryUse.change(self.device, -self.nbytes)
        self._handle, self._owned = None, False

    def __del__(self) -> None:
        if getattr(self, "_owned", False):
            self.deallocate()

    def copyin(self, src: memoryview) -> Buffer:
        """Fill the buffer from host memory of exactly `nbytes` bytes."""
        view = _as_bytes(src, "copyin source")
        if view.nbytes != self.nbytes:
            raise ValueError(f"copyin of {view.nbytes} bytes into {self!r}, which holds {self.nbytes} bytes")
        if self.nbytes:
            self._allocator_for_copy().copyin(self.handle, view)
        return self

    def copyout(self, dest: memoryview) -> memoryview:
        """Copy the buffer into writable host memory of exactly `nbytes` bytes and return that memory."""
        view = _as_bytes(dest, "copyout destination")
        if view.nbytes != self.nbytes:
            raise ValueError(f"copyout of {self!r}, which holds {self.nbytes} bytes, into {view.nbytes} bytes")
        if self.nbytes:
            self._allocator_for_copy().copyout(view, self.handle)
        return dest

    def _allocator_for_copy(self) -> Allocator:
        if self.allocator is None or self._handle is None:
            raise RuntimeError(f"{self!r} is not allocated; call allocate() first")
        return self.allocator

    def __repr__(self) -> str:
        view = f" view of {self.base!r} at byte {self.offset}" if self.base is not None else ""
        return f"<Buffer {self.device} {self.size} x {self.dtype!r}{view}>"


class Compiler(abc.ABC):
    """Turns rendered source into a binary the device's `Program` can load.

    `cachekey` names the compiler and target (e.g. "compile_cuda_sm_80"); binaries are cached on disk under it.
    None disables caching, for compilers whose output depends on more than the source.

    `threadsafe`: `compile` may run on a worker thread while the caller's thread goes on (it releases the GIL while
    it works, and its output depends only on the source), so the kernels of a schedule compile while the next ones
    are generated. False keeps compiling on the caller's thread.
    """

    threadsafe: ClassVar[bool] = False

    def __init__(self, cachekey: str | None = None) -> None:
        self.cachekey = cachekey

    @abc.abstractmethod
    def compile(self, src: str) -> bytes:
        """Compile `src` to a binary. Raise `CompileError` with the compiler's message when it fails."""

    def worker_factory(self) -> tuple[Callable[..., Compiler], tuple] | None:
        """A picklable (callable, args) that builds an equal compiler in another process, so that kernels can
        compile in worker processes (`lazygrad_uop.compile_workers`) on every core; None (the default) compiles in
        this process only. Worth it for compilers that can't run on several threads of one process at once."""
        return None

    def compile_cached(self, src: str, compile: Callable[[str], bytes] | None = None) -> bytes:
        """`compile(src)` (by default this compiler's), through the on-disk cache unless `DISABLE_COMPILER_CACHE`
        is set."""
        compile = compile or self.compile
        if self.cachekey is None or DISABLE_COMPILER_CACHE.value:
            return compile(src)
        key = (self.cachekey, src)
        if (lib := diskcache_get("compiler", key)) is not None:
            return lib
        lib = compile(src)
        diskcache_put("compiler", key, lib)
        return lib


class CompileError(RuntimeError):
    """A compiler rejected the source it was given; the message holds the compiler's diagnostics."""


class Program(abc.ABC):
    """A compiled kernel, loaded on one opened device and ready to run: `Program(device, name, lib)` loads kernel
    `name` of `lib` (what the device's `Compiler` produced) on `device`, the `CompiledDevice` it runs on (its
    context, queue or library cache). `CompiledDevice.load_program(name, lib)` is how callers make one."""

    def __init__(self, device: CompiledDevice, name: str, lib: bytes) -> None:
        self.device, self.name, self.lib = device, name, lib

    @abc.abstractmethod
    def __call__(
        self,
        *bufs: Any,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        """Run the kernel on buffer handles `bufs` with symbolic variable values `vals`. With `wait`, block until it
        finishes and return its run time in seconds; without, return None."""


class Renderer(abc.ABC):
    """Turns a linear program of UOps into source for one target, and describes that target's limits.

    Subclasses set the class attributes `device` (the device name) and `suffix` (names kernels' source, e.g.
    "CUDA"), and the target's limits: whether float4 vectors, local (workgroup) dimensions and shared memory exist,
    the maximum global and local sizes per dimension (None: unlimited), the bytes of shared memory, and the tensor
    cores it can use. The limits are class-level defaults that an instance may set for the hardware it was made for
    (an OpenCL renderer takes the opened device's local sizes and shared memory).

    Limits the code generator's optimisations respect: `vector_width` (lanes of one vector ALU op and of an unaligned
    vector load or store; 1 means scalar arithmetic, with `supports_float4` still allowing aligned 2- and 4-element
    loads and stores, and `wide_vectors` aligned 16-byte loads and stores of narrower elements too: 8 halves, 16
    bytes), `max_upcast` (the register budget: the most elements a thread may hold for upcast and unrolled
    axes together), `max_workgroup_threads` (threads of one workgroup), `has_threads` (a host target that runs a
    kernel's outermost parallel loop across CPU cores: codegen turns that loop into `SPECIAL core0`), and `warp_size`
    (threads whose values `SHUFFLE_XOR` exchanges, a power of two dividing the hardware's warp; 0: no shuffles, so
    grouped reductions combine through shared memory only), `has_async_copy` (it renders `ASYNC_COPY` and
    `ASYNC_WAIT`: copies into local memory that overlap the math, CUDA's cp.async on sm_80 and newer),
    `has_ldmatrix` (it renders `LDMATRIX`: a warp's tensor-core fragments read from local memory as 8x8 matrices,
    CUDA's ldmatrix on sm_75 and newer), `has_tma` (it renders `TMA_LOAD` and the `MBARRIER_*` ops: boxes of a
    tensor copied into local memory by the tensor memory accelerator, Hopper's sm_90), and `compute_units` (the
    units that run workgroups or threads at once: a GPU's multiprocessors, a CPU's cores; 0 when unknown), which
    decides how finely a long reduction to few outputs is split.
    """

    device: ClassVar[str] = ""
    suffix: ClassVar[str] = ""
    supports_float4: bool = True
    wide_vectors: bool = False
    has_local: bool = True
    has_shared: bool = True
    has_threads: bool = False
    global_max: tuple[int, ...] | None = None
    local_max: tuple[int, ...] | None = None
    shared_max: int = 32768
    vector_width: int = 1
    max_upcast: int = 256
    max_workgroup_threads: int = 1024
    warp_size: int = 0
    has_async_copy: bool = False
    has_ldmatrix: bool = False
    has_tma: bool = False
    compute_units: int = 0
    # A tuple rather than a list so that subclasses can't mutate a default they share.
    tensor_cores: Sequence[TensorCore] = ()

    @abc.abstractmethod
    def render(self, uops: list[UOp]) -> str:
        """The source of the kernel whose linear program is `uops`."""

    def tensor_core_targets(self) -> tuple[str, ...]:
        """The targets (`TensorCoreSpec.target`) whose registered tensor-core descriptions this renderer runs, in
        order of preference: e.g. ("sm_86", "sm_80") for an sm_86 GPU, which also runs sm_80's instructions. The
        registry merges the descriptions of all of them and hands them to the renderer. None by default."""
        return ()

    def tensor_core_problem(self, tc: TensorCore, target: str) -> str | None:
        """None if this renderer can emit `tc` on `target`, else one line saying why not. The registry asks this of
        every description a plugin registers and rejects, with a warning naming the plugin, those it can't emit, so
        that a kernel never fails at render time. By default a renderer emits no tensor cores."""
        return f"{type(self).__name__} renders no tensor cores"

    def add_tensor_cores(self, tensor_cores: Sequence[TensorCore]) -> None:
        """Use `tensor_cores` in addition to the ones this renderer already has (the registry's hand-over)."""
        self.tensor_cores = tuple(dict.fromkeys((*self.tensor_cores, *tensor_cores)))


@dataclass(frozen=True)
class SharedMatrix:
    """Where a tensor core that reads its operands from local memory itself (Hopper's `wgmma`, a `WGMMA` UOp) finds
    each element of one operand, as the PTX ISA's shared memory matrix descriptors define it: one of the canonical
    layouts, in units of 16 bytes ("core matrix" rows of 16 bytes), for an operand of MN x K elements (M x K for A,
    N x K for B).

    - `major` "k": K-major, 8 rows of MN per core matrix, each row 16 bytes of K. Element (mn, k) is at byte
      (mn // 8) * sbo + (mn % 8) * row + k * itemsize within a swizzle atom, row = `swizzle` bytes (16 without
      swizzling, the next 16 bytes of K then `lbo` bytes further on).
    - `major` "mn": MN-major, rows of `swizzle` bytes of MN (16 without swizzling), 8 rows of K per atom. Element
      (mn, k) is at byte (mn // per_row) * lbo + (k // 8) * sbo + (k % 8) * row + (mn % per_row) * itemsize.
    - `swizzle` 128, 64 or 32: the address's bits 4-6 (which 16 bytes of a 128-byte line) are XORed with its bits 7-9
      (which line of 8), masked to the swizzle's width (3, 2 or 1 bits), as the hardware does on absolute shared
      addresses; a swizzled operand's layout therefore starts 1024-byte aligned. 0: no swizzling.

    `lbo` and `sbo` are bytes (the descriptor stores them over 16); `lbo` is unused by a swizzled K-major layout."""

    major: str
    lbo: int
    sbo: int
    swizzle: int = 128

    def __post_init__(self) -> None:
        if self.major not in ("k", "mn"):
            raise ValueError(f"a shared matrix is K-major ('k') or MN-major ('mn'), got {self.major!r}")
        if self.swizzle not in (0, 32, 64, 128):
            raise ValueError(f"swizzle is 0, 32, 64 or 128 bytes, got {self.swizzle!r}")
        if any(not isinstance(v, int) or v < 0 or v % 16 for v in (self.lbo, self.sbo)):
            raise ValueError(f"lbo and sbo are byte offsets, multiples of 16: got {self.lbo}, {self.sbo}")

    def address(self, start: int, mn: int, k: int, itemsize: int) -> int:
        """The byte address of element (mn, k) of the operand whose descriptor starts at byte `start`."""
        row = self.swizzle or 16
        per_row = row // itemsize
        if self.major == "k":
            if self.swizzle:
                plain = start + (mn // 8) * self.sbo + (mn % 8) * row + k * itemsize
            else:
                plain = (
                    start + (mn // 8) * self.sbo + (k // per_row) * self.lbo + (mn % 8) * 16 + (k % per_row) * itemsize
                )
        else:
            if self.swizzle:
                plain = start + (mn // per_row) * self.lbo + (k // 8) * self.sbo + (k % 8) * row
            else:
                plain = start + (mn // per_row) * self.sbo + (k // 8) * self.lbo + (k % 8) * 16
            plain += (mn % per_row) * itemsize
        return swizzled(plain, self.swizzle)


def swizzled(address: int, swizzle: int) -> int:
    """Byte `address` after the swizzle of `swizzle` bytes (128, 64, 32; 0 none) of `SharedMatrix`."""
    if not swizzle:
        return address
    mask = swizzle // 16 - 1
    return address ^ (((address >> 7) & mask) << 4)


TMA_MAX_RANK = 5
"""The most dims a `TensorMap` has (the tensor memory accelerator's tiled mode)."""
TMA_MAX_BOX = 256
"""The longest a `TensorMap`'s box is along any dim."""


@dataclass(frozen=True)
class TensorMap:
    """A tensor in global memory as Hopper's tensor memory accelerator (TMA, `cp.async.bulk.tensor`, a `TMA_LOAD`
    UOp) copies boxes of it into local memory; the CUDA driver encodes it as a `CUtensorMap` from the buffer's
    address (`cuTensorMapEncodeTiled`).

    - `dtype`: the scalar element type; `offset`: elements from the buffer's start to coordinate (0, ..., 0).
    - `dims`: the tensor's extents, innermost first (1 to `TMA_MAX_RANK`); `strides`: elements per step along each,
      `strides[0]` 1 (the innermost dim is contiguous).
    - `box`: the extents of the box one copy moves, innermost first, each 1 to `TMA_MAX_BOX`.
    - `swizzle`: 128, 64 or 32 bytes, or 0 for none. The box lands in local memory row-major (innermost fastest),
      each element's byte address then swizzled as `SharedMatrix`'s (`swizzled`: bits 4-6 XORed with bits 7-9) on the
      absolute shared address, so that the rows a wgmma reads with the same swizzle are the box's rows.

    A copy at coordinates c reads element c + b of the tensor for each box position b, and zero where any coordinate
    lies outside [0, dims). The driver's rules (`problem` says which one a map breaks): the address (with `offset`)
    and every stride but the innermost's a multiple of 16 bytes, the box's innermost extent a multiple of 16 bytes
    and, swizzled, at most the swizzle's width."""

    dtype: DType
    offset: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = 128

    def __post_init__(self) -> None:
        if (why := self.problem()) is not None:
            raise ValueError(f"tensor map {self}: {why}")

    def problem(self) -> str | None:
        """None when the tensor memory accelerator takes this map, else why not."""
        item = self.dtype.itemsize
        rank = len(self.dims)
        if not 1 <= rank <= TMA_MAX_RANK or len(self.strides) != rank or len(self.box) != rank:
            return f"dims, strides and box name the same 1 to {TMA_MAX_RANK} dims"
        if self.swizzle not in (0, 32, 64, 128):
            return f"swizzle is 0, 32, 64 or 128 bytes, not {self.swizzle}"
        if any(not isinstance(d, int) or not 0 < d < 1 << 32 for d in self.dims):
            return "each dim is a positive int below 2**32"
        if self.strides[0] != 1:
            return "the innermost dim must be contiguous (stride 1)"
        if any(not isinstance(s, int) or s <= 0 or (s * item) % 16 or s * item >= 1 << 40 for s in self.strides[1:]):
            return "each outer stride is positive, a multiple of 16 bytes and below 2**40 bytes"
        if not isinstance(self.offset, int) or self.offset < 0 or (self.offset * item) % 16:
            return "the offset is a multiple of 16 bytes"
        if any(not isinstance(b, int) or not 0 < b <= TMA_MAX_BOX for b in self.box):
            return f"each box extent is 1 to {TMA_MAX_BOX}"
        inner = self.box[0] * item
        if inner % 16 or (self.swizzle and inner > self.swizzle):
            return f"the box's innermost {inner} bytes must be a multiple of 16 and at most the swizzle's width"
        return None

    @property
    def box_bytes(self) -> int:
        """Bytes one copy lands (whatever part of the box lies outside the tensor: zeros count too)."""
        return self.dtype.itemsize * math.prod(self.box)

    def element(self, coords: Sequence[int]) -> int | None:
        """The buffer index (in elements) of the element at `coords` (innermost first), None outside the tensor."""
        if any(not 0 <= c < d for c, d in zip(coords, self.dims, strict=True)):
            return None
        return self.offset + sum(c * s for c, s in zip(coords, self.strides, strict=True))

    def destination(self, start: int, position: int) -> int:
        """The shared byte address box element `position` (row-major, innermost fastest) lands at when the box
        starts at byte `start`."""
        return swizzled(start + position * self.dtype.itemsize, self.swizzle)


@dataclass(frozen=True)
class TensorCore:
    """A matrix-multiply-accumulate instruction, C (M x N) += A (M x K) @ B (K x N), executed by `threads` threads
    together, each holding `elements_per_thread` elements of A, B and C.

    `swizzle` is the layout: which element of A, B and C each thread holds in each of its registers, as the
    tuple `(layout_A, layout_B, layout_C)`. Every dimension is a power of two, and so is a layout:
    `layout_X = (thread_bits, register_bits)` names, for each bit of the thread index (lowest first) and each bit of
    the register index within the thread's vector (lowest first), the bit of a coordinate it selects: "m2" is bit 2 of
    the row of A and C, "n0" bit 0 of the column of B and C, "k1" bit 1 of the reduction index. A thread bit written
    "" selects nothing: the threads that differ only in it hold the same elements (AMD's WMMA replicates A and B over
    the two halves of a wave this way). The coordinate bits of each operand are each named exactly once: A uses m
    and k, B k and n, C m and n. For example CUDA's m16n8k16 holds C with thread bits ("n1", "n2", "m0", "m1", "m2")
    and register bits ("n0", "m3"): thread t, register r holds C[(t >> 2) + 8 * (r >> 1)][2 * (t & 3) + (r & 1)].
    The code generator (lazygrad_codegen) and the PYTHON device's emulation read only this layout.

    `opts` is free-form text a device package may attach for its own renderer; the generic code generator ignores it.

    `shared_operands`: the instruction reads A and B from local memory itself (Hopper's warpgroup `wgmma`: 128
    threads, M = 64), laid out as a `SharedMatrix` each, so a kernel takes it only with its operands staged (STAGE);
    `swizzle` then gives layout_C alone, as `((), (), layout_C)`, and `elements_per_thread` is (0, 0, C's).

    `input_mantissa_bits`, when set, says the core multiplies its inputs rounded to that many explicit mantissa bits
    (round to nearest, ties away from zero; the exponent range of `dtype_in` is kept), not at the full precision of
    `dtype_in`: NVIDIA's TF32 cores take float32 inputs rounded to 10 bits. Such a core computes less exactly than the
    kernel it replaces asks for, so codegen uses it only where the `TF32` setting allows (`lazygrad_uop.config.TF32`);
    the PYTHON device emulates the rounding.
    """

    dims: tuple[int, int, int]  # (N, M, K)
    threads: int
    elements_per_thread: tuple[int, int, int]  # (A, B, C)
    dtype_in: DType
    dtype_out: DType
    opts: tuple[str, ...] = ()
    swizzle: tuple[Any, ...] = ()
    input_mantissa_bits: int | None = None
    shared_operands: bool = False

    def __post_init__(self) -> None:
        if len(self.dims) != 3 or any(not isinstance(d, int) or d <= 0 for d in self.dims):
            raise ValueError(f"tensor core dims must be three positive ints (N, M, K), got {self.dims!r}")
        if self.threads <= 0:
            raise ValueError(f"tensor core threads must be positive, got {self.threads}")
        if len(self.elements_per_thread) != 3:
            raise ValueError(f"elements_per_thread must be (A, B, C), got {self.elements_per_thread!r}")
        bits = self.input_mantissa_bits
        if bits is not None:
            if not dtypes.is_float(self.dtype_in):
                raise ValueError(f"tensor core input_mantissa_bits rounds float inputs; {self.dtype_in} is no float")
            full = dtypes.finfo(self.dtype_in)[1]
            if not (isinstance(bits, int) and not isinstance(bits, bool) and 0 <= bits < full):
                raise ValueError(
                    f"tensor core input_mantissa_bits rounds float inputs to fewer mantissa bits than their dtype "
                    f"holds: None or an int from 0 to {full - 1} for {self.dtype_in}, got {bits!r}"
                )
        if self.swizzle:
            self._check_layout()
            return
        n, m, k = self.dims
        for operand, elements, per_thread in zip("ABC", (m * k, k * n, m * n), self.elements_per_thread, strict=True):
            if elements != self.threads * per_thread:
                raise ValueError(
                    f"tensor core {self}: {operand} has {elements} elements but {self.threads} threads x "
                    f"{per_thread} elements per thread hold {self.threads * per_thread}"
                )

    def _check_layout(self) -> None:
        n, m, k = self.dims
        sizes = {"m": m, "n": n, "k": k}
        for d, size in sizes.items():
            if size & (size - 1):
                raise ValueError(f"tensor core {self}: a layout needs power-of-two dims, {d.upper()} is {size}")
        if self.threads & (self.threads - 1):
            raise ValueError(f"tensor core {self}: a layout needs a power-of-two thread count, got {self.threads}")
        if len(self.swizzle) != 3:
            raise ValueError(
                f"tensor core {self}: swizzle must be (layout_A, layout_B, layout_C), got {self.swizzle!r}"
            )
        for operand, dims, layout, per_thread in zip(
            "ABC", ("mk", "kn", "mn"), self.swizzle, self.elements_per_thread, strict=True
        ):
            if self.shared_operands and operand != "C":
                if layout or per_thread:
                    raise ValueError(
                        f"tensor core {self}: its operands are read from local memory (shared_operands), so "
                        f"layout_{operand} must be () and its elements per thread 0"
                    )
                continue
            if len(layout) != 2:
                raise ValueError(f"tensor core {self}: layout_{operand} must be (thread_bits, register_bits)")
            thread_bits, register_bits = tuple(layout[0]), tuple(layout[1])
            if 1 << len(thread_bits) != self.threads or 1 << len(register_bits) != per_thread:
                raise ValueError(
                    f"tensor core {self}: layout_{operand} has {len(thread_bits)} thread bits and "
                    f"{len(register_bits)} register bits, but {self.threads} threads and {per_thread} elements per "
                    "thread need log2 of each"
                )
            named = [b for b in thread_bits + register_bits if b != ""]
            if "" in register_bits:
                raise ValueError(f"tensor core {self}: every register bit of layout_{operand} must name a bit")
            wanted = sorted(f"{d}{i}" for d in dims for i in range(sizes[d].bit_length() - 1))
            if sorted(named) != wanted:
                raise ValueError(
                    f"tensor core {self}: layout_{operand} names bits {sorted(named)}, but must name each of "
                    f"{wanted} exactly once"
                )
        if "" in tuple(self.swizzle[2][0]):
            raise ValueError(f"tensor core {self}: C can't be replicated over threads (a thread bit of C is '')")

    def __str__(self) -> str:
        rounded = [] if self.input_mantissa_bits is None else [f"m{self.input_mantissa_bits}"]
        kind = "WGMMA" if self.shared_operands else "WMMA"
        return "_".join([kind, *map(str, self.dims), self.dtype_in.name, *rounded, self.dtype_out.name])


@dataclass(frozen=True, eq=False)
class KernelLaunch:
    """One launch of a compiled kernel: the `program`, the allocator handles of its buffers in parameter order, its
    launch sizes and the values of its symbolic variables (in the order of the program's variable parameters)."""

    program: Program
    bufs: tuple[Any, ...]
    global_size: tuple[int, int, int] = (1, 1, 1)
    local_size: tuple[int, int, int] = (1, 1, 1)
    vals: tuple[int, ...] = ()


class GraphRunner(abc.ABC):
    """A device's way to run a fixed list of kernel launches as one unit (a CUDA graph, a Metal indirect command
    buffer, one native function that calls every CPU kernel in order), so that replaying them costs one call
    instead of one per kernel. The JIT builds one per run of consecutive kernels on a device that has a graph type.

    The contract a device's graph type (`CompiledDevice.graph`) implements:

    - `__init__(device, launches)`: prepare the launches, in order, all of programs of `device`. It may take a
      while (encoding, instantiating, compiling); replays must be cheap. Raise `GraphError` for launches the device
      can't batch (the JIT then runs them one by one).
    - `update(changes)`: for the next replays, launch `i` becomes `changes[i]`: the same program with other buffers
      (e.g. a new input), variable values or, when its variables changed, launch sizes. The base method checks and
      stores them in `self.launches`; devices extend it to patch what they prepared.
    - `__call__(wait)`: run every launch, in order, each seeing the writes of the ones before. Without `wait` the
      device may still be running when it returns; with `wait`, block until done and return the seconds it took.
    """

    def __init__(self, device: CompiledDevice, launches: Sequence[KernelLaunch]) -> None:
        if not launches:
            raise GraphError("a graph needs at least one kernel launch")
        self.device, self.launches = device, list(launches)

    def update(self, changes: Mapping[int, KernelLaunch]) -> None:
        """Replace launch `i` by `changes[i]` for the next replays."""
        for i, new in changes.items():
            old = self.launches[i]
            if new.program is not old.program or len(new.bufs) != len(old.bufs) or len(new.vals) != len(old.vals):
                raise GraphError(
                    f"launch {i} of the graph runs {old.program.name} with {len(old.bufs)} buffers and "
                    f"{len(old.vals)} values; an update must keep its program and argument counts (build a new graph)"
                )
            self.launches[i] = new

    @abc.abstractmethod
    def __call__(self, wait: bool = False) -> float | None:
        """Run every launch in order; with `wait`, block until done and return the run time in seconds."""


class GraphError(RuntimeError):
    """A graph can't be built from, or updated with, the launches it was given."""


class CompiledDevice:
    """An opened device: the allocator, renderer, compiler and program type (`runtime`, a `Program` subclass,
    constructed as `runtime(device, name, lib)`) that run kernels on it, and optionally a graph type (a `GraphRunner`
    subclass) that runs a list of kernels as one unit. `Device["NAME"]` returns one of these."""

    def __init__(
        self,
        device: str,
        allocator: Allocator,
        renderer: Renderer,
        compiler: Compiler,
        runtime: type[Program],
        graph: type[GraphRunner] | None = None,
    ) -> None:
        self.device, self.allocator, self.renderer, self.compiler = device, allocator, renderer, compiler
        self.runtime, self.graph = runtime, graph
        # the device's own compiler, which a renderer that brings none compiles with
        self.default_compiler = compiler

    def use_renderer(self, renderer: Renderer, compiler: Compiler | None = None) -> None:
        """Render this device's kernels with `renderer` from now on, and compile them with `compiler` when one is
        given (a renderer plugin's `RendererSpec.compiler`: its source needs another compiler than the device's), else
        with the device's own compiler."""
        self.renderer = renderer
        self.compiler = compiler if compiler is not None else self.default_compiler

    def load_program(self, name: str, lib: bytes) -> Program:
        """Kernel `name` of binary `lib` (from this device's compiler), loaded on this device."""
        return self.runtime(self, name, lib)

    def synchronize(self) -> None:
        """Wait for all work queued on the device. Devices that run asynchronously override this; for a
        synchronous device there is nothing to wait for."""

    def __repr__(self) -> str:
        return f"<CompiledDevice {self.device} renderer={type(self.renderer).__name__}>"
