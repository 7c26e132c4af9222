"""A request is charged what was relayed, however it ends: a client that hangs up after 100 tokens,
a backend that breaks or goes quiet, a backend that reports no usage at all. Real gateway over HTTP,
the fixture upstream and the real sim; the charge is read where a tenant's admin reads it
(/admin/usage) and where the limiter keeps it (the next request's 429 and Retry-After)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from backends.sim.testing import SimProcess, run_sim_process
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import (
    METRICS_KEY,
    GatewayServer,
    auth,
    chat_body,
    events,
    get,
    make_config,
    metric,
    post,
    wait_until,
)
from tests.gateway.processes import call
from tests.sse import data_of

ADMIN = "admin-secret-4242"
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def estimate(body: dict[str, Any]) -> int:
    """The gateway's prompt estimate where the backend says nothing: 4 bytes of the body a token
    (aiohttp's json= sends json.dumps(body))."""
    return math.ceil(len(json.dumps(body).encode()) / 4)


def with_options(body: dict[str, Any], options: dict[str, bool] | None) -> dict[str, Any]:
    return {**body, "stream_options": options} if options else body


def asked_continuous(seen_body: dict[str, Any]) -> bool:
    options = seen_body.get("stream_options") or {}
    return bool(options.get("include_usage") and options.get("continuous_usage_stats"))


def new_key(gs: GatewayServer, name: str, **limits: int) -> str:
    status, made = call(gs.url + "/admin/keys", ADMIN, {"name": name, **limits})
    assert status == 201, made
    key: str = made["key"]
    return key


async def charged(gs: GatewayServer, name: str, num_requests: int = 1) -> dict[str, int]:
    """The key's row of /admin/usage, once it shows num_requests requests."""
    row: dict[str, int] = {}

    async def poll() -> bool:
        nonlocal row
        status, raw = await get(gs.url + "/admin/usage", auth(ADMIN))
        assert status == 200
        row = next((r for r in json.loads(raw)["data"] if r["key"] == name), {})
        return row.get("requests") == num_requests

    for _ in range(200):  # 10 s at most
        if await poll():
            break
        await asyncio.sleep(0.05)
    assert row.get("requests") == num_requests, row
    return row


async def read_then_hang_up(url: str, key: str, body: dict[str, Any], num_tokens: int) -> int:
    """Reads the stream until num_tokens content tokens came, then drops the connection."""
    num_read = 0
    async with aiohttp.ClientSession() as s:
        resp = await s.post(url + "/v1/chat/completions", json=body, headers=auth(key))
        assert resp.status == 200
        async for line in resp.content:
            payload = data_of(line)
            if payload and payload.startswith("{"):
                choices = json.loads(payload).get("choices") or [{}]
                num_read += bool(choices[0].get("delta", {}).get("content"))
            if num_read >= num_tokens:
                break
        resp.close()  # the connection goes: the client is gone
    return num_read


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    with run_sim_process(model="m") as process:
        yield process


@pytest.mark.parametrize(
    ("report_usage", "options"),
    [
        (True, None),  # the client asks nothing: the gateway asks the backend for what it needs
        (True, CONTINUOUS),  # usage on every chunk, asked by the client itself: exact
        (False, None),  # a backend that reports no usage: the relayed chunks are counted
    ],
)
async def test_a_client_that_hangs_up_after_100_tokens_is_charged_them(tmp_path, report_usage, options) -> None:
    behavior = Behavior(num_output_tokens=3000, interval_s=0.005, report_usage=report_usage)
    body = with_options(chat_body(), options)
    with UpstreamServer(behavior, model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], admin_key=ADMIN, per_key=True)) as gs:
            key = new_key(gs, "cut")
            assert await read_then_hang_up(gs.url, key, body, 100) == 100
            assert await wait_until(lambda: up.requests[0].disconnected, 10)
            row = await charged(gs, "cut")
            _, text = await get(gs.url + "/metrics", auth(METRICS_KEY))
    assert metric(text, "zerogap_tokens_total", key="cut", kind="completion") == row["completion_tokens"]
    num_sent = up.requests[0].num_tokens_sent
    assert 100 <= row["completion_tokens"] <= num_sent < 3000  # what was relayed, not 0, not max_tokens
    exact = report_usage and asked_continuous(up.requests[0].body)
    assert row["prompt_tokens"] == (2 if exact else estimate(body))  # "say hello": 2 words, 2 tokens


@pytest.mark.parametrize("options", [None, CONTINUOUS])
async def test_a_client_that_hangs_up_on_the_sim_is_charged_what_it_was_sent(tmp_path, sim, options) -> None:
    body = with_options(chat_body(max_tokens=2500, ignore_eos=True), options)
    _, _, whole = await post(sim.url + "/v1/chat/completions", chat_body(stream=False, max_tokens=1))
    prompt = json.loads(whole)["usage"]["prompt_tokens"]
    with GatewayServer(make_config(tmp_path, [("sim", sim.url, "m")], admin_key=ADMIN)) as gs:
        key = new_key(gs, "cut")
        assert await read_then_hang_up(gs.url, key, body, 100) == 100
        row = await charged(gs, "cut")
    assert 100 <= row["completion_tokens"] < 2000  # the sim runs ~5 ms a token: 2500 would take 14 s
    assert row["prompt_tokens"] == prompt or (options is None and row["prompt_tokens"] == estimate(body))


