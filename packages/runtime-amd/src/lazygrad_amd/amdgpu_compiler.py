"""Compiling amdgcn LLVM IR to AMDGPU code objects with llvmlite: parse, optimise for the target GPU, emit an ELF
object, and link it with `ld.lld` into the shared object that the HIP runtime loads; and reading a code object's
kernel metadata back (`code_object_kernels`), which says where each kernel argument goes.

llvmlite's LLVM must have been built with the AMDGPU target (the wheels on the package index are). Without `ld.lld`
the compiler can still emit the relocatable object (`link=False`), which is enough to check that a kernel compiles;
loading it needs the link.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import llvmlite.binding as llvm

from lazygrad_codegen.llvm_compiler import LLVMIRCompiler, init_llvm
from lazygrad_uop.device import CompileError

TRIPLE = "amdgcn-amd-amdhsa"
# Code object version 5: what ROCm 5.x and 6.x runtimes load and what ld.lld from LLVM 15 on links (newer LLVMs
# default to version 6, which older runtimes and linkers reject)
CODE_OBJECT_VERSION = 500
_MODULE_FLAGS = (
    f'!llvm.module.flags = !{{!0}}\n!0 = !{{i32 1, !"amdhsa_code_object_version", i32 {CODE_OBJECT_VERSION}}}\n'
)
# ELF machine number of AMDGPU code objects
EM_AMDGPU = 224


def amdgpu_target_reason() -> str | None:
    """None when llvmlite's LLVM can generate amdgcn code, else why not."""
    try:
        init_llvm()
        llvm.Target.from_triple(TRIPLE)
    except Exception as exc:  # noqa: BLE001 - llvmlite reports a missing target or a broken library in several ways
        return f"llvmlite's LLVM has no AMDGPU target ({type(exc).__name__}: {exc}); install an llvmlite built with it"
    return None


def find_ld_lld() -> str | None:
    """The path of an `ld.lld` that can link AMDGPU objects (LLVM 15 or newer, for code object v5): the newest
    versioned one on PATH (e.g. `ld.lld-16`), a plain `ld.lld`, or ROCm's own under $ROCM_PATH (default /opt/rocm)."""
    versioned: list[tuple[int, str]] = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        for path in glob.glob(os.path.join(folder, "ld.lld-*")):
            if (m := re.fullmatch(r"ld\.lld-(\d+)", os.path.basename(path))) and os.access(path, os.X_OK):
                versioned.append((int(m.group(1)), path))
    candidates = [path for _, path in sorted(versioned, reverse=True)]
    candidates += [p for p in (shutil.which("ld.lld"),) if p]
    rocm = os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "llvm", "bin", "ld.lld")
    candidates += [rocm] if os.access(rocm, os.X_OK) else []
    return next((path for path in candidates if _lld_major(path) >= MIN_LLD_MAJOR), None)


# code object v5 needs an lld from LLVM 15 on (older ones stop at "unknown abi version")
MIN_LLD_MAJOR = 15


