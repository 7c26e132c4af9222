"""A lean streaming upstream for the gateway benches: OpenAI-style SSE on a fixed schedule.

    python -m bench._upstream --port N [--ttft-s 0.05] [--interval-s 0.1] [--num-tokens 32] [--tokens-spread 0]

Every POST .../completions is answered at once with a chunked text/event-stream; its first
token comes ttft_s after the request (num_tokens ± tokens_spread of them, drawn evenly by a
seeded generator, so every run sees the same lengths), then one token every interval_s (absolute schedule, so
no drift), each its own SSE event, its own HTTP chunk and its own write, as vLLM sends them.
After the last token: a usage event (choices: []) when the request asked for
stream_options.include_usage, then `data: [DONE]`. With stream_options.continuous_usage_stats
every token's event carries the usage so far as well, as vLLM sends it (the gateway asks for
it on every stream, so that a stream cut short is charged what was relayed). Each token is " tK" in
`"text":" tK"`, which the load generator counts.

It is a raw asyncio.Protocol on uvloop with every event precomputed, so one token costs one
timer and one write: cheap enough to drive a gateway process to its limit. The gateway and
nginx see the same upstream, and the "direct" rounds measure it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from typing import Any

NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n"  # /health, /metrics
HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _chunk(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def _usage(num_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": 2, "completion_tokens": num_tokens, "total_tokens": num_tokens + 2}


def _tokens(num_tokens: int, continuous: bool) -> list[bytes]:
    """The chunk of each token (with the usage so far when `continuous`)."""
    tokens = []
    for k in range(num_tokens):
        obj: dict[str, Any] = {"id": "cmpl-bench", "object": "text_completion", "model": "bench",
               "choices": [{"index": 0, "text": f" t{k}", "logprobs": None,
                            "finish_reason": "length" if k == num_tokens - 1 else None}]}  # fmt: skip
        if continuous:
            obj["usage"] = _usage(k + 1)
        tokens.append(_chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"))
    return tokens


def _events(num_tokens: int) -> tuple[list[bytes], bytes, bytes]:
    """The chunk of each token, the usage-and-end chunks, and the end chunks alone."""
    tokens = _tokens(num_tokens, continuous=False)
    usage = _usage(num_tokens)
    usage_event = {"id": "cmpl-bench", "object": "text_completion", "model": "bench", "choices": [], "usage": usage}
    end = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    with_usage = _chunk(b"data: " + json.dumps(usage_event, separators=(",", ":")).encode() + b"\n\n") + end
    return tokens, with_usage, end


class Stream(asyncio.Protocol):
    """One client connection (keep-alive): requests one after another, each streamed on its schedule."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: Any = None
        self.buffer = b""
        self.handle: asyncio.TimerHandle | None = None
        self.k = 0
        self.t0 = 0.0
        self.tail = b""
        self.tokens: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.handle is not None:
            return  # a pipelined request waits until the current one ends
        head = self.buffer[:end]
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = self.buffer[end + 4 + length :]
        request_line = head.split(b"\r\n", 1)[0]
        if not (head.startswith(b"POST") and b"completions" in request_line):
            known = head.startswith(b"GET") and (b" /health " in request_line or b" /metrics " in request_line)
            self.transport.write(OK if known else NOT_FOUND)
            if self.buffer:
                self.data_received(b"")
            return
        options = body.replace(b" ", b"")
        events = self.server.events()
        self.tail = events.with_usage if b'"include_usage":true' in options else events.end
        continuous = b'"continuous_usage_stats":true' in options
        self.tokens = events.continuous_tokens if continuous else events.tokens
        self.transport.write(HEAD)
        self.k = 0
        self.t0 = self.loop.time() + self.server.ttft_s
        self.handle = self.loop.call_at(self.t0, self.tick)

    def tick(self) -> None:
        server, tokens, k = self.server, self.tokens, self.k
        self.transport.write(tokens[k])
        k = self.k = k + 1
        if k < len(tokens):
            self.handle = self.loop.call_at(self.t0 + k * server.interval_s, self.tick)
            return
        self.transport.write(self.tail)
        self.handle = None
        if self.buffer:
            self.data_received(b"")


class Events:
    """Every chunk of an answer of num_tokens tokens, precomputed."""

    def __init__(self, num_tokens: int) -> None:
        self.tokens, self.with_usage, self.end = _events(num_tokens)
        self.continuous_tokens = _tokens(num_tokens, continuous=True)


class Server:
    def __init__(self, ttft_s: float, interval_s: float, num_tokens: int, tokens_spread: int = 0) -> None:
        self.ttft_s = ttft_s
        self.interval_s = interval_s
        lengths = range(max(1, num_tokens - tokens_spread), num_tokens + tokens_spread + 1)
        self.by_length = [Events(n) for n in lengths]
        self.rng = random.Random(0)

    def events(self) -> Events:
        """The chunks of the next answer (its length drawn from num_tokens ± tokens_spread)."""
        by_length = self.by_length
        return by_length[0] if len(by_length) == 1 else self.rng.choice(by_length)


def main() -> None:
    import uvloop

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ttft-s", type=float, default=0.05)
    p.add_argument("--interval-s", type=float, default=0.1)
    p.add_argument("--num-tokens", type=int, default=32)
    p.add_argument("--tokens-spread", type=int, default=0, help="each answer has num_tokens ± this many tokens")
    args = p.parse_args()
    server = Server(args.ttft_s, args.interval_s, args.num_tokens, args.tokens_spread)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(lambda: Stream(server), "127.0.0.1", args.port, backlog=4096)
        async with srv:
            await srv.serve_forever()

    uvloop.run(serve())


if __name__ == "__main__":
    main()
