"""The hot path of a stream: each chunk from the backend is filtered and sent to the client
from the upstream connection's own callback, with no task woken per chunk.

A task woken per chunk resumed through a dozen coroutine frames (uvicorn, the middleware,
the endpoint, the relay's generators, read_chunk) and back, each cold in the cache: that was
most of the gateway's CPU per relayed token. Here the ASGI `send` coroutine is stepped by
hand (or, on uvicorn, its one write made directly: gateway/relay/chunk_writer.py): it finishes at
once unless the client's socket is full. When it does wait, the rest of
that send runs in a task, reading from the backend pauses, and the chunks that were already
on their way queue behind it, in order; reading resumes once they are sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from gateway.relay.chunk_writer import ChunkWriter, HeadWriter, chunk_writer, head_writer
from gateway.relay.idle import FirstByteWait, IdleWatch
from gateway.relay.sse import SseFilter
from gateway.server.asgi import Message, Send
from gateway.server.errors import bare
from gateway.upstream.client import UpstreamError, UpstreamResponse

if TYPE_CHECKING:
    from gateway.pool.flights import Flight
    from gateway.relay.exchange import Exchange


class _Rest:
    """Awaits the rest of a coroutine that was stepped by hand and is now waiting on `pending`."""

    __slots__ = ("coro", "pending")

    def __init__(self, coro: Generator[Any, Any, None], pending: Any) -> None:
        self.coro = coro
        self.pending = pending

    def __await__(self) -> Generator[Any, Any, None]:
        coro, pending = self.coro, self.pending
        while True:
            try:
                sent = yield pending
            except BaseException as exc:  # cancelled: the coroutine decides, as it would if awaited
                try:
                    pending = coro.throw(exc)
                except StopIteration:
                    return
                continue
            try:
                pending = coro.send(sent)
            except StopIteration:
                return


class Pipe:
    """Relays the body of one streamed answer; the relay runs it with the client's `send` (Responder.pipe).

    It is handed the stream before its first byte: the first bytes for the client go out from the
    callback that brought them, the response's head with them (unless a keep-alive sent it), with
    no task woken in between. Until then nothing has reached the client from this attempt, so the
    relay can still try another backend if it ends: `relayed` says whether anything went out, and
    `first_byte.expired` whether the wait for it ran out (or the gateway ended it)."""

    __slots__ = (
        "_backlog", "_deadline_s", "_error", "_flusher", "_message", "_send", "_write", "_write_head", "exchange",
        "filt", "first_byte", "flight", "relayed", "resp", "watch",
    )  # fmt: skip

    def __init__(
        self,
        resp: UpstreamResponse,
        filt: SseFilter,
        exchange: Exchange,
        watch: IdleWatch,
        flight: Flight,
        first_byte_deadline_s: float,
    ) -> None:
        self.resp = resp
        self.filt = filt
        self.exchange = exchange
        self.watch = watch
        self.flight = flight
        self.relayed = False  # bytes of this stream went to the client
        self.first_byte: FirstByteWait | None = None  # set while run() waits for the first byte
        self._deadline_s = first_byte_deadline_s  # time.monotonic(): [gateway].first_byte_timeout_s from the start
        self._error: BaseException | None = None  # what broke the stream (UpstreamError, or from send)
        self._send: Send | None = None
        self._write: ChunkWriter | None = None  # straight to the socket when send would do only that
        self._write_head: HeadWriter | None = None  # the head and the first chunk in one write, likewise
        self._message: Message = {"type": "http.response.body", "body": b"", "more_body": True}
        self._backlog: list[bytes] | None = None  # chunks behind a send that waits (None: none waits)
        self._flusher: asyncio.Task[None] | None = None

    async def run(self, send: Send) -> BaseException | None:
        """Relay until the backend's body ends (None) or breaks: then what broke it (an
        UpstreamError from the backend, or what sending to the client raised)."""
        self._send = send
        self._write = chunk_writer(send)
        self._write_head = head_writer(send)
        self.first_byte = FirstByteWait(self._deadline_s, self.resp.close)
        self.flight.waiting_for_first_byte(self.first_byte)
        try:
            await self.resp.pipe(self._on_data)
        except UpstreamError as exc:
            self._error = self._error or bare(exc)
        except BaseException:
            if self._flusher is not None:
                self._flusher.cancel()
            raise
        finally:
            self.first_byte.cancel()
        if self._flusher is not None:
            await self._flusher
        error, self._error = self._error, None
        return error

    def _on_data(self, data: bytes) -> None:
        self.exchange.last_s = self.watch.last_s = time.monotonic()
        data = self.filt.feed(data)
        if not data:
            return
        if self._backlog is not None:
            self._backlog.append(data)
            return
        if not self.relayed and self._begin(data):
            return
        write = self._write
        if write is not None and write(data):
            return
        message = self._message
        message["body"] = data
        if self._step(message, []):
            self._message = {"type": "http.response.body", "body": b"", "more_body": True}  # that one is in use

    def _begin(self, data: bytes) -> bool:
        """The stream's first bytes for the client: it is now relayed (its TTFT, no more keep-alives, the
        idle watch from here on) and its head goes out first. True: data waits behind the head."""
        self.relayed = True
        exchange = self.exchange
        exchange.stream_began(self.watch.last_s)
        assert self.first_byte is not None
        self.first_byte.cancel()
        self.watch.arm()
        self.flight.streaming(self.watch)
        if not exchange.start_stream():
            return False
        head = exchange.stream_headers(self.watch.last_s)  # x-zerogap-overhead-ms: known now, sent with the bytes
        if self._write_head is not None and self._write_head(head, data):
            return True
        return self._step({"type": "http.response.start", "status": 200, "headers": head}, [data])

    def _step(self, message: Message, then: list[bytes]) -> bool:
        """Send message by stepping `send` by hand; True if it did not finish: it broke the stream, or
        it waits (the socket is full), and then the chunks in `then` and those that come meanwhile go
        after it, and reading pauses."""
        assert self._send is not None
        coro = self._send(message).__await__()
        try:
            pending = coro.send(None)
        except StopIteration:
            return False
        except BaseException as exc:
            self._broken(exc)
            return True
        self._backlog = then
        self.resp.pause_reading()
        self._flusher = asyncio.ensure_future(self._finish(coro, pending))
        self._flusher.add_done_callback(self._flushed)
        return True

    async def _finish(self, coro: Generator[Any, Any, None], pending: Any) -> None:
        await _Rest(coro, pending)
        backlog = self._backlog
        assert backlog is not None and self._send is not None
        while backlog:
            data = b"".join(backlog)
            backlog.clear()
            await self._send({"type": "http.response.body", "body": data, "more_body": True})
        self._backlog = None
        self.resp.resume_reading()

    def _flushed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._broken(task.exception())

    def _broken(self, exc: BaseException | None) -> None:
        """Sending to the client failed: stop the stream (run() returns what broke it)."""
        self._error = bare(exc) if exc is not None else None
        self.resp.close()
