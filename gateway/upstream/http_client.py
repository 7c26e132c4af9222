"""HttpUpstream: a lean HTTP/1.1 client to the backends on asyncio, with a keep-alive pool per
backend (scheme, host, port). Connections and their responses are in gateway/upstream/connection.py."""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from urllib.parse import urlsplit

from gateway.upstream.client import UpstreamError, UpstreamResponse
from gateway.upstream.connection import Connection, Response

KEEPALIVE_S = 30.0  # an idle pooled connection older than this is closed, not reused
USER_AGENT = b"zerogap-gateway"


class _Target:
    """Where a URL goes: the pool key, the Host header and the request target."""

    __slots__ = ("host", "key", "port", "request_line_tail", "ssl")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamError("connect", f"not an http(s) URL: {url!r}", "has a URL the gateway cannot use")
        self.ssl = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.ssl else 80)
        self.key = (parts.scheme, self.host, self.port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = parts.netloc.rsplit("@", 1)[-1]
        self.request_line_tail = f" {target} HTTP/1.1\r\nHost: {host_header}\r\n".encode("latin-1")


class ConnectionPool:
    """The connections to one backend (scheme, host, port): idle ones kept most recent last."""

    def __init__(self, client: HttpUpstream, target: _Target) -> None:
        self.client = client
        self.loop = asyncio.get_running_loop()
        self.host = target.host
        self.port = target.port
        self.ssl = target.ssl
        self.idle: collections.deque[Connection] = collections.deque()
        self.num_busy = 0  # connections carrying a request (or being opened for one)
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.all: set[Connection] = set()

    def take(self) -> Connection | None:
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

    def put(self, conn: Connection) -> None:
        conn.busy = False
        conn.idle_since = now = time.monotonic()
        self.idle.append(conn)
        self._done_with()
        idle = self.idle
        while idle and now - idle[0].idle_since > KEEPALIVE_S:  # the oldest, unused for long: close
            idle.popleft().abort()

    def forget(self, conn: Connection) -> None:
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

    async def acquire(self, fresh: bool) -> tuple[Connection, bool]:
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

    async def _connect(self) -> Connection:
        timeout_s = self.client.connect_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                _, proto = await self.loop.create_connection(
                    lambda: Connection(self),
                    self.host,
                    self.port,
                    ssl=self.client.ssl_context() if self.ssl else None,
                    server_hostname=self.host if self.ssl else None,
                )
        except TimeoutError:
            failure = f"did not accept the connection within {timeout_s} s ([gateway].connect_timeout_s)"
            raise UpstreamError(
                "connect", f"no connection to {self.host}:{self.port} within {timeout_s} s", failure
            ) from None
        except OSError as exc:
            failure = "refused the connection" if isinstance(exc, ConnectionRefusedError) else "could not be reached"
            raise UpstreamError("connect", f"cannot connect to {self.host}:{self.port}: {exc}", failure) from None
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
        self._pools: dict[tuple[str, str, int], ConnectionPool] = {}
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
        resp: Response | None = None
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

    async def _request(self, method: bytes, url: str, body: bytes | None, headers: dict[str, str]) -> Response:
        target = self._target(url)
        pool = self._pools.get(target.key)
        if pool is None:
            pool = self._pools[target.key] = ConnectionPool(self, target)
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
            resp = conn.resp = Response(conn, pool.loop)
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
