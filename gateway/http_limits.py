"""HTTP limits as nginx has them, on uvicorn's httptools protocol (which has none of them).

- Header size: the request line and headers of a request are at most `[server] max_header_bytes`;
  beyond it: 431 and the connection closed. A header line that never ends is cut as soon as the
  bytes received in the header section pass the limit (httptools buffers a partial line where we
  cannot see it, so we count what arrives before the headers are complete).
- Header time: a request's headers are complete within `header_timeout_s` of the connection's
  start (first request) or of the request's first byte (later ones: an idle keep-alive connection
  keeps uvicorn's own keep-alive timeout). Else: 408 if a byte of the request came and nothing is
  in flight, and the connection closed (slowloris).
- Body time: the body is complete within `body_timeout_s` of the headers; else 408, closed.
- Connections: beyond `max_connections` open in this process, a request gets 503, closed.
- Lingering close: a connection closed while its client still sends a body (a 413, a 408) sends
  its answer, then reads and drops the rest for a bounded time (gateway/lingering.py), so the
  client reads the answer instead of a reset.

Why a protocol subclass: the limits are per connection and per request, and the gateway's CPU
per relayed token is a headline figure. Nothing here runs per response chunk (the send path is
uvicorn's, untouched); per incoming chunk it adds an attribute test or two; a timer is armed per
connection, and per request only when its headers (or body) do not come in the read that began
them; the exact header size is computed only when the bytes counted pass the limit.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import TimerHandle
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.asgi import ASGIApp, Receive, Scope, Send, send_error
from gateway.errors import ApiError
from gateway.lingering import LingeringTransport

log = logging.getLogger("zerogap.gateway.http")

HEADER_LINE_OVERHEAD_BYTES = 4  # ": " and CRLF of one header line
REQUEST_LINE_OVERHEAD_BYTES = 20  # method, spaces, "HTTP/1.1", CRLF; and the blank line


class HttpLimits(NamedTuple):
    max_header_bytes: int = 32 * 1024
    header_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    max_connections: int = 10_000


class _Refused(Exception):
    """Raised from a parser callback after the refusal is written: it stops httptools' parsing."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of `limits` (see `protocol_class`)."""

    limits: ClassVar[HttpLimits] = HttpLimits()
    on_refused: ClassVar[Callable[[str], None] | None] = None  # each refusal's reason (metrics)

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._in_headers = True  # between a message's end (or the connection's start) and its headers' end
        self._header_bytes = 0  # bytes received while _in_headers (those of a pipelined tail not counted)
        self._exact_check = False  # the request began mid-chunk: its header size is computed at its end
        self._timer: TimerHandle | None = None  # the header or the body deadline, whichever is running
        self._over_limit = False
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._lingering = LingeringTransport(transport, self.loop, self._client_may_be_sending)
        super().connection_made(self._lingering)  # type: ignore[arg-type]
        self._over_limit = len(self.connections) > self.limits.max_connections
        self._timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._lingering.release()
        super().connection_lost(exc)

    def eof_received(self) -> None:
        if self._lingering.lingering:  # the client read our answer and closed its side: done
            self._lingering.close_now()

    def _client_may_be_sending(self) -> bool:
        """A close now would leave the client writing its body: a response sent before the
        request's body was read to its end (lingering.py). Not after a refusal of the headers:
        a header section over the limit is cut at once (nothing of it is worth reading)."""
        return not self._in_headers and self.cycle is not None and self.cycle.more_body

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with the bytes of the header section counted and the body deadline armed."""
        if self._lingering.lingering:
            self._lingering.discard(data)
            return
        self._unset_keepalive_if_required()
        if self._in_headers:
            if self._refused:  # the connection closes after the responses in flight: drop the rest
                return
            self._header_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refused:  # our refusal stopped the parser; the response is written
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._in_headers:
            if self._header_bytes > self.limits.max_header_bytes:
                self._refuse_incomplete(headers_too_large(self.limits))
            elif self._header_bytes and self._timer is None:  # a later request's headers (or blank
                # lines, which the parser skips) began and are not complete: their deadline runs
                self._timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timed_out)
        elif self._timer is None:  # a body that did not come with its headers: it has a deadline
            self._timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timed_out)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._header_bytes:  # it began in the tail of a chunk that ended the previous request,
            self._exact_check = True  # not counted as headers
            if self._timer is None:
                self._timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timed_out)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._cancel_timer()
        error = None
        if (self._exact_check or self._header_bytes > self.limits.max_header_bytes) and (
            self._header_section_bytes() > self.limits.max_header_bytes
        ):
            error = headers_too_large(self.limits)
        elif self._over_limit:
            error = too_many_connections(self.limits)
        self._exact_check = False
        if error is None:
            super().on_headers_complete()
            return
        self._refuse_request(error)
        raise _Refused  # stops the parser: the request's body is not read

    def on_message_complete(self) -> None:
        self._cancel_timer()
        self._in_headers = True
        self._header_bytes = 0
        super().on_message_complete()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_section_bytes(self) -> int:
        """The request line and headers as received (less the spaces httptools strips)."""
        lines = sum(len(name) + len(value) for name, value in self.headers)
        return len(self.url) + REQUEST_LINE_OVERHEAD_BYTES + lines + HEADER_LINE_OVERHEAD_BYTES * len(self.headers)

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "client"

    def _idle(self) -> bool:
        """No response is in flight on this connection: one of ours may be written."""
        return self.cycle is None or self.cycle.response_complete

    def _refuse_request(self, error: ApiError) -> None:
        """Answer a request whose headers are complete with `error`, and close: now, or after the
        responses in flight (pipelined requests), as uvicorn queues a request (app swapped)."""
        self._refused = True
        self._count(error.code)
        log.info("%s: %d, closing: %s", self._peer(), error.status, error.code)
        if self._idle():
            self.transport.write(self._response(error))
            self.transport.close()
            return
        app, self.app = self.app, _answer(error)
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def _refuse_incomplete(self, error: ApiError) -> None:
        """Refuse a request whose headers are not complete: answer and close, or when responses
        are in flight (it was pipelined), close after them; what the client sends next is dropped."""
        self._refused = True
        self._cancel_timer()
        self._count(error.code)
        log.info("%s: %d, closing: %s", self._peer(), error.status, error.code)
        if not self._idle():
            self._close_after_responses()
            return
        self.transport.write(self._response(error))
        self.transport.close()

    def _close_after_responses(self) -> None:
        """Read no more, and close once the responses in flight are sent (uvicorn closes after a
        response whose cycle is not keep-alive); at once when none is."""
        if self._idle():
            self.transport.close()
            return
        self.cycle.keep_alive = False
        self.flow.pause_reading()

    def _count(self, reason: str | None) -> None:
        count = type(self).on_refused  # read from the class: a plain function, not bound to self
        if count is not None:
            count(reason or "other")

    def _response(self, error: ApiError) -> bytes:
        """The error as bytes on the wire, with uvicorn's default headers (server, date)."""
        body = error.encoded()
        content = [STATUS_LINE[error.status]]
        for name, value in self.server_state.default_headers:
            content += [name, b": ", value, b"\r\n"]
        for key, text in error.headers.items():
            content += [key.encode(), b": ", text.encode(), b"\r\n"]
        content += [b"content-type: application/json\r\ncontent-length: ", b"%d" % len(body), b"\r\n\r\n", body]
        return b"".join(content)

    def _header_timed_out(self) -> None:
        """Slowloris: the headers did not come in time. Silent close on a connection that sent no
        byte of this request (as nginx does), else a 408 and close; but when a response is in
        flight (the late request was pipelined), close after it."""
        self._timer = None
        if self.transport.is_closing():
            return
        began = self._header_bytes > 0 or self._exact_check  # a byte of this request came
        self._count("header_timeout" if began else "silent_connection")
        log.log(logging.INFO if began else logging.DEBUG, "%s: closing: headers not complete in time", self._peer())
        if not self._idle():
            self._refused = True
            self._close_after_responses()
            return
        if began:
            self.transport.write(self._response(header_timeout(self.limits)))
        self.transport.close()

    def _body_timed_out(self) -> None:
        """A slow body: 408 and close; the app, waiting in receive(), gets http.disconnect. When
        the app already answers (it did not wait for the body), close after its response."""
        self._timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # we stopped reading (the app has not taken the body yet): not the client's
            self._timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timed_out)
            return
        log.info("%s: closing: body not complete in time", self._peer())
        self._count("body_timeout")
        cycle = self.cycle
        if cycle.response_started:
            self._close_after_responses()
            return
        self.transport.write(self._response(body_timeout(self.limits)))
        cycle.disconnected = True  # its sends are dropped from now, before the connection is lost
        cycle.message_event.set()
        self.transport.close()


