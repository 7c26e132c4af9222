"""One streamed completion over a kept-alive connection (geventhttpclient, the client
Locust's FastHttpUser uses), timed per content chunk.

TTFT: send -> first content chunk (a reasoning model's reasoning or its answer). TTFA: send ->
the first chunk of the answer itself. TPOT: (E2E - TTFT) / (output tokens - 1), reasoning included.
ITL: the gaps between content chunks. Output tokens: usage.completion_tokens, or the
content chunks counted when the server sends no usage (the record says which).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import gevent
from geventhttpclient import HTTPClient
from geventhttpclient.response import HTTPParseError

from loadgen.send_clock import SendClock
from loadgen.sse import SseParser
from loadreport.record import INTERRUPTED, RequestRecord

BLOCK_SIZE = 64 * 1024
DRAIN_TIMEOUT_S = 1.0
Callback = Callable[[RequestRecord, list[float]], None]


class RequestFailed(Exception):
    """What Locust shows in its failures table: the kind first, then the detail."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


def traceparent(start_wall: float) -> str:
    """A W3C traceparent for one request (api.traceparent), sampled: the trace id's first 16 hex digits
    are the time the request was made in microseconds since the epoch (its head carries the header, so
    a fraction of a millisecond before requests.csv's sent time), the rest random."""
    return f"00-{int(start_wall * 1e6):016x}{os.urandom(8).hex()}-{os.urandom(8).hex()}-01"


class StreamClient:
    def __init__(
        self,
        base_url: str,
        path: str,
        headers: dict[str, str],
        connect_s: float,
        timeout_s: float,
        stream: bool = True,
        traced: bool = False,
    ) -> None:
        self.traced = traced  # each request sends a traceparent of its own (api.traceparent)
        parts = urlsplit(base_url)
        self.path = parts.path.rstrip("/") + path
        self.chat = path.endswith("/chat/completions")
        self.timeout_s = timeout_s
        self.streamed = stream
        accept = "text/event-stream" if stream else "application/json"
        self.headers = {"Content-Type": "application/json", "Accept": accept, **headers}
        self.http = HTTPClient(
            parts.hostname or "127.0.0.1",
            port=parts.port or (443 if parts.scheme == "https" else 80),
            ssl=parts.scheme == "https",
            connection_timeout=connect_s,
            network_timeout=timeout_s,
            concurrency=1,
            block_size=BLOCK_SIZE,
        )
        self.clock = SendClock(self.http)  # when each request's bytes go out (loadgen/send_clock.py)

    def close(self) -> None:
        self.http.close()

    def stream(
        self, body: bytes, planned: float | None = None, on_interrupt: Callback | None = None
    ) -> tuple[RequestRecord, list[float], str]:
        """Send one request and read it to the end. Returns the record, the wall-clock
        time of each content chunk, and the failure detail ("" when it went well).
        planned: open loop, the planned send (wall clock); the record keeps the lag behind it.
        When the test stops mid-stream, on_interrupt gets what was read so far."""
        parser = SseParser(self.chat)
        start_wall, start = time.time(), time.perf_counter()
        trace_id = ""
        if self.traced:
            self.headers["traceparent"] = header = traceparent(start_wall)
            trace_id = header[3:35]
        kind, detail, end = "", "", None
        self.clock.reset()
        try:
            end = self._send_and_read(body, parser)
        except RequestFailed as exc:
            kind, detail = exc.kind, str(exc)
        except gevent.GreenletExit:
            if on_interrupt is not None:
                start_wall, start, send_lag_s = self._sent(start_wall, start, planned)
                cut = _to_record(parser, start_wall, start, INTERRUPTED, send_lag_s, None, self.streamed, trace_id)
                on_interrupt(*cut)
            raise
        except (TimeoutError, gevent.Timeout) as exc:
            kind, detail = "timeout", f"timeout: no byte for {self.timeout_s} s ({exc})"
        except (OSError, HTTPParseError) as exc:
            kind = "broken stream" if parser.content_times else "connection error"
            detail = f"{kind}: {type(exc).__name__}: {exc}"
        except ValueError as exc:  # json.JSONDecodeError
            kind, detail = "bad chunk", f"bad chunk: not JSON ({exc})"
        start_wall, start, send_lag_s = self._sent(start_wall, start, planned)
        record, walls = _to_record(parser, start_wall, start, kind, send_lag_s, end, self.streamed, trace_id)
        return record, walls, detail

    def _sent(self, start_wall: float, start: float, planned: float | None) -> tuple[float, float, float | None]:
        """The request's start moved to when its bytes went out (wall clock, perf_counter), if they did:
        TTFT, E2E and requests.csv's sent time count from there (loadgen/send_clock.py); and its lag
        behind the planned send (open loop; else None)."""
        sent = self.clock.sent_at
        if sent is not None and sent >= start:
            start_wall, start = start_wall + (sent - start), sent
        return start_wall, start, None if planned is None else max(0.0, start_wall - planned)

    def _send_and_read(self, body: bytes, parser: SseParser) -> float:
        """Returns when the stream ended ([DONE], or the body's end): E2E stops there."""
        response = self.http.request("POST", self.path, body=body, headers=self.headers)
        try:
            status = response.get_code()
            if status >= 400:
                text = response.read()[:500].decode("utf-8", "replace")
                raise RequestFailed(f"HTTP {status}", _error_message(text))
            if not self.streamed:
                return _read_whole(response, parser)
            readline, feed, clock = response.readline, parser.feed_line, time.perf_counter
            while True:
                line = readline(b"\n")
                if not line:
                    break
                feed(line, clock())
                if parser.done:
                    break
            end = clock()
            parser.finish(end)
            if parser.done and not response.message_complete:
                _drain(response)  # the body's end follows [DONE]: read it so the connection is kept
        finally:
            response.release()
        if parser.error is not None:
            raise RequestFailed("stream error", parser.error)
        if not parser.done:
            raise RequestFailed("broken stream", "the stream ended without data: [DONE]")
        if not parser.content_times:
            raise RequestFailed("empty stream", "no content chunk before [DONE]")
        return end


