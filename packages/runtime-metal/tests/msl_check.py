"""Checks Metal Shading Language with the host's C++ compiler: `c++ -fsyntax-only -std=c++17` against the
declarations in `msl_header/` (Metal's types, address spaces, attributes and builtins that the renderer uses), with
warnings as errors, so an undeclared builtin, a wrong type, an unknown attribute or a double fails."""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

HEADER_DIR = Path(__file__).parent / "msl_header"
_files = itertools.count()


def cxx() -> str | None:
    """The C++ compiler on PATH, if any."""
    return shutil.which("c++")


def check_msl(sources: list[str], workdir: Path) -> None:
    """Compile every source in `sources` for syntax and types; fail with the compiler's messages and the source."""
    compiler = cxx()
    assert compiler is not None, "no C++ compiler (c++) on PATH"
    paths = []
    for src in sources:
        path = workdir / f"kernel{next(_files)}.metal"
        path.write_text(src)
        paths.append(path)
    cmd = [compiler, "-fsyntax-only", "-std=c++17", "-x", "c++", "-Wall", "-Werror", "-I", str(HEADER_DIR)]
    proc = subprocess.run([*cmd, *map(str, paths)], capture_output=True, text=True)
    if proc.returncode != 0:
        listing = "\n\n".join(f"// {p.name}\n{p.read_text()}" for p in paths if p.name in proc.stderr)
        raise AssertionError(f"the MSL doesn't compile against msl_header:\n{proc.stderr}\n{listing}")
