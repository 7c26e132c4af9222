"""Each class of bad input gets the OpenAI error body with the right status and a clear message;
malformed bodies of every kind, sent to a real gateway process, get no 5xx and leave no traceback in its log."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json

import aiohttp
import pytest

from common.net import free_port
from gateway.server.lingering import LINGER_BYTES, LINGER_S
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import METRICS_KEY, UNIFIED, GatewayServer, auth, error_of, make_config, metric
from tests.gateway.malformed import corpus
from tests.gateway.processes import UNIFIED as PROC_KEY
from tests.gateway.processes import GatewayProcess, write_config


@pytest.fixture
def gateway(tmp_path):
    with UpstreamServer(model="m") as up:
        config = make_config(tmp_path, [("b0", up.url, "m")], {"max_body_bytes": 2048}, per_key=True)
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
    (CHAT, {}, b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "'model' is required"),
    (CHAT, {}, b'{"model": "m"}', 400, "'messages' is required"),
    (CHAT, {}, b'{"model": "m", "messages": ["hi"]}', 400, "string 'role'"),
    (CHAT, {}, b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', 400, "'stream' must be"),
    (CHAT, {}, b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": -1}', 400, "'max_tokens' must be"),
    (CHAT, {}, b'{"model": "m", "messages": [{"role": "user"}], "stream_options": 3}', 400, "'stream_options'"),
    ("/v1/completions", {}, b'{"model": "m"}', 400, "'prompt' is required"),
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

    # no Content-Length: the limit is counted while reading; the gateway answers 413 and closes the
    # connection rather than drain a body of unknown length (so a raw socket, which can read the answer
    # while the rest of the body is refused)
    port = gs.config.server.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {UNIFIED}\r\n"
    writer.write(head.encode() + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    with contextlib.suppress(ConnectionError):
        for _ in range(10):
            writer.write(b"3e8\r\n" + b" " * 1000 + b"\r\n")
            await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)  # to the end: the gateway closes the connection
    writer.close()
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert b"max_body_bytes" in answer
    assert up.requests == []


async def test_refused_requests_are_counted_without_client_strings_as_labels(gateway) -> None:
    gs, _ = gateway
    body = {"model": "made-up-model-name", "messages": [{"role": "user", "content": "x"}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(gs.url + CHAT, json=body, headers=auth()) as resp:
            assert resp.status == 404
        async with s.post(gs.url + CHAT, json=body, headers={"Authorization": "Bearer nope"}) as resp:
            assert resp.status == 401
        async with s.get(gs.url + "/metrics", headers=auth(METRICS_KEY)) as resp:
            text = await resp.read()
    assert b"made-up-model-name" not in text and b"nope" not in text
    assert metric(text, "zerogap_requests_total", model="unknown", key="unified", status="404") == 1
    assert metric(text, "zerogap_requests_total", model="none", key="none", status="401") == 1


@pytest.fixture(scope="module")
def gateway_process(tmp_path_factory):
    """`zerogap gateway` as its own process at debug level, its log captured, the default 4 MiB body limit."""
    tmp_path = tmp_path_factory.mktemp("fuzz")
    with UpstreamServer(model="m") as up:
        port = free_port()
        config = write_config(tmp_path / "config.toml", port, up.url, {}, server='[logging]\nlevel = "debug"')
        with GatewayProcess(config, port) as gw:
            yield gw, up


async def test_no_malformed_body_gets_a_5xx_or_leaves_a_traceback(gateway_process) -> None:
    gw, up = gateway_process
    headers = {"Authorization": f"Bearer {PROC_KEY}", "Content-Type": "application/json"}
    cases = corpus()
    answers: dict[int, int] = {}
    wrong: list[str] = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        for path, name, body in cases:
            async with s.post(gw.url + path, data=io.BytesIO(body), headers=headers) as resp:  # sized
                raw = await resp.read()
            answers[resp.status] = answers.get(resp.status, 0) + 1
            if resp.status >= 500 or (resp.status >= 400 and set(json.loads(raw)) != {"error"}):
                wrong.append(f"{name}: {resp.status} {raw[:200]!r}")
        good = {"model": "m", "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 2}
        async with s.post(gw.url + CHAT, json=good, headers=headers) as resp:
            assert resp.status == 200  # the gateway still serves
    assert wrong == []
    for seen in up.requests:  # what did reach the backend: a checked body, as the gateway sends it
        assert isinstance(seen.body, dict) and "priority" not in seen.body, seen.body
        if seen.body.get("stream"):
            assert seen.body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert answers.get(400, 0) > len(cases) // 2 and 200 in answers, answers  # the corpus reached both sides
    log = gw.logs()
    assert "refused /v1/chat/completions" in log  # debug lines with the refusals were written
    for sign in ("Traceback", "Logging error", "ERROR", "Exception"):
        assert sign not in log, log[log.index(sign) - 2000 : log.index(sign) + 2000]


async def test_a_refused_client_that_keeps_sending_is_cut_off_after_the_linger_bound(gateway) -> None:
    """The lingering close (gateway/server/lingering.py) reads what a refused client still sends, but at
    most LINGER_BYTES: past them the connection closes, however fast the client sends."""
    gs, _ = gateway
    _reader, writer = await asyncio.open_connection("127.0.0.1", gs.config.server.port)
    head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {UNIFIED}\r\n"
    writer.write(head.encode() + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n" % 65536 + b" " * 65536 + b"\r\n"
    sent = 0
    with pytest.raises(ConnectionError):
        for _ in range(64 * LINGER_BYTES // 65536):  # bounded: 64x the linger bound (LINGER_S stops it too)
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
    writer.close()
    # the bound plus what the two sockets' buffers hold; without the bound, LINGER_S lets ~1 GB through
    assert LINGER_BYTES < sent < 8 * LINGER_BYTES, sent


async def test_a_refused_client_that_holds_the_connection_open_is_closed_after_the_linger_time(gateway) -> None:
    """After the 413 and its FIN the gateway reads for at most LINGER_S: a client that neither
    closes nor sends much (a trickle, far under LINGER_BYTES) is then cut off (its writes fail)."""
    gs, _ = gateway
    reader, writer = await asyncio.open_connection("127.0.0.1", gs.config.server.port)
    head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {UNIFIED}\r\n"
    writer.write(head.encode() + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    writer.write(b"%x\r\n" % (5 * 1024 * 1024) + b" " * 65536)  # declares more than max_body_bytes
    answer = await asyncio.wait_for(reader.read(), 10)  # the answer, then the gateway's FIN
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    deadline = asyncio.get_running_loop().time() + 5 * LINGER_S  # bounded: the linger ends in LINGER_S
    with pytest.raises(ConnectionError):
        while asyncio.get_running_loop().time() < deadline:
            writer.write(b" " * 1024)  # a trickle: 1 KiB per 50 ms, far under LINGER_BYTES
            await writer.drain()
            await asyncio.sleep(0.05)
    writer.close()
