"""One keep-alive connection to a backend (an asyncio.Protocol, httptools parsing the response)
and the response it carries. Body bytes go to the reader as they arrive (all that came since the
last read, never held back), or straight to a sink (gateway/relay/pipe.py) from the read's callback; a
response that is closed drops its connection at once, so the backend sees the close and frees
the slot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

import httptools

from gateway.upstream.client import UpstreamError

HIGH_WATER_BYTES = 1 << 18  # unread body bytes above which the connection stops reading


class Owner(Protocol):
    """What a connection needs of its pool (gateway/upstream/http_client.py's ConnectionPool)."""

    loop: asyncio.AbstractEventLoop

    def forget(self, conn: Connection) -> None:
        """The connection closed (whatever its state)."""

    def put(self, conn: Connection) -> None:
        """The connection is idle again, ready for the next request."""


class Connection(asyncio.Protocol):
    """One connection to a backend, carrying one response at a time."""

    def __init__(self, pool: Owner) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self.resp: Response | None = None
        self.closed = False
        self.paused = False
        self.busy = False  # carrying a request (counted in the pool's num_busy)
        self.idle_since = 0.0

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # TCP_NODELAY is already on: asyncio's and uvloop's TCP transports both set it.
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass, but is one

    def data_received(self, data: bytes) -> None:
        resp, parser = self.resp, self.parser
        if resp is None or resp.done or parser is None:  # bytes on an idle connection: nothing can be trusted on it
            self.abort()
            return
        resp.got_bytes = True
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            resp.flush_piped()
            resp.fail("broken", f"bad HTTP response from the backend ({exc})", "sent a malformed HTTP response")
            self.abort()
            return
        if resp._piped:
            resp.flush_piped()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        resp = self.resp
        # The parser and the transport hold this protocol: dropped, nothing here is a reference cycle.
        self.resp = self.parser = self.transport = None
        if resp is None or resp.done:
            return
        if resp.status and resp.until_close:  # a body without length ends with the connection
            resp.message_complete()
            return
        detail = str(exc) if exc else "the backend closed the connection"
        failure = "reset the connection" if isinstance(exc, ConnectionResetError) else "closed the connection"
        resp.fail("broken", detail or type(exc).__name__, failure)

    def pause_writing(self) -> None:  # requests are small; nothing to hold back
        pass

    def resume_writing(self) -> None:
        pass

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        resp = self.resp
        assert resp is not None
        lower = name.lower()
        if lower == b"content-type":
            resp.content_type = value.decode("latin-1")
        elif lower == b"content-length" or (lower == b"transfer-encoding" and b"chunked" in value.lower()):
            resp.until_close = False

    def on_headers_complete(self) -> None:
        resp, parser = self.resp, self.parser
        assert resp is not None and parser is not None
        resp.status = parser.get_status_code()
        if resp.status in (204, 304) or 100 <= resp.status < 200:
            resp.until_close = False
        resp.headers_complete()

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        assert resp is not None
        if resp._sink is not None:  # piped: what this read brought goes on in one piece at its end
            resp._piped.append(body)
        else:
            resp.feed(body)

    def on_message_complete(self) -> None:
        resp, parser = self.resp, self.parser
        assert resp is not None and parser is not None
        resp.keep_alive = parser.should_keep_alive()
        resp.message_complete()

    # the pool's side

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
            self.pool.forget(self)
            if self.resp is not None:
                self.resp.fail("broken", "the connection was closed by the gateway", "was disconnected by the gateway")

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()


class Response:
    """One response; its body is read with read_chunk (bytes as they came) or read_all."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_end",
        "_error",
        "_piped",
        "_sink",
        "_waiter",
        "conn",
        "content_type",
        "done",
        "got_bytes",
        "headers_waiter",
        "keep_alive",
        "status",
        "until_close",
    )

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.status = 0
        self.content_type = "application/json"
        self.done = False
        self.keep_alive = False
        self.got_bytes = False
        self.until_close = True  # no Content-Length and not chunked: the body ends with the connection
        self.headers_waiter: asyncio.Future[None] | None = loop.create_future()
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: UpstreamError | None = None
        self._sink: Callable[[bytes], None] | None = None
        self._piped: list[bytes] = []  # body chunks of the current read, for the sink
        self._end: asyncio.Future[None] | None = None

    # from the connection

    def headers_complete(self) -> None:
        waiter, self.headers_waiter = self.headers_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER_BYTES:
            self.conn.pause()
        self._wake()

    def message_complete(self) -> None:
        self.done = True
        self._wake()
        end = self._end
        if end is not None and not end.done():
            end.set_result(None)

    def fail(self, reason: str, detail: str, failure: str) -> None:
        if self.done or self._error is not None:
            return
        self._error = UpstreamError(reason, detail, failure)
        waiter, self.headers_waiter = self.headers_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(self._error.again())
            waiter.exception()  # retrieved: no "never retrieved" warning if nobody waits any more
        self._wake()
        end, self._sink = self._end, None
        if end is not None and not end.done():
            end.set_exception(self._error.again())
            end.exception()  # retrieved, as above

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # UpstreamResponse

    async def read_chunk(self) -> bytes:
        while True:
            chunks = self._chunks
            if chunks:
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._buffered = 0
                if self.conn.paused:
                    self.conn.resume()
                return data
            if self._error is not None:
                raise self._error.again()
            if self.done:
                return b""
            waiter = self._waiter = self.conn.pool.loop.create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None

    async def read_all(self) -> bytes:
        parts: list[bytes] = []
        while True:
            data = await self.read_chunk()
            if not data:
                return b"".join(parts)
            parts.append(data)

    def pipe(self, sink: Callable[[bytes], None]) -> asyncio.Future[None]:
        end = self._end = self.conn.pool.loop.create_future()
        buffered = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._error is not None:
            end.set_exception(self._error.again())
            end.exception()
        elif self.done:
            end.set_result(None)
        else:
            self._sink = sink
            self.conn.resume()  # paused above the high-water mark, perhaps; the sink may pause it again
        if buffered:
            sink(buffered)
        return end

    def flush_piped(self) -> None:
        """Hand the chunks of one read to the sink as one piece: no delay, one write for all of them."""
        piped = self._piped
        if not piped:
            return
        data = piped[0] if len(piped) == 1 else b"".join(piped)
        piped.clear()
        if self._sink is not None:
            self._sink(data)

    def pause_reading(self) -> None:
        self.conn.pause()

    def resume_reading(self) -> None:
        self.conn.resume()

    def close(self) -> None:
        self._sink = None
        self.conn.abort()  # which ends the pipe's future, if one waits
        self._end = None

    def release(self) -> None:
        self._sink = self._end = None  # the sink's owner holds this response; the end's error holds frames
        conn = self.conn
        if self.done and self.keep_alive and not self._chunks and not conn.closed and not conn.paused:
            conn.resp = None
            conn.pool.put(conn)
        else:
            conn.abort()
