"""The idle timeout of a stream, with one timer per idle period rather than one per chunk."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class IdleWatch:
    """Calls on_idle() once no touch (last_s = now) came for idle_s: one timer per idle period,
    not one per chunk."""

    __slots__ = ("_handle", "_loop", "fired", "idle_s", "last_s", "on_idle")

    def __init__(self, idle_s: float, on_idle: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self.idle_s = idle_s
        self.on_idle = on_idle
        self.fired = False
        self.last_s = time.monotonic()
        self._handle = self._loop.call_later(idle_s, self._check)

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
        self._handle.cancel()
        self._handle = self._loop.call_later(idle_s, self._check)

    def cancel(self) -> None:
        self._handle.cancel()