async def test_tpm_settles_on_the_relayed_tokens(tmp_path) -> None:
    """300 tokens a minute (5 a second). A stream cut after 100 tokens is charged them: the bucket
    keeps what it was charged, not the refunded reservation, and a request whose estimate the
    bucket would hold after a refund waits for exactly the charged tokens to refill."""
    first, second = chat_body(max_tokens=250), chat_body(max_tokens=250)
    second_estimate = estimate(second) + 250  # prompt bytes / 4 + max_tokens, what the limiter reserves
    with UpstreamServer(Behavior(num_output_tokens=3000, interval_s=0.005), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], admin_key=ADMIN)) as gs:
            key = new_key(gs, "tpm300", tpm=300)
            start_s = time.monotonic()
            assert await read_then_hang_up(gs.url, key, first, 100) == 100
            row = await charged(gs, "tpm300")
            status, headers, _ = await post(gs.url + "/v1/chat/completions", second, auth(key))
            elapsed_s = time.monotonic() - start_s
    total = row["prompt_tokens"] + row["completion_tokens"]
    assert status == 429 and total >= 100  # a refund would leave 300 tokens: this request would go through
    missing = second_estimate - (300 - total)  # tokens the bucket lacks, less what refilled since (5 a second)
    assert missing / 5 - elapsed_s <= int(headers["Retry-After"]) <= missing / 5 + 1, (total, elapsed_s, headers)


@pytest.mark.parametrize("report_usage", [True, False])
async def test_a_stream_the_backend_breaks_or_stalls_is_charged_the_tokens_relayed(tmp_path, report_usage) -> None:
    settings = {"idle_timeout_s": 0.5, "max_retries": 0}
    behavior = Behavior(num_output_tokens=50, close_after_tokens=7, report_usage=report_usage)
    with UpstreamServer(behavior, model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], settings, admin_key=ADMIN)) as gs:
            key = new_key(gs, "broken")
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth(key))
            assert status == 200 and json.loads(events(raw)[-2])["error"]["code"] == 502
            broken = await charged(gs, "broken")
            up.behavior.close_after_tokens, up.behavior.stall_after_tokens = None, 5
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth(key))
            assert status == 200 and json.loads(events(raw)[-2])["error"]["code"] == 504  # idle timeout
            both = await charged(gs, "broken", 2)
    exact = report_usage and asked_continuous(up.requests[0].body)
    assert broken["completion_tokens"] == 7 and both["completion_tokens"] == 7 + 5
    assert broken["prompt_tokens"] == (2 if exact else estimate(chat_body()))


async def test_an_answer_without_usage_is_charged_its_chunks_and_an_estimated_prompt(tmp_path) -> None:
    """Not streamed, yet asked upstream as a stream (gateway/relay/assemble.py): one token per chunk."""
    with UpstreamServer(Behavior(num_output_tokens=10, report_usage=False), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], admin_key=ADMIN)) as gs:
            key = new_key(gs, "plain")
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(stream=False), auth(key))
            row = await charged(gs, "plain")
    text = json.loads(raw)["choices"][0]["message"]["content"]
    assert status == 200 and "usage" not in json.loads(raw)
    assert row["prompt_tokens"] == estimate(chat_body(stream=False))
    assert row["completion_tokens"] == 10 and text


async def test_a_client_that_leaves_before_the_first_token_is_charged_its_prompt(tmp_path) -> None:
    with UpstreamServer(Behavior(ttft_s=3), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], admin_key=ADMIN)) as gs:
            key = new_key(gs, "early")
            body = chat_body(stream=False)
            timeout = aiohttp.ClientTimeout(total=0.5)
            async with aiohttp.ClientSession(timeout=timeout) as s:
                with pytest.raises(TimeoutError):
                    await s.post(gs.url + "/v1/chat/completions", json=body, headers=auth(key))
            assert await wait_until(lambda: bool(up.requests) and up.requests[0].disconnected, 5)
            row = await charged(gs, "early")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (estimate(body), 0)


def usage_seen(raw: bytes) -> list[bool]:
    """For each chunk of a relayed stream ([DONE] aside): whether it has a usage field."""
    payloads = events(raw)
    assert payloads[-1] == "[DONE]"
    return ["usage" in json.loads(p) for p in payloads[:-1]]


@pytest.mark.parametrize("upstream", ["fixture", "sim"])
async def test_each_client_sees_the_usage_it_asked_for_and_no_more(tmp_path, upstream, request) -> None:
    with UpstreamServer(Behavior(num_output_tokens=6), model="m") as up:
        url = up.url if upstream == "fixture" else request.getfixturevalue("sim").url
        with GatewayServer(make_config(tmp_path, [("b0", url, "m")])) as gs:
            seen = {}
            for name, options in (("none", None), ("final", {"include_usage": True}), ("every", CONTINUOUS)):
                body = with_options(chat_body(max_tokens=6), options)
                status, _, raw = await post(gs.url + "/v1/chat/completions", body, auth())
                assert status == 200
                seen[name] = usage_seen(raw)
                if name == "final":
                    final = json.loads(events(raw)[-2])
    assert not any(seen["none"]) and len(seen["none"]) >= 6
    assert seen["final"] == [False] * (len(seen["final"]) - 1) + [True]  # exactly the final usage chunk
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 6
    assert all(seen["every"]) and len(seen["every"]) == len(seen["final"])
