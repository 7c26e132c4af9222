"""Virtual keys and usage in PostgreSQL ([gateway].database_url), shared by every gateway process.

Tables (prefixed zerogap_) are created on start under an advisory lock, so processes that start
together do not race; `zerogap_meta` holds the schema version, the store secret (32 random
bytes: keys are kept as HMAC-SHA256(secret, key)) and the keys' change counter. Allow-lists are
TEXT[] (NULL: every model); version 2 added max_concurrency. Usage is added
with INSERT ... ON CONFLICT DO UPDATE SET n = n + excluded.n: concurrent flushes from many
processes never lose an update. One connection per process (psycopg 3, async), used under a
lock; a broken connection is dropped and made again on the next call.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import errors

from gateway.tenants.keys.base import NO_LIMITS, KeyLimits, KeyRecord, KeyStoreError, UsageRow, duplicate, new_key
from gateway.tenants.keys.fields import checked

SCHEMA_VERSION = 2
SCHEMA_LOCK_ID = 0x7A65726F67  # pg_advisory_xact_lock key for schema changes ("zerog")
CONNECT_TIMEOUT_S = 3
QUERY_TIMEOUT_S = 5.0

MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE zerogap_keys (
    name TEXT PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,
    models TEXT[],
    rpm BIGINT,
    tpm BIGINT,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION,
    revoked_at DOUBLE PRECISION
);
CREATE TABLE zerogap_usage (
    key_name TEXT NOT NULL,
    model TEXT NOT NULL,
    num_requests BIGINT NOT NULL DEFAULT 0,
    prompt_tokens BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    updated_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (key_name, model)
);
""",
    2: "ALTER TABLE zerogap_keys ADD COLUMN IF NOT EXISTS max_concurrency BIGINT",
}
KEY_COLUMNS = ", ".join(("name", "digest", "models", "created_at", "expires_at", "revoked_at", *KeyLimits.names()))
# Every limit's column, made on open if missing (a limit added after the table was made): NULL is no limit.
ADD_LIMIT_COLUMNS = "; ".join(
    f"ALTER TABLE zerogap_keys ADD COLUMN IF NOT EXISTS {name} BIGINT" for name in KeyLimits.names()
)

BUMP = "UPDATE zerogap_meta SET v = (v::bigint + 1)::text WHERE k = 'version'"
ADD_USAGE = (
    "INSERT INTO zerogap_usage VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (key_name, model) DO UPDATE SET "
    "num_requests = zerogap_usage.num_requests + excluded.num_requests, "
    "prompt_tokens = zerogap_usage.prompt_tokens + excluded.prompt_tokens, "
    "completion_tokens = zerogap_usage.completion_tokens + excluded.completion_tokens, "
    "updated_at = excluded.updated_at"
)


