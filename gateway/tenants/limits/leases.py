"""The concurrency slots this process holds in a shared store (the workers' SQLite file, or
Redis), kept alive while their requests run: every lease_s / 3 the process renews the expiry of
each live lease. A process that dies renews nothing, so its slots free themselves within
lease_s ([gateway].concurrency_lease_s), and the store drops them when it next admits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from gateway.tenants.limits.base import Slot, new_slot

log = logging.getLogger("zerogap.gateway.limits")

Renew = Callable[[dict[str, str]], Awaitable[None]]  # lease id -> key


class Leases:
    def __init__(self, lease_s: float, renew: Renew) -> None:
        self.lease_s = lease_s
        self.owner = uuid.uuid4().hex[:16]  # this process, in its lease ids
        self.live: dict[str, str] = {}
        self._renew = renew
        self._task: asyncio.Task[None] | None = None
        self._warned_s = 0.0

    def new(self, key: str) -> Slot:
        return new_slot(key, self.owner)

    def hold(self, slot: Slot) -> None:
        self.live[slot.lease_id] = slot.key
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._renew_forever())

    def drop(self, slot: Slot) -> bool:
        """True if the slot was held here and is now dropped (False: released already, or local)."""
        if slot.released or slot.local:
            return False
        slot.released = True
        return self.live.pop(slot.lease_id, None) is not None

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if not self.live:
                continue
            try:
                await self._renew(dict(self.live))
            except Exception as exc:  # the store is down: the leases lapse; admission says what to do then
                if time.monotonic() - self._warned_s > 10:
                    self._warned_s = time.monotonic()
                    log.warning("renewing %d concurrency leases failed: %s", len(self.live), exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
