"""The frontend uses the scheduler through its public package only: `from lazygrad_scheduler import X` with X in
`lazygrad_scheduler.__all__`, never a module inside it (those are free to change)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lazygrad
import lazygrad_scheduler

FRONTEND = Path(lazygrad.__file__).parent


def scheduler_violations(source: str, public: set[str]) -> list[str]:
    """Each import in `source` that reaches past the scheduler's public package, as 'line N: what'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {a.name}" for a in node.names if a.name.startswith("lazygrad_scheduler.")
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module.startswith("lazygrad_scheduler."):
                found.append(f"line {node.lineno}: from {node.module} import ...")
            elif node.module == "lazygrad_scheduler":
                found += [f"line {node.lineno}: {a.name} is not public" for a in node.names if a.name not in public]
    return found


def frontend_modules() -> list[Path]:
    modules = sorted(FRONTEND.rglob("*.py"))
    assert len(modules) > 10, f"expected the frontend's modules under {FRONTEND}"
    return modules


@pytest.mark.parametrize("path", frontend_modules(), ids=lambda p: str(p.relative_to(FRONTEND)))
def test_frontend_imports_only_the_scheduler_package(path: Path) -> None:
    bad = scheduler_violations(path.read_text(), set(lazygrad_scheduler.__all__))
    assert not bad, (
        f"{path.relative_to(FRONTEND)} imports scheduler internals: {bad}; export it from lazygrad_scheduler"
    )


def test_the_check_sees_each_form_of_a_private_import() -> None:
    public = {"kernelize"}
    src = (
        "import lazygrad_scheduler.memory\n"
        "from lazygrad_scheduler.kernelize import view_base\n"
        "from lazygrad_scheduler import kernelize, _Group\n"
        "from lazygrad_scheduler import kernelize\n"
        "import lazygrad_scheduler\n"
        "def f():\n    from lazygrad_scheduler.schedule import ScheduleItem\n"
    )
    assert sorted(scheduler_violations(src, public)) == [
        "line 1: import lazygrad_scheduler.memory",
        "line 2: from lazygrad_scheduler.kernelize import ...",
        "line 3: _Group is not public",
        "line 7: from lazygrad_scheduler.schedule import ...",
    ]


def test_public_names_exist() -> None:
    missing = [n for n in lazygrad_scheduler.__all__ if not hasattr(lazygrad_scheduler, n)]
    assert not missing, f"lazygrad_scheduler.__all__ lists names it doesn't define: {missing}"