def where(url: str) -> str:
    """host:port/db of a database URL, without user or password (safe to print)."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"


class PostgresStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._secret = b""

    def digest(self, key: str) -> str:
        return hmac.new(self._secret, key.encode(), hashlib.sha256).hexdigest()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, application_name="zerogap-gateway"
            )
        return self._conn

    async def _run(self, work: Any) -> Any:
        """Run `work(conn)` under the lock; a failed connection is closed, to be made again next time."""
        async with self._lock:
            try:
                async with asyncio.timeout(QUERY_TIMEOUT_S + CONNECT_TIMEOUT_S):
                    return await work(await self._connection())
            except (psycopg.OperationalError, psycopg.InterfaceError, TimeoutError):
                await self._drop()
                raise

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                await conn.close()
            except psycopg.Error:
                pass

    async def open(self) -> None:
        try:
            self._secret = await self._run(self._migrate)
        except psycopg.Error as exc:
            raise KeyStoreError(
                f"PostgreSQL at {where(self.url)} cannot be used ({str(exc).strip()}). Start it, or fix "
                "[gateway].database_url (postgresql://user@host:port/db); the user needs CREATE on the database."
            ) from None

    async def _migrate(self, conn: psycopg.AsyncConnection[Any]) -> bytes:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_ID,))
            await conn.execute("CREATE TABLE IF NOT EXISTS zerogap_meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
            await conn.execute(
                "INSERT INTO zerogap_meta VALUES ('schema_version', '0'), ('version', '0'), ('secret', %s) "
                "ON CONFLICT (k) DO NOTHING",
                (secrets.token_hex(32),),
            )
            rows = dict(await (await conn.execute("SELECT k, v FROM zerogap_meta")).fetchall())
            current = int(rows["schema_version"])
            if current > SCHEMA_VERSION:
                raise KeyStoreError(
                    f"PostgreSQL at {where(self.url)} has key-store schema version {current}, newer than this "
                    f"gateway's {SCHEMA_VERSION}. Upgrade zerogap."
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                await conn.execute(MIGRATIONS[version])
                await conn.execute("UPDATE zerogap_meta SET v = %s WHERE k = 'schema_version'", (str(version),))
            await conn.execute(ADD_LIMIT_COLUMNS)
        return bytes.fromhex(rows["secret"])

    async def version(self) -> int:
        async def work(conn: psycopg.AsyncConnection[Any]) -> int:
            row = await (await conn.execute("SELECT v FROM zerogap_meta WHERE k = 'version'")).fetchone()
            return int(row[0]) if row else 0

        result: int = await self._run(work)
        return result

    async def keys(self) -> list[KeyRecord]:
        async def work(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = await conn.execute(f"SELECT {KEY_COLUMNS} FROM zerogap_keys ORDER BY name")
            return await cur.fetchall()

        rows = await self._run(work)  # models: NULL allows every model, an array exactly those
        return [
            KeyRecord(r[0], r[1], tuple(r[2]) if r[2] is not None else None, KeyLimits(*r[6:]), *r[3:6]) for r in rows
        ]

    async def create(
        self,
        name: str,
        models: Iterable[str] | None = None,
        limits: KeyLimits = NO_LIMITS,
        expires_at: float | None = None,
    ) -> str:
        fields = checked(name, models, limits)
        key = new_key(name)
        listed = list(fields.models) if fields.models is not None else None
        row = (name, self.digest(key), listed, time.time(), expires_at, None, *fields.limits.values())

        async def work(conn: psycopg.AsyncConnection[Any]) -> None:
            async with conn.transaction():
                marks = ", ".join(["%s"] * len(row))
                await conn.execute(f"INSERT INTO zerogap_keys ({KEY_COLUMNS}) VALUES ({marks})", row)
                await conn.execute(BUMP)

        try:
            await self._run(work)
        except errors.UniqueViolation:
            raise duplicate(name) from None
        return key

    async def revoke(self, name: str) -> bool:
        async def work(conn: psycopg.AsyncConnection[Any]) -> bool:
            async with conn.transaction():
                cur = await conn.execute(
                    "UPDATE zerogap_keys SET revoked_at = %s WHERE name = %s AND revoked_at IS NULL",
                    (time.time(), name),
                )
                await conn.execute(BUMP)
                return cur.rowcount > 0

        result: bool = await self._run(work)
        return result

    async def add_usage(self, rows: Iterable[UsageRow]) -> None:
        now = time.time()
        params = [(r.key_name, r.model, r.num_requests, r.prompt_tokens, r.completion_tokens, now) for r in rows]

        async def work(conn: psycopg.AsyncConnection[Any]) -> None:
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(ADD_USAGE, params)

        await self._run(work)

    async def usage(self) -> list[UsageRow]:
        async def work(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = await conn.execute(
                "SELECT key_name, model, num_requests, prompt_tokens, completion_tokens FROM zerogap_usage "
                "ORDER BY key_name, model"
            )
            return await cur.fetchall()

        return [UsageRow(*r) for r in await self._run(work)]

    async def close(self) -> None:
        async with self._lock:
            await self._drop()
