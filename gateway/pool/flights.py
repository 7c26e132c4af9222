"""The requests in flight at each backend, so that the gateway can act on them when a backend
leaves the pool (ejection) or the gateway shuts down (drain).

A `Flight` is one attempt of one request at one backend. While it waits for the first byte it
holds the attempt's `asyncio.Timeout`: moving that to now ends the wait at once (the relay then
retries elsewhere, or fails cleanly). Once it streams it holds the stream's `IdleWatch`:
shortening that ends the stream with the SSE error event after a grace period without bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Literal, get_args

from common.net import public_url
from gateway.pool.model_pool import Backend
from gateway.relay.idle import FirstByteWait, IdleWatch

log = logging.getLogger("zerogap.gateway.flights")

Why = Literal["ejected", "draining"]
Cause = Literal["health", "outlier", "connect"]  # why a backend left the pool
CAUSES: tuple[Cause, ...] = get_args(Cause)


class Flight:
    __slots__ = ("backend", "first_byte", "grace_s", "peers", "retries_left", "stop", "timeout", "tried", "watch")

    def __init__(self, backend: Backend, peers: list[Backend], tried: list[Backend], retries_left: int) -> None:
        self.backend = backend
        self.peers = peers  # the backends of its model
        self.tried = tried  # the backends this request tried (this one included)
        self.retries_left = retries_left
        self.timeout: asyncio.Timeout | None = None  # set while waiting for the answer's head
        self.first_byte: FirstByteWait | None = None  # set while a stream waits for its first byte
        self.watch: IdleWatch | None = None  # set while streaming
        self.stop: Why | None = None  # why the gateway ends this attempt
        self.grace_s = 0.0

    def movable(self) -> bool:
        """Whether another healthy backend may take this request (one it has not tried, a retry left)."""
        return self.retries_left > 0 and any(b.healthy and b not in self.tried for b in self.peers)

    def end(self, why: Why, grace_s: float) -> None:
        """Stop waiting now; stop streaming after grace_s without a byte. A drain overrides an ejection.
        A request waiting at an ejected backend with nowhere else to go keeps waiting there."""
        if self.stop == "draining" or (self.stop == why and grace_s >= self.grace_s):
            return
        if why == "ejected" and self.watch is None and not self.movable():
            return
        self.stop, self.grace_s = why, grace_s
        if self.watch is not None:
            self.watch.shorten(grace_s)
        elif self.timeout is not None:
            _expire_now(self.timeout)
        elif self.first_byte is not None:
            self.first_byte.expire_now()

    def waiting(self, timeout: asyncio.Timeout) -> None:
        """The attempt waits for its first byte within `timeout`."""
        self.timeout = timeout
        if self.stop is not None:
            _expire_now(timeout)

    def waiting_for_first_byte(self, wait: FirstByteWait) -> None:
        """A stream's head came; its pipe waits for the first byte until `wait` expires."""
        self.timeout = None
        self.first_byte = wait
        if self.stop is not None:
            wait.expire_now()

    def streaming(self, watch: IdleWatch) -> None:
        """The first byte came: from now on the stream's idle watch is what ends it."""
        self.timeout = self.first_byte = None
        self.watch = watch
        if self.stop is not None:  # ended between the first byte and the stream's start
            watch.shorten(self.grace_s)

    def ended(self, idle_s: float) -> tuple[int, str]:
        """The status and message of a stream the gateway ended (idle, ejected backend, drain)."""
        if self.stop == "draining":
            return 503, "The gateway is shutting down ([gateway].drain_timeout_s passed); stream ended."
        if self.stop == "ejected":
            return 502, (
                f"Backend {self.backend.name} left the pool and sent nothing for {self.grace_s:g} s "
                "([gateway].eject_grace_s); stream ended."
            )
        return 504, f"The backend sent nothing for {idle_s} s ([gateway].idle_timeout_s); stream ended."


def _expire_now(timeout: asyncio.Timeout) -> None:
    if not timeout.expired():  # one that already fired is on its way out
        timeout.reschedule(asyncio.get_running_loop().time())


class Flights:
    """Every Flight in this process, by backend."""

    def __init__(self, eject_grace_s: float, on_leave: Callable[[Backend, Cause], None] | None = None) -> None:
        self.eject_grace_s = eject_grace_s
        self.on_leave = on_leave  # told each time a backend in the pool leaves it (the metric)
        self.drained = False  # the drain's deadline passed: a new attempt ends at once
        self._by_backend: dict[Backend, set[Flight]] = {}

    def open(self, backend: Backend, peers: list[Backend], tried: list[Backend], retries_left: int) -> Flight:
        flight = Flight(backend, peers, tried, retries_left)
        self._by_backend.setdefault(backend, set()).add(flight)
        if self.drained:
            flight.stop = "draining"
        return flight

    def close(self, flight: Flight) -> None:
        self._by_backend[flight.backend].discard(flight)
        flight.backend.num_attempts += 1

    def __len__(self) -> int:
        return sum(len(fs) for fs in self._by_backend.values())

    def take_out(self, backend: Backend, reason: str, cause: Cause) -> None:
        """The backend leaves the pool: its first-byte waiters are retried elsewhere now (those
        that can go elsewhere), its streams end after eject_grace_s without a byte."""
        if backend.healthy:
            log.warning("backend %s (%s) leaves the pool: %s", backend.name, public_url(backend.url), reason)
            if self.on_leave is not None:
                self.on_leave(backend, cause)
        backend.healthy = False
        for flight in list(self._by_backend.get(backend, ())):
            flight.end("ejected", self.eject_grace_s)

    def end_all(self) -> int:
        """The drain's deadline: every attempt still in flight ends now. Returns how many."""
        self.drained = True
        flights = [f for fs in self._by_backend.values() for f in fs]
        for flight in flights:
            flight.end("draining", 0.0)
        return len(flights)
