"""The settings of the HTTP limits (gateway/server/http_limits.py) and their answers: OpenAI error bodies,
each closing its connection. An answer's code labels zerogap_http_refused_total{reason}, but for
the per-client refusal (PER_CLIENT_REASON)."""

from __future__ import annotations

import logging
from asyncio import TimerHandle
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, NamedTuple

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.server.asgi import ASGIApp, Receive, Scope, Send, send_error
from gateway.server.errors import ApiError


class HttpLimits(NamedTuple):
    max_header_bytes: int = 32 * 1024
    header_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    max_connections: int = 10_000
    max_connections_per_client: int = 1024
    idle_connection_timeout_s: float = 10.0
    forwarded_allow_ips: tuple[str, ...] = ()  # trusted proxies: their connections count in no client's


log = logging.getLogger("zerogap.gateway.http")

CLOSE = {"connection": "close"}
PER_CLIENT_REASON = "too_many_connections_per_client"  # its code is too_many_connections, as the global one's


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


def too_many_connections_per_client(limits: HttpLimits) -> ApiError:
    return ApiError(
        503,
        f"Your address holds the most connections the gateway allows one client "
        f"({limits.max_connections_per_client}, [server].max_connections_per_client). "
        "Reuse your open connections (keep-alive), or close some, and retry.",
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


def response_bytes(error: ApiError, default_headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The error as bytes on the wire, with uvicorn's default headers (server, date)."""
    body = error.encoded()
    content = [STATUS_LINE[error.status]]
    for name, value in default_headers:
        content += [name, b": ", value, b"\r\n"]
    for key, text in error.headers.items():
        content += [key.encode(), b": ", text.encode(), b"\r\n"]
    content += [b"content-type: application/json\r\ncontent-length: ", b"%d" % len(body), b"\r\n\r\n", body]
    return b"".join(content)


def answer_app(error: ApiError) -> ASGIApp:
    """An ASGI app that answers `error` (for a refused request queued behind others)."""

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        await send_error(send, error)

    return answer


def tell_gone(cycle: Any) -> None:
    """A cycle just marked disconnected: its relay's client side, if one watches it (client_side.py),
    is told at once."""
    gone = getattr(cycle, "on_gone", None)
    if gone is not None and cycle.disconnected:
        cycle.on_gone = None
        gone()


class Refused(Exception):
    """Raised from a parser callback after the refusal is written: it stops httptools' parsing."""


class RefusingProtocol(HttpToolsProtocol):
    """How the HTTP limits answer and close (gateway/server/http_limits.py's LimitedHttpProtocol keeps the
    state these read, and decides when)."""

    limits: ClassVar[HttpLimits] = HttpLimits()
    on_refused: ClassVar[Callable[[str], None] | None] = None  # each refusal's reason (metrics)
    _timer: TimerHandle | None  # the header or the body deadline, whichever is running
    _header_bytes: int  # bytes of the request's header section received so far
    _exact_check: bool  # the request began mid-chunk
    _refused: bool
    _started_s: float  # the connection's start, on the loop's clock

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

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
            self.transport.write(self._answer_bytes(error))
            self.transport.close()
            return
        app, self.app = self.app, answer_app(error)
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
        self.transport.write(self._answer_bytes(error))
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

    def _answer_bytes(self, error: ApiError) -> bytes:
        return response_bytes(error, self.server_state.default_headers)

    def _idle_timed_out(self) -> None:
        """A new connection's idle_connection_timeout_s: closed without an answer if no byte of a
        request came; else its headers keep their header_timeout_s from the connection's start."""
        self._timer = None
        left_s = self._started_s + self.limits.header_timeout_s - self.loop.time()
        if (self._header_bytes > 0 or self._exact_check) and left_s > 0:
            self._timer = self.loop.call_later(left_s, self._header_timed_out)
            return
        self._header_timed_out()

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
            self.transport.write(self._answer_bytes(header_timeout(self.limits)))
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
        self.transport.write(self._answer_bytes(body_timeout(self.limits)))
        cycle.disconnected = True  # its sends are dropped from now, before the connection is lost
        cycle.message_event.set()
        tell_gone(cycle)
        self.transport.close()
