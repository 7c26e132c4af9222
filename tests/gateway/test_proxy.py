"""The client's side of a relayed request (gateway/endpoints/completions.py): a client that goes away stops the
relay and closes the upstream request; while a stream waits for its first token the client
gets SSE keep-alive comments."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp

from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import (
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


async def test_client_disconnect_closes_upstream(tmp_path) -> None:
    with UpstreamServer(Behavior(num_output_tokens=1000, interval_s=0.01), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
            async with aiohttp.ClientSession() as s:
                async with s.post(gs.url + "/v1/chat/completions", json=chat_body(), headers=auth()) as resp:
                    await resp.content.readany()
            assert await wait_until(lambda: up.requests[0].disconnected, 2.0)
            assert up.requests[0].num_tokens_sent < 1000 and not up.requests[0].finished
            _, text = await get(gs.url + "/metrics")
            assert gs.gw.router.backends[0].num_inflight == 0
    assert metric(text, "zerogap_requests_total", status="499") == 1


async def test_disconnect_while_waiting_for_first_token(tmp_path) -> None:
    with UpstreamServer(Behavior(ttft_s=30), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
            async with aiohttp.ClientSession() as s:
                task = asyncio.ensure_future(s.post(gs.url + "/v1/chat/completions", json=chat_body(), headers=auth()))
                assert await wait_until(lambda: bool(up.requests), 3)
                task.cancel()
            assert await wait_until(lambda: up.requests[0].disconnected, 2.0)


async def test_keepalive_comments_while_first_token_is_slow(tmp_path) -> None:
    with UpstreamServer(Behavior(ttft_s=0.7, num_output_tokens=2), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], {"keepalive_interval_s": 0.2})) as gs:
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
    text = raw.decode()
    assert status == 200 and text.startswith(": keep-alive\n\n")
    assert 2 <= text.count(": keep-alive\n\n") <= 8  # every 0.2 s for 0.7 s; more if the machine is slow
    assert events(raw)[-1] == "[DONE]"


async def test_client_gone_during_a_whole_answer_closes_upstream_and_logs_no_error(tmp_path, caplog) -> None:
    """The relay runs in the request's own task; a client that goes away stops it there, quietly."""
    with UpstreamServer(Behavior(hang_before_headers=True), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
            async with aiohttp.ClientSession() as s:
                url = gs.url + "/v1/chat/completions"
                task = asyncio.ensure_future(s.post(url, json=chat_body(stream=False), headers=auth()))
                assert await wait_until(lambda: bool(up.requests), 3)
                task.cancel()
            assert await wait_until(lambda: up.requests[0].disconnected, 2.0)
            assert await wait_until(lambda: gs.gw.router.backends[0].num_inflight == 0, 2.0)
            up.behavior.hang_before_headers = False
            status, _, raw = await post(url, chat_body(stream=False), auth())  # the gateway serves on
            _, text = await get(gs.url + "/metrics")
    assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"]
    assert metric(text, "zerogap_requests_total", status="499") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
