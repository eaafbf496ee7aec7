"""Compiling CUDA C with NVRTC (through cuda-python's `cuda.bindings.nvrtc`).

A kernel is compiled for the GPU's own architecture: to a cubin (machine code the driver loads as is) when NVRTC knows
the architecture, else to PTX for the newest virtual architecture NVRTC knows below it, which the driver compiles when
it loads the module. `cuda_fp16.h` and `cuda_bf16.h` come from the CUDA runtime headers (the `nvidia-cuda-runtime`
package, or a toolkit named by CUDA_HOME / CUDA_PATH). Binaries are cached on disk by `Compiler.compile_cached`.

What a kernel needs at launch beyond its arguments travels in its binary as module `__constant__`s the runtime reads
without the driver: its dynamic shared memory (`dynamic_shared`) and the TMA tensor maps it takes as parameters
(`tensor_maps`).
"""

from __future__ import annotations

import functools
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lazygrad_cuda.renderer import DYNAMIC_SHARED_SYMBOL, TENSOR_MAP_WORDS, TENSOR_MAPS_SYMBOL
from lazygrad_uop.config import DEBUG
from lazygrad_uop.device import TMA_MAX_RANK, CompileError, Compiler


class NVRTCError(RuntimeError):
    """NVRTC failed for a reason other than the source (it could not be loaded, or was given bad options)."""


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise NVRTCError(
            f"cuda-bindings is not importable ({exc}); `pip install cuda-bindings nvidia-cuda-nvrtc`"
        ) from exc
    return nvrtc


def _check(result: tuple, what: str) -> tuple:
    """The values after an NVRTC call's status, or NVRTCError naming the call and the status."""
    nvrtc = _nvrtc()
    err, *rest = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NVRTCError(f"{what} failed: {err.name}")
    return tuple(rest)


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor) version; NVRTCError when NVRTC can't be loaded."""
    nvrtc = _nvrtc()
    try:
        result = nvrtc.nvrtcVersion()
    except Exception as exc:
        raise NVRTCError(f"NVRTC could not be loaded: {exc}; `pip install nvidia-cuda-nvrtc`") from exc
    major, minor = _check(result, "nvrtcVersion")
    return int(major), int(minor)


