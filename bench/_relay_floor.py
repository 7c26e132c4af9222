"""The least a completion relay in CPython can do per request: the floor under any Python data plane.

Issue 36 asks whether the gateway's per-request CPU can come down to the Rust routers'. This relay
is the design the issue names taken to its end, with nothing else: uvloop, httptools on both sides,
every step a callback of the connection that brought its bytes (no task, no coroutine, no ASGI, no
middleware), the upstream head prebuilt, kept-alive upstream connections reused LIFO. Per request it
does only what every router does: check the bearer key (constant time), parse the JSON body once
(the model and `stream`, as vllm-router reads them), write the request upstream, and copy the
answer's chunks to the client with the chunked framing rewritten. No limits, metrics, retries,
usage or errors beyond a 401/400: it is a measuring stick, not a product (`--peers floor` in
bench/gateway_overhead.py), and never serves a user.

    python -m bench._relay_floor --port P --upstream-port U --key KEY
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import signal
from typing import Any

import httptools
import uvloop

CLIENT_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
UNAUTHORIZED = b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Upstream(asyncio.Protocol):
    """One kept-alive connection to the backend; relays one answer at a time to `client`."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.client: Client | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_headers_complete(self) -> None:
        if self.client is not None and not self.client.gone:
            self.client.transport.write(CLIENT_HEAD)

    def on_body(self, body: bytes) -> None:
        if self.client is not None and not self.client.gone:
            self.client.transport.write(b"%x\r\n%s\r\n" % (len(body), body))

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        if client is not None and not client.gone:
            client.transport.write(b"0\r\n\r\n")
        self.relay.idle.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.relay.idle:
            self.relay.idle.remove(self)


class Client(asyncio.Protocol):
    """One client connection: requests one after another (keep-alive)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.authorization = b""
        self.body: list[bytes] = []
        self.gone = False  # the client hung up: its answer's rest is read from upstream and dropped

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"authorization":
            self.authorization = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body = b"".join(self.body), []
        if not hmac.compare_digest(self.authorization, self.relay.authorization):
            self.transport.write(UNAUTHORIZED)
            return
        try:
            call = json.loads(body)
            model, _stream = call["model"], call.get("stream", False)
        except (ValueError, KeyError, TypeError):
            self.transport.write(BAD_REQUEST)
            return
        self.relay.forward(self, model, body)


class Relay:
    def __init__(self, upstream_port: int, key: str) -> None:
        self.upstream_port = upstream_port
        self.authorization = f"Bearer {key}".encode()
        self.idle: list[Upstream] = []
        self.head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"

    def forward(self, client: Client, _model: str, body: bytes) -> None:
        request = b"%sContent-Length: %d\r\n\r\n%s" % (self.head, len(body), body)
        if self.idle:
            upstream = self.idle.pop()
            upstream.client = client
            upstream.transport.write(request)
            return
        asyncio.get_running_loop().create_task(self._connect(client, request))

    async def _connect(self, client: Client, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(lambda: Upstream(self), "127.0.0.1", self.upstream_port)
        upstream.client = client
        upstream.transport.write(request)


async def serve(port: int, upstream_port: int, key: str) -> None:
    """Until SIGINT or SIGTERM, then a normal exit at once, whatever connections are open (a profiler
    around it writes its file; asyncio's own SIGINT cancels the task, whose exit then waits)."""
    relay = Relay(upstream_port, key)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(relay), "127.0.0.1", port, backlog=4096)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        server.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--key", required=True)
    args = p.parse_args()
    uvloop.run(serve(args.port, args.upstream_port, args.key))


if __name__ == "__main__":
    main()
