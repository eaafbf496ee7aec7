"""A persistent key-value cache in one sqlite file, shared by every lazygrad process of the user: compiled binaries,
rendered programs, BEAM search results.

The file is `<cachedir>/lazygrad/cache.db`, where cachedir is `CACHEDIR` if set, else the platform's user cache
directory. `CACHELEVEL=0` turns the cache off: gets miss and puts do nothing.

The cache only ever saves work, so it never stops a computation: a cache that can't be opened, read or written (a
corrupt or truncated file, a read-only one, `CACHEDIR` naming a file or an unwritable folder) is reported once with a
warning naming its path and how to clear it, and this process goes on without it. Every entry carries a checksum of
its key and bytes, verified before the bytes are unpickled, so an entry that was damaged, or copied under another
key, is a miss (and is recomputed and replaced) rather than garbage handed to a loader.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import sqlite3
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from lazygrad_uop.config import CACHELEVEL, getenv

# Part of every table name: bump it when the meaning or layout of cached values changes, so old entries are never
# read back. 2: entries carry a checksum.
CACHE_VERSION = 2

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Several processes share the file; a writer holds the lock only for one statement, so waiting is better than failing.
_LOCK_TIMEOUT_S = 30.0
_connections: dict[tuple[int, str], sqlite3.Connection] = {}
# the cache files this process found unusable and no longer touches
_unusable: set[str] = set()
_lock = threading.Lock()


class CacheWarning(UserWarning):
    """The compile cache is damaged or unusable; lazygrad goes on without it (or without the damaged entry)."""


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


def _how_to_clear(path: Path) -> str:
    return (
        f"delete {path.parent} (rm -rf '{path.parent}') to start a fresh cache, point CACHEDIR at a writable folder, "
        "or set CACHELEVEL=0 to compile without a cache"
    )


def _give_up(path: Path, exc: BaseException) -> None:
    """Stop using the cache file at `path` in this process, with one warning saying why and how to fix it."""
    key = str(path)
    if key in _unusable:
        return
    _unusable.add(key)
    if (conn := _connections.pop((os.getpid(), key), None)) is not None:
        conn.close()
    warnings.warn(
        f"lazygrad's compile cache at {path} is unusable ({type(exc).__name__}: {exc}); compiling without it. "
        f"To fix it, {_how_to_clear(path)}.",
        CacheWarning,
        stacklevel=3,
    )


def _transient(exc: sqlite3.Error) -> bool:
    # another process holding the write lock past the timeout: skip this entry, the cache itself is fine
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


def _connect(path: Path) -> sqlite3.Connection:
    # One connection per process and file: a connection inherited through fork must not be used by the child.
    key = (os.getpid(), str(path))
    if (conn := _connections.get(key)) is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=_LOCK_TIMEOUT_S, check_same_thread=False, isolation_level=None)
        try:
            # write-ahead logging without a sync per insert: a compile writes an entry per kernel, and a full sync
            # each time cost ~13 ms apiece; a crash can lose only the last entries, which are compiled again
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error:
            conn.close()
            raise
        _connections[key] = conn
    return conn


def _table(table: str) -> str:
    if not _TABLE_NAME.fullmatch(table):
        raise ValueError(f"cache table name must be letters, digits and underscores, got {table!r}")
    return f"{table}_v{CACHE_VERSION}"


def _hash_key(key: Any) -> str:
    return hashlib.sha256(pickle.dumps(key, protocol=4)).hexdigest()


def _checksum(hashed_key: str, blob: bytes) -> str:
    # over the key too: a sound entry moved under another key must not be taken for that key's value
    return hashlib.sha256(hashed_key.encode() + b"\0" + blob).hexdigest()


def _usable(path: Path) -> bool:
    return CACHELEVEL.value != 0 and str(path) not in _unusable


def diskcache_get(table: str, key: Any) -> Any:
    """The value stored under `key` in `table`, or None when there is none (or the cache is off or unusable)."""
    name = _table(table)
    path = cache_path()
    if not _usable(path):
        return None
    try:
        if not path.exists():
            return None  # a lookup should not create the file
    except OSError:
        return None
    hashed = _hash_key(key)
    with _lock:
        try:
            row = _connect(path).execute(f"SELECT val, sum FROM {name} WHERE key = ?", (hashed,)).fetchone()
        except sqlite3.OperationalError as exc:
            # Tables are created by the first put; before that a get is simply a miss.
            if "no such table" in str(exc) or _transient(exc):
                return None
            _give_up(path, exc)
            return None
        except (sqlite3.Error, OSError) as exc:
            _give_up(path, exc)
            return None
    if row is None:
        return None
    blob, stored_sum = row
    if not isinstance(blob, bytes) or stored_sum != _checksum(hashed, blob):
        _damaged_entry(path, table)
        return None
    try:
        return pickle.loads(blob)
    except Exception:  # noqa: BLE001 - the checksum matched, so this is code that has changed shape since it wrote
        return None


_reported_damage: set[str] = set()


def _damaged_entry(path: Path, table: str) -> None:
    # one warning per file: a damaged file usually has many damaged entries, each of which is recomputed
    if str(path) not in _reported_damage:
        _reported_damage.add(str(path))
        warnings.warn(
            f"lazygrad's compile cache at {path} has an entry in {table!r} whose checksum doesn't match its bytes; "
            f"it is ignored and recomputed. If this repeats, {_how_to_clear(path)}.",
            CacheWarning,
            stacklevel=3,
        )


def diskcache_put(table: str, key: Any, value: Any) -> Any:
    """Store `value` under `key` in `table` (replacing what was there) and return `value`."""
    name = _table(table)
    path = cache_path()
    if not _usable(path):
        return value
    blob = pickle.dumps(value)
    hashed = _hash_key(key)
    with _lock:
        try:
            conn = _connect(path)
            conn.execute(f"CREATE TABLE IF NOT EXISTS {name} (key TEXT PRIMARY KEY, val BLOB NOT NULL, sum TEXT)")
            conn.execute(
                f"INSERT OR REPLACE INTO {name} (key, val, sum) VALUES (?, ?, ?)",
                (hashed, blob, _checksum(hashed, blob)),
            )
        except sqlite3.Error as exc:
            if not _transient(exc):
                _give_up(path, exc)
        except OSError as exc:
            _give_up(path, exc)
    return value
