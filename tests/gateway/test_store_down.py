"""[gateway].on_store_down with real stores taken away while a real gateway serves: PostgreSQL
stopped (pg_ctl stop) and started again; the SQLite key file locked by another process.

"refuse": virtual keys get 503 naming the setting while the store's refresh fails; the unified
key still works. "serve_cached": the keys loaded before keep working. Either way: the gauge
zerogap_key_store_up, a counter of what was done with each virtual-key request meanwhile, and a
log line when the mode takes effect and when the store is back."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from subprocess import PIPE
from typing import Any

from tests.fixtures.postgres import PostgresServer
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import UNIFIED, GatewayServer, auth, chat_body, error_of, get, make_config, metric, post

ADMIN = "admin-store-down-key-1"
DOWN_WITHIN_S = 30.0  # the refresh fails within the store's own timeouts (SQLite retries a lock ~10 s)


def config_for(tmp_path: Path, upstream_url: str, **settings: Any) -> Any:
    gateway = {"key_refresh_interval_s": 0.2, "usage_flush_interval_s": 0.2, **settings}
    return make_config(tmp_path, [("b0", upstream_url, "m")], gateway=gateway, admin_key=ADMIN)


async def chat(gs: GatewayServer, key: str) -> tuple[int, dict[str, str], bytes]:
    return await post(gs.url + "/v1/chat/completions", chat_body(stream=False), auth(key))


async def new_key(gs: GatewayServer, name: str) -> str:
    status, _, raw = await post(gs.url + "/admin/keys", {"name": name}, auth(ADMIN))
    assert status == 201, raw
    return str(json.loads(raw)["key"])


async def metrics_of(gs: GatewayServer) -> bytes:
    return (await get(gs.url + "/metrics"))[1]


async def wait_store_up(gs: GatewayServer, up: float, timeout_s: float = DOWN_WITHIN_S) -> None:
    deadline = time.monotonic() + timeout_s
    while metric(await metrics_of(gs), "zerogap_key_store_up") != up:
        assert time.monotonic() < deadline, f"zerogap_key_store_up did not become {up} within {timeout_s} s"
        await asyncio.sleep(0.1)


def said(caplog: Any, words: str) -> int:
    return sum(words in r.getMessage() for r in caplog.records)


async def check_refusing(gs: GatewayServer, key: str) -> int:
    """While the store is down: the virtual key (and an unknown one: no 401 either, the store cannot
    say) gets 503, the unified key 200. Returns the number of 503s."""
    refused = [await chat(gs, key), await chat(gs, "zg-not-known-here")]
    for status, headers, raw in refused:
        err = error_of(raw)
        assert status == 503 and err["code"] == "key_store_unavailable" and "on_store_down" in err["message"]
        assert headers["Retry-After"] == "1"
    assert (await chat(gs, UNIFIED))[0] == 200
    status, raw = await get(gs.url + "/ready")
    assert status == 200 and json.loads(raw)["key_store"] == "down"  # the gateway still serves the unified key
    return len(refused)


async def test_refuse_while_postgres_is_down(tmp_path, postgres: PostgresServer, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="zerogap.gateway")
    with UpstreamServer(model="m") as up:
        config = config_for(tmp_path, up.url, database_url=postgres.new_database(), on_store_down="refuse")
        with GatewayServer(config) as gs:
            key = await new_key(gs, "team")
            assert (await chat(gs, key))[0] == 200
            postgres.stop()
            try:
                await wait_store_up(gs, 0)
                num_refused = await check_refusing(gs, key)
                text = await metrics_of(gs)
            finally:
                postgres.start()
            assert metric(text, "zerogap_key_store_down_requests_total", action="refused") == num_refused
            assert metric(text, "zerogap_key_store_down_requests_total", action="served_cached") == 0
            assert metric(text, "zerogap_auth_failures_total") == 0  # a 503 is no failed authentication
            await wait_store_up(gs, 1)
            assert (await chat(gs, key))[0] == 200
    assert said(caplog, 'virtual keys get 503 until it is back ([gateway].on_store_down = "refuse")') == 1
    assert said(caplog, "key store reachable again") == 1


async def test_serve_cached_while_postgres_is_down(tmp_path, postgres: PostgresServer, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="zerogap.gateway")
    with UpstreamServer(model="m") as up:
        config = config_for(tmp_path, up.url, database_url=postgres.new_database())  # the default
        assert config.gateway.on_store_down == "serve_cached"
        with GatewayServer(config) as gs:
            key = await new_key(gs, "team")
            assert (await chat(gs, key))[0] == 200
            postgres.stop()
            try:
                await wait_store_up(gs, 0)
                statuses = [(await chat(gs, key))[0] for _ in range(5)]
                assert (await chat(gs, UNIFIED))[0] == 200
                text = await metrics_of(gs)
            finally:
                postgres.start()
            assert statuses == [200] * 5
            assert metric(text, "zerogap_key_store_down_requests_total", action="served_cached") == 5
            assert metric(text, "zerogap_key_store_down_requests_total", action="refused") == 0
            await wait_store_up(gs, 1)
            assert (await chat(gs, key))[0] == 200
            text = await metrics_of(gs)
            assert metric(text, "zerogap_key_store_down_requests_total", action="served_cached") == 5
    assert said(caplog, '([gateway].on_store_down = "serve_cached")') == 1
    assert said(caplog, "key store reachable again") == 1


LOCK_WAL_READERS = """
import fcntl, os, sys
fd = os.open(sys.argv[1] + "-shm", os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 123)  # every WAL read-mark lock (sqlite.org/walformat.html)
print("locked", flush=True)
sys.stdin.read()
"""


async def test_refuse_while_the_sqlite_file_is_locked(tmp_path, caplog) -> None:
    """An open SQLite file cannot be taken away from its reader by chmod, rename or truncation (its
    descriptor and page cache keep working), so "down" here is another process holding the file's
    WAL read locks: each read then fails with "locking protocol" after SQLite's own retries."""
    caplog.set_level(logging.WARNING, logger="zerogap.gateway")
    with UpstreamServer(model="m") as up:
        with GatewayServer(config_for(tmp_path, up.url, on_store_down="refuse")) as gs:
            key = await new_key(gs, "team")
            assert (await chat(gs, key))[0] == 200
            key_file = gs.config.resolve_path(gs.config.gateway.key_store)
            locker = await asyncio.create_subprocess_exec(
                sys.executable, "-c", LOCK_WAL_READERS, str(key_file), stdin=PIPE, stdout=PIPE
            )
            try:
                assert locker.stdout is not None and await locker.stdout.readline() == b"locked\n"
                await wait_store_up(gs, 0)
                await check_refusing(gs, key)
            finally:
                locker.kill()
                await locker.communicate()
            await wait_store_up(gs, 1)
            assert (await chat(gs, key))[0] == 200
    assert said(caplog, 'on_store_down = "refuse"') == 1 and said(caplog, "key store reachable again") == 1
