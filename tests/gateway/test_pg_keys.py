"""The PostgreSQL key store on a real server: max_concurrency and allow-lists round-trip as they
were given, bad fields never reach the table, and a database made by the schema-1 gateway is
upgraded in place (its keys keep working)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac

import psycopg
import pytest

from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.keys.fields import InvalidKeyField
from gateway.tenants.keys.postgres import MIGRATIONS, SCHEMA_VERSION, PostgresStore
from tests.fixtures.postgres import PostgresServer

SECRET = "cd" * 32


async def opened(url: str) -> PostgresStore:
    store = PostgresStore(url)
    await store.open()
    return store


async def test_max_concurrency_and_allow_lists_round_trip(database_url) -> None:
    store = await opened(database_url)
    try:
        await store.create("capped", models=["m", "org/model:v1.5"], limits=KeyLimits(max_concurrency=4, rpm=10))
        await store.create("free")
        for bad in ([""], ["a,b"], ["a b"], []):
            with pytest.raises(InvalidKeyField) as caught:
                await store.create("refused", models=bad)
            assert caught.value.param == "models"
        with pytest.raises(InvalidKeyField, match="max_concurrency"):
            await store.create("refused", limits=KeyLimits(max_concurrency=100_001))
        records = {r.name: r for r in await store.keys()}
    finally:
        await store.close()
    assert set(records) == {"capped", "free"}
    assert (records["capped"].models, records["capped"].limits.max_concurrency, records["capped"].limits.rpm) == (
        ("m", "org/model:v1.5"), 4, 10,
    )  # fmt: skip
    assert (records["free"].models, records["free"].limits.max_concurrency) == (None, None)
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT models, max_concurrency FROM zerogap_keys WHERE name = 'capped'").fetchone()
    assert row == (["m", "org/model:v1.5"], 4)  # a real array, not a joined string


def schema_1_database(postgres: PostgresServer) -> tuple[str, str]:
    """A database as the schema-1 gateway left it, with one key; (url, that key's secret)."""
    url = postgres.new_database()
    secret = "zg-made-by-schema-1"
    digest = hmac.new(bytes.fromhex(SECRET), secret.encode(), hashlib.sha256).hexdigest()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE zerogap_meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        conn.execute("INSERT INTO zerogap_meta VALUES ('schema_version', '1'), ('version', '5'), ('secret', %s)",
                     (SECRET,))  # fmt: skip
        conn.execute(MIGRATIONS[1])
        conn.execute("INSERT INTO zerogap_keys (name, digest, models, rpm, created_at) VALUES (%s, %s, %s, 7, 1.0)",
                     ("old", digest, ["m", "x"]))  # fmt: skip
    return url, secret


async def test_schema_1_database_is_upgraded_in_place(postgres) -> None:
    url, secret = schema_1_database(postgres)
    stores = [PostgresStore(url) for _ in range(3)]
    await asyncio.gather(*(s.open() for s in stores))  # processes starting together: one upgrade
    try:
        store = stores[0]
        old = next(r for r in await store.keys() if r.name == "old")
        assert (old.models, old.limits.rpm, old.limits.max_concurrency) == (("m", "x"), 7, None)
        assert store.digest(secret) == old.digest  # the same store secret: the old key still authenticates
        await stores[1].create("new", limits=KeyLimits(max_concurrency=2))
        assert {r.name: r.limits.max_concurrency for r in await stores[2].keys()} == {"new": 2, "old": None}
    finally:
        for s in stores:
            await s.close()
    with psycopg.connect(url) as conn:
        version = conn.execute("SELECT v FROM zerogap_meta WHERE k = 'schema_version'").fetchone()
    assert version == (str(SCHEMA_VERSION),)