def _lld_major(path: str) -> int:
    """The LLVM major version of the `ld.lld` at `path` (0 when it can't be told)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    m = re.search(r"LLD (\d+)", out)
    return int(m.group(1)) if m else 0


class AMDGPUCompiler(LLVMIRCompiler):
    """amdgcn LLVM IR to a code object for `arch`: linked with ld.lld (a shared object HIP can load) when `link`,
    else the relocatable ELF object."""

    what = "amdgcn IR"

    def __init__(self, arch: str, link: bool = True, opt: int = 3) -> None:
        if (reason := amdgpu_target_reason()) is not None:
            raise RuntimeError(reason)
        self.arch = arch
        self.ld_lld = find_ld_lld() if link else None
        if link and self.ld_lld is None:
            raise RuntimeError(
                "ld.lld is needed to link AMDGPU code objects and was not found (apt-get install lld, or ROCm's "
                "llvm/bin on PATH); pass link=False to only emit objects"
            )
        target_machine = llvm.Target.from_triple(TRIPLE).create_target_machine(
            cpu=arch, features="", opt=opt, reloc="pic"
        )
        kind = "so" if link else "o"
        version = "_".join(map(str, llvm.llvm_version_info))
        super().__init__(target_machine, opt, f"compile_amdgpu_{arch}_llvm{version}_O{opt}_{kind}")

    def module_text(self, src: str) -> str:
        """`src` with the module flag that selects the code object version."""
        return f"{src}\n{_MODULE_FLAGS}"

    def compile(self, src: str) -> bytes:
        """The code object of `src`: linked when the compiler links, else the object."""
        obj = self.object(src)
        return obj if self.ld_lld is None else link(obj, self.ld_lld)


def link(obj: bytes, ld_lld: str) -> bytes:
    """The shared-object code object that ld.lld links from the ELF object `obj`."""
    with tempfile.TemporaryDirectory(prefix="lazygrad_amdgpu_") as tmp:
        src, out = os.path.join(tmp, "kernel.o"), os.path.join(tmp, "kernel.hsaco")
        with open(src, "wb") as f:
            f.write(obj)
        done = subprocess.run([ld_lld, "-shared", "--no-undefined", src, "-o", out], capture_output=True, text=True)
        if done.returncode != 0:
            raise CompileError(f"{ld_lld} could not link the AMDGPU object:\n{done.stderr.strip()}")
        with open(out, "rb") as f:
            return f.read()


# *** reading code objects ***

# the ELF note that holds a code object's metadata (a MessagePack map), owned by "AMDGPU"
NT_AMDGPU_METADATA = 32
_SHT_NOTE = 7


@dataclass(frozen=True)
class KernelArg:
    """One explicit argument of a kernel: where it goes in the kernarg segment and what it is (`kind` is the
    metadata's value kind: "global_buffer" for a buffer's address, "by_value" for a number)."""

    name: str
    offset: int
    size: int
    kind: str


@dataclass(frozen=True)
class KernelInfo:
    """What a code object's metadata says about one kernel: its explicit arguments in parameter order, the size and
    alignment of its whole kernarg segment (hidden arguments the runtime fills included), its wave size, the largest
    work-group it may be launched with, and its static local (LDS) and private memory per group and per item."""

    name: str
    args: tuple[KernelArg, ...]
    kernarg_size: int
    kernarg_align: int
    wavefront_size: int
    max_workgroup_size: int
    group_segment_size: int
    private_segment_size: int


def code_object_kernels(lib: bytes) -> dict[str, KernelInfo]:
    """The kernels of the AMDGPU code object `lib` (a linked shared object or a relocatable object) by name, from
    its NT_AMDGPU_METADATA note. Raises ValueError when `lib` is not an AMDGPU ELF file with that note."""
    if lib[:4] != b"\x7fELF" or lib[4] != 2 or lib[5] != 1:
        raise ValueError("not a little-endian 64-bit ELF file: AMDGPU code objects are")
    (machine,) = struct.unpack_from("<H", lib, 18)
    if machine != EM_AMDGPU:
        raise ValueError(f"ELF machine {machine} is not AMDGPU ({EM_AMDGPU})")
    (shoff,) = struct.unpack_from("<Q", lib, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", lib, 0x3A)
    for i in range(shnum):
        sh_type, _, _, offset, size = struct.unpack_from("<4xIQQQQ", lib, shoff + i * shentsize)
        if sh_type != _SHT_NOTE:
            continue
        pos, end = offset, offset + size
        while pos + 12 <= end:
            namesz, descsz, note_type = struct.unpack_from("<III", lib, pos)
            name_at = pos + 12
            desc_at = name_at + (namesz + 3) // 4 * 4
            owner = lib[name_at : name_at + namesz].rstrip(b"\0")
            if note_type == NT_AMDGPU_METADATA and owner == b"AMDGPU":
                metadata, _ = _unpack(lib[desc_at : desc_at + descsz], 0)
                return {k[".name"]: _kernel_info(k) for k in metadata.get("amdhsa.kernels", [])}
            pos = desc_at + (descsz + 3) // 4 * 4
    raise ValueError("the ELF file has no AMDGPU metadata note (NT_AMDGPU_METADATA): not a code object v3 or newer")


def _kernel_info(k: dict[str, Any]) -> KernelInfo:
    explicit = [a for a in k.get(".args", []) if not str(a[".value_kind"]).startswith("hidden_")]
    return KernelInfo(
        name=k[".name"],
        args=tuple(KernelArg(a.get(".name", ""), a[".offset"], a[".size"], a[".value_kind"]) for a in explicit),
        kernarg_size=k[".kernarg_segment_size"],
        kernarg_align=k[".kernarg_segment_align"],
        wavefront_size=k[".wavefront_size"],
        max_workgroup_size=k[".max_flat_workgroup_size"],
        group_segment_size=k[".group_segment_fixed_size"],
        private_segment_size=k[".private_segment_fixed_size"],
    )


# MessagePack, the subset code object metadata uses: maps, arrays, strings, ints, bools, nil (and floats, binary)
_FIXED = {0xC0: None, 0xC2: False, 0xC3: True}
_SCALARS = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q"}
_SCALARS.update({0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"})
# type byte -> (what, width of its length field)
_SIZED = {0xC4: ("bin", 1), 0xC5: ("bin", 2), 0xC6: ("bin", 4), 0xD9: ("str", 1), 0xDA: ("str", 2)}
_SIZED.update({0xDB: ("str", 4), 0xDC: ("array", 2), 0xDD: ("array", 4), 0xDE: ("map", 2), 0xDF: ("map", 4)})
_LENGTH = {1: ">B", 2: ">H", 4: ">I"}


def _unpack(buf: bytes, pos: int) -> tuple[Any, int]:
    """The MessagePack value at `pos` of `buf`, and the position after it."""
    t = buf[pos]
    pos += 1
    if t <= 0x7F:
        return t, pos
    if t >= 0xE0:
        return t - 0x100, pos
    if t in _FIXED:
        return _FIXED[t], pos
    if t in _SCALARS:
        return struct.unpack_from(_SCALARS[t], buf, pos)[0], pos + struct.calcsize(_SCALARS[t])
    if 0x80 <= t <= 0x8F:
        kind, n = "map", t & 0x0F
    elif 0x90 <= t <= 0x9F:
        kind, n = "array", t & 0x0F
    elif 0xA0 <= t <= 0xBF:
        kind, n = "str", t & 0x1F
    elif t in _SIZED:
        kind, width = _SIZED[t]
        (n,) = struct.unpack_from(_LENGTH[width], buf, pos)
        pos += width
    else:
        raise ValueError(f"MessagePack type byte 0x{t:02x} at {pos - 1} is not one code object metadata uses")
    if kind in ("str", "bin"):
        raw = buf[pos : pos + n]
        return (raw.decode() if kind == "str" else raw), pos + n
    items = []
    for _ in range(2 * n if kind == "map" else n):
        item, pos = _unpack(buf, pos)
        items.append(item)
    return (dict(zip(items[::2], items[1::2], strict=True)) if kind == "map" else items), pos
