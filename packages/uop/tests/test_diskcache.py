"""The on-disk cache: where it lives, what it stores, and that several processes can write to it at once."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lazygrad_uop.config import Context
from lazygrad_uop.diskcache import CACHE_VERSION, CacheWarning, cache_path, diskcache_get, diskcache_put


@pytest.fixture
def cachedir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    return tmp_path


def test_roundtrip_and_misses(cachedir: Path) -> None:
    assert diskcache_get("things", ("a", 1)) is None  # before the table exists
    value = {"lib": b"\x00\x01", "opts": [1, 2]}
    assert diskcache_put("things", ("a", 1), value) == value
    assert diskcache_get("things", ("a", 1)) == value
    assert diskcache_get("things", ("a", 2)) is None
    assert diskcache_get("other", ("a", 1)) is None
    diskcache_put("things", ("a", 1), "replaced")
    assert diskcache_get("things", ("a", 1)) == "replaced"


def test_file_location_and_versioned_tables(cachedir: Path) -> None:
    diskcache_put("things", "k", 1)
    db = cachedir / "lazygrad" / "cache.db"
    assert cache_path() == db
    with sqlite3.connect(db) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {f"things_v{CACHE_VERSION}"}


def test_default_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CACHEDIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path() == tmp_path / "xdg" / "lazygrad" / "cache.db"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(sys, "platform", "linux")
    assert cache_path() == tmp_path / ".cache" / "lazygrad" / "cache.db"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert cache_path() == tmp_path / "Library" / "Caches" / "lazygrad" / "cache.db"


def test_cachelevel_zero_disables(cachedir: Path) -> None:
    with Context(CACHELEVEL=0):
        diskcache_put("things", "k", 1)
        assert diskcache_get("things", "k") is None
    assert diskcache_get("things", "k") is None
    assert not (cachedir / "lazygrad" / "cache.db").exists()


def test_table_names_are_checked(cachedir: Path) -> None:
    with pytest.raises(ValueError, match="letters, digits and underscores"):
        diskcache_put("x; DROP TABLE y", "k", 1)


def test_unreadable_entries_are_misses(cachedir: Path) -> None:
    diskcache_put("things", "k", 1)
    with sqlite3.connect(cachedir / "lazygrad" / "cache.db") as conn:
        conn.execute(f"UPDATE things_v{CACHE_VERSION} SET val = ?", (b"not a pickle",))
    with pytest.warns(CacheWarning, match="checksum"):
        assert diskcache_get("things", "k") is None


def test_concurrent_writers(cachedir: Path) -> None:
    writer = textwrap.dedent(
        """
        import sys
        from lazygrad_uop.diskcache import diskcache_put
        for i in range(40):
            diskcache_put("shared", (sys.argv[1], i), i * i)
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(p)]) for p in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    assert all(diskcache_get("shared", (str(p), i)) == i * i for p in range(4) for i in range(40))
