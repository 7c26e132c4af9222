"""The limits of one process, in its memory: no shared store (one worker, no [gateway].redis_url),
or the fallback of the Redis limiter while Redis is down."""

from __future__ import annotations

import time

from gateway.tenants.auth import Principal
from gateway.tenants.limits.base import Slot, new_slot
from gateway.tenants.limits.rule import Bucket, cap_of, clamp, head_rule, settled_level, tpm_rule


class MemoryLimiter:
    """The limits of one process, in memory (asyncio runs each method to its end at once)."""

    def __init__(self) -> None:
        self._rpm: dict[str, Bucket] = {}
        self._tpm: dict[str, Bucket] = {}
        self._held: dict[str, int] = {}

    async def admit(self, who: Principal) -> Slot | None:
        return self.take_head(who)

    async def reserve(self, who: Principal, estimate: int, budget_tokens: int) -> None:
        self.take_tokens(who, estimate, budget_tokens)

    async def close(self) -> None:
        return None

    def num_held(self, key: str) -> int:
        return self._held.get(key, 0)

    def take_head(self, who: Principal) -> Slot | None:
        now = time.monotonic()
        rpm = _bucket(self._rpm, who.name, who.limits.rpm, now)
        capped = who.limits.max_concurrency is not None
        head_rule(who, rpm, self._held.get(who.name, 0) if capped else 0)
        if rpm is not None:
            rpm.level -= 1
        if not capped:
            return None
        self._held[who.name] = self._held.get(who.name, 0) + 1
        return new_slot(who.name, "mem", local=True)

    def take_tokens(self, who: Principal, estimate: int, budget_tokens: int) -> None:
        tpm = _bucket(self._tpm, who.name, who.limits.tpm, time.monotonic())
        if tpm is None:
            return
        estimate = clamp(estimate)
        tpm_rule(who, tpm, estimate, budget_tokens)
        tpm.level -= estimate

    def settle(self, who: Principal, estimate: int, actual: int) -> None:
        bucket = self._tpm.get(who.name)
        if bucket is not None and who.limits.tpm is not None:
            bucket.level = settled_level(bucket, estimate, actual)

    def release(self, slot: Slot) -> None:
        if slot.released:
            return
        slot.released = True
        held = self._held.get(slot.key, 0) - 1
        if held > 0:
            self._held[slot.key] = held
        else:
            self._held.pop(slot.key, None)


def _bucket(buckets: dict[str, Bucket], name: str, limit: int | None, now: float) -> Bucket | None:
    capacity = cap_of(limit)
    if capacity is None:
        buckets.pop(name, None)
        return None
    bucket = buckets.get(name)
    if bucket is None:
        bucket = buckets[name] = Bucket(float(capacity), float(capacity), now)
    else:
        bucket.refill(float(capacity), now)
    return bucket
