"""Routing and health through a real gateway: round-robin, least load, backends down and back."""

from __future__ import annotations

import asyncio
import json

from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, error_of, get, make_config, metric, post, wait_until


async def test_round_robin_alternates(tmp_path) -> None:
    with UpstreamServer(model="m") as a, UpstreamServer(model="m") as b:
        config = make_config(tmp_path, [("a", a.url, "m"), ("b", b.url, "m")], {"routing": "round_robin"})
        with GatewayServer(config) as gs:
            for _ in range(6):
                assert (await post(gs.url + "/v1/completions", {"model": "m", "prompt": "x"}, auth()))[0] == 200
    assert len(a.requests) == 3 and len(b.requests) == 3


async def test_least_load_avoids_the_busy_backend(tmp_path) -> None:
    with UpstreamServer(Behavior(extra_waiting=20), model="m") as busy, UpstreamServer(model="m") as idle:
        config = make_config(tmp_path, [("busy", busy.url, "m"), ("idle", idle.url, "m")])
        with GatewayServer(config) as gs:
            assert await wait_until(lambda: gs.gw.router.backends[0].num_reported == 20, 3)
            for _ in range(5):
                assert (await post(gs.url + "/v1/completions", {"model": "m", "prompt": "x"}, auth()))[0] == 200
            _, text = await get(gs.url + "/metrics")
    assert len(busy.requests) == 0 and len(idle.requests) == 5
    assert metric(text, "zerogap_backend_reported_load", backend="busy") == 20


async def test_least_load_counts_requests_in_flight(tmp_path) -> None:
    with UpstreamServer(Behavior(ttft_s=0.5), model="m") as a, UpstreamServer(Behavior(ttft_s=0.5), model="m") as b:
        config = make_config(tmp_path, [("a", a.url, "m"), ("b", b.url, "m")], {"load_scrape_interval_s": 60})
        with GatewayServer(config) as gs:
            results = await asyncio.gather(
                *(post(gs.url + "/v1/completions", {"model": "m", "prompt": "x"}, auth()) for _ in range(6))
            )
    assert [r[0] for r in results] == [200] * 6
    assert len(a.requests) == 3 and len(b.requests) == 3


async def test_backend_down_at_start_and_health_return(tmp_path) -> None:
    with UpstreamServer(model="m") as up, UpstreamServer(model="m") as other:
        other.stop()  # down before the gateway starts
        config = make_config(tmp_path, [("up", up.url, "m"), ("down", other.url, "m")])
        with GatewayServer(config) as gs:
            assert [b.healthy for b in gs.gw.router.backends] == [True, False]
            for _ in range(3):
                assert (await post(gs.url + "/v1/chat/completions", chat_body(), auth()))[0] == 200
            assert len(up.requests) == 3
            other.start()
            assert await wait_until(lambda: gs.gw.router.backends[1].healthy, 3)
            up.behavior.healthy = False  # fails its health check: leaves the pool
            assert await wait_until(lambda: not gs.gw.router.backends[0].healthy, 3)
            _, text = await get(gs.url + "/metrics")
            assert metric(text, "zerogap_backend_up", backend="up") == 0
            assert metric(text, "zerogap_backend_up", backend="down") == 1
            for _ in range(3):
                assert (await post(gs.url + "/v1/chat/completions", chat_body(), auth()))[0] == 200
    assert len(other.requests) == 3 and len(up.requests) == 3


async def test_no_healthy_backend_gives_503_and_not_ready(tmp_path) -> None:
    with UpstreamServer(model="m") as up:
        up.stop()
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
            assert status == 503 and "No healthy backend serves model 'm'" in error_of(raw)["message"]
            status, body = await get(gs.url + "/ready")
            assert status == 503 and json.loads(body)["backends"]["b0"]["up"] is False
            assert (await get(gs.url + "/health"))[0] == 200
            up.start()
            assert await wait_until(lambda: gs.gw.router.ready(), 3)
            assert (await get(gs.url + "/ready"))[0] == 200


async def test_backend_killed_is_retried_elsewhere_and_marked_down(tmp_path) -> None:
    with UpstreamServer(model="m") as a, UpstreamServer(model="m") as b:
        config = make_config(tmp_path, [("a", a.url, "m"), ("b", b.url, "m")], {"health_interval_s": 30})
        with GatewayServer(config) as gs:
            a.kill()  # the health check will not notice for 30 s: the request must
            results = [await post(gs.url + "/v1/completions", {"model": "m", "prompt": "x"}, auth()) for _ in range(4)]
            assert not gs.gw.router.backends[0].healthy
    assert [r[0] for r in results] == [200] * 4 and len(b.requests) == 4


async def test_retry_and_connect_error_series_start_at_zero(tmp_path) -> None:
    with UpstreamServer(model="m") as a:
        with GatewayServer(make_config(tmp_path, [("a", a.url, "m")])) as gs:
            _, text = await get(gs.url + "/metrics")
    lines = text.decode().splitlines()
    assert 'zerogap_retries_total{backend="a",model="m"} 0.0' in lines
    assert 'zerogap_upstream_errors_total{backend="a",model="m",status="connect"} 0.0' in lines
