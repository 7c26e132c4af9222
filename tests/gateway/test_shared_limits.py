"""Rate limits shared by two gateway processes through a real Redis ([gateway].redis_url)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.net import free_port, wait_for_port
from common.process_group import stop_process
from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.keys.sqlite import KeyStore
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, error_of, get, make_config, metric, post
from tests.tools import require_tool


class RedisProcess:
    """A real redis-server of this test's own, which the test may stop and start again (same port)."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.dir = tmp_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        self.proc = subprocess.Popen(
            [require_tool("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port(self.port, 120, self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_process: RedisProcess) -> str:
    return redis_process.url


async def test_two_gateways_share_one_rpm_budget(tmp_path, redis_url) -> None:
    with UpstreamServer(Behavior(num_output_tokens=2), model="m") as up:
        settings = {"redis_url": redis_url}
        a_config = make_config(tmp_path, [("b0", up.url, "m")], settings)
        b_config = make_config(tmp_path, [("b0", up.url, "m")], settings)  # same key store file
        store = KeyStore(a_config.resolve_path(a_config.gateway.key_store))
        key = store.create("shared", limits=KeyLimits(rpm=3))
        store.close()
        with GatewayServer(a_config) as a, GatewayServer(b_config) as b:
            statuses = []
            for gs in (a, b, a, b):
                status, headers, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth(key))
                statuses.append(status)
    assert statuses == [200, 200, 200, 429]  # each process alone would have allowed 3
    assert error_of(raw)["code"] == "rate_limit_requests" and 15 <= int(headers["Retry-After"]) <= 21


async def test_redis_down_falls_back_to_local_limits(tmp_path, caplog) -> None:
    with UpstreamServer(model="m") as up:
        dead = f"redis://127.0.0.1:{free_port()}/0"
        config = make_config(tmp_path, [("b0", up.url, "m")], {"redis_url": dead})
        store = KeyStore(config.resolve_path(config.gateway.key_store))
        key = store.create("fallback", limits=KeyLimits(rpm=1))
        store.close()
        with caplog.at_level(logging.WARNING, "zerogap.gateway.limits"), GatewayServer(config) as gs:
            first = await post(gs.url + "/v1/chat/completions", chat_body(), auth(key))
            second = await post(gs.url + "/v1/chat/completions", chat_body(), auth(key))
    assert first[0] == 200 and second[0] == 429
    assert "Redis rate limits unavailable" in caplog.text


def limited_key(config_path: Path) -> str:
    store = KeyStore(config_path)
    try:
        return store.create("limited", limits=KeyLimits(rpm=1000))
    finally:
        store.close()


async def test_on_redis_down_refuse_answers_503_while_redis_is_away(tmp_path, redis_process, caplog) -> None:
    with UpstreamServer(model="m") as up:
        config = make_config(
            tmp_path, [("b0", up.url, "m")], {"redis_url": redis_process.url, "on_redis_down": "refuse"}
        )
        key = limited_key(config.resolve_path(config.gateway.key_store))
        url = f"http://127.0.0.1:{config.server.port}/v1/chat/completions"
        with caplog.at_level(logging.WARNING, "zerogap.gateway.limits"), GatewayServer(config) as gs:
            assert (await post(url, chat_body(), auth(key)))[0] == 200
            redis_process.stop()
            status, headers, raw = await post(url, chat_body(), auth(key))
            unified = await post(url, chat_body(), auth())  # a key without limits needs no Redis
            _, text = await get(gs.url + "/metrics")
            redis_process.start()
            assert await eventually_ok(url, key)
    assert status == 503 and headers["Retry-After"] == "2", raw
    err = error_of(raw)
    assert err["code"] == "limits_unavailable" and 'on_redis_down = "refuse"' in err["message"]
    assert unified[0] == 200
    assert metric(text, "zerogap_limits_backend_down_total", mode="refuse") == 1
    assert "on_redis_down = refuse" in caplog.text and "Redis reachable again" in caplog.text


async def test_on_redis_down_local_serves_from_this_process(tmp_path, redis_process, caplog) -> None:
    with UpstreamServer(model="m") as up:
        config = make_config(tmp_path, [("b0", up.url, "m")], {"redis_url": redis_process.url})
        key = limited_key(config.resolve_path(config.gateway.key_store))
        url = f"http://127.0.0.1:{config.server.port}/v1/chat/completions"
        with caplog.at_level(logging.WARNING, "zerogap.gateway.limits"), GatewayServer(config) as gs:
            redis_process.stop()
            statuses = [(await post(url, chat_body(), auth(key)))[0] for _ in range(3)]
            _, text = await get(gs.url + "/metrics")
    assert statuses == [200, 200, 200]
    assert metric(text, "zerogap_limits_backend_down_total", mode="local") == 3
    assert "on_redis_down = local" in caplog.text


async def eventually_ok(url: str, key: str, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (await post(url, chat_body(), auth(key)))[0] == 200:
            return True
        await asyncio.sleep(0.2)
    return False
