"""The test upstream itself: timing, lengths, usage, failure modes, recording."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import aiohttp
import pytest

from tests.fixtures.upstream import Behavior, UpstreamServer
from zerogap.net import free_port, wait_for_port
from zerogap.process_group import stop_process


def sse_events(raw: bytes) -> list[str]:
    return [e[len("data: ") :] for e in raw.decode().split("\n\n") if e.startswith("data: ")]


async def post(url: str, body: dict) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.read()


async def test_streams_with_role_chunk_usage_and_done() -> None:
    with UpstreamServer(Behavior(num_output_tokens=5, tokens_per_chunk=2), model="m") as up:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "a b c"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        status, raw = await post(up.url + "/v1/chat/completions", body)
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    texts = [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]]
    assert texts == [" t0 t1", " t2 t3", " t4"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert up.requests[0].finished and not up.requests[0].disconnected


async def test_max_tokens_ignore_eos_and_whole_body() -> None:
    with UpstreamServer(Behavior(num_output_tokens=4)) as up:
        _, raw = await post(up.url + "/v1/completions", {"model": "x", "prompt": "hi", "max_tokens": 9})
        capped = json.loads(raw)
        _, raw = await post(
            up.url + "/v1/completions", {"model": "x", "prompt": "hi", "max_tokens": 9, "ignore_eos": True}
        )
        forced = json.loads(raw)
        _, raw = await post(up.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True})
    assert capped["usage"]["completion_tokens"] == 4 and capped["choices"][0]["finish_reason"] == "stop"
    assert forced["usage"]["completion_tokens"] == 9 and forced["choices"][0]["finish_reason"] == "length"
    events = sse_events(raw)
    assert all("usage" not in json.loads(e) for e in events[:-1])  # not asked for
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


async def test_timing_is_honoured() -> None:
    with UpstreamServer(Behavior(ttft_s=0.2, interval_s=0.05, num_output_tokens=5)) as up:
        start = time.monotonic()
        async with (
            aiohttp.ClientSession() as s,
            s.post(up.url + "/v1/completions", json={"prompt": "x", "stream": True}) as resp,
        ):
            first = None
            async for _ in resp.content.iter_any():
                first = first or time.monotonic() - start
        total = time.monotonic() - start
    assert first is not None and 0.18 <= first < 1.0
    assert 0.38 <= total < 2.0


async def test_failure_modes_and_metrics() -> None:
    with UpstreamServer(Behavior(fail_status=503, num_failures=1, extra_waiting=3)) as up:
        status, _ = await post(up.url + "/v1/completions", {"prompt": "x"})
        assert status == 503
        status, _ = await post(up.url + "/v1/completions", {"prompt": "x"})
        assert status == 200
        async with aiohttp.ClientSession() as s, s.get(up.url + "/metrics") as resp:
            text = await resp.text()
        assert 'vllm:num_requests_waiting{model_name="test-model"} 3.0' in text
        up.behavior.close_after_tokens = 2
        with pytest.raises(aiohttp.ClientPayloadError):
            await post(up.url + "/v1/completions", {"prompt": "x", "stream": True})
        up.behavior.healthy = False
        async with aiohttp.ClientSession() as s, s.get(up.url + "/health") as resp:
            assert resp.status == 503


async def test_client_disconnect_is_recorded_and_restart_on_same_port() -> None:
    with UpstreamServer(Behavior(ttft_s=5)) as up:
        async with aiohttp.ClientSession() as s:
            async with s.post(up.url + "/v1/completions", json={"prompt": "x", "stream": True}) as resp:
                assert resp.status == 200
        assert up.wait_for(lambda u: bool(u.requests) and u.requests[0].disconnected, 3)
        port = up.port
        up.stop()
        with pytest.raises(aiohttp.ClientConnectionError):
            await post(up.url + "/v1/completions", {"prompt": "x"})
        up.start()
        up.behavior.ttft_s = 0
        assert up.port == port
        status, _ = await post(up.url + "/v1/completions", {"prompt": "x"})
        assert status == 200


async def test_keep_requests_bounds_the_record() -> None:
    """A long soak's record is bounded: between keep_requests and twice that, the newest last."""
    with UpstreamServer(model="m", keep_requests=3) as up:
        for i in range(10):
            status, _ = await post(up.url + "/v1/completions", {"model": "m", "prompt": f"p{i}", "max_tokens": 1})
            assert status == 200
            assert len(up.requests) <= 5
    assert len(up.requests) >= 3 and up.requests[-1].body["prompt"] == "p9"


def test_runs_as_its_own_process() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fixtures.upstream",
            "--port",
            str(port),
            "--model",
            "sub",
            "--num-output-tokens",
            "3",
        ]
    )
    try:
        wait_for_port(port, 120, proc)
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as resp:
            assert json.loads(resp.read())["data"][0]["id"] == "sub"
    finally:
        stop_process(proc)
