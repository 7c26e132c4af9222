"""GET /metrics/backends (gateway/endpoints/backends_info.py): each backend's metrics URL for tools that read the
engines' signals, guarded as GET /metrics is ([server].metrics_key), never a secret in the body.
Also from issue 24: the 404/405 of an unknown path or method carry a string code, and the rate
log says nothing while the gateway is idle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.net import free_port
from gateway.observe.rate_log import RateLog, counter_total
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import UNIFIED, GatewayServer, auth, chat_body, error_of, get, make_config, post, wait_until

ADMIN = "admin-pool-info-key-42"
METRICS = "metrics-pool-info-key-77"
BACKEND_SECRET = "backend-upstream-secret-9f3a"
URL_PASSWORD = "url-password-5c1e"


def config_for(tmp_path: Path, upstream_url: str, metrics_key: str = "", dead_port: int = 9) -> Any:
    """Two backends: a real one, and one whose URL has user:password@ and a query and which holds an api_key."""
    dead = f"http://scraper:{URL_PASSWORD}@127.0.0.1:{dead_port}/v1/?token={URL_PASSWORD}"
    extra = f'[[backends]]\nname = "b1"\nurl = "{dead}"\nmodel = "m"\napi_key = "{BACKEND_SECRET}"\n'
    config = make_config(tmp_path, [("b0", upstream_url, "m")], admin_key=ADMIN, extra=extra)
    return config.model_copy(update={"server": config.server.model_copy(update={"metrics_key": metrics_key})})


async def test_the_listing_needs_the_metrics_key_and_names_each_backends_metrics_url(tmp_path) -> None:
    dead_port = free_port()
    with UpstreamServer(model="m") as up:
        with GatewayServer(config_for(tmp_path, up.url, METRICS, dead_port)) as gs:
            url = gs.url + "/metrics/backends"
            for headers in (None, auth(UNIFIED), auth(ADMIN), auth(METRICS + "x")):
                status, raw = await get(url, headers)
                err = error_of(raw)
                assert status == 401 and err["type"] == "authentication_error", headers
                assert "[server].metrics_key" in err["message"] and b"metrics_url" not in raw
            status, raw = await get(url, auth(METRICS))
            assert status == 200, raw
            by_name = {entry["name"]: entry for entry in json.loads(raw)["data"]}
            assert set(by_name) == {"b0", "b1"}
            assert by_name["b0"] == {"name": "b0", "model": "m", "url": up.url, "metrics_url": up.url + "/metrics",
                                     "up": True}  # fmt: skip
            scraped_status, page = await get(by_name["b0"]["metrics_url"])  # the URL works: the engine's own page
            assert scraped_status == 200 and b"vllm:num_requests_running" in page
            assert by_name["b1"]["url"] == f"http://127.0.0.1:{dead_port}/v1"  # no user:password@, no query
            assert by_name["b1"]["metrics_url"] == f"http://127.0.0.1:{dead_port}/v1/metrics"
    for secret in (BACKEND_SECRET, URL_PASSWORD, "scraper", UNIFIED, ADMIN, METRICS):
        assert secret.encode() not in raw, secret


async def test_without_a_metrics_key_the_listing_is_open(tmp_path) -> None:
    with UpstreamServer(model="m") as up:
        with GatewayServer(config_for(tmp_path, up.url)) as gs:
            status, raw = await get(gs.url + "/metrics/backends")
    assert status == 200
    assert json.loads(raw)["data"][0]["metrics_url"] == up.url + "/metrics"
    assert BACKEND_SECRET.encode() not in raw and URL_PASSWORD.encode() not in raw


async def test_an_unknown_path_or_method_has_a_string_code(tmp_path) -> None:
    with UpstreamServer(model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
            missing = await get(gs.url + "/v2/nothing-here", auth())
            wrong_method = await get(gs.url + "/v1/chat/completions", auth())
            status, _, raw = await post(gs.url + "/metrics/backends", {}, auth())
    assert missing[0] == 404 and error_of(missing[1])["code"] == "not_found"
    assert "No such endpoint" in error_of(missing[1])["message"]
    assert wrong_method[0] == 405 and error_of(wrong_method[1])["code"] == "method_not_allowed"
    assert status == 405 and error_of(raw)["code"] == "method_not_allowed"


async def test_the_rate_log_says_nothing_while_idle(tmp_path) -> None:
    """The gateway's real counters, the clock injected: a line per interval in which requests finished,
    one idle line when they stop, then nothing (never "relayed 0 output tok/s")."""
    with UpstreamServer(model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
            m = gs.gw.metrics

            async def serve(num_done: int) -> None:  # one request, counted (the counters move after the answer)
                status, _, _ = await post(gs.url + "/v1/chat/completions", chat_body(stream=False), auth())
                assert status == 200
                # settled: counted, or kept for the next batch, which the rate log applies before it reads
                settled = lambda: counter_total(m.requests.metric) + m.settled.num_pending == num_done  # noqa: E731
                assert await wait_until(settled, timeout_s=10)

            rates = RateLog(m.tokens.metric, m.requests.metric, now_s=0.0, flush=m.settled.flush)
            lines = [rates.tick(10.0)]  # started, nothing served yet
            await serve(1)
            lines += [rates.tick(20.0), rates.tick(30.0), rates.tick(40.0), rates.tick(50.0)]
            await serve(2)
            lines.append(rates.tick(60.0))
    assert lines[0] is None
    assert lines[1] is not None and lines[1].startswith("relayed ") and "0.1 req/s (last 10 s)" in lines[1]
    assert lines[2] == "idle: no request finished in the last 10 s"
    assert lines[3] is None and lines[4] is None
    assert lines[5] is not None and "0.1 req/s (last 10 s)" in lines[5]  # the rate of its own interval
    assert not any(line and "relayed 0 " in line for line in lines)
