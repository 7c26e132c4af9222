"""The zerogap gateway's in-flight gauge on the harness's timeline: read from the gateway's GET /metrics
(with the metrics key) beside the backends, summed over them, into timeline.csv and the step's
backend.gateway_inflight_mean, where the diagnosis tells `gateway` from `frontend` with it. Real
gateway and upstream servers on loopback; streams held open by an upstream that stalls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from loadgen.gateway_inflight import GatewayInflight, gateway_metrics_url
from loadgen.sampler import Sampler
from loadreport.settings import MetricsSection
from loadreport.timeline import COLUMNS
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, make_config, wait_until

METRICS_KEY = "gateway-inflight-metrics-key-7"
KEY_ENV = "ZG_TEST_INFLIGHT_METRICS_KEY"


@pytest.fixture()
def stalled(tmp_path: Path) -> Iterator[tuple[GatewayServer, UpstreamServer, UpstreamServer]]:
    """A gateway with a metrics key over two backends whose streams never end by themselves."""
    with (
        UpstreamServer(Behavior(stall_after_tokens=1), model="m") as a,
        UpstreamServer(Behavior(stall_after_tokens=1), model="m") as b,
    ):
        config = make_config(tmp_path, [("b0", a.url, "m"), ("b1", b.url, "m")])
        config = config.model_copy(update={"server": config.server.model_copy(update={"metrics_key": METRICS_KEY})})
        with GatewayServer(config) as gs:
            yield gs, a, b


def num_streaming(*ups: UpstreamServer) -> int:
    return sum(1 for up in ups for seen in up.requests if seen.num_tokens_sent >= 1 and not seen.disconnected)


def test_the_gauge_is_read_at_the_root_of_the_base_url() -> None:
    assert gateway_metrics_url("https://gw.example:8443/api/") == "https://gw.example:8443/metrics"
    assert GatewayInflight(None, KEY_ENV, 1.0).sample() is None


async def test_the_sampler_reads_what_the_gateway_passed_on(
    stalled: tuple[GatewayServer, UpstreamServer, UpstreamServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    gs, a, b = stalled
    monkeypatch.setenv("ZEROGAP_METRICS_KEY", METRICS_KEY)
    sampler = Sampler(MetricsSection(), gs.url + "/api")
    async with aiohttp.ClientSession() as session:
        held = [await session.post(gs.url + "/v1/chat/completions", json=chat_body(), headers=auth()) for _ in range(5)]
        assert [r.status for r in held] == [200] * 5
        assert await wait_until(lambda: num_streaming(a, b) == 5, 15)
        first = await asyncio.to_thread(sampler.sample, 7)
        assert first.gateway_inflight == 5.0 and first.running is not None  # summed over both backends
        for response in held[:2]:
            response.close()  # the client hangs up: the gateway frees the request at the engine
        assert await wait_until(lambda: sum(s.disconnected for up in (a, b) for s in up.requests) == 2, 15)
        second = await asyncio.to_thread(sampler.sample, 7)
        assert second.gateway_inflight == 3.0
        for response in held[2:]:
            response.close()
    assert "gateway_inflight" in COLUMNS


async def test_a_refused_key_or_no_gateway_gives_none_and_is_not_asked_again(
    stalled: tuple[GatewayServer, UpstreamServer, UpstreamServer], caplog: pytest.LogCaptureFixture
) -> None:
    gs, a, _ = stalled
    caplog.set_level(logging.INFO, logger="zerogap.loadtest")
    refused = GatewayInflight(gs.url + "/api", KEY_ENV, 5.0, env={KEY_ENV: "not-the-metrics-key"})
    assert await asyncio.to_thread(refused.sample) is None and refused.url is None
    said = [r.getMessage() for r in caplog.records if "no gateway in-flight figure" in r.getMessage()]
    assert said == [
        f"zerogap: no gateway in-flight figure (GET {gs.url}/metrics answered 401 with the key in {KEY_ENV})"
    ]
    assert "not-the-metrics-key" not in caplog.text
    engine = GatewayInflight(a.url + "/v1", KEY_ENV, 5.0, env={})  # an engine's /metrics has no such gauge
    assert await asyncio.to_thread(engine.sample) is None and engine.url is None
    keyed = GatewayInflight(gs.url, KEY_ENV, 5.0, env={KEY_ENV: METRICS_KEY})
    assert await asyncio.to_thread(keyed.sample) == 0.0 and keyed.known
