"""A persistent key-value cache in one sqlite file, shared by every lazygrad process of the user: compiled binaries,
BEAM search results.

The file is `<cachedir>/lazygrad/cache.db`, where cachedir is `CACHEDIR` if set, else the platform's user cache
directory. `CACHELEVEL=0` turns the cache off: gets miss and puts do nothing.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

from lazygrad_uop.config import CACHELEVEL, getenv

# Part of every table name: bump it when the meaning of cached values changes, so old entries are never read back.
CACHE_VERSION = 1

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Several processes share the file; a writer holds the lock only for one statement, so waiting is better than failing.
_LOCK_TIMEOUT_S = 30.0
_connections: dict[tuple[int, str], sqlite3.Connection] = {}
_lock = threading.Lock()


def cache_path() -> Path:
    """Where the cache file lives, from `CACHEDIR` or the platform's user cache directory."""
    if cachedir := getenv("CACHEDIR", ""):
        return Path(cachedir).expanduser() / "lazygrad" / "cache.db"
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        base = Path(xdg)
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path.home() / ".cache"
    return base / "lazygrad" / "cache.db"


def _connect(path: Path) -> sqlite3.Connection:
    # One connection per process and file: a connection inherited through fork must not be used by the child.
    key = (os.getpid(), str(path))
    if (conn := _connections.get(key)) is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=_LOCK_TIMEOUT_S, check_same_thread=False, isolation_level=None)
        # write-ahead logging without a sync per insert: a compile writes an entry per kernel, and a full sync each
        # time cost ~13 ms apiece; a crash can lose only the last entries, which are compiled again
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        _connections[key] = conn
    return conn


def _table(table: str) -> str:
    if not _TABLE_NAME.fullmatch(table):
        raise ValueError(f"cache table name must be letters, digits and underscores, got {table!r}")
    return f"{table}_v{CACHE_VERSION}"


def _hash_key(key: Any) -> str:
    return hashlib.sha256(pickle.dumps(key, protocol=4)).hexdigest()


def diskcache_get(table: str, key: Any) -> Any:
    """The value stored under `key` in `table`, or None when there is none (or the cache is off)."""
    name = _table(table)
    if CACHELEVEL.value == 0:
        return None
    if not (path := cache_path()).exists():
        return None  # a lookup should not create the file
    with _lock:
        try:
            row = _connect(path).execute(f"SELECT val FROM {name} WHERE key = ?", (_hash_key(key),)).fetchone()
        except sqlite3.OperationalError as exc:
            # Tables are created by the first put; before that a get is simply a miss.
            if "no such table" in str(exc):
                return None
            raise
    if row is None:
        return None
    try:
        return pickle.loads(row[0])
    except (pickle.UnpicklingError, AttributeError, ImportError, EOFError):
        # An entry written by code that has since changed shape: treat it as absent and let it be overwritten.
        return None


def diskcache_put(table: str, key: Any, value: Any) -> Any:
    """Store `value` under `key` in `table` (replacing what was there) and return `value`."""
    name = _table(table)
    if CACHELEVEL.value == 0:
        return value
    blob = pickle.dumps(value)
    with _lock:
        conn = _connect(cache_path())
        conn.execute(f"CREATE TABLE IF NOT EXISTS {name} (key TEXT PRIMARY KEY, val BLOB NOT NULL)")
        conn.execute(f"INSERT OR REPLACE INTO {name} (key, val) VALUES (?, ?)", (_hash_key(key), blob))
    return value
