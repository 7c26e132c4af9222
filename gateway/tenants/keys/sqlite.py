"""Virtual keys and usage in one SQLite file (the default store; see gateway/tenants/keys/base.py).

Secrets are never stored: each key is kept as HMAC-SHA256(store secret, key), where the
store secret is 32 random bytes made when the file is created. A `version` row is bumped
by every change to the keys, so a running gateway notices a revocation by reading one row.
Allow-lists are stored as JSON lists; the file's mode and schema upgrades: gateway/tenants/keys/sqlite_schema.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from gateway.tenants.keys.base import NO_LIMITS, KeyLimits, KeyRecord, KeyStoreError, UsageRow, duplicate, new_key
from gateway.tenants.keys.fields import checked
from gateway.tenants.keys.sqlite_schema import connect

log = logging.getLogger("zerogap.gateway.keys.sqlite")
KEY_COLUMNS = ", ".join(("name", "digest", "models", "created_at", "expires_at", "revoked_at", *KeyLimits.names()))

__all__ = ["KeyRecord", "KeyStore", "KeyStoreError", "SqliteStore", "UsageRow"]


class KeyStore:
    """Thread-safe access to the SQLite file (the gateway calls it from worker threads)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._db = connect(path)
            secret = self._db.execute("SELECT v FROM meta WHERE k='secret'").fetchone()[0]
        except (sqlite3.Error, OSError) as exc:
            raise KeyStoreError(
                f"key store {path}: cannot be opened ({exc}). Check [gateway].key_store and the folder's permissions."
            ) from None
        self._secret = bytes.fromhex(secret)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def digest(self, key: str) -> str:
        return hmac.new(self._secret, key.encode(), hashlib.sha256).hexdigest()

    def version(self, blocking: bool = True) -> int | None:
        """The store's change counter; None when blocking=False and another thread is using the store."""
        if not self._lock.acquire(blocking):
            return None
        try:
            return int(self._db.execute("SELECT v FROM meta WHERE k='version'").fetchone()[0])
        finally:
            self._lock.release()

    def _bump(self) -> None:
        self._db.execute("UPDATE meta SET v = CAST(v AS INTEGER) + 1 WHERE k='version'")

    def create(
        self,
        name: str,
        models: Iterable[str] | None = None,
        limits: KeyLimits = NO_LIMITS,
        expires_at: float | None = None,
    ) -> str:
        """Store a new key and return its secret (shown once, never stored); the fields are checked first."""
        fields = checked(name, models, limits)
        key = new_key(name)
        listed = json.dumps(fields.models) if fields.models is not None else None
        row = (name, self.digest(key), listed, time.time(), expires_at, None, *fields.limits.values())
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute(f"INSERT INTO keys ({KEY_COLUMNS}) VALUES ({', '.join('?' * len(row))})", row)
                self._bump()
                self._db.execute("COMMIT")
            except sqlite3.IntegrityError:
                self._db.execute("ROLLBACK")
                raise duplicate(name) from None
        return key

    def revoke(self, name: str) -> bool:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            cur = self._db.execute(
                "UPDATE keys SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", (time.time(), name)
            )
            self._bump()
            self._db.execute("COMMIT")
            return cur.rowcount > 0

    def keys(self) -> list[KeyRecord]:
        with self._lock:
            rows = self._db.execute(f"SELECT {KEY_COLUMNS} FROM keys ORDER BY name").fetchall()
        return [KeyRecord(r[0], r[1], _models(r[0], r[2]), KeyLimits(*r[6:]), *r[3:6]) for r in rows]

    def add_usage(self, rows: Iterable[UsageRow]) -> None:
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                "INSERT INTO usage VALUES (?,?,?,?,?,?) ON CONFLICT (key_name, model) DO UPDATE SET "
                "num_requests = num_requests + excluded.num_requests, "
                "prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
                "completion_tokens = completion_tokens + excluded.completion_tokens, updated_at = excluded.updated_at",
                [(r.key_name, r.model, r.num_requests, r.prompt_tokens, r.completion_tokens, now) for r in rows],
            )
            self._db.execute("COMMIT")

    def usage(self) -> list[UsageRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT key_name, model, num_requests, prompt_tokens, completion_tokens FROM usage "
                "ORDER BY key_name, model"
            ).fetchall()
        return [UsageRow(*r) for r in rows]


def _models(name: str, stored: str | None) -> tuple[str, ...] | None:
    """The stored JSON allow-list; None allows every model. A list that cannot be read allows none."""
    if stored is None:
        return None
    try:
        models = json.loads(stored)
    except ValueError:
        models = None
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        log.warning("key %r: its stored model list cannot be read; it may use no model until recreated", name)
        return ()
    return tuple(models)


class SqliteStore:
    """The Store interface over KeyStore: each call runs in a worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._store: KeyStore | None = None

    @property
    def sync(self) -> KeyStore:
        if self._store is None:
            raise KeyStoreError(f"key store {self.path}: not open")
        return self._store

    async def open(self) -> None:
        if self._store is None:
            self._store = await asyncio.to_thread(KeyStore, self.path)

    def digest(self, key: str) -> str:
        return self.sync.digest(key)

    async def version(self) -> int:
        version = await asyncio.to_thread(self.sync.version)
        return version or 0

    async def keys(self) -> list[KeyRecord]:
        return await asyncio.to_thread(self.sync.keys)

    async def create(
        self,
        name: str,
        models: Iterable[str] | None = None,
        limits: KeyLimits = NO_LIMITS,
        expires_at: float | None = None,
    ) -> str:
        return await asyncio.to_thread(self.sync.create, name, models, limits, expires_at)

    async def revoke(self, name: str) -> bool:
        return await asyncio.to_thread(self.sync.revoke, name)

    async def add_usage(self, rows: Iterable[UsageRow]) -> None:
        await asyncio.to_thread(self.sync.add_usage, list(rows))

    async def usage(self) -> list[UsageRow]:
        return await asyncio.to_thread(self.sync.usage)

    async def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
