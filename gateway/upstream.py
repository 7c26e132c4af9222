"""The HTTP client to the backends, behind a small interface tests may replace.

`HttpUpstream` is a lean HTTP/1.1 client on asyncio: one `asyncio.Protocol` per connection,
httptools for the response (chunked bodies decoded there), a keep-alive pool per backend.
Body bytes are handed to the reader as they arrive (all that came since the last read, never
held back); a response that is closed drops its connection at once, so the backend sees the
close and frees the slot.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Callable
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

KEEPALIVE_S = 30.0  # an idle pooled connection older than this is closed, not reused
HIGH_WATER_BYTES = 1 << 18  # unread body bytes above which the connection stops reading
USER_AGENT = b"zerogap-gateway"


class UpstreamError(Exception):
    """The backend could not be reached or broke the connection; `reason` is a short label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def again(self) -> UpstreamError:
        """A fresh copy to raise: a stored error raised twice would carry the frames of both
        raises, and those frames hold its keeper (a reference cycle the collector must find)."""
        return UpstreamError(self.reason, self.detail)


class UpstreamResponse(Protocol):
    status: int
    content_type: str

    async def read_chunk(self) -> bytes:
        """The next bytes as they arrive; b"" at the end. Raises UpstreamError if the connection breaks.
        Cancelling it loses nothing: the bytes wait for the next call."""
        ...

    async def read_all(self) -> bytes: ...

    def pipe(self, sink: Callable[[bytes], None]) -> asyncio.Future[None]:
        """From now on hand every body chunk to sink(data) from the connection's own callback
        (what is buffered first), instead of to read_chunk; the future ends with the body, or
        fails with UpstreamError if the connection breaks."""
        ...

    def pause_reading(self) -> None:
        """Read nothing more from the backend until resume_reading (the sink's side is full)."""
        ...

    def resume_reading(self) -> None: ...

    def close(self) -> None:
        """Drop the connection now (the backend sees it close and can free the slot)."""
        ...

    def release(self) -> None:
        """Give a fully read connection back to the pool."""
        ...


class UpstreamClient(Protocol):
    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse: ...

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]: ...

    async def close(self) -> None: ...


