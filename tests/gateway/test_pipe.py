"""The stream's hot path (gateway/relay/pipe.py) against a real upstream through the real upstream
client: a client-side send that has to wait holds the backend back (reading pauses) and loses,
doubles or reorders nothing; a send that fails stops the stream and closes the upstream request."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.pool.flights import Flight
from gateway.relay.exchange import SSE_HEADERS
from gateway.relay.idle import IdleWatch
from gateway.relay.pipe import Pipe
from gateway.relay.sse import SHOW_ALL, SseFilter
from gateway.server.asgi import Message
from gateway.upstream.client import UpstreamResponse
from gateway.upstream.http_client import HttpUpstream
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
    # what the pipe touches of the exchange: the last chunk's time, the stream's start, whether the head is its to send
    out: Any = SimpleNamespace(last_s=None, start_stream=lambda: False)
    out.stream_began, out.stream_headers = lambda at_s: None, lambda answer_s=None: SSE_HEADERS
    flight = Flight(SimpleNamespace(name="b0"), [], [], 0)  # type: ignore[arg-type]
    deadline_s = time.monotonic() + 30
    return Pipe(resp, filt, out, IdleWatch(30, resp.close, armed=False), flight, deadline_s), filt, out


BURST = 20  # tokens the backend writes, unread, while a send waits


async def until(condition: Any, what: str) -> None:
    """Wait for an event the test names (bounded, but not a timing figure)."""
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


def num_tokens_in(chunk: bytes) -> int:
    return chunk.count(b'"content"')


@pytest.mark.parametrize(
    ("buffered", "waits_at"),
    [
        # the 5th send waits while the backend goes on sending, unread; then the first of the burst read after it
        (False, (5, 6)),
        # the bytes that came before the pipe started go first, and that very send waits
        (True, (1,)),
    ],
)
async def test_a_send_that_waits_holds_the_backend_and_loses_nothing(buffered, waits_at) -> None:
    with UpstreamServer(Behavior(num_output_tokens=NUM_TOKENS, interval_s=0.001), model="m") as up:
        client, resp, first = await open_stream(up.url)
        seen = up.requests[0]
        if buffered:  # the backend writes a burst before the pipe starts to read
            await until(lambda: seen.num_tokens_sent >= BURST, f"the backend wrote {BURST} tokens")
        pipe, filt, out = make_pipe(resp)
        sent = [filt.feed(first)]
        held: list[bool] = []
        after_wait: list[int] = []  # indexes in `sent` of the sends that follow a wait

        async def send(message: Message) -> None:
            if len(sent) in waits_at:  # the client's socket is full: this send waits until the backend wrote more
                start = seen.num_tokens_sent
                target = min(start + BURST, NUM_TOKENS)
                await until(lambda: seen.num_tokens_sent >= target or seen.finished, "the backend wrote a burst")
                held.append(resp.conn.paused)  # type: ignore[attr-defined]
                after_wait.append(len(sent) + 1)
            sent.append(bytes(message["body"]))

        error = await asyncio.wait_for(pipe.run(send), 30)
        sent.append(filt.rest())
        resp.release()
        await client.close()
    assert error is None and held == [True] * len(waits_at)  # reading from the backend paused meanwhile
    assert tokens(b"".join(sent)) == "".join(f" t{k}" for k in range(NUM_TOKENS))  # every token, once, in order
    # the chunks of one read (the burst the backend wrote during each wait) went out in one send
    burst = [num_tokens_in(sent[i]) for i in after_wait if i < len(sent)]
    assert len(burst) == len(waits_at) and min(burst) >= BURST // 2, (burst, [num_tokens_in(c) for c in sent[:12]])
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

        error = await asyncio.wait_for(pipe.run(send), 10)
        assert isinstance(error, RuntimeError)
        assert up.wait_for(lambda s: s.requests[0].disconnected, 5)
        await client.close()
    assert up.requests[0].num_tokens_sent < NUM_TOKENS
