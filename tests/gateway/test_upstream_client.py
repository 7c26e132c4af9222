"""The gateway's own HTTP client (gateway/upstream/client.py) over real loopback sockets: chunked streams,
keep-alive reuse, refused and timed-out connections, backends that break or hang, and closing."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import uvloop

from common.net import free_port
from gateway.upstream.client import UpstreamError
from gateway.upstream.http_client import HttpUpstream
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import wait_until

JSON = {"Content-Type": "application/json"}


def body(stream: bool = True, **extra: Any) -> bytes:
    return json.dumps({"model": "m", "prompt": "a b c", "stream": stream, **extra}).encode()


async def read_stream(client: HttpUpstream, url: str, payload: bytes) -> tuple[int, str, list[bytes]]:
    resp = await client.post(url + "/v1/completions", payload, JSON)
    chunks = []
    while chunk := await resp.read_chunk():
        chunks.append(chunk)
    resp.release()
    return resp.status, resp.content_type, chunks


def data_events(raw: bytes) -> list[str]:
    return [e[6:] for e in raw.decode().split("\n\n") if e.startswith("data: ")]


def num_open(client: HttpUpstream) -> int:
    return sum(len(pool.all) for pool in client._pools.values())


async def test_chunked_stream_is_read_as_it_arrives_then_the_connection_is_reused() -> None:
    with UpstreamServer(Behavior(num_output_tokens=5, stall_after_tokens=2), model="m") as up:
        client = HttpUpstream(connect_timeout_s=2)
        try:
            # The upstream holds the rest of the stream after two tokens: they are read now,
            # nothing waits for more bytes (else this would hang, however fast the machine).
            resp = await client.post(up.url + "/v1/completions", body(), JSON)
            seen = b""
            while b" t1" not in seen:
                seen += await asyncio.wait_for(resp.read_chunk(), 10)
            resp.close()
            up.behavior.stall_after_tokens = None
            status, ctype, chunks = await read_stream(client, up.url, body(stream_options={"include_usage": True}))
            assert status == 200 and ctype.startswith("text/event-stream")
            evs = data_events(b"".join(chunks))
            assert [json.loads(e)["choices"][0]["text"] for e in evs[:5]] == [" t0", " t1", " t2", " t3", " t4"]
            assert json.loads(evs[5])["usage"]["completion_tokens"] == 5 and evs[6] == "[DONE]"
            for _ in range(3):
                assert (await read_stream(client, up.url, body()))[0] == 200
            status, raw = await client.get(up.url + "/health", 2)
            assert status == 200 and raw == b""
            assert num_open(client) == 1  # one keep-alive connection carried the last five requests
        finally:
            await client.close()
        assert num_open(client) == 0


async def test_whole_body_and_4xx_answers() -> None:
    with UpstreamServer(Behavior(num_output_tokens=3, fail_status=None), model="m") as up:
        client = HttpUpstream(connect_timeout_s=2)
        try:
            resp = await client.post(up.url + "/v1/completions", body(stream=False), JSON)
            whole = json.loads(await resp.read_all())
            resp.release()
            assert resp.status == 200 and resp.content_type.startswith("application/json")
            assert whole["usage"]["completion_tokens"] == 3
            up.behavior.fail_status = 422
            resp = await client.post(up.url + "/v1/completions", body(), JSON)
            assert resp.status == 422 and b"failing on purpose" in await resp.read_all()
            resp.release()
            assert num_open(client) == 1
        finally:
            await client.close()


async def test_concurrent_requests_get_their_own_connections() -> None:
    with UpstreamServer(Behavior(num_output_tokens=4, interval_s=0.02), model="m") as up:
        client = HttpUpstream(connect_timeout_s=2)
        try:
            results = await asyncio.gather(*(read_stream(client, up.url, body()) for _ in range(8)))
            assert all(r[0] == 200 and data_events(b"".join(r[2]))[-1] == "[DONE]" for r in results)
            assert num_open(client) == 8
        finally:
            await client.close()


async def test_max_connections_per_backend_makes_requests_wait() -> None:
    with UpstreamServer(Behavior(num_output_tokens=3, interval_s=0.05), model="m") as up:
        client = HttpUpstream(connect_timeout_s=2, max_connections_per_backend=1)
        try:
            results = await asyncio.gather(*(read_stream(client, up.url, body()) for _ in range(3)))
            assert [r[0] for r in results] == [200, 200, 200]
            assert num_open(client) == 1
        finally:
            await client.close()


async def test_connection_refused() -> None:
    client = HttpUpstream(connect_timeout_s=2)
    try:
        with pytest.raises(UpstreamError) as info:
            await client.post(f"http://127.0.0.1:{free_port()}/v1/completions", body(), JSON)
        assert info.value.reason == "connect"
        with pytest.raises(UpstreamError):
            await client.get(f"http://127.0.0.1:{free_port()}/health", 1)
    finally:
        await client.close()


async def test_connect_timeout() -> None:
    """A listener whose accept queue is full drops the SYN: the connection never opens."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(s)
        client = HttpUpstream(connect_timeout_s=0.3)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(UpstreamError) as info:
            await client.post(f"http://127.0.0.1:{port}/v1/completions", body(), JSON)
        assert info.value.reason == "connect" and "0.3 s" in info.value.detail
        assert 0.25 <= loop.time() - t0 < 3
        await client.close()
    finally:
        for s in fillers:
            s.close()
        listener.close()


