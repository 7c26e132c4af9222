"""The stream's hot path (gateway/pipe.py) against a real upstream through the real upstream
client: a client-side send that has to wait holds the backend back (reading pauses) and loses,
doubles or reorders nothing; a send that fails stops the stream and closes the upstream request."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.asgi import Message
from gateway.http_client import HttpUpstream
from gateway.idle import IdleWatch
from gateway.pipe import Pipe
from gateway.sse import SHOW_ALL, SseFilter
from gateway.upstream import UpstreamResponse
from tests.fixtures.upstream import Behavior, UpstreamServer

NUM_TOKENS = 300
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()


def tokens(raw: bytes) -> str:
    events = [e[6:] for e in raw.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    return "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])


async def open_stream(url: str) -> tuple[HttpUpstream, UpstreamResponse, bytes]:
    client = HttpUpstream(connect_timeout_s=5)
    resp = await client.post(url + "/v1/chat/completions", BODY, {"Content-Type": "application/json"})
    return client, resp, await resp.read_chunk()


def make_pipe(resp: UpstreamResponse) -> tuple[Pipe, SseFilter, Any]:
    filt = SseFilter(SHOW_ALL)
    out: Any = SimpleNamespace(last_s=None)  # the pipe only stamps the last chunk's time on it
    return Pipe(resp, filt, out, IdleWatch(30, resp.close)), filt, out


@pytest.mark.parametrize(
    ("buffered_s", "waits_at"),
    [
        # the 5th send waits while the backend goes on sending, unread; then the first of the burst read after it
        (0.0, (5, 6)),
        # the bytes that came before the pipe started go first, and that very send waits
        (0.1, (1,)),
    ],
)
async def test_a_send_that_waits_holds_the_backend_and_loses_nothing(buffered_s, waits_at) -> None:
    with UpstreamServer(Behavior(num_output_tokens=NUM_TOKENS, interval_s=0.001), model="m") as up:
        client, resp, first = await open_stream(up.url)
        await asyncio.sleep(buffered_s)
        pipe, filt, out = make_pipe(resp)
        sent = [filt.feed(first)]
        held: list[bool] = []
        loop = asyncio.get_running_loop()

        async def send(message: Message) -> None:
            if len(sent) in waits_at:  # the client's socket is full: this send waits 0.2 s
                gate = asyncio.Event()
                loop.call_later(0.2, gate.set)
                await gate.wait()
                held.append(resp.conn.paused)  # type: ignore[attr-defined]
            sent.append(bytes(message["body"]))

        await asyncio.wait_for(pipe.run(send), 10)
        sent.append(filt.rest())
        resp.release()
        await client.close()
    assert pipe.error is None and held == [True] * len(waits_at)  # reading from the backend paused meanwhile
    assert tokens(b"".join(sent)) == "".join(f" t{k}" for k in range(NUM_TOKENS))  # every token, once, in order
    assert len(sent) < NUM_TOKENS // 2  # the chunks of one read (the bursts after a wait) went out in one send
    assert out.last_s is not None


async def test_a_send_that_fails_stops_the_stream_and_closes_the_upstream_request() -> None:
    with UpstreamServer(Behavior(num_output_tokens=NUM_TOKENS, interval_s=0.002), model="m") as up:
        client, resp, _ = await open_stream(up.url)
        pipe, _, _ = make_pipe(resp)
        num_sent = 0

        async def send(message: Message) -> None:
            nonlocal num_sent
            num_sent += 1
            if num_sent == 3:
                raise RuntimeError("the client's transport broke")

        await asyncio.wait_for(pipe.run(send), 10)
        assert isinstance(pipe.error, RuntimeError)
        assert up.wait_for(lambda s: s.requests[0].disconnected, 5)
        await client.close()
    assert up.requests[0].num_tokens_sent < NUM_TOKENS
