"""Compiling amdgcn LLVM IR to AMDGPU code objects with llvmlite: parse, optimise for the target GPU, emit an ELF
object, and link it with `ld.lld` into the shared object that the HIP runtime loads.

llvmlite's LLVM must have been built with the AMDGPU target (the wheels on the package index are). Without `ld.lld`
the compiler can still emit the relocatable object (`link=False`), which is enough to check that a kernel compiles;
loading it needs the link.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
import threading

import llvmlite.binding as llvm

from lazygrad_uop.config import DEBUG
from lazygrad_uop.device import CompileError, Compiler

TRIPLE = "amdgcn-amd-amdhsa"
# Code object version 5: what ROCm 5.x and 6.x runtimes load and what ld.lld from LLVM 15 on links (newer LLVMs
# default to version 6, which older runtimes and linkers reject)
CODE_OBJECT_VERSION = 500
_MODULE_FLAGS = (
    f'!llvm.module.flags = !{{!0}}\n!0 = !{{i32 1, !"amdhsa_code_object_version", i32 {CODE_OBJECT_VERSION}}}\n'
)
# ELF machine number of AMDGPU code objects
EM_AMDGPU = 224

_init_lock = threading.Lock()
_initialized = False


def _init_llvm() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


def amdgpu_target_reason() -> str | None:
    """None when llvmlite's LLVM can generate amdgcn code, else why not."""
    try:
        _init_llvm()
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


class AMDGPUCompiler(Compiler):
    """amdgcn LLVM IR to a code object for `arch`: linked with ld.lld (a shared object HIP can load) when `link`,
    else the relocatable ELF object."""

    def __init__(self, arch: str, link: bool = True, opt: int = 3) -> None:
        if (reason := amdgpu_target_reason()) is not None:
            raise RuntimeError(reason)
        self.arch, self.opt = arch, opt
        self.ld_lld = find_ld_lld() if link else None
        if link and self.ld_lld is None:
            raise RuntimeError(
                "ld.lld is needed to link AMDGPU code objects and was not found (apt-get install lld, or ROCm's "
                "llvm/bin on PATH); pass link=False to only emit objects"
            )
        target = llvm.Target.from_triple(TRIPLE)
        self.target_machine = target.create_target_machine(cpu=arch, features="", opt=opt, reloc="pic")
        kind = "so" if link else "o"
        super().__init__(f"compile_amdgpu_{arch}_llvm{'_'.join(map(str, llvm.llvm_version_info))}_O{opt}_{kind}")

    def optimized_module(self, src: str) -> llvm.ModuleRef:
        """`src` parsed, verified and optimised for the target; raises CompileError with LLVM's message when the IR
        is invalid."""
        try:
            mod = llvm.parse_assembly(f"{src}\n{_MODULE_FLAGS}")
            mod.verify()
        except RuntimeError as exc:
            raise CompileError(f"LLVM rejected the amdgcn IR: {exc}\n{src}") from exc
        tm = self.target_machine
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        builder = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=self.opt))
        builder.getModulePassManager().run(mod, builder)
        return mod

    def object(self, src: str) -> bytes:
        """The relocatable ELF object of `src`. `DEBUG>=7` prints its assembly."""
        mod = self.optimized_module(src)
        if DEBUG >= 7:
            print(self.target_machine.emit_assembly(mod))
        return self.target_machine.emit_object(mod)

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