def _read_whole(response: Any, parser: SseParser) -> float:
    """A non-streamed answer: its content counts as one chunk at the end (TTFT = E2E)."""
    body = response.read()
    end = time.perf_counter()
    parser.on_json(json.loads(body), end)
    parser.done = True
    if parser.error is not None:
        raise RequestFailed("stream error", parser.error)
    if not parser.content_times:
        raise RequestFailed("empty answer", "no content in the answer")
    return end


def _drain(response: Any) -> None:
    with gevent.Timeout(DRAIN_TIMEOUT_S, False):
        while response.readline(b"\n"):
            pass


def _error_message(text: str) -> str:
    try:
        body: Any = json.loads(text)
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip()


def _to_record(
    parser: SseParser,
    start_wall: float,
    start: float,
    kind: str,
    send_lag_s: float | None,
    end: float | None = None,
    streamed: bool = True,
    trace_id: str = "",
) -> tuple[RequestRecord, list[float]]:
    end = time.perf_counter() if end is None else end
    times = parser.content_times
    if parser.completion_tokens is not None:
        tokens, source = int(parser.completion_tokens), "usage"
    else:
        tokens, source = len(times), "chunks"
    reasoning = parser.reasoning_tokens
    if reasoning is None and parser.reasoning_chunks:  # counted: its chunks at this answer's tokens per chunk
        reasoning = round(parser.reasoning_chunks * tokens / len(times))
    record = RequestRecord(
        start=start_wall,
        end=start_wall + (end - start),
        ok=not kind,
        error_kind=kind,
        ttft_s=(times[0] - start) if times else None,
        e2e_s=end - start,
        output_tokens=tokens,
        prompt_tokens=int(parser.prompt_tokens or 0),
        token_source=source,
        send_lag_s=send_lag_s,
        streamed=streamed,
        ttfa_s=(parser.answer_time - start) if parser.answer_time is not None else None,
        reasoning_tokens=reasoning,
        cached_tokens=parser.cached_tokens,
        trace_id=trace_id,
    )
    add = record.itl.add_ms
    for before, after in itertools.pairwise(times):
        add((after - before) * 1000.0)
    return record, [start_wall + (t - start) for t in times]
