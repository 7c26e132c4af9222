"""Per-key max_concurrency against a real gateway over HTTP and a real upstream: in one process,
across two gateway processes sharing a real Redis, and when a process holding slots is killed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from common.net import free_port
from gateway.tenants.limits.memory import MemoryLimiter
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.concurrent_streams import (
    NUM_TOKENS,
    SLOW,
    check_split,
    eventually,
    new_key,
    status_is,
    status_of,
    streams,
)
from tests.gateway.helpers import (
    METRICS_KEY,
    GatewayServer,
    auth,
    chat_body,
    get,
    make_config,
    metric,
    post,
    wait_until,
)
from tests.gateway.processes import GatewayProcess, write_config


async def test_twelve_streams_on_a_key_of_four(tmp_path: Path) -> None:
    with UpstreamServer(Behavior(interval_s=SLOW, num_output_tokens=NUM_TOKENS), model="m") as up:
        config = make_config(tmp_path, [("b0", up.url, "m")], per_key=True)
        key = new_key(tmp_path, "four", 4)
        with GatewayServer(config) as gs:
            check_split(await streams([gs.url] * 12, key, up), 4)
            limiter = gs.gw.limiter
            assert isinstance(limiter, MemoryLimiter)
            assert await wait_until(lambda: limiter.num_held("four") == 0, 10)
            up.behavior.interval_s = SLOW
            check_split(await streams([gs.url] * 5, key, up), 4)  # the 4 slots came back, and no more
            assert await wait_until(lambda: limiter.num_held("four") == 0, 10)  # each request fully accounted
            _, text = await get(gs.url + "/metrics", auth(METRICS_KEY))
    assert metric(text, "zerogap_ratelimited_total", key="four", limit="concurrency") == 9
    assert metric(text, "zerogap_requests_total", key="four", status="429") == 9
    assert metric(text, "zerogap_requests_total", key="four", status="200") == 8


async def test_a_stream_whose_client_hangs_up_frees_its_slot(tmp_path: Path) -> None:
    with UpstreamServer(Behavior(stall_after_tokens=2), model="m") as up:  # a stream never ends by itself
        config = make_config(tmp_path, [("b0", up.url, "m")])
        key = new_key(tmp_path, "one", 1)
        with GatewayServer(config) as gs:
            session = aiohttp.ClientSession()
            try:
                held = await session.post(gs.url + "/v1/chat/completions", json=chat_body(), headers=auth(key))
                assert held.status == 200
                assert await status_of(gs.url, key) == 429
                held.close()  # the client hangs up mid-stream
            finally:
                await session.close()
            await eventually(lambda: status_is(gs.url, key, 200), 15)
            limiter = gs.gw.limiter
            assert isinstance(limiter, MemoryLimiter)
            # status_is hung up on its stream too; the gateway frees that slot when it sees the close
            assert await wait_until(lambda: limiter.num_held("one") == 0, 10)


def gateway_pair(tmp_path: Path, up: UpstreamServer, settings: dict[str, object]) -> list[GatewayProcess]:
    """Two gateway processes (pods) with one key store and the same [gateway] settings."""
    procs = []
    for name in ("a", "b"):
        port = free_port()
        procs.append(GatewayProcess(write_config(tmp_path / f"{name}.toml", port, up.url, settings), port))
    return procs


async def test_two_gateways_sharing_redis_admit_exactly_the_cap(tmp_path: Path, redis_server: str) -> None:
    with UpstreamServer(Behavior(interval_s=SLOW, num_output_tokens=NUM_TOKENS), model="m") as up:
        key = new_key(tmp_path, "pods", 4)
        a, b = gateway_pair(tmp_path, up, {"redis_url": redis_server})
        with a, b:
            check_split(await streams([a.url, b.url] * 6, key, up), 4)  # each alone would admit 4


async def test_the_slots_of_a_killed_gateway_come_back_within_the_lease(tmp_path: Path, redis_server: str) -> None:
    lease_s = 1.0
    with UpstreamServer(Behavior(stall_after_tokens=2), model="m") as up:
        key = new_key(tmp_path, "crash", 2)
        a, b = gateway_pair(tmp_path, up, {"redis_url": redis_server, "concurrency_lease_s": lease_s})
        with a, b:
            session = aiohttp.ClientSession()
            try:
                held = [await session.post(a.url + "/v1/chat/completions", json=chat_body(), headers=auth(key))
                        for _ in range(2)]  # fmt: skip
                assert [r.status for r in held] == [200, 200]
                await asyncio.sleep(4 * lease_s)  # renewed by a meanwhile: still held
                assert await status_of(b.url, key) == 429
                a.kill()  # SIGKILL: no release, no renewal
                await eventually(lambda: status_is(b.url, key, 200), 15)  # the lease is 1 s: generous
            finally:
                await session.close()


async def test_a_stream_the_backend_breaks_frees_its_slot(tmp_path: Path) -> None:
    with UpstreamServer(model="m") as up:
        config = make_config(tmp_path, [("b0", up.url, "m")])
        key = new_key(tmp_path, "broken", 1)
        with GatewayServer(config) as gs:
            body = {**chat_body(), "fixture": {"close_after_tokens": 3}}  # the upstream aborts mid-stream
            status, _, raw = await post(gs.url + "/v1/chat/completions", body, auth(key))
            assert status == 200 and b'"error"' in raw, raw  # the break, told inside the stream
            assert await wait_until(lambda: gs.gw.limiter.num_held("broken") == 0, 10)  # type: ignore[attr-defined]
            assert await status_of(gs.url, key) == 200
