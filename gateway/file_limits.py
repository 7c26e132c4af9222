"""The rate limits of gateway/limits.py shared by the workers of one `zerogap gateway --workers N`
when there is no [gateway].redis_url: the same token buckets, kept in a SQLite file in the
supervisor's temporary folder (ZEROGAP_SHARED_LIMITS names it). Each admission is one short
write transaction (BEGIN IMMEDIATE), so the workers together admit exactly one budget.
The buckets refill on the system's monotonic clock, which every process on the host shares."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from gateway.auth import Principal
from gateway.limits import Bucket, limited

SHARED_LIMITS_ENV = "ZEROGAP_SHARED_LIMITS"
SCHEMA = "CREATE TABLE IF NOT EXISTS buckets (k TEXT PRIMARY KEY, level REAL NOT NULL, ts REAL NOT NULL)"


class FileLimiter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS buckets (k TEXT PRIMARY KEY, level REAL NOT NULL, ts REAL NOT NULL)"
        )

    def _load(self, key: str, limit: int | None, now: float) -> Bucket | None:
        if limit is None:
            return None
        row = self._db.execute("SELECT level, ts FROM buckets WHERE k = ?", (key,)).fetchone()
        bucket = Bucket(float(limit), float(limit), now) if row is None else Bucket(float(limit), row[0], row[1])
        bucket.refill(float(limit), now)
        return bucket

    def _store(self, key: str, bucket: Bucket) -> None:
        self._db.execute(
            "INSERT INTO buckets VALUES (?, ?, ?) ON CONFLICT (k) DO UPDATE SET level = excluded.level, "
            "ts = excluded.ts",
            (key, bucket.level, bucket.updated_s),
        )

    async def admit(self, who: Principal, estimate: int) -> None:
        self.take(who, estimate)

    def take(self, who: Principal, estimate: int) -> None:
        """Take one request and reserve `estimate` tokens, or raise ApiError 429."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            now = time.monotonic()
            rpm = self._load(f"{who.name}:rpm", who.rpm, now)
            tpm = self._load(f"{who.name}:tpm", who.tpm, now)
            if rpm is not None and who.rpm is not None and rpm.level < 1:
                raise limited("requests", who.rpm, rpm.seconds_until(1))
            if tpm is not None and who.tpm is not None and tpm.level <= 0:
                raise limited("tokens", who.tpm, tpm.seconds_until(1e-9))
            if rpm is not None:
                rpm.level -= 1
                self._store(f"{who.name}:rpm", rpm)
            if tpm is not None:
                tpm.level -= estimate
                self._store(f"{who.name}:tpm", tpm)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def settle(self, who: Principal, estimate: int, actual: int) -> None:
        """Replace a request's reservation by what it used."""
        if who.tpm is None or estimate == actual:
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            bucket = self._load(f"{who.name}:tpm", who.tpm, time.monotonic())
            if bucket is not None:
                bucket.level = min(bucket.capacity, bucket.level + estimate - actual)
                self._store(f"{who.name}:tpm", bucket)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    async def close(self) -> None:
        self._db.close()
