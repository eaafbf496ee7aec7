"""Fault injection for the on-disk cache: a damaged or unusable cache warns once, naming its path and how to clear
it, and the work goes on without it; a damaged entry is never handed back."""

from __future__ import annotations

import os
import pickle
import sqlite3
import warnings
from pathlib import Path

import pytest

from lazygrad_uop import diskcache
from lazygrad_uop.device import Compiler
from lazygrad_uop.diskcache import CACHE_VERSION, CacheWarning, diskcache_get, diskcache_put


@pytest.fixture
def cachedir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CACHEDIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def db_of(cachedir: Path) -> Path:
    return cachedir / "lazygrad" / "cache.db"


def exercise(n: int = 3) -> list[object]:
    """Puts and gets as a compile does; returns what the gets saw."""
    seen = []
    for i in range(n):
        assert diskcache_put("things", ("k", i), i * 10) == i * 10  # put always hands the value back
        seen.append(diskcache_get("things", ("k", i)))
    return seen


def warns_once_about(path: Path, run: object) -> list[object]:
    """`run()` under recorded warnings: exactly one CacheWarning, naming `path` and the way to clear it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run()  # type: ignore[operator]
    msgs = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(msgs) == 1, msgs
    assert str(path) in msgs[0] and "rm -rf" in msgs[0] and "CACHELEVEL=0" in msgs[0]
    return out


def test_cachedir_is_a_file(cachedir: Path) -> None:
    cachedir.write_text("not a folder")
    assert warns_once_about(db_of(cachedir), exercise) == [None, None, None]
    assert cachedir.read_text() == "not a folder"


def test_cachedir_parent_can_not_be_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("CACHEDIR", str(blocker / "missing" / "deeper"))
    assert warns_once_about(blocker / "missing" / "deeper" / "lazygrad" / "cache.db", exercise) == [None] * 3


def test_garbage_file(cachedir: Path) -> None:
    db_of(cachedir).parent.mkdir(parents=True)
    db_of(cachedir).write_bytes(os.urandom(4096))
    assert warns_once_about(db_of(cachedir), exercise) == [None, None, None]


def test_truncated_file(cachedir: Path) -> None:
    for i in range(200):
        diskcache_put("things", ("old", i), os.urandom(512))
    diskcache._connections.clear()  # as a new process would, open the damaged file afresh
    data = db_of(cachedir).read_bytes()
    for suffix in ("-wal", "-shm"):
        Path(str(db_of(cachedir)) + suffix).unlink(missing_ok=True)
    db_of(cachedir).write_bytes(data[: len(data) // 3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = exercise()
        olds = [diskcache_get("things", ("old", i)) for i in range(200)]
    # sqlite may still read a truncated file's first pages: entries it gives back must be intact, the rest missing
    assert all(v is None or (isinstance(v, bytes) and len(v) == 512) for v in olds)
    assert all(v in (None, i * 10) for i, v in enumerate(seen))
    assert len([w for w in caught if issubclass(w.category, CacheWarning)]) <= 1


def test_read_only_database(cachedir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    diskcache_put("things", ("k", 0), 0)
    real_connect = sqlite3.connect

    def read_only(path: object, *args: object, **kwargs: object) -> sqlite3.Connection:
        # what sqlite answers for a file it may not write (root ignores file modes, so the mode can't be tested)
        return real_connect(f"file:{path}?mode=ro", *args, uri=True, **kwargs)  # type: ignore[arg-type]

    diskcache._connections.clear()
    monkeypatch.setattr(diskcache.sqlite3, "connect", read_only)
    # reading works or the cache is given up; writes never raise, and the warning comes once
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = exercise()
    msgs = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(msgs) == 1 and str(db_of(cachedir)) in msgs[0]
    assert all(v in (None, i * 10) for i, v in enumerate(seen))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes read-only folders")
def test_unwritable_folder(cachedir: Path) -> None:
    cachedir.mkdir()
    cachedir.chmod(0o500)
    try:
        assert warns_once_about(db_of(cachedir), exercise) == [None, None, None]
    finally:
        cachedir.chmod(0o700)


def test_wrong_bytes_in_a_valid_pickle_are_detected_and_replaced(cachedir: Path) -> None:
    diskcache_put("things", "k", b"the real binary")
    with sqlite3.connect(db_of(cachedir)) as conn:
        conn.execute(f"UPDATE things_v{CACHE_VERSION} SET val = ?", (pickle.dumps(b"\xde\xad\xbe\xef garbage"),))
    with pytest.warns(CacheWarning, match="checksum"):
        assert diskcache_get("things", "k") is None
    diskcache_put("things", "k", b"the real binary")
    assert diskcache_get("things", "k") == b"the real binary"


def test_an_entry_moved_under_another_key_is_a_miss(cachedir: Path) -> None:
    diskcache_put("things", "a", "value of a")
    diskcache_put("things", "b", "value of b")
    table = f"things_v{CACHE_VERSION}"
    with sqlite3.connect(db_of(cachedir)) as conn:
        val, check = conn.execute(f"SELECT val, sum FROM {table} WHERE key = ?", (diskcache._hash_key("a"),)).fetchone()
        conn.execute(f"UPDATE {table} SET val = ?, sum = ? WHERE key = ?", (val, check, diskcache._hash_key("b")))
    with pytest.warns(CacheWarning):
        assert diskcache_get("things", "b") is None
    assert diskcache_get("things", "a") == "value of a"


class CountingCompiler(Compiler):
    """Compiles by reversing the source's bytes, counting the compiles."""

    def __init__(self) -> None:
        super().__init__("compile_counting_test")
        self.compiles = 0

    def compile(self, src: str) -> bytes:
        self.compiles += 1
        return src.encode()[::-1]


def test_corrupt_compiler_entry_is_recompiled(cachedir: Path) -> None:
    c = CountingCompiler()
    assert c.compile_cached("kernel source") == b"ecruos lenrek" and c.compiles == 1
    assert c.compile_cached("kernel source") == b"ecruos lenrek" and c.compiles == 1  # from the cache
    with sqlite3.connect(db_of(cachedir)) as conn:
        conn.execute(f"UPDATE compiler_v{CACHE_VERSION} SET val = ?", (pickle.dumps(b"\x00" * 13),))
    with pytest.warns(CacheWarning):
        assert c.compile_cached("kernel source") == b"ecruos lenrek"
    assert c.compiles == 2
    assert c.compile_cached("kernel source") == b"ecruos lenrek" and c.compiles == 2  # the rebuilt entry


def test_compiling_goes_on_with_an_unusable_cache(cachedir: Path) -> None:
    cachedir.write_text("not a folder")
    c = CountingCompiler()
    with pytest.warns(CacheWarning):
        assert c.compile_cached("abc") == b"cba"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert c.compile_cached("abc") == b"cba"
    assert c.compiles == 2