class _Target:
    """Where a URL goes: the pool key, the Host header and the request target."""

    __slots__ = ("host", "key", "port", "request_line_tail", "ssl")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamError("connect", f"not an http(s) URL: {url!r}")
        self.ssl = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.ssl else 80)
        self.key = (parts.scheme, self.host, self.port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = parts.netloc.rsplit("@", 1)[-1]
        self.request_line_tail = f" {target} HTTP/1.1\r\nHost: {host_header}\r\n".encode("latin-1")


class _Conn(asyncio.Protocol):
    """One connection to a backend, carrying one response at a time."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self.resp: _Response | None = None
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
            resp.fail("broken", f"bad HTTP response from the backend ({exc})")
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
        resp.fail("broken", detail or type(exc).__name__)

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
                self.resp.fail("broken", "the connection was closed by the gateway")

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()


class _Response:
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

    def __init__(self, conn: _Conn, loop: asyncio.AbstractEventLoop) -> None:
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

    def fail(self, reason: str, detail: str) -> None:
        if self.done or self._error is not None:
            return
        self._error = UpstreamError(reason, detail)
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


class _Pool:
    """The connections to one backend (scheme, host, port): idle ones kept most recent last."""

    def __init__(self, client: HttpUpstream, target: _Target) -> None:
        self.client = client
        self.loop = asyncio.get_running_loop()
        self.host = target.host
        self.port = target.port
        self.ssl = target.ssl
        self.idle: collections.deque[_Conn] = collections.deque()
        self.num_busy = 0  # connections carrying a request (or being opened for one)
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.all: set[_Conn] = set()

    def take(self) -> _Conn | None:
        now = time.monotonic()
        idle = self.idle
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if now - conn.idle_since > KEEPALIVE_S:
                conn.abort()
                continue
            return conn
        return None

    def put(self, conn: _Conn) -> None:
        conn.busy = False
        conn.idle_since = now = time.monotonic()
        self.idle.append(conn)
        self._done_with()
        idle = self.idle
        while idle and now - idle[0].idle_since > KEEPALIVE_S:  # the oldest, unused for long: close
            idle.popleft().abort()

    def forget(self, conn: _Conn) -> None:
        """A connection closed (whatever its state)."""
        if conn in self.all:
            self.all.discard(conn)
            if conn.busy:
                conn.busy = False
                self._done_with()
            else:
                try:
                    self.idle.remove(conn)
                except ValueError:
                    pass  # taken out of the idle list already

    def _done_with(self) -> None:
        self.num_busy -= 1
        self._wake_next()

    def _wake_next(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    async def acquire(self, fresh: bool) -> tuple[_Conn, bool]:
        """A connection for one request, and whether it was reused from the pool."""
        limit = self.client.max_per_backend
        while limit and self.num_busy >= limit and not self.idle:
            waiter = self.loop.create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():  # woken, but not going: wake the next one
                    self._wake_next()
                raise
        conn = None if fresh else self.take()
        self.num_busy += 1
        if conn is not None:
            conn.busy = True
            return conn, True
        try:
            conn = await self._connect()
        except BaseException:
            self._done_with()
            raise
        conn.busy = True
        return conn, False

    async def _connect(self) -> _Conn:
        timeout_s = self.client.connect_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                _, proto = await self.loop.create_connection(
                    lambda: _Conn(self),
                    self.host,
                    self.port,
                    ssl=self.client.ssl_context() if self.ssl else None,
                    server_hostname=self.host if self.ssl else None,
                )
        except TimeoutError:
            raise UpstreamError("connect", f"no connection within {timeout_s} s") from None
        except OSError as exc:
            raise UpstreamError("connect", f"cannot connect to {self.host}:{self.port}: {exc}") from None
        self.all.add(proto)
        return proto

    def close(self) -> None:
        for conn in list(self.all):
            conn.abort()
        self.idle.clear()


class HttpUpstream:
    """Keep-alive connection pools, one per backend; connect timeout from [gateway].connect_timeout_s,
    at most `max_connections_per_backend` requests at once per backend (0: no limit)."""

    def __init__(self, connect_timeout_s: float, max_connections_per_backend: int = 0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_per_backend = max_connections_per_backend
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._targets: dict[str, _Target] = {}
        self._ssl: ssl.SSLContext | None = None

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) > 4096:
                self._targets.clear()
            target = self._targets[url] = _Target(url)
        return target

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        return await self._request(b"POST", url, body, headers)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        resp: _Response | None = None
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self._request(b"GET", url, None, {})
                data = await resp.read_all()
        except BaseException:
            if resp is not None:
                resp.close()
            raise
        resp.release()
        return resp.status, data

    async def _request(self, method: bytes, url: str, body: bytes | None, headers: dict[str, str]) -> _Response:
        target = self._target(url)
        pool = self._pools.get(target.key)
        if pool is None:
            pool = self._pools[target.key] = _Pool(self, target)
        head = [method, target.request_line_tail, b"User-Agent: ", USER_AGENT, b"\r\n"]
        for name, value in headers.items():
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        if body is not None:
            head.append(b"Content-Length: %d\r\n\r\n" % len(body))
            head.append(body)
        else:
            head.append(b"\r\n")
        raw = b"".join(head)
        fresh = False
        while True:
            conn, reused = await pool.acquire(fresh)
            resp = conn.resp = _Response(conn, pool.loop)
            assert conn.transport is not None
            conn.transport.write(raw)
            waiter = resp.headers_waiter
            try:
                if waiter is not None:
                    await waiter
            except UpstreamError:
                if reused and not resp.got_bytes:  # the backend had closed the idle connection: once more
                    fresh = True
                    continue
                raise
            except BaseException:
                conn.abort()
                raise
            return resp

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
