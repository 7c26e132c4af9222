"""Graceful drain on SIGTERM (or a first Ctrl-C).

The server stops accepting connections at once (its listening sockets close; a new client is
refused) and /ready answers 503. Requests that had reached this process are served; streams in
flight may finish for up to [gateway].drain_timeout_s. Then every request still in flight ends:
a stream with the SSE error event and [DONE], a request still waiting for its first byte with a
503. Then the app shuts down: usage is flushed to the key store, so nothing counted is lost. A
second signal exits at once.

All of it lives in this process (the app and its server), so a supervisor of several worker
processes only forwards SIGTERM to each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Callable
from types import FrameType

import uvicorn

from gateway.pool.flights import Flights

log = logging.getLogger("zerogap.gateway.drain")

SHUTDOWN_MARGIN_S = 5.0  # the server's own shutdown waits this much longer than the drain


class Drain:
    """The drain of one gateway app: `begin()` starts it; `draining` says whether it started."""

    def __init__(self, flights: Flights, timeout_s: float) -> None:
        self.flights = flights
        self.timeout_s = timeout_s
        self.draining = False
        self.started_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def begin(self) -> None:
        if self.draining:
            return
        self.draining = True
        self.started_s = time.monotonic()
        log.warning(
            "draining: %d request(s) in flight may finish within %g s ([gateway].drain_timeout_s)",
            len(self.flights), self.timeout_s,
        )  # fmt: skip
        self._task = asyncio.get_running_loop().create_task(self._end_late_ones())

    async def _end_late_ones(self) -> None:
        await asyncio.sleep(self.timeout_s)  # cancelled by stop() when all ended sooner
        num = self.flights.end_all()
        if num:
            log.warning("drain timeout: ended %d request(s) still in flight", num)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose first SIGTERM/SIGINT starts the app's drain (`on_drain`) as it stops
    accepting; it waits drain_timeout_s (+ a margin) for the connections to end."""

    def __init__(self, config: uvicorn.Config, on_drain: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_drain = on_drain
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if not first:
            self.force_exit = True  # a second signal: do not wait any more
        elif self._loop is not None and sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        for server in self.servers:  # stop accepting now, not at the server's next tick
            server.close()
        self.on_drain()


def server_for(config: uvicorn.Config, drain_timeout_s: float, on_drain: Callable[[], None]) -> DrainingServer:
    config.timeout_graceful_shutdown = int(drain_timeout_s + SHUTDOWN_MARGIN_S + 0.999)
    return DrainingServer(config, on_drain)
