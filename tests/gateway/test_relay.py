"""Relaying through a real gateway to real upstreams: streams, usage, retries, timeouts, disconnects."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import pytest

from common.net import free_port, wait_for_port
from common.process_group import stop_process
from gateway.upstream.client import UpstreamResponse
from gateway.upstream.http_client import HttpUpstream
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import (
    METRICS_KEY,
    GatewayServer,
    auth,
    chat_body,
    error_of,
    events,
    get,
    make_config,
    metric,
    post,
    wait_until,
)


async def test_stream_is_relayed_and_usage_chunk_stripped(tmp_path) -> None:
    with UpstreamServer(Behavior(num_output_tokens=4), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], per_key=True)) as gs:
            direct = events((await post(up.url + "/v1/chat/completions", chat_body()))[2])
            status, headers, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
            _, _, with_usage = await post(
                gs.url + "/v1/chat/completions", chat_body(stream_options={"include_usage": True}), auth()
            )
            _, text = await get(gs.url + "/metrics", auth(METRICS_KEY))
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    relayed = events(raw)
    assert relayed[-1] == "[DONE]"
    strip = lambda evs: [{k: v for k, v in json.loads(e).items() if k not in ("id", "created")} for e in evs[:-1]]  # noqa: E731
    assert strip(relayed) == strip(direct)  # same chunks as direct, no usage chunk (not asked for)
    assert all("usage" not in json.loads(e) for e in relayed[:-1])
    asked = {"include_usage": True, "continuous_usage_stats": True}  # usage on every chunk: what was relayed
    assert up.requests[1].body["stream_options"] == asked  # the gateway always asks
    last = json.loads(events(with_usage)[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4
    assert metric(text, "zerogap_tokens_total", kind="completion", key="unified") == 8
    assert metric(text, "zerogap_time_to_first_token_seconds_count", backend="b0") == 2


async def test_non_stream_and_completions_under_base_url(tmp_path) -> None:
    with UpstreamServer(Behavior(num_output_tokens=3), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
            status, _, raw = await post(gs.url + "/api/v1/completions", {"model": "m", "prompt": "a b"}, auth())
            s2, _, raw2 = await post(gs.url + "/api/v1/chat/completions", chat_body(stream=False), auth())
            s3, models = await get(gs.url + "/api/v1/models", auth())
    usage = json.loads(raw)["usage"]  # vLLM's UsageInfo, every field (the details None here)
    assert status == 200 and {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        "prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5
    }  # fmt: skip
    assert s2 == 200 and json.loads(raw2)["choices"][0]["message"]["content"] == " t0 t1 t2"
    assert s3 == 200 and [m["id"] for m in json.loads(models)["data"]] == ["m"]
    assert [r.path for r in up.requests] == ["/v1/completions", "/v1/chat/completions"]


async def test_backend_dies_mid_stream_ends_with_error_event(tmp_path) -> None:
    with UpstreamServer(Behavior(num_output_tokens=50, close_after_tokens=3), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
            _, text = await get(gs.url + "/metrics")
    evs = events(raw)
    assert status == 200 and evs[-1] == "[DONE]"
    assert sum(1 for e in evs if '"content":" t' in e) == 3
    err = json.loads(evs[-2])["error"]
    assert err["code"] == 502 and "broke the stream" in err["message"]
    assert metric(text, "zerogap_requests_total", status="502") == 1


async def test_retry_on_another_backend_before_first_byte(tmp_path) -> None:
    with UpstreamServer(Behavior(fail_status=503), model="m") as bad, UpstreamServer(model="m") as good:
        config = make_config(tmp_path, [("bad", bad.url, "m"), ("good", good.url, "m")], {"routing": "round_robin"})
        with GatewayServer(config) as gs:
            results = [await post(gs.url + "/v1/chat/completions", chat_body(), auth()) for _ in range(4)]
            _, text = await get(gs.url + "/metrics")
    assert [r[0] for r in results] == [200] * 4
    assert len(bad.requests) == 2 and len(good.requests) == 4
    assert metric(text, "zerogap_retries_total", backend="good") == 2
    assert metric(text, "zerogap_upstream_errors_total", backend="bad", status="503") == 2


async def test_a_stream_that_ends_before_its_first_byte_is_retried_elsewhere(tmp_path) -> None:
    """The stream's head came (200), then the backend hung up before its first event: nothing went
    to the client yet, so another backend is tried, and the client gets a whole stream."""
    body = {"model": "m", "prompt": "hi", "stream": True, "max_tokens": 4}
    with UpstreamServer(Behavior(close_after_tokens=0), model="m") as bad, UpstreamServer(model="m") as good:
        config = make_config(tmp_path, [("bad", bad.url, "m"), ("good", good.url, "m")], {"routing": "round_robin"})
        with GatewayServer(config) as gs:
            results = [await post(gs.url + "/v1/completions", body, auth()) for _ in range(4)]
            _, text = await get(gs.url + "/metrics")
    for status, _, raw in results:
        evs = events(raw)
        assert status == 200 and evs[-1] == "[DONE]" and not any('"error"' in e for e in evs), raw[-300:]
        assert "".join(json.loads(e)["choices"][0]["text"] for e in evs[:-1] if json.loads(e)["choices"]) != ""
    assert len(bad.requests) == 2 and len(good.requests) == 4
    assert metric(text, "zerogap_retries_total", backend="good") == 2
    assert metric(text, "zerogap_upstream_errors_total", backend="bad") == 2


async def test_a_stream_whose_first_byte_never_comes_gets_a_504(tmp_path) -> None:
    """The head came at once, the first token would take 5 s: after first_byte_timeout_s (0.4 s)
    the client gets a 504 (not a started stream: nothing went to it) and the backend's request
    is closed."""
    settings = {"first_byte_timeout_s": 0.4, "keepalive_interval_s": 10, "max_retries": 0}
    with UpstreamServer(Behavior(ttft_s=5), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], settings)) as gs:
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
            assert await wait_until(lambda: up.requests[0].disconnected, 2)
            _, text = await get(gs.url + "/metrics")
    assert status == 504 and "first_byte_timeout_s" in error_of(raw)["message"]
    assert metric(text, "zerogap_upstream_errors_total", backend="b0", status="first_byte_timeout") == 1


async def test_all_backends_failing_gives_502_and_4xx_passes_through(tmp_path) -> None:
    with UpstreamServer(Behavior(fail_status=500), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], {"max_retries": 3})) as gs:
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
            assert status == 502 and "answered 500" in error_of(raw)["message"]
            assert len(up.requests) == 1  # one backend: not retried on itself
            up.behavior.fail_status = 400
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
            assert status == 400 and error_of(raw)["message"] == "failing on purpose with 400"


async def test_first_byte_and_idle_timeouts(tmp_path) -> None:
    settings = {"first_byte_timeout_s": 0.4, "idle_timeout_s": 0.4, "keepalive_interval_s": 10, "max_retries": 0}
    with UpstreamServer(Behavior(hang_before_headers=True), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], settings)) as gs:
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(stream=False), auth())
            assert status == 504 and "first_byte_timeout_s" in error_of(raw)["message"]
            assert await wait_until(lambda: up.requests[0].disconnected, 2)
            up.behavior.hang_before_headers = False
            up.behavior.stall_after_tokens = 2
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
    evs = events(raw)
    assert status == 200 and json.loads(evs[-2])["error"]["code"] == 504
    assert "idle_timeout_s" in json.loads(evs[-2])["error"]["message"]


async def test_backend_api_key_sent_and_client_key_never_forwarded(tmp_path) -> None:
    with UpstreamServer(Behavior(api_key="backend-key-xyz"), model="m") as up:
        extra = ""
        config = make_config(tmp_path, [("b0", up.url, "m")], extra=extra)
        config.backends[0].api_key = "backend-key-xyz"
        with GatewayServer(config) as gs:
            status, _, _ = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
    assert status == 200
    seen = up.requests[0]
    assert seen.headers["Authorization"] == "Bearer backend-key-xyz"
    assert "unified-secret" not in json.dumps(seen.headers) + json.dumps(seen.body)


@pytest.fixture
def upstream_process() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The fixture upstream as its own process (so that it can be SIGKILLed)."""
    port = free_port()
    cmd = [sys.executable, "-m", "tests.fixtures.upstream", "--port", str(port), "--model", "m",
           "--interval-s", "0.05", "--num-output-tokens", "1000"]  # fmt: skip
    proc = subprocess.Popen(cmd)
    try:
        wait_for_port(port, 120, proc)
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


