"""Developer sessions: `nox -s tests` (everything), `nox -s <package folder>` (one package installed on its own with
only its lazygrad dependencies), `nox -s lint`, `nox -s bench`. `nox -l` lists them."""

from __future__ import annotations

import os
import shlex
import tomllib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import nox

ROOT = Path(__file__).parent
PACKAGES = ROOT / "packages"
# Example plugins: installed into the whole-suite session, their tests run there (the conformance suite on them).
EXAMPLE_PLUGINS = sorted(p.parent for p in (ROOT / "examples" / "plugin").glob("*/pyproject.toml"))
# Test-only reference; its absence must not stop the suite (tests that need it skip).
TORCH = "torch==2.13.0"

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests"]


@cache
def pyprojects() -> dict[str, dict[str, Any]]:
    """Every package folder's name and its parsed pyproject.toml."""
    return {p.parent.name: tomllib.loads(p.read_text()) for p in sorted(PACKAGES.glob("*/pyproject.toml"))}


def _requirement_name(requirement: str) -> str:
    name = requirement
    for stop in "[<>=!~;@ ":
        name = name.split(stop, 1)[0]
    return name.strip().lower().replace("_", "-")


def closure(folder: str) -> list[str]:
    """`folder` and the folders of every lazygrad package it depends on, directly or not, dependencies first."""
    by_dist = {data["project"]["name"]: name for name, data in pyprojects().items()}
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        for requirement in pyprojects()[name]["project"].get("dependencies", []):
            if (dep := by_dist.get(_requirement_name(requirement))) is not None:
                visit(dep)
        order.append(name)

    visit(folder)
    # lazygrad packages a folder's tests need (e.g. lazygrad-testkit), with their own dependencies
    for requirement in nox.project.dependency_groups(pyprojects()[folder], "test"):
        if (dep := by_dist.get(_requirement_name(requirement))) is not None:
            visit(dep)
    return order


def install_packages(session: nox.Session, folders: list[str], tested: list[str], extra: Sequence[Path] = ()) -> None:
    """Install `folders` (and the project folders `extra`) editable in one resolver run, so their lazygrad
    dependencies come from this checkout and never from a package index, plus the `test` dependency group of each
    folder in `tested` (less the lazygrad packages, installed from here)."""
    ours = {data["project"]["name"] for data in pyprojects().values()}
    test_deps = sorted(
        {
            dep
            for f in tested
            for dep in nox.project.dependency_groups(pyprojects()[f], "test")
            if _requirement_name(dep) not in ours
        }
    )
    editable = [arg for f in folders for arg in ("-e", str(PACKAGES / f))]
    editable += [arg for p in extra for arg in ("-e", str(p))]
    session.install(*find_links(session), *editable, *test_deps)


def find_links(session: nox.Session) -> list[str]:
    """uv does not read pip's configuration; hand it pip's local wheel directories so both see the same wheels."""
    if session.venv_backend != "uv" or not (links := os.environ.get("PIP_FIND_LINKS")):
        return []
    return [arg for link in shlex.split(links) for arg in ("--find-links", link)]


def install_torch(session: nox.Session) -> None:
    """Install the torch reference if this platform has it; a failure only means torch-based tests skip."""
    session.install(*find_links(session), TORCH, success_codes=[0, 1, 2])


def run_pytest(session: nox.Session, *paths: str, extra: tuple[str, ...] = ()) -> None:
    # Exit code 5 is "no tests collected", which a package that has not grown tests yet legitimately returns.
    session.run("pytest", *extra, *paths, *session.posargs, success_codes=[0, 5])


@nox.session
def tests(session: nox.Session) -> None:
    """Every package and example plugin installed together, the whole test suite, and the conformance suite
    (lazygrad-testkit) on every in-tree device usable here."""
    install_packages(session, list(pyprojects()), tested=list(pyprojects()), extra=EXAMPLE_PLUGINS)
    session.install("pytest-xdist", "hypothesis")
    install_torch(session)
    tests = [str(PACKAGES / f / "tests") for f in pyprojects()] + [str(p / "tests") for p in EXAMPLE_PLUGINS]
    # the slowest tests are listed at the end, to keep an eye on the suite's time
    run_pytest(session, *tests, extra=("-n", "auto", "--durations=25"))
    run_pytest(session, "lazygrad_testkit", extra=("-n", "auto", "--pyargs"))
    # the example plugins under the same suite, as a third party runs it; the system C compiler (GCC 12) has no
    # bfloat16 in C, which CDEV renders natively (CPU:C renders 16-bit floats as storage with conversions in C)
    for device, lacking in (("CDEV", ("bfloat16",)), ("CPU:C", ())):
        skips = [f"--lazygrad-skip-dtype={dt}" for dt in lacking]
        run_pytest(session, "lazygrad_testkit", extra=("-n", "auto", "--pyargs", f"--lazygrad-device={device}", *skips))


def _package_session(folder: str) -> None:
    def run(session: nox.Session) -> None:
        install_packages(session, closure(folder), tested=[folder])
        install_torch(session)
        run_pytest(session, str(PACKAGES / folder / "tests"))

    run.__doc__ = f"packages/{folder} installed alone (with its lazygrad dependencies), its tests."
    nox.session(name=folder)(run)


for _folder in pyprojects():
    _package_session(_folder)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def bench(session: nox.Session) -> None:
    """Run every benchmark in benchmarks/ (never part of the test suite)."""
    install_packages(session, list(pyprojects()), tested=[])
    install_torch(session)
    # a benchmark is a script; the modules they share (core.py, example_modules.py) have no main block
    scripts = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if '__name__ == "__main__"' in p.read_text())
    if not scripts:
        session.skip("benchmarks/ holds no benchmark yet")
    for script in scripts:
        session.run("python", str(script), *session.posargs)


@nox.session
def cuda(session: nox.Session) -> None:
    """The op suite and the CUDA package's tests on an NVIDIA GPU (fails, saying why, where CUDA is unusable)."""
    install_packages(session, list(pyprojects()), tested=["frontend", "runtime-cuda"])
    session.install("hypothesis")
    install_torch(session)
    why = "from lazygrad_uop.registry import Device; print(Device.usable('CUDA') or '')"
    if reason := session.run("python", "-c", why, silent=True).strip():
        session.error(f"the CUDA device is not usable here: {reason}")
    session.run("pytest", str(PACKAGES / "frontend" / "tests" / "test_ops.py"), "-k", "CUDA", *session.posargs)
    session.run("pytest", str(PACKAGES / "runtime-cuda" / "tests"), *session.posargs)
