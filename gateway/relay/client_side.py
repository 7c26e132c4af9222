"""The client's side of one relayed request: a client that goes away stops the relay (which
closes the upstream request), and a stream that waits for its answer gets an SSE comment every
keepalive_interval_s, so that proxies and clients on the way do not time it out.

On uvicorn's httptools protocol (the gateway's server) both come from callbacks, with no task per
request: the gateway's own protocol (gateway/server/http_limits.py) calls the cycle's `on_gone` when
it marks the cycle disconnected; on uvicorn's plain protocol, which tells a request's cycle of a lost
connection by setting `disconnected` and then its message event, the cycle's event is swapped for
one that also calls back (`_GoneEvent`);
the keep-alive is a timer, and only a keep-alive that is due starts a task to send it. A task
per request that waited on `receive()` cost ~6 % of the gateway's CPU per request
(bench/PERF_NOTES.md). On any other ASGI server: that task, as ASGI has it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.relay.chunk_writer import httptools_cycle
from gateway.server.asgi import Receive, Send

if TYPE_CHECKING:
    from gateway.relay.exchange import Exchange

log = logging.getLogger("zerogap.gateway.client_side")
KEEPALIVE = b": keep-alive\n\n"


class _GoneEvent(asyncio.Event):
    """A uvicorn cycle's message event that calls `gone` once the cycle is disconnected."""

    def __init__(self, cycle: Any, gone: Callable[[], None]) -> None:
        super().__init__()
        self._cycle = cycle
        self._gone: Callable[[], None] | None = gone

    def set(self) -> None:
        super().set()
        gone = self._gone
        if gone is not None and self._cycle.disconnected:
            self._gone = None
            gone()

    def unhook(self) -> None:
        """No more calls; and no reference back to the cycle (which holds this event), so that the
        cycle is freed when its request ends, not by the cycle collector."""
        self._gone = self._cycle = None


def _hookable(receive: Receive) -> Any:
    """uvicorn's httptools cycle behind `receive`, if it has what the hook needs; else None."""
    cycle = httptools_cycle(receive, RequestResponseCycle.receive)
    if cycle is None:
        return None
    if not isinstance(getattr(cycle, "message_event", None), asyncio.Event) or not hasattr(cycle, "disconnected"):
        return None
    if not hasattr(getattr(cycle, "flow", None), "resume_reading"):
        return None
    return cycle


def _sent(sending: asyncio.Future[None]) -> None:
    """A keep-alive that failed is logged (the relay's own send sees a client that is gone)."""
    if not sending.cancelled() and sending.exception() is not None:
        log.warning("a keep-alive comment could not be sent: %r", sending.exception())


class ClientSide:
    """Watches the client of one relayed request, from `start` (the relay's task is running) to `stop`."""

    __slots__ = (
        "_cycle", "_event", "_sending", "_task", "_timer", "_watch", "exchange", "finished", "gone", "interval_s",
        "send",
    )  # fmt: skip

    def __init__(self, exchange: Exchange, send: Send, interval_s: float) -> None:
        self.exchange = exchange
        self.send = send
        self.interval_s = interval_s
        self.finished = False  # the relay has sent its last message: nothing to stop any more
        self.gone = False  # the client went away and the relay was stopped for it
        self._task: asyncio.Task[Any] | None = None  # the relay's
        self._event: _GoneEvent | None = None
        self._cycle: Any = None  # the cycle whose on_gone is ours (the gateway's own protocol)
        self._timer: asyncio.TimerHandle | None = None
        self._sending: asyncio.Future[None] | None = None  # a keep-alive on its way
        self._watch: asyncio.Future[None] | None = None  # the task of a server that is not uvicorn's

    def start(self, receive: Receive, relay_task: asyncio.Task[Any]) -> None:
        self._task = relay_task
        cycle = _hookable(receive)
        if cycle is None:
            self._watch = asyncio.ensure_future(self._watch_receive(receive))
            return
        cycle.flow.resume_reading()  # as receive() would: a client that hangs up is seen only while reading
        if hasattr(cycle, "on_gone"):  # the gateway's protocol calls it (http_refusals.tell_gone): no event swapped
            if cycle.disconnected:
                self._gone()
                return
            self._cycle = cycle
            cycle.on_gone = self._gone
        else:
            self._event = cycle.message_event = _GoneEvent(cycle, self._gone)
            if cycle.disconnected:  # gone already, before the hook
                self._event.unhook()
                self._gone()
                return
        if self.exchange.call.stream:
            delay_s = self.exchange.t0_s + self.interval_s - time.monotonic()
            self._timer = asyncio.get_running_loop().call_later(max(delay_s, 0.0), self._keepalive_due)

    def stop(self) -> None:
        self.finished = True
        if self._event is not None:
            self._event.unhook()
        if self._cycle is not None:
            self._cycle.on_gone = self._cycle = None
        if self._timer is not None:
            self._timer.cancel()
        for future in (self._sending, self._watch):
            if future is not None:
                future.cancel()

    def _gone(self) -> None:
        if not self.finished and self._task is not None:
            self.gone = True
            self._task.cancel()

    def _keepalive_due(self) -> None:
        self._timer = None
        if self.finished or self.gone or self.exchange.replied:
            return
        self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._keepalive_due)
        if self._sending is None or self._sending.done():  # one at a time: a full socket delays the next
            self._sending = asyncio.ensure_future(self._keepalive())
            self._sending.add_done_callback(_sent)

    async def _keepalive(self) -> None:
        exchange = self.exchange
        if exchange.start_stream():  # the head goes before any answer: its overhead is the time until now
            await self.send({"type": "http.response.start", "status": 200, "headers": exchange.stream_headers()})
        await self.send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})

    async def _watch_receive(self, receive: Receive) -> None:
        """The same for a server whose disconnect is known only from `receive()`."""
        exchange = self.exchange
        keepalive_s = exchange.t0_s + self.interval_s
        while True:
            if exchange.call.stream and not exchange.replied:
                delay_s = keepalive_s - time.monotonic()
                if delay_s <= 0:
                    keepalive_s = time.monotonic() + self.interval_s
                    await self._keepalive()
                    continue
                try:
                    async with asyncio.timeout(delay_s):
                        message = await receive()
                except TimeoutError:
                    continue
            else:
                message = await receive()
            if message["type"] == "http.disconnect":
                self._gone()
                return
