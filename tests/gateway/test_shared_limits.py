"""Rate limits shared by two gateway processes through a real Redis ([gateway].redis_url)."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator

import pytest

from backends.process_group import stop_process
from gateway.keystore import KeyStore
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, error_of, make_config, post
from tests.tools import require_tool
from zerogap.net import free_port, wait_for_port


@pytest.fixture
def redis_url(tmp_path) -> Iterator[str]:
    binary = require_tool("redis-server")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port, 10, proc)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_process(proc)


async def test_two_gateways_share_one_rpm_budget(tmp_path, redis_url) -> None:
    with UpstreamServer(Behavior(num_output_tokens=2), model="m") as up:
        settings = {"redis_url": redis_url}
        a_config = make_config(tmp_path, [("b0", up.url, "m")], settings)
        b_config = make_config(tmp_path, [("b0", up.url, "m")], settings)  # same key store file
        store = KeyStore(a_config.resolve_path(a_config.gateway.key_store))
        key = store.create("shared", rpm=3)
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
        key = store.create("fallback", rpm=1)
        store.close()
        with caplog.at_level(logging.WARNING, "zerogap.gateway.limits"), GatewayServer(config) as gs:
            first = await post(gs.url + "/v1/chat/completions", chat_body(), auth(key))
            second = await post(gs.url + "/v1/chat/completions", chat_body(), auth(key))
    assert first[0] == 200 and second[0] == 429
    assert "Redis rate limits unavailable" in caplog.text
