"""The harness's streaming client against the real upstream fixture: timing, token
counts and every failure kind."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from loadgen.client import StreamClient
from tests.fixtures.upstream import Behavior, UpstreamServer


def body(max_tokens: int = 12) -> bytes:
    return json.dumps(
        {
            "model": "test-model",
            "messages": [{"role": "user", "content": "one two three"}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    ).encode()


def client(url: str, timeout_s: float = 10.0, path: str = "/v1/chat/completions") -> StreamClient:
    return StreamClient(url, path, {}, 5.0, timeout_s)


def test_multi_token_chunks_count_tokens_from_usage_and_time_them() -> None:
    """Timed by events, not by the machine's speed: TTFT is the first content chunk's arrival (the
    headers come at once, 50 ms before it: a TTFT taken at the headers is shorter than the
    upstream's own), the ITL holds the gaps between the chunks' arrivals, and the stream's end is
    after the last chunk."""
    with UpstreamServer(Behavior(ttft_s=0.05, interval_s=0.02, tokens_per_chunk=3)) as up:
        streamer = client(up.url)
        record, walls, detail = streamer.stream(body(12))
        streamer.close()
        (seen,) = up.requests
    assert record.ok and detail == ""
    assert record.output_tokens == 12 and record.token_source == "usage" and record.prompt_tokens == 3
    assert len(walls) == 4  # 12 tokens in chunks of 3
    assert seen.ttft_s is not None and record.ttft_s is not None
    assert record.ttft_s >= seen.ttft_s >= 0.05  # sent before the upstream got it, read after it wrote the chunk
    assert record.ttft_s == pytest.approx(walls[0] - record.start, abs=1e-6)
    gaps_ms = sorted(1000 * (after - before) for before, after in itertools.pairwise(walls))
    assert record.itl.count == 3 and record.itl.percentile(50) == pytest.approx(gaps_ms[1], abs=0.1)
    assert record.e2e_s - record.ttft_s >= walls[-1] - walls[0]


def test_completions_endpoint_and_a_kept_alive_connection() -> None:
    with UpstreamServer(Behavior(num_output_tokens=5)) as up:
        streamer = client(up.url, path="/v1/completions")
        payload = json.dumps({"model": "test-model", "prompt": "a b", "max_tokens": 5, "stream": True,
                              "stream_options": {"include_usage": True}}).encode()  # fmt: skip
        results = [streamer.stream(payload)[0] for _ in range(3)]
        streamer.close()
    assert all(r.ok and r.output_tokens == 5 for r in results)


def test_http_error_timeout_and_broken_stream_are_failures_by_kind() -> None:
    with UpstreamServer(Behavior(interval_s=0.01)) as up:
        up.behavior.fail_status, up.behavior.num_failures = 503, 1
        streamer = client(up.url, timeout_s=0.5)
        failed, _, detail = streamer.stream(body())
        assert (failed.ok, failed.error_kind) == (False, "HTTP 503") and detail.startswith("HTTP 503: ")
        up.behavior.close_after_tokens = 3
        broken, _, _ = streamer.stream(body())
        assert broken.error_kind == "broken stream"
        up.behavior.close_after_tokens, up.behavior.stall_after_tokens = None, 2
        stalled, _, detail = streamer.stream(body())
        assert stalled.error_kind == "timeout" and "0.5 s" in detail
        streamer.close()


def test_no_server_is_a_connection_error() -> None:
    from common.net import free_port

    streamer = client(f"http://127.0.0.1:{free_port()}")
    record, _, detail = streamer.stream(body())
    assert record.error_kind == "connection error" and "connection error" in detail


def test_one_connection_is_kept_for_many_streams() -> None:
    """The body's end after [DONE] is read, so the socket goes back to the pool (a new
    connection per request would cost a handshake and, at scale, ephemeral ports)."""
    import asyncio
    import threading

    from bench.harness_throughput import CannedUpstream

    connections: list[int] = []

    class LateEnd:
        """Sends the chunked body's last 5 bytes (0 CRLF CRLF) 20 ms after [DONE], as aiohttp does."""

        def __init__(self, transport: Any) -> None:
            self.transport = transport

        def write(self, data: bytes) -> None:
            if data.endswith(b"0\r\n\r\n"):
                self.transport.write(data[:-5])
                loop.call_later(0.02, self.transport.write, data[-5:])
            else:
                self.transport.write(data)

    class Counting(CannedUpstream):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            connections.append(1)
            super().connection_made(transport)
            self.transport = LateEnd(transport)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(loop.create_server(Counting, "127.0.0.1", 0), loop).result(10)
    port = server.sockets[0].getsockname()[1]
    try:
        streamer = client(f"http://127.0.0.1:{port}")
        records = [streamer.stream(body())[0] for _ in range(5)]
        streamer.close()
    finally:
        # Closed on the loop's thread: asyncio's Server is not thread-safe. Closed from this one, it raced
        # the client's hang-up (both wake the server's waiters): TypeError, 2 runs in 30 on a busy machine.
        async def stop() -> None:
            server.close()
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    assert all(r.ok and r.output_tokens == 256 for r in records)
    assert len(connections) == 1
