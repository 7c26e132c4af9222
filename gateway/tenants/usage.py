"""Token usage per key and model: counted in memory, added to the key store in batches
(every [gateway].usage_flush_interval_s and at shutdown). A failed flush keeps the counts
for the next one, so usage made while the store is down is written when it is back."""

from __future__ import annotations

import asyncio
import logging

from gateway.tenants.keys.base import Store, UsageRow

log = logging.getLogger("zerogap.gateway.usage")


class UsageRecorder:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: dict[tuple[str, str], list[int]] = {}
        self._failing = False

    def record(self, key_name: str, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        row = self._pending.get((key_name, model))
        if row is None:
            row = self._pending[(key_name, model)] = [0, 0, 0]
        row[0] += 1
        row[1] += prompt_tokens
        row[2] += completion_tokens

    def _take(self) -> list[UsageRow]:
        pending, self._pending = self._pending, {}
        return [UsageRow(k, m, r[0], r[1], r[2]) for (k, m), r in pending.items()]

    async def flush(self) -> None:
        rows = self._take()
        if not rows:
            return
        try:
            await self._store.add_usage(rows)
        except Exception as exc:  # keep the counts for the next flush rather than lose them
            if not self._failing:
                log.warning("usage flush failed, keeping the counts in memory until the store is back: %s", exc)
            self._failing = True
            for r in rows:
                self._merge(r)
            return
        if self._failing:
            log.warning("usage flush succeeded again: the counts kept in memory are written")
        self._failing = False

    def _merge(self, r: UsageRow) -> None:
        row = self._pending.setdefault((r.key_name, r.model), [0, 0, 0])
        row[0] += r.num_requests
        row[1] += r.prompt_tokens
        row[2] += r.completion_tokens

    async def flush_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.flush()
