"""The idle timeout of a stream, with one timer per idle period rather than one per chunk."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class IdleWatch:
    """Calls on_idle() once no touch (last_s = now) came for idle_s: one timer per idle period,
    not one per chunk."""

    __slots__ = ("_handle", "_loop", "fired", "idle_s", "last_s", "on_idle")

    def __init__(self, idle_s: float, on_idle: Callable[[], None], armed: bool = True) -> None:
        self._loop = asyncio.get_running_loop()
        self.idle_s = idle_s
        self.on_idle = on_idle
        self.fired = False
        self.last_s = time.monotonic()
        self._handle: asyncio.TimerHandle | None = None
        if armed:
            self.arm()

    def arm(self) -> None:
        """Start watching (a stream's first byte came): idle_s from now."""
        self.last_s = time.monotonic()
        self._handle = self._loop.call_later(self.idle_s, self._check)

    def _check(self) -> None:
        wait_s = self.last_s + self.idle_s - time.monotonic()
        if wait_s > 0:
            self._handle = self._loop.call_later(wait_s, self._check)
            return
        self.fired = True
        self.on_idle()

    def shorten(self, idle_s: float) -> None:
        """From now on the idle limit is idle_s (if shorter), counted from now."""
        if self.fired or idle_s >= self.idle_s:
            return
        self.idle_s = idle_s
        self.last_s = time.monotonic()
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_later(idle_s, self._check)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


class FirstByteWait:
    """A stream's wait for its first byte, held by the stream's pipe: on_expired() once at the
    deadline ([gateway].first_byte_timeout_s from the attempt's start), or at once when the
    gateway ends the attempt (expire_now: an ejected backend, the drain's deadline)."""

    __slots__ = ("_handle", "expired", "on_expired")

    def __init__(self, deadline_s: float, on_expired: Callable[[], None]) -> None:
        self.on_expired = on_expired
        self.expired = False
        loop = asyncio.get_running_loop()
        self._handle: asyncio.Handle = loop.call_later(max(deadline_s - time.monotonic(), 0.0), self._expire)

    def _expire(self) -> None:
        self.expired = True
        self.on_expired()

    def expire_now(self) -> None:
        if not self.expired:
            self._handle.cancel()
            self._handle = asyncio.get_running_loop().call_soon(self._expire)

    def cancel(self) -> None:
        self._handle.cancel()
