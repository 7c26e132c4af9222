"""HTTP limits as nginx has them, on uvicorn's httptools protocol (which has none of them).

- Header size: the request line and headers of a request are at most `[server] max_header_bytes`;
  beyond it: 431 and the connection closed. A header line that never ends is cut as soon as the
  bytes received in the header section pass the limit (httptools buffers a partial line where we
  cannot see it, so we count what arrives before the headers are complete).
- Idle: a connection that sends no byte of a request within `idle_connection_timeout_s` (of its
  start, or of its last response: it replaces uvicorn's keep-alive timeout) is closed silently.
- Header time: a request's headers are complete within `header_timeout_s` of the connection's
  start (first request) or of the request's first byte (later ones). Else: 408 if a byte of the
  request came and nothing is in flight, and the connection closed (slowloris).
- Body time: the body is complete within `body_timeout_s` of the headers; else 408, closed. A
  response begun while the body is not all here closes the connection (`Connection: close`): a
  refusal that does not read the body (401, 413, 429, on any endpoint) does not wait for it.
- Connections: one client address holds at most `max_connections_per_client` (client_conns.py);
  beyond it a new connection is answered 503 at once and closed, and counts toward nothing else.
  Beyond `max_connections` open in this process, a request gets 503, closed.
- Lingering close: a connection closed while its client still sends a body (a 413, a 408) sends
  its answer, then reads and drops the rest for a bounded time (gateway/server/lingering.py), so the
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
from typing import Any, ClassVar

import httptools
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.server.client_conns import ClientConnections, TrustedProxies
from gateway.server.http_refusals import (
    PER_CLIENT_REASON,
    HttpLimits,
    Refused,
    RefusingProtocol,
    headers_too_large,
    tell_gone,
    too_many_connections,
    too_many_connections_per_client,
)
from gateway.server.inline_task import InlineTask, inline_paths
from gateway.server.lingering import LingeringTransport

log = logging.getLogger("zerogap.gateway.http")

HEADER_LINE_OVERHEAD_BYTES = 4  # ": " and CRLF of one header line
REQUEST_LINE_OVERHEAD_BYTES = 20  # method, spaces, "HTTP/1.1", CRLF; and the blank line


class LimitedHttpProtocol(RefusingProtocol):
    """uvicorn's httptools protocol with the limits of `limits` (see `protocol_class`)."""

    counts: ClassVar[ClientConnections] = ClientConnections(HttpLimits().max_connections_per_client)
    _inline_app: ClassVar[Any] = None  # the app whose inline paths are _inline_set
    _inline_set: ClassVar[frozenset[str]] = frozenset()

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
        self._counted = False  # in `counts` (not refused for its client's count)
        self._group: str | None = None  # the client address group it counts against
        self._started_s = 0.0
        self._keep_alive_held = False  # the cycle's keep-alive is off while its body is not all here
        self._shutting_down = False
        self._feeding = False  # in data_received's feed: a completion request found there starts inline
        self._inline: tuple[Any, Any] | None = None  # (cycle, app) of that request, started after the feed
        self.timeout_keep_alive = self.limits.idle_connection_timeout_s  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._lingering = LingeringTransport(transport, self.loop, self._client_may_be_sending)
        super().connection_made(self._lingering)  # type: ignore[arg-type]
        counts = self.counts
        self._group = counts.group_of(self.client[0] if self.client else None)
        if counts.full(self._group):
            self._refuse_at_connect()
            return
        counts.opened(self._group)
        self._counted = True
        self._over_limit = counts.num_open > self.limits.max_connections
        self._started_s = self.loop.time()
        limits = self.limits
        if limits.idle_connection_timeout_s < limits.header_timeout_s:
            self._timer = self.loop.call_later(limits.idle_connection_timeout_s, self._idle_timed_out)
        else:
            self._timer = self.loop.call_later(limits.header_timeout_s, self._header_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._lingering.release()
        if self._counted:
            self._counted = False
            self.counts.closed(self._group)
        super().connection_lost(exc)
        if self.cycle is not None:
            tell_gone(self.cycle)

    def shutdown(self) -> None:
        self._shutting_down = True  # a keep-alive held off is not given back (see on_message_complete)
        super().shutdown()

    def _refuse_at_connect(self) -> None:
        """Beyond max_connections_per_client: answer at once and close (lingering, so that a client
        that sends its request meanwhile reads the answer); not counted toward max_connections."""
        self._refused = True
        error = too_many_connections_per_client(self.limits)
        self._count(PER_CLIENT_REASON)
        log.info("%s: %d, closing: %s", self._peer(), error.status, PER_CLIENT_REASON)
        self.transport.write(self._answer_bytes(error))
        self.transport.close()

    def eof_received(self) -> None:
        if self._lingering.lingering:  # the client read our answer and closed its side: done
            self._lingering.close_now()

    def _client_may_be_sending(self) -> bool:
        """A close now would leave the client writing its body: a response sent before the
        request's body was read to its end (lingering.py). Not after a refusal of the headers:
        a header section over the limit is cut at once (nothing of it is worth reading)."""
        if not self._counted:  # refused at connect: its request may be on its way
            return True
        return not self._in_headers and self.cycle is not None and self.cycle.more_body

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with the bytes of the header section counted and the body deadline armed; a
        completion request completed here starts after the feed, in this callback (InlineTask)."""
        if self._lingering.lingering:
            self._lingering.discard(data)
            return
        self._feeding = True
        try:
            self._feed(data)
        finally:
            self._feeding = False
            if self._inline is not None:
                self._start_inline()

    def _feed(self, data: bytes) -> None:
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
            self._hold_keep_alive()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """A POST to a completion endpoint, from the parser: started at the end of this read, in this
        callback, instead of a task's first step in a later iteration of the loop (a hop, behind
        every other ready callback); its body is then in hand if it came in this read."""
        cycle.on_gone = None  # a relay's client side may set it: told when the client goes (tell_gone)
        if self._feeding and cycle.scope["method"] == "POST" and cycle.scope["path"] in self._inline_paths(app):
            self._inline = (cycle, app)
            return
        super()._start_asgi_task(cycle, app)

    def _inline_paths(self, app: Any) -> frozenset[str]:
        cls = type(self)
        if cls._inline_app is not app:
            cls._inline_app, cls._inline_set = app, inline_paths(app)
        return cls._inline_set

    def _start_inline(self) -> None:
        cycle, app = self._inline  # type: ignore[misc]
        self._inline = None
        task = InlineTask(cycle.run_asgi(app), self.loop)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)  # type: ignore[arg-type]
        task.start()

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
        raise Refused  # stops the parser: the request's body is not read

    def on_message_complete(self) -> None:
        self._cancel_timer()
        self._in_headers = True
        self._header_bytes = 0
        if self._keep_alive_held:
            self._keep_alive_held = False
            if not self._shutting_down and not self.cycle.response_started:
                self.cycle.keep_alive = True
        super().on_message_complete()

    def _hold_keep_alive(self) -> None:
        """The request's body did not all come with its headers: until it has, its response closes
        the connection (`Connection: close`, then a lingering close), so that an answer given before
        the body is read (a 401, 413, 429 on any endpoint) does not wait for the rest of it."""
        cycle = self.cycle
        if cycle is not None and cycle.keep_alive and not cycle.response_started:
            cycle.keep_alive = False
            self._keep_alive_held = True

    def _header_section_bytes(self) -> int:
        """The request line and headers as received (less the spaces httptools strips)."""
        lines = sum(len(name) + len(value) for name, value in self.headers)
        return len(self.url) + REQUEST_LINE_OVERHEAD_BYTES + lines + HEADER_LINE_OVERHEAD_BYTES * len(self.headers)


def protocol_class(limits: HttpLimits, on_refused: Callable[[str], None] | None = None) -> type[LimitedHttpProtocol]:
    """The protocol class to give uvicorn.Config(http=...): uvicorn makes one per connection.
    on_refused(reason) is called for each refusal (zerogap_http_refused_total{reason}). Its
    connections are counted together (per process: each server gets its own class)."""

    class ConfiguredHttpProtocol(LimitedHttpProtocol):
        pass

    ConfiguredHttpProtocol.limits = limits
    ConfiguredHttpProtocol.on_refused = on_refused
    trusted = TrustedProxies(limits.forwarded_allow_ips)
    ConfiguredHttpProtocol.counts = ClientConnections(limits.max_connections_per_client, trusted)
    return ConfiguredHttpProtocol