@functools.cache
def nvrtc_architectures() -> tuple[int, ...]:
    """The compute capabilities NVRTC can compile for, as numbers (80 for sm_80), ascending."""
    (archs,) = _check(_nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    return tuple(sorted(int(a) for a in archs))


@dataclass(frozen=True)
class CompileTarget:
    """What NVRTC compiles for: `arch` is the GPU's "sm_XY"; `nvrtc_arch` the architecture option NVRTC gets
    ("sm_90" for a cubin, "compute_86" for PTX); `cubin` says which of the two the compiler returns."""

    arch: str
    nvrtc_arch: str
    cubin: bool


def compile_target(arch: str, supported: tuple[int, ...] | None = None) -> CompileTarget:
    """How to compile for GPU architecture `arch` ("sm_86") with an NVRTC that supports `supported` (default: the
    installed NVRTC's list): a cubin for that architecture if NVRTC knows it, else PTX for the newest one below it,
    which the driver compiles for the GPU when loading. ValueError when NVRTC knows no architecture that old."""
    m = re.fullmatch(r"sm_(\d+)([a-z]?)", arch)
    if m is None:
        raise ValueError(f"a CUDA architecture is written like 'sm_80', got {arch!r}")
    cc = int(m.group(1))
    supported = nvrtc_architectures() if supported is None else supported
    if cc in supported:
        return CompileTarget(arch, arch, cubin=True)
    older = [a for a in supported if a <= cc]
    if not older:
        raise ValueError(
            f"NVRTC compiles for sm_{min(supported)} and newer; this GPU is {arch}. Install an older CUDA "
            "(nvidia-cuda-nvrtc) that still supports it."
        )
    return CompileTarget(arch, f"compute_{older[-1]}", cubin=False)


@functools.cache
def cuda_include_dirs() -> tuple[str, ...]:
    """Directories holding `cuda_fp16.h`: the CUDA runtime headers' package, else CUDA_HOME / CUDA_PATH."""
    found: list[str] = []
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        if (d := find_nvidia_header_directory("cudart")) is not None:
            found.append(str(d))
    except Exception:  # noqa: BLE001 - pathfinder is a helper; the environment variables below still work
        pass
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if (root := os.environ.get(var)) and (Path(root) / "include" / "cuda_fp16.h").exists():
            found.append(str(Path(root) / "include"))
    return tuple(dict.fromkeys(d for d in found if (Path(d) / "cuda_fp16.h").exists()))


@dataclass(frozen=True)
class NVRTCOutput:
    """What one NVRTC compilation produced: the PTX text, and the cubin when compiled for a real architecture."""

    ptx: bytes
    cubin: bytes | None
    log: str


def nvrtc_compile(src: str, nvrtc_arch: str, name: str = "kernel", options: Sequence[str] = ()) -> NVRTCOutput:
    """Compile CUDA C `src` for `nvrtc_arch` ("sm_90" or "compute_90"), with more NVRTC `options` if given (e.g.
    `--ptxas-options=-v`, whose register and spill report lands in the log). CompileError with NVRTC's log when the
    source does not compile."""
    nvrtc = _nvrtc()
    nvrtc_version()  # a clear error when libnvrtc is missing
    (prog,) = _check(nvrtc.nvrtcCreateProgram(src.encode(), f"{name}.cu".encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={nvrtc_arch}".encode(), *(f"-I{d}".encode() for d in cuda_include_dirs())]
        opts += [o.encode() for o in options]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        (size,) = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        log = bytearray(size)
        _check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        log_text = log.rstrip(b"\0").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            hint = ""
            if "cuda_fp16.h" in log_text or "cuda_bf16.h" in log_text:
                hint = (
                    "\nhalf and bfloat16 kernels need the CUDA runtime headers: `pip install nvidia-cuda-runtime`, "
                    "or set CUDA_HOME to a CUDA toolkit"
                )
            raise CompileError(f"NVRTC ({nvrtc_arch}) rejected {name}:\n{log_text}{hint}\n{src}")
        (ptx_size,) = _check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = bytearray(ptx_size)
        _check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        cubin: bytes | None = None
        if nvrtc_arch.startswith("sm_"):
            (cubin_size,) = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            buf = bytearray(cubin_size)
            _check(nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
            cubin = bytes(buf)
        return NVRTCOutput(bytes(ptx), cubin, log_text)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@dataclass(frozen=True)
class PtxasUsage:
    """What ptxas reports for one kernel: the registers a thread uses, and the bytes it spills to local memory
    (stores and loads; nonzero when the register file could not hold the kernel's live values)."""

    registers: int
    spill_stores: int
    spill_loads: int

    @property
    def spills(self) -> int:
        """Bytes spilled, stores and loads together: 0 for a kernel that fits its registers."""
        return self.spill_stores + self.spill_loads


def ptxas_usage(src: str, arch: str, name: str = "kernel") -> PtxasUsage:
    """Compile `src` for the real architecture `arch` ("sm_80") with `--ptxas-options=-v` and read the register and
    spill report of its kernel from NVRTC's log. CompileError when it does not compile; NVRTCError when the log has
    no report (an NVRTC that does not pass the option to ptxas). The NVRTC 13.0 of an H100 machine's torch
    environment returned, now and then, an empty log for a program whose report it gave on the next compile (two of
    about 150 compiles in a test run, different programs each run; never seen with NVRTC 13.0 or 13.5 on a machine
    without a GPU): a log without the report is compiled again, up to `PTXAS_REPORT_TRIES` times in all."""
    log = ""
    for _ in range(PTXAS_REPORT_TRIES):
        log = nvrtc_compile(src, wgmma_arch(src, arch), name, options=("--ptxas-options=-v",)).log
        registers = re.search(r"Used (\d+) registers", log)
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        if registers is not None and spills is not None:
            return PtxasUsage(int(registers.group(1)), int(spills.group(1)), int(spills.group(2)))
    raise NVRTCError(f"no ptxas register report for {name} on {arch} in NVRTC's log:\n{log}")


PTXAS_REPORT_TRIES = 3
"""Compiles `ptxas_usage` tries before it gives up on a log without ptxas's report."""


def dynamic_shared(lib: bytes) -> int:
    """The bytes of dynamic shared memory the kernel of `lib` (a cubin or NUL-terminated PTX from `NVRTCCompiler`)
    is launched with: the value of its module's `__constant__` `DYNAMIC_SHARED_SYMBOL`, which the renderer writes for
    a kernel whose local memory exceeds the static limit; 0 when there is none. Read from the binary itself, so the
    number travels with it (through the disk cache, BEAM's compiles) and needs no driver call."""
    if lib[:4] != b"\x7fELF":
        m = re.search(rb"\.const\s+\.align\s+\d+\s+\.u32\s+" + DYNAMIC_SHARED_SYMBOL.encode() + rb"\s*=\s*(\d+);", lib)
        return int(m.group(1)) if m else 0
    data = _elf_symbol(lib, DYNAMIC_SHARED_SYMBOL.encode())
    return struct.unpack("<I", data)[0] if data is not None and len(data) == 4 else 0


TENSOR_MAP_SWIZZLES = (0, 32, 64, 128)
"""The shared-memory swizzles a tensor map may have, in bytes (0: none)."""


@dataclass(frozen=True)
class TensorMapArg:
    """One TMA tensor map a kernel takes as a parameter (after its buffers and ints), as its binary describes it: a
    `rank`-dimensional view of buffer argument `buffer` starting `offset` bytes in, of elements of the driver's
    `CUtensorMapDataType` `dtype`, with sizes `dims` (innermost first) and the byte strides `strides` of dims 1 to
    rank-1, copied in boxes of `box` elements, swizzled in shared memory in `swizzle`-byte rows (0: not swizzled)."""

    buffer: int
    dtype: int
    swizzle: int
    offset: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]

    @property
    def rank(self) -> int:
        """The number of dimensions (1 to `TMA_MAX_RANK`)."""
        return len(self.dims)


def tensor_maps(lib: bytes) -> tuple[TensorMapArg, ...]:
    """The tensor maps the kernel of `lib` (a cubin or NUL-terminated PTX from `NVRTCCompiler`) takes, in parameter
    order: the module's `__constant__` `TENSOR_MAPS_SYMBOL` (the renderer's `tensor_map_table`), `{n, <map 0's
    TENSOR_MAP_WORDS words>, ...}`, each map's words being its buffer argument, `CUtensorMapDataType`, rank, swizzle
    bytes, byte offset, then `TMA_MAX_RANK` each of dims (1 past the rank), byte strides (the first the element size,
    0 past the rank) and box extents (1 past the rank). () when there is none. ValueError when the table is malformed
    (its count does not match its size, a rank outside 1 to `TMA_MAX_RANK`, a swizzle not in `TENSOR_MAP_SWIZZLES`):
    a renderer bug, as the kernel can't be launched right."""
    name = TENSOR_MAPS_SYMBOL.encode()
    if lib[:4] == b"\x7fELF":
        data = _elf_symbol(lib, name)
        if data is None:
            return ()
    else:
        # NVRTC writes a u64 array as bytes, the trailing zero ones left out (all of them when all are zero)
        m = re.search(rb"\.const\s+\.align\s+\d+\s+\.b8\s+" + name + rb"\[(\d+)\]\s*(?:=\s*\{([\d,\s]*)\})?\s*;", lib)
        if m is None:
            return ()
        data = bytes(int(b) for b in m.group(2).split(b",")) if m.group(2) else b""
        data = data.ljust(int(m.group(1)), b"\0")
    count = struct.unpack_from("<Q", data)[0] if len(data) >= 8 else None
    if count is None or len(data) != 8 * (1 + TENSOR_MAP_WORDS * count):
        raise ValueError(
            f"the kernel's {TENSOR_MAPS_SYMBOL} is {len(data)} bytes, not the count (8 bytes) and "
            f"{TENSOR_MAP_WORDS} 8-byte words per map that its count ({count}) asks for: the renderer wrote a "
            "malformed tensor map table"
        )
    words = struct.unpack_from(f"<{TENSOR_MAP_WORDS * count}Q", data, 8)
    return tuple(_tensor_map(i, words[TENSOR_MAP_WORDS * i : TENSOR_MAP_WORDS * (i + 1)]) for i in range(count))


def _tensor_map(i: int, w: tuple[int, ...]) -> TensorMapArg:
    """Map `i` of a tensor map table, from its `TENSOR_MAP_WORDS` words."""
    buffer, dtype, rank, swizzle, offset = w[:5]
    if not 1 <= rank <= TMA_MAX_RANK:
        raise ValueError(
            f"tensor map {i} of the kernel's {TENSOR_MAPS_SYMBOL} has rank {rank}; TMA takes 1 to {TMA_MAX_RANK} dims"
        )
    if swizzle not in TENSOR_MAP_SWIZZLES:
        raise ValueError(
            f"tensor map {i} of the kernel's {TENSOR_MAPS_SYMBOL} swizzles {swizzle} bytes; TMA swizzles "
            f"{', '.join(map(str, TENSOR_MAP_SWIZZLES))} bytes"
        )
    dims, strides, box = (w[5 + TMA_MAX_RANK * k : 5 + TMA_MAX_RANK * k + rank] for k in range(3))
    return TensorMapArg(buffer, dtype, swizzle, offset, tuple(dims), tuple(strides[1:]), tuple(box))


def _elf_symbol(elf: bytes, name: bytes) -> bytes | None:
    """The bytes the symbol `name` of a 64-bit little-endian ELF file (a cubin) covers in its section, or None when
    it has no such symbol (or it reaches outside its section)."""
    if elf[4:6] != b"\x02\x01":  # ELFCLASS64, little-endian: what NVRTC writes
        return None
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    # (type, offset, size, link) of each section
    sections = [struct.unpack_from("<4xI16xQQI", elf, shoff + i * shentsize) for i in range(shnum)]
    for kind, offset, size, link in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link][1]
        for at in range(offset, offset + size, 24):
            st_name, st_shndx, st_value, st_size = struct.unpack_from("<I2xHQQ", elf, at)
            end = elf.index(b"\0", strtab + st_name)
            if elf[strtab + st_name : end] != name or not 0 < st_shndx < shnum:
                continue
            _, data, data_size, _ = sections[st_shndx]
            if st_value + st_size > data_size:
                return None
            return elf[data + st_value : data + st_value + st_size]
    return None


class NVRTCCompiler(Compiler):
    """CUDA C to a binary for one GPU architecture: a cubin, or NUL-terminated PTX text where NVRTC does not know
    the architecture (see `compile_target`). The cache key names NVRTC's version and the target."""

    def __init__(self, target: CompileTarget) -> None:
        self.target = target
        major, minor = nvrtc_version()
        kind = "cubin" if target.cubin else "ptx"
        super().__init__(f"compile_cuda_nvrtc{major}.{minor}_{target.nvrtc_arch}_{kind}")

    def compile(self, src: str) -> bytes:
        """The cubin (or PTX) of `src`. `DEBUG>=7` prints the PTX. A kernel with `wgmma` instructions is compiled
        for sm_90a, the architecture-specific target that has them (its cubin runs on sm_90 GPUs only, as the
        renderer writes wgmma for those only)."""
        out = nvrtc_compile(src, wgmma_arch(src, self.target.nvrtc_arch), _kernel_name(src))
        if DEBUG >= 7:
            print(out.ptx.rstrip(b"\0").decode())
        if self.target.cubin:
            assert out.cubin is not None, "NVRTC compiled for a real architecture gives a cubin"
            return out.cubin
        # the driver reads PTX as a C string
        return out.ptx if out.ptx.endswith(b"\0") else out.ptx + b"\0"


def wgmma_arch(src: str, nvrtc_arch: str) -> str:
    """`nvrtc_arch`, with the `a` of its architecture-specific features where `src` issues `wgmma` on sm_90."""
    return f"{nvrtc_arch}a" if "wgmma.mma_async" in src and nvrtc_arch in ("sm_90", "compute_90") else nvrtc_arch


def _kernel_name(src: str) -> str:
    m = re.search(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", src)
    return m.group(1) if m else "kernel"
