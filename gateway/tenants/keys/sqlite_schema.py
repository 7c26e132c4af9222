"""The SQLite key file: made readable by its owner only, and its tables created or upgraded.

The file holds the store secret and every key's digest, so it is created with mode 0600
(SQLite gives its -wal and -shm files the mode of the database file). A file found readable
by others (made by an older zerogap, or copied) is tightened to 0600, with a warning.

Schema versions live in SQLite's `PRAGMA user_version`:
  0  the first layout (models joined with commas), or a new, empty file;
  1  models as a JSON list, and max_concurrency.
The upgrade runs in one IMMEDIATE transaction, so gateway workers that start together on an
old file upgrade it once. Old allow-lists keep their meaning: a comma-joined "a,b" becomes
["a", "b"], NULL (every model) stays NULL. The one exception is "": the old code stored it only
for `models: [""]`, an allow-list meant to restrict, which its reader turned into "every model"
(the hole this upgrade closes). It becomes [] (no model), with a warning that names the key.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sqlite3
import stat
import time
from pathlib import Path

from gateway.tenants.keys.base import KeyLimits, KeyStoreError

log = logging.getLogger("zerogap.gateway.keys.sqlite")

SCHEMA_VERSION = 1
FILE_MODE = 0o600
BUSY_TIMEOUT_S = 5.0  # how long a connection waits for another one's lock
TABLES = (
    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,
    models TEXT,
    created_at REAL NOT NULL,
    expires_at REAL,
    revoked_at REAL,
    """
    + ",\n    ".join(f"{name} INTEGER" for name in KeyLimits.names())
    + "\n)",
    """CREATE TABLE IF NOT EXISTS usage (
    key_name TEXT NOT NULL,
    model TEXT NOT NULL,
    num_requests INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL,
    PRIMARY KEY (key_name, model)
)""",
)


def owner_only(path: Path) -> None:
    """Create `path` with mode 0600 if it is missing; tighten it (and its -wal, -shm) if others may read it."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
        return
    except FileExistsError:
        pass
    for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            mode = stat.S_IMODE(file.stat().st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            try:
                file.chmod(FILE_MODE)
                log.warning("key store %s was mode %04o (readable by others): now %04o", file, mode, FILE_MODE)
            except OSError as exc:
                log.warning("key store %s is mode %04o (readable by others) and cannot be tightened (%s): "
                            "chmod 600 it", file, mode, exc)  # fmt: skip


def connect(path: Path) -> sqlite3.Connection:
    """The key file, owner-only, in WAL mode, at the current schema."""
    path.parent.mkdir(parents=True, exist_ok=True)
    owner_only(path)
    db = sqlite3.connect(path, check_same_thread=False, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        _write_ahead_log(db)
        if _user_version(db) != SCHEMA_VERSION:
            _upgrade(db, path)
        if _limit_columns_missing(db):
            _add_limit_columns(db)
        return db
    except BaseException:
        db.close()
        raise


def _write_ahead_log(db: sqlite3.Connection) -> None:
    """Switch the file to WAL, waiting out other processes doing the same.

    Leaving rollback-journal mode takes an exclusive lock, and SQLite answers "database is locked" at once,
    without its busy handler, to a connection that asks while another holds it (4 workers opening one old
    file together: 11 failures in 300 tries here). So ask again until BUSY_TIMEOUT_S has passed.
    """
    deadline_s = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            if db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
        if time.monotonic() >= deadline_s:
            raise sqlite3.OperationalError(f"database is locked: could not switch to WAL in {BUSY_TIMEOUT_S:g} s")
        time.sleep(0.01)


def _user_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def _upgrade(db: sqlite3.Connection, path: Path) -> None:
    db.execute("BEGIN IMMEDIATE")
    try:
        version = _user_version(db)  # another process may have upgraded it meanwhile
        if version > SCHEMA_VERSION:
            raise KeyStoreError(
                f"key store {path} has schema version {version}, newer than this zerogap's {SCHEMA_VERSION}. "
                "Upgrade zerogap."
            )
        if version < SCHEMA_VERSION:
            old_layout = _table_exists(db, "keys")
            for statement in TABLES:
                db.execute(statement)
            if old_layout:
                _upgrade_from_0(db)
            db.execute("INSERT OR IGNORE INTO meta VALUES ('secret', ?)", (secrets.token_hex(32),))
            db.execute("INSERT OR IGNORE INTO meta VALUES ('version', '0')")
            db.execute("UPDATE meta SET v = CAST(v AS INTEGER) + 1 WHERE k='version'")  # reload everywhere
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _limit_columns_missing(db: sqlite3.Connection) -> list[str]:
    """KeyLimits's fields the keys table has no column for (a file from before a limit was added)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(keys)")}
    return [name for name in KeyLimits.names() if name not in columns]


def _add_limit_columns(db: sqlite3.Connection) -> None:
    """One column per new limit (NULL: no limit for the keys already there), under the write lock;
    the change counter bumped once, so that every gateway reloads the keys."""
    db.execute("BEGIN IMMEDIATE")
    try:
        if _add_missing_limit_columns(db):  # read again: another process may have added them
            db.execute("UPDATE meta SET v = CAST(v AS INTEGER) + 1 WHERE k='version'")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _add_missing_limit_columns(db: sqlite3.Connection) -> bool:
    """Inside the caller's transaction: add the missing limits' columns; True if any was."""
    missing = _limit_columns_missing(db)
    for name in missing:
        db.execute(f"ALTER TABLE keys ADD COLUMN {name} INTEGER")
    return bool(missing)


def _table_exists(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone() is not None


def _upgrade_from_0(db: sqlite3.Connection) -> None:
    """Add the limits' columns the old table lacks (max_concurrency); turn comma-joined allow-lists
    into JSON lists, keeping what each meant."""
    _add_missing_limit_columns(db)
    for name, joined in db.execute("SELECT name, models FROM keys WHERE models IS NOT NULL").fetchall():
        if joined == "":
            log.warning("key %r had the allow-list [\"\"], which granted every model; it now grants none. "
                        "Revoke it and create it again with the models it may use.", name)  # fmt: skip
        listed = json.dumps(joined.split(",") if joined else [])
        db.execute("UPDATE keys SET models = ? WHERE name = ?", (listed, name))
