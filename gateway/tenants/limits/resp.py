"""The Redis connection of the limiter (gateway/tenants/limits/redis.py): one connection, pipelined.

Each admission of a key with limits runs a script or two in Redis, so the client's own cost is
paid per request. redis-py's asyncio client spends ~170 µs of CPU per command here (its pool,
its locks, a StreamWriter, a Python parser), and its pool of 100 connections refused commands
outright ("Too many connections") when a few hundred requests ended at once. This client keeps
one connection: a command is packed and written at once, its reply is matched by order (Redis
answers a connection's commands in order), and commands sent in the background (`send(...,
flush=False)`: the settlements and releases at a request's end) wait up to BACKGROUND_WAIT_S for
the next command that is awaited (the next admission's) and go out in its write, ahead of it: on
one host every write to Redis wakes redis-server, and costs the gateway about what relaying a few
tokens does. This process's own later commands always see them first (one connection, in order);
other processes see a release or a settlement at most BACKGROUND_WAIT_S later.

A command that has waited `timeout_s` for its reply, or a connection that breaks, fails every
command in flight with redis-py's ConnectionError or TimeoutError (the limiter treats any
RedisError or OSError as Redis being down); the next command connects again. The URL is read
by redis-py's parse_url: redis://, rediss:// (TLS) and unix://, with a username, a password and
a database number.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from redis.asyncio.connection import parse_url
from redis.exceptions import AuthenticationError, ConnectionError, InvalidResponse, ResponseError, TimeoutError

Arg = bytes | str | int | float
_INCOMPLETE = object()
BACKGROUND_WAIT_S = 0.01  # the longest a background command waits for an awaited one to share its write
_CRLF = b"\r\n"


def pack(args: Sequence[Arg]) -> bytes:
    """One command in RESP: an array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else (a if isinstance(a, str) else repr(a)).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def parse(buf: bytes, pos: int) -> tuple[Any, int]:
    """The reply that starts at buf[pos] and where the next one starts, or (_INCOMPLETE, pos). An
    error reply is returned as a ResponseError (raised to its command's caller, not here)."""
    end = buf.find(_CRLF, pos)
    if end < 0:
        return _INCOMPLETE, pos
    kind, line, after = buf[pos], buf[pos + 1 : end], end + 2
    if kind == 58:  # ':' an integer
        return int(line), after
    if kind == 36:  # '$' a bulk string (-1: nil)
        n = int(line)
        if n < 0:
            return None, after
        if len(buf) < after + n + 2:
            return _INCOMPLETE, pos
        return buf[after : after + n], after + n + 2
    if kind == 42:  # '*' an array (-1: nil)
        n = int(line)
        if n < 0:
            return None, after
        items = []
        for _ in range(n):
            item, after = parse(buf, after)
            if item is _INCOMPLETE:
                return _INCOMPLETE, pos
            items.append(item)
        return items, after
    if kind == 43:  # '+' a simple string
        return line, after
    if kind == 45:  # '-' an error
        return ResponseError(line.decode(errors="replace")), after
    raise InvalidResponse(f"Redis sent a reply this client cannot read: {bytes(buf[pos : pos + 32])!r}")