CLOSE = {"connection": "close"}


def headers_too_large(limits: HttpLimits) -> ApiError:
    return ApiError(
        431,
        f"The request line and headers are larger than {limits.max_header_bytes} bytes "
        "([server].max_header_bytes). Send fewer or shorter headers.",
        code="headers_too_large",
        headers=CLOSE,
    )


def too_many_connections(limits: HttpLimits) -> ApiError:
    return ApiError(
        503,
        f"The gateway holds its most connections ({limits.max_connections}, [server].max_connections). "
        "Retry shortly, or reuse a connection.",
        "server_error",
        code="too_many_connections",
        headers={"retry-after": "1", **CLOSE},
    )


def header_timeout(limits: HttpLimits) -> ApiError:
    return ApiError(
        408,
        f"The request headers did not arrive within {limits.header_timeout_s:g} s ([server].header_timeout_s).",
        code="header_timeout",
        headers=CLOSE,
    )


def body_timeout(limits: HttpLimits) -> ApiError:
    return ApiError(
        408,
        f"The request body did not arrive within {limits.body_timeout_s:g} s ([server].body_timeout_s). "
        "Send the whole body at once.",
        code="body_timeout",
        headers=CLOSE,
    )


def _answer(error: ApiError) -> ASGIApp:
    """An ASGI app that answers `error` (for a refused request queued behind others)."""

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        await send_error(send, error)

    return answer


def protocol_class(limits: HttpLimits, on_refused: Callable[[str], None] | None = None) -> type[LimitedHttpProtocol]:
    """The protocol class to give uvicorn.Config(http=...): uvicorn makes one per connection.
    on_refused(reason) is called for each refusal (zerogap_http_refused_total{reason})."""

    class ConfiguredHttpProtocol(LimitedHttpProtocol):
        pass

    ConfiguredHttpProtocol.limits = limits
    ConfiguredHttpProtocol.on_refused = on_refused
    return ConfiguredHttpProtocol
