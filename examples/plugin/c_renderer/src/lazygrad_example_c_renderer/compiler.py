"""The system C compiler, producing the relocatable object file a CPU program loads."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from lazygrad_uop.device import CompileError, Compiler


class CCompiler(Compiler):
    """Compiles C with `$CC` (default `cc`) to an object file: `-O2` without fast-math, so float results are IEEE's,
    as numpy's are."""

    def __init__(self) -> None:
        self.cc = os.environ.get("CC", "cc")
        # the cache key names the compiler, so two compilers never share cached objects
        super().__init__(f"compile_c_object_{Path(self.cc).name}")

    def compile(self, src: str) -> bytes:
        """The object file of `src`; CompileError with the compiler's messages when it fails or is missing."""
        if shutil.which(self.cc) is None:
            raise CompileError(f"no C compiler {self.cc!r} on PATH: install one (e.g. apt-get install gcc) or set CC")
        with tempfile.TemporaryDirectory() as tmp:
            obj, linked = Path(tmp) / "kernel.o", Path(tmp) / "linked.o"
            # no auto-vectorisation: its constant vectors need 16-byte aligned sections, which the CPU device's
            # object loader (LLVM's) does not promise for a foreign object, and misaligned they read wrong values
            compile_cmd = [self.cc, "-c", "-O2", "-fPIC", "-fno-tree-vectorize", "-fno-math-errno", "-x", "c", "-"]
            compile_cmd += ["-o", str(obj)]
            # a partial link pulls in the compiler's runtime helpers the kernel calls (half-precision conversions
            # on x86): the CPU's loader resolves other symbols from the process, which doesn't have those
            runtime = subprocess.run([self.cc, "-print-libgcc-file-name"], capture_output=True, text=True).stdout
            link_cmd = [self.cc, "-r", "-nostdlib", str(obj), runtime.strip(), "-o", str(linked)]
            for cmd, given in ((compile_cmd, src), (link_cmd, None)):
                proc = subprocess.run(cmd, input=given, capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise CompileError(f"{self.cc} rejected the kernel:\n{proc.stderr}\n{src}")
            return linked.read_bytes()