async def test_backend_closing_mid_stream_raises_after_the_bytes_it_sent() -> None:
    with UpstreamServer(Behavior(num_output_tokens=50, close_after_tokens=3, interval_s=0.01), model="m") as up:
        client = HttpUpstream(connect_timeout_s=2)
        try:
            resp = await client.post(up.url + "/v1/completions", body(), JSON)
            got = b""
            with pytest.raises(UpstreamError) as info:
                while True:
                    chunk = await resp.read_chunk()
                    assert chunk, "the stream must not end cleanly"
                    got += chunk
            assert info.value.reason == "broken"
            assert len(data_events(got)) == 3
            resp.close()
            assert num_open(client) == 0
        finally:
            await client.close()


async def test_close_mid_stream_closes_the_upstream_request() -> None:
    with UpstreamServer(Behavior(num_output_tokens=1000, interval_s=0.01), model="m") as up:
        client = HttpUpstream(connect_timeout_s=2)
        try:
            resp = await client.post(up.url + "/v1/completions", body(), JSON)
            assert await resp.read_chunk()
            resp.close()
            assert await wait_until(lambda: up.requests[0].disconnected, 2)
            assert not up.requests[0].finished and num_open(client) == 0
            assert (await read_stream(client, up.url, body(max_tokens=2)))[0] == 200  # a fresh connection
        finally:
            await client.close()


async def test_cancelled_while_waiting_closes_the_upstream_request() -> None:
    with UpstreamServer(Behavior(hang_before_headers=True), model="m") as up:
        client = HttpUpstream(connect_timeout_s=2)
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await client.post(up.url + "/v1/completions", body(), JSON)
            assert await wait_until(lambda: bool(up.requests) and up.requests[0].disconnected, 2)
            up.behavior.hang_before_headers = False
            up.behavior.ttft_s = 5
            resp = await client.post(up.url + "/v1/completions", body(), JSON)  # headers now, first token later
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await resp.read_chunk()
            resp.close()
            assert await wait_until(lambda: len(up.requests) == 2 and up.requests[1].disconnected, 2)
            assert num_open(client) == 0
        finally:
            await client.close()


async def test_read_chunk_cancelled_loses_nothing() -> None:
    with UpstreamServer(Behavior(ttft_s=0.3, num_output_tokens=2), model="m") as up:
        client = HttpUpstream(connect_timeout_s=2)
        try:
            resp = await client.post(up.url + "/v1/completions", body(), JSON)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await resp.read_chunk()
            raw = await resp.read_all()
            resp.release()
            assert data_events(raw)[-1] == "[DONE]" and len(data_events(raw)) == 3
            assert num_open(client) == 1
        finally:
            await client.close()


async def raw_server(handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]) -> AsyncIterator[str]:
    """A hand-written HTTP server (one coroutine per connection) for what the fixture cannot do."""
    writers: list[asyncio.StreamWriter] = []

    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            await handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(guarded, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


async def test_get_timeout_closes_the_connection() -> None:
    seen = asyncio.Event()
    closed = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        seen.set()
        await reader.read()  # until the client closes
        closed.set()
        writer.close()

    async for url in raw_server(silent):
        client = HttpUpstream(connect_timeout_s=2)
        with pytest.raises(TimeoutError):
            await client.get(url + "/health", 0.2)
        assert seen.is_set()
        await asyncio.wait_for(closed.wait(), 2)
        assert num_open(client) == 0
        await client.close()


async def test_stale_keepalive_connection_is_replaced_once() -> None:
    """A backend that closed an idle keep-alive connection just as a request went out on it:
    the request goes again on a fresh connection (nothing of the answer had come)."""
    num_connections = 0

    async def one_answer_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal num_connections
        num_connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        await read_request(reader)  # the second request on this connection: hang up without answering
        writer.close()

    async for url in raw_server(one_answer_per_connection):
        client = HttpUpstream(connect_timeout_s=2)
        try:
            for _ in range(3):
                resp = await client.post(url + "/v1/completions", body(stream=False), JSON)
                assert resp.status == 200 and await resp.read_all() == b"{}"
                resp.release()
            assert num_connections == 3
        finally:
            await client.close()


async def test_body_until_close_and_bad_http() -> None:
    async def http10(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_request(reader)
        if b"/bad" in head:
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        else:
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\npart one, ")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"part two")
        await writer.drain()
        writer.close()

    async for url in raw_server(http10):
        client = HttpUpstream(connect_timeout_s=2)
        try:
            resp = await client.post(url + "/v1/completions", body(stream=False), JSON)
            assert resp.content_type == "text/plain" and await resp.read_all() == b"part one, part two"
            resp.release()
            with pytest.raises(UpstreamError) as info:
                await client.post(url + "/bad", body(), JSON)
            assert info.value.reason == "broken"
            assert num_open(client) == 0
        finally:
            await client.close()


def test_on_uvloop() -> None:
    """The gateway serves on uvloop, whose transports are not asyncio's classes."""

    async def main() -> None:
        with UpstreamServer(Behavior(num_output_tokens=3), model="m") as up:
            client = HttpUpstream(connect_timeout_s=2)
            try:
                for _ in range(2):
                    status, _, chunks = await read_stream(client, up.url, body())
                    assert status == 200 and data_events(b"".join(chunks))[-1] == "[DONE]"
                assert num_open(client) == 1
                resp = await client.post(up.url + "/v1/completions", body(max_tokens=500, ignore_eos=True), JSON)
                resp.close()
                with pytest.raises(UpstreamError):
                    await client.post(f"http://127.0.0.1:{free_port()}/v1/completions", body(), JSON)
            finally:
                await client.close()

    uvloop.run(main())
