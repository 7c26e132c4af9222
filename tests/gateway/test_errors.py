"""Each class of bad input gets the OpenAI error body with the right status and a clear message."""

from __future__ import annotations

import aiohttp
import pytest

from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import UNIFIED, GatewayServer, auth, error_of, make_config, metric


@pytest.fixture
def gateway(tmp_path):
    with UpstreamServer(model="m") as up:
        config = make_config(tmp_path, [("b0", up.url, "m")], {"max_body_bytes": 2048})
        with GatewayServer(config) as gs:
            yield gs, up


CHAT = "/v1/chat/completions"
OK_CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'

CASES = [
    # (path, headers, body, status, words in the message)
    (CHAT, {}, OK_CHAT, 401, "Missing API key"),
    (CHAT, {"Authorization": "Bearer wrong"}, OK_CHAT, 401, "Invalid API key"),
    (CHAT, {"Authorization": "Basic xyz"}, OK_CHAT, 401, "Malformed Authorization"),
    (CHAT, {"Content-Type": "text/plain"}, OK_CHAT, 415, "application/json"),
    (CHAT, {}, b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 3000 + b'"}]}', 413, "2048"),
    (CHAT, {}, b"{not json", 400, "not valid JSON"),
    (CHAT, {}, b"[1, 2]", 400, "JSON object"),
    (CHAT, {}, b'{"messages": [{"role": "user", "content": "hi"}]}', 422, "'model' is required"),
    (CHAT, {}, b'{"model": "m"}', 422, "'messages' is required"),
    (CHAT, {}, b'{"model": "m", "messages": ["hi"]}', 422, "string 'role'"),
    (CHAT, {}, b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', 422, "'stream' must be"),
    (CHAT, {}, b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": -1}', 422, "'max_tokens' must be"),
    (CHAT, {}, b'{"model": "m", "messages": [{"role": "user"}], "stream_options": 3}', 422, "'stream_options'"),
    ("/v1/completions", {}, b'{"model": "m"}', 422, "'prompt' is required"),
    (CHAT, {}, b'{"model": "nope", "messages": [{"role": "user"}]}', 404, "'nope' does not exist"),
    ("/v2/chat", {}, OK_CHAT, 404, "No such endpoint"),
]


@pytest.mark.parametrize(("path", "headers", "body", "status", "words"), CASES)
async def test_bad_requests(gateway, path, headers, body, status, words) -> None:
    gs, up = gateway
    sent = {"Authorization": f"Bearer {UNIFIED}", "Content-Type": "application/json", **headers}
    sent = {k: v for k, v in sent.items() if not (k == "Authorization" and status == 401 and not headers)}
    async with aiohttp.ClientSession() as s, s.post(gs.url + path, data=body, headers=sent) as resp:
        raw = await resp.read()
        assert resp.status == status, raw
        assert resp.headers["Content-Type"].startswith("application/json")
    err = error_of(raw)
    assert words in err["message"]
    assert up.requests == []  # nothing reached the backend


async def test_wrong_method_and_streamed_oversized_body(gateway) -> None:
    gs, up = gateway
    async with aiohttp.ClientSession() as s:
        async with s.get(gs.url + CHAT, headers=auth()) as resp:
            assert resp.status == 405 and "POST" in error_of(await resp.read())["message"]

        async def chunks():  # no Content-Length: the limit is counted while reading
            for _ in range(10):
                yield b" " * 1000

        headers = {**auth(), "Content-Type": "application/json"}
        async with s.post(gs.url + CHAT, data=chunks(), headers=headers) as resp:
            assert resp.status == 413
    assert up.requests == []


async def test_refused_requests_are_counted_without_client_strings_as_labels(gateway) -> None:
    gs, _ = gateway
    body = {"model": "made-up-model-name", "messages": [{"role": "user", "content": "x"}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(gs.url + CHAT, json=body, headers=auth()) as resp:
            assert resp.status == 404
        async with s.post(gs.url + CHAT, json=body, headers={"Authorization": "Bearer nope"}) as resp:
            assert resp.status == 401
        async with s.get(gs.url + "/metrics") as resp:
            text = await resp.read()
    assert b"made-up-model-name" not in text and b"nope" not in text
    assert metric(text, "zerogap_requests_total", model="unknown", key="unified", status="404") == 1
    assert metric(text, "zerogap_requests_total", model="none", key="none", status="401") == 1