class _Protocol(asyncio.Protocol):
    def __init__(self, timeout_s: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.timeout_s = timeout_s
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[tuple[asyncio.Future[Any], float]] = deque()  # in the order sent
        self.buffer = b""
        self.outbox: list[bytes] = []  # background commands, written with the next awaited one (or at the wait's end)
        self.outbox_timer: asyncio.TimerHandle | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, command: bytes, flush: bool = True) -> asyncio.Future[Any]:
        future = self.loop.create_future()
        if self.lost is not None or self.transport is None:
            future.set_exception(ConnectionError(f"the connection to Redis is closed: {self.lost}"))
            return future
        self.waiting.append((future, self.loop.time()))
        if flush:
            if self.outbox:  # behind the background commands sent before it, in one write
                self.outbox.append(command)
                self._flush()
            else:
                self.transport.write(command)
        else:
            if not self.outbox:
                self.outbox_timer = self.loop.call_at(self.loop.time() + BACKGROUND_WAIT_S, self._flush)
            self.outbox.append(command)
        if self.timer is None:
            self.timer = self.loop.call_at(self.loop.time() + self.timeout_s, self._check)
        return future

    def _flush(self) -> None:
        if self.outbox_timer is not None:
            self.outbox_timer.cancel()
            self.outbox_timer = None
        if self.outbox and self.transport is not None and self.lost is None:
            self.transport.write(b"".join(self.outbox))
        self.outbox.clear()

    def data_received(self, data: bytes) -> None:
        buf = self.buffer + data if self.buffer else data
        pos, n = 0, len(buf)
        try:
            while pos < n:
                reply, pos = parse(buf, pos)
                if reply is _INCOMPLETE:
                    break
                future = self.waiting.popleft()[0]
                if not future.done():  # its caller may have been cancelled meanwhile
                    if isinstance(reply, ResponseError):
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)
        except InvalidResponse as exc:
            self.abort(exc)
            return
        except (ValueError, IndexError) as exc:  # a length that is no number, a reply nothing waits for
            self.abort(InvalidResponse(f"Redis sent a reply this client cannot match: {exc}"))
            return
        self.buffer = buf[pos:] if pos < n else b""

    def _check(self) -> None:
        """Fail everything in flight once the oldest command has waited timeout_s for its reply."""
        self.timer = None
        if not self.waiting or self.lost is not None:
            return
        due = self.waiting[0][1] + self.timeout_s
        if due <= self.loop.time():
            self.abort(TimeoutError(f"Redis did not answer within {self.timeout_s:g} s"))
        else:
            self.timer = self.loop.call_at(due, self._check)

    def abort(self, exc: BaseException) -> None:
        if self.lost is None:
            self.lost = exc
        if self.transport is not None:
            self.transport.abort()
        self._fail_all()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost is None:
            self.lost = ConnectionError(f"Redis closed the connection{f': {exc}' if exc else ''}")
        self._fail_all()

    def _fail_all(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.outbox_timer is not None:
            self.outbox_timer.cancel()
            self.outbox_timer = None
        self.outbox.clear()
        while self.waiting:
            future = self.waiting.popleft()[0]
            if not future.done():
                future.set_exception(self.lost or ConnectionError("the connection to Redis is closed"))


class RedisConnection:
    """One pipelined connection to the Redis of `url`, (re)opened by the first command that needs it."""

    def __init__(self, url: str, timeout_s: float = 1.0, connect_timeout_s: float = 1.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._options = parse_url(url)
        self._tls = urlsplit(url).scheme == "rediss"
        self._protocol: _Protocol | None = None
        self._opening: asyncio.Task[_Protocol] | None = None
        self._closed = False

    def send(self, *args: Arg, flush: bool = True) -> asyncio.Future[Any]:
        """The command's reply, to await (or to leave running, with flush=False: a background write)."""
        p = self._protocol
        if p is not None and p.lost is None:
            return p.send(pack(args), flush)
        return asyncio.ensure_future(self._send_when_open(pack(args), flush))

    async def _send_when_open(self, command: bytes, flush: bool) -> Any:
        return await (await self._open()).send(command, flush)

    async def _open(self) -> _Protocol:
        if self._closed:
            raise ConnectionError("the Redis connection was closed")
        if self._opening is None or self._opening.done():  # one attempt shared by everyone who waits
            self._opening = asyncio.ensure_future(self._connect())
            self._opening.add_done_callback(_retrieved)  # its failure is each waiter's, even if none is left
        return await asyncio.shield(self._opening)

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        o = self._options
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if "path" in o:
                    _, protocol = await loop.create_unix_connection(lambda: _Protocol(self.timeout_s), o["path"])
                else:
                    host, port = o.get("host", "localhost"), int(o.get("port", 6379))
                    _, protocol = await loop.create_connection(
                        lambda: _Protocol(self.timeout_s), host, port, ssl=self._ssl_context() if self._tls else None
                    )
        except TimeoutError as exc:  # the builtin: asyncio.timeout's
            raise TimeoutError(f"connecting to Redis took more than {self.connect_timeout_s:g} s") from exc
        except OSError as exc:
            raise ConnectionError(f"cannot connect to Redis: {exc}") from exc
        try:
            await self._handshake(protocol)
        except BaseException:
            protocol.abort(ConnectionError("the connection to Redis was not set up"))
            raise
        self._protocol = protocol
        return protocol

    async def _handshake(self, protocol: _Protocol) -> None:
        o = self._options
        if o.get("password") is not None:
            auth = ("AUTH", o["username"], o["password"]) if o.get("username") else ("AUTH", o["password"])
            try:
                await protocol.send(pack(auth))
            except ResponseError as exc:
                raise AuthenticationError(str(exc)) from None
        if int(o.get("db") or 0):
            await protocol.send(pack(("SELECT", int(o["db"]))))

    def _ssl_context(self) -> ssl.SSLContext:
        o = self._options
        cafile = o.get("ssl_ca_certs")
        context = ssl.create_default_context(cafile=str(cafile) if cafile else None)
        reqs = str(o.get("ssl_cert_reqs") or "required").lower()
        if reqs == "none":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif reqs == "optional":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_OPTIONAL
        return context

    async def close(self) -> None:
        self._closed = True
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        p, self._protocol = self._protocol, None
        if p is not None and p.transport is not None and p.lost is None:
            p._flush()
            p.lost = ConnectionError("the Redis connection was closed")
            p.transport.close()
            p._fail_all()


class Script:
    """A Lua script run by its SHA1 (EVALSHA); sent whole (EVAL, which also caches it) when Redis
    does not have it (the first call, a restart, SCRIPT FLUSH)."""

    def __init__(self, connection: RedisConnection, source: str) -> None:
        self.connection = connection
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        try:
            return await self.connection.send("EVALSHA", self.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            if not _no_script(exc):
                raise
        return await self.connection.send("EVAL", self.source, len(keys), *keys, *args)

    def background(self, keys: Sequence[Arg], args: Sequence[Arg]) -> asyncio.Future[Any]:
        """The same, written with this turn's other background commands (no task of its own)."""
        outer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def first_done(first: asyncio.Future[Any]) -> None:
            if not first.cancelled() and _no_script(first.exception()):
                self.connection.send("EVAL", self.source, len(keys), *keys, *args).add_done_callback(settle)
            else:
                settle(first)

        def settle(done: asyncio.Future[Any]) -> None:
            if outer.done():
                return
            if done.cancelled():
                outer.cancel()
            elif (exc := done.exception()) is not None:
                outer.set_exception(exc)
            else:
                outer.set_result(done.result())

        self.connection.send("EVALSHA", self.sha, len(keys), *keys, *args, flush=False).add_done_callback(first_done)
        return outer


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _no_script(exc: BaseException | None) -> bool:
    return isinstance(exc, ResponseError) and str(exc).startswith("NOSCRIPT")