async def test_backend_process_killed_mid_stream(tmp_path, upstream_process) -> None:
    proc, url = upstream_process
    with GatewayServer(make_config(tmp_path, [("b0", url, "m")])) as gs:
        async with aiohttp.ClientSession() as s:
            async with s.post(gs.url + "/v1/chat/completions", json=chat_body(), headers=auth()) as resp:
                first = await resp.content.readany()
                proc.kill()  # SIGKILL: no goodbye from the backend
                rest = await asyncio.wait_for(resp.read(), 5)
        assert await wait_until(lambda: not gs.gw.router.backends[0].healthy, 3)
    evs = events(first + rest)
    assert evs[-1] == "[DONE]" and json.loads(evs[-2])["error"]["code"] == 502


class RecordingClient(HttpUpstream):
    """The real client, recording each upstream URL: shows that create_app(config, client=...) swaps it."""

    def __init__(self) -> None:
        super().__init__(connect_timeout_s=2.0)
        self.urls: list[str] = []

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        self.urls.append(url)
        return await super().post(url, body, headers)


async def test_upstream_client_is_swappable(tmp_path) -> None:
    client = RecordingClient()
    with UpstreamServer(model="m") as up:
        config = make_config(tmp_path, [("b0", up.url, "m")])
        with GatewayServer(config, client=client) as gs:
            assert (await post(gs.url + "/api/v1/completions", {"model": "m", "prompt": "x"}, auth()))[0] == 200
    assert client.urls == [up.url + "/v1/completions"]
