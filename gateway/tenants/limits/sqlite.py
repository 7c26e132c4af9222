"""The limits of gateway/tenants/limits/ shared by the workers of one `zerogap gateway --workers N`
when there is no [gateway].redis_url: the same token buckets and concurrency slots, kept in a
SQLite file in the supervisor's temporary folder (ZEROGAP_SHARED_LIMITS names it). Each
admission is one short write transaction (BEGIN IMMEDIATE), so the workers together admit
exactly one budget and one max_concurrency per key.

A slot is a row of `leases` with an expiry that its worker renews (gateway/tenants/limits/leases.py); a worker
that is killed renews nothing, and its rows are dropped by the next admission after they
expire. The buckets and leases run on the system's monotonic clock, which every process on the
host shares."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from gateway.tenants.auth import Principal
from gateway.tenants.limits.base import Slot
from gateway.tenants.limits.leases import Leases
from gateway.tenants.limits.rule import Bucket, cap_of, clamp, head_rule, settled_level, tpm_rule

SHARED_LIMITS_ENV = "ZEROGAP_SHARED_LIMITS"
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS buckets (k TEXT PRIMARY KEY, level REAL NOT NULL, ts REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS leases (id TEXT PRIMARY KEY, k TEXT NOT NULL, owner TEXT NOT NULL, "
    "expires REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS leases_by_key ON leases (k, expires)",
    "CREATE INDEX IF NOT EXISTS leases_by_owner ON leases (owner)",
)
T = TypeVar("T")


class SqliteLimiter:
    def __init__(self, path: Path, lease_s: float = 5.0) -> None:
        self.path = path
        self._db = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=OFF")
        for statement in SCHEMA:
            self._db.execute(statement)
        self.leases = Leases(lease_s, self._renew)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _load(self, key: str, limit: int | None, now: float) -> Bucket | None:
        capacity = cap_of(limit)
        if capacity is None:
            return None
        row = self._db.execute("SELECT level, ts FROM buckets WHERE k = ?", (key,)).fetchone()
        bucket = Bucket(capacity, capacity, now) if row is None else Bucket(capacity, row[0], row[1])
        bucket.refill(float(capacity), now)
        return bucket

    def _store(self, key: str, bucket: Bucket) -> None:
        self._db.execute(
            "INSERT INTO buckets VALUES (?, ?, ?) ON CONFLICT (k) DO UPDATE SET level = excluded.level, "
            "ts = excluded.ts",
            (key, bucket.level, bucket.updated_s),
        )

    def num_held(self, key: str) -> int:
        """Live slots of the key, over all the workers."""
        row = self._db.execute("SELECT COUNT(*) FROM leases WHERE k = ? AND expires > ?", (key, time.monotonic()))
        return int(row.fetchone()[0])

    async def admit(self, who: Principal) -> Slot | None:
        return self._locked(lambda: self._take_head(who))

    def _locked(self, work: Callable[[], T]) -> T:
        with self._transaction():
            return work()

    def _take_head(self, who: Principal) -> Slot | None:
        now = time.monotonic()
        rpm = self._load(f"{who.name}:rpm", who.limits.rpm, now)
        capped = who.limits.max_concurrency is not None
        if capped:
            self._db.execute("DELETE FROM leases WHERE k = ? AND expires <= ?", (who.name, now))
        head_rule(who, rpm, self.num_held(who.name) if capped else 0)
        if rpm is not None:
            rpm.level -= 1
            self._store(f"{who.name}:rpm", rpm)
        if not capped:
            return None
        slot = self.leases.new(who.name)
        self._db.execute(
            "INSERT INTO leases VALUES (?, ?, ?, ?)",
            (slot.lease_id, who.name, self.leases.owner, now + self.leases.lease_s),
        )
        self.leases.hold(slot)
        return slot

    async def reserve(self, who: Principal, estimate: int, budget_tokens: int) -> None:
        self._locked(lambda: self._take_tokens(who, clamp(estimate), budget_tokens))

    def _take_tokens(self, who: Principal, estimate: int, budget_tokens: int) -> None:
        tpm = self._load(f"{who.name}:tpm", who.limits.tpm, time.monotonic())
        if tpm is None:
            return
        tpm_rule(who, tpm, estimate, budget_tokens)
        tpm.level -= estimate
        self._store(f"{who.name}:tpm", tpm)

    def settle(self, who: Principal, estimate: int, actual: int) -> None:
        if who.limits.tpm is None or estimate == actual:
            return
        with self._transaction():
            bucket = self._load(f"{who.name}:tpm", who.limits.tpm, time.monotonic())
            if bucket is not None:
                bucket.level = settled_level(bucket, estimate, actual)
                self._store(f"{who.name}:tpm", bucket)

    def release(self, slot: Slot) -> None:
        if self.leases.drop(slot):
            self._db.execute("DELETE FROM leases WHERE id = ?", (slot.lease_id,))

    async def _renew(self, live: dict[str, str]) -> None:
        """This process's live leases, lease_s on; one that lapsed stays lapsed (its row may linger until
        the next admission drops it, but its slot is free: another request may hold it already)."""
        now = time.monotonic()
        self._db.execute(
            "UPDATE leases SET expires = ? WHERE owner = ? AND expires > ?",
            (now + self.leases.lease_s, self.leases.owner, now),
        )

    async def close(self) -> None:
        await self.leases.close()
        self._db.execute("DELETE FROM leases WHERE owner = ?", (self.leases.owner,))
        self._db.close()
