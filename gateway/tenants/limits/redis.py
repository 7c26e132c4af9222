"""The limits of gateway/tenants/limits/ kept in Redis ([gateway].redis_url), so that every gateway
process and pod that uses it counts against the same buckets and the same concurrency slots
(the Lua scripts: gateway/tenants/limits/redis_lua.py; the slots' leases: gateway/tenants/limits/leases.py),
over one pipelined connection (gateway/tenants/limits/resp.py): two scripts awaited per admission (HEAD at
the headers, TOKENS after the body), and at the request's end the settlement and the release sent
in the background, in the write of the next admission (or at most resp.BACKGROUND_WAIT_S later).

When Redis cannot be reached, [gateway].on_redis_down decides:
- "local" (the default): this process counts the limits in its own memory, as if it were alone;
- "refuse": requests of keys that have any limit get 503 (keys without limits are served).
Either way zerogap_limits_backend_down_total{mode} counts the requests it concerned, a warning
is logged when it takes effect (and at most every 10 s while it lasts), and Redis is tried again
after REDIS_RETRY_S without making every request wait for a connect timeout meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from redis.exceptions import RedisError

from gateway.server.errors import ApiError
from gateway.tenants.auth import Principal
from gateway.tenants.limits.base import Slot
from gateway.tenants.limits.leases import Leases
from gateway.tenants.limits.memory import MemoryLimiter
from gateway.tenants.limits.redis_lua import HEAD, RENEW, SETTLE, TOKENS
from gateway.tenants.limits.resp import RedisConnection, Script
from gateway.tenants.limits.rule import cap_of, check_fits, clamp, concurrency_limited, limited

log = logging.getLogger("zerogap.gateway.limits")

REDIS_RETRY_S = 1.0  # after a failure, Redis is tried again this long later (meanwhile: on_redis_down)
WARN_EVERY_S = 10.0
OnDown = Literal["local", "refuse"]
DOWN = (RedisError, OSError)


def limits_unavailable() -> ApiError:
    return ApiError(
        503,
        "This key's limits cannot be checked right now: the gateway's Redis is unreachable and "
        '[gateway].on_redis_down = "refuse". Retry in a few seconds.',
        "server_error",
        code="limits_unavailable",
        headers={"Retry-After": str(int(REDIS_RETRY_S) + 1)},
    )


class RedisLimiter:
    def __init__(
        self,
        url: str,
        lease_s: float = 5.0,
        on_down: OnDown = "local",
        count_down: Callable[[str], None] | None = None,
    ) -> None:
        self._redis = RedisConnection(url, timeout_s=1.0, connect_timeout_s=1.0)
        self._head = Script(self._redis, HEAD)
        self._tokens = Script(self._redis, TOKENS)
        self._settle = Script(self._redis, SETTLE)
        self._renew_script = Script(self._redis, RENEW)
        self.on_down = on_down
        self._count_down = count_down or (lambda mode: None)
        self._local = MemoryLimiter()
        self.leases = Leases(lease_s, self._renew)
        self._pending: set[asyncio.Future[Any]] = set()
        self._down_until_s = 0.0
        self._down = False
        self._warned_s = 0.0

    @staticmethod
    def _key(name: str, kind: str) -> str:
        return f"zerogap:limit:{name}:{kind}"

    def _failed(self, exc: BaseException) -> None:
        self._down_until_s = time.monotonic() + REDIS_RETRY_S
        if not self._down or time.monotonic() - self._warned_s > WARN_EVERY_S:
            self._warned_s = time.monotonic()
            what = (
                "counting limits in this process only"
                if self.on_down == "local"
                else "refusing requests of keys with limits (503)"
            )
            log.warning("Redis rate limits unavailable (%s); on_redis_down = %s: %s", exc, self.on_down, what)
        self._down = True

    def _reached(self) -> None:
        if self._down:
            log.warning("Redis reachable again: limits are shared again")
        self._down = False

    def _fallback(self) -> None:
        """Redis is down for this request: count it, and refuse it if so configured."""
        self._count_down(self.on_down)
        if self.on_down == "refuse":
            raise limits_unavailable()

    def _skip(self) -> bool:
        """Redis failed a moment ago: don't make this request wait for it."""
        return self._down and time.monotonic() < self._down_until_s

    async def admit(self, who: Principal) -> Slot | None:
        rpm, cap = cap_of(who.limits.rpm), cap_of(who.limits.max_concurrency)
        if not self._skip():
            slot = self.leases.new(who.name) if cap is not None else None
            keys = [self._key(who.name, "rpm"), self._key(who.name, "slots")]
            args: list[int | float | str] = [rpm or 0, cap or 0, self.leases.lease_s, slot.lease_id if slot else ""]
            try:
                ok, kind, wait_s = await self._head(keys=keys, args=args)
            except DOWN as exc:
                self._failed(exc)
            else:
                self._reached()
                if not int(ok):
                    if kind == b"concurrency":
                        raise concurrency_limited(cap or 0)
                    raise limited("requests", rpm or 0, float(wait_s))
                if slot is not None:
                    self.leases.hold(slot)
                return slot
        self._fallback()
        return self._local.take_head(who)

    async def reserve(self, who: Principal, estimate: int, budget_tokens: int) -> None:
        estimate = clamp(estimate)
        tpm = check_fits(who, estimate, budget_tokens)
        if tpm is None:
            return
        if not self._skip():
            try:
                ok, wait_s = await self._tokens(keys=[self._key(who.name, "tpm")], args=[tpm, estimate])
            except DOWN as exc:
                self._failed(exc)
            else:
                self._reached()
                if not int(ok):
                    raise limited("tokens", tpm, float(wait_s))
                return
        self._fallback()
        self._local.take_tokens(who, estimate, budget_tokens)

    def settle(self, who: Principal, estimate: int, actual: int) -> None:
        tpm = cap_of(who.limits.tpm)
        delta = clamp(estimate) - clamp(actual)
        if tpm is None or delta == 0:
            return
        sent = self._settle.background([self._key(who.name, "tpm")], [tpm, delta])
        self._background(sent, lambda: self._local.settle(who, estimate, actual))

    def release(self, slot: Slot) -> None:
        if slot.local:
            self._local.release(slot)
        elif self.leases.drop(slot):  # not renewed from now on: if this fails too, it lapses
            self._background(self._redis.send("ZREM", self._key(slot.key, "slots"), slot.lease_id, flush=False))

    def num_held_here(self, key: str) -> int:
        """This process's live slots of the key (in Redis or, Redis down, in memory)."""
        return sum(1 for k in self.leases.live.values() if k == key) + self._local.num_held(key)

    async def _renew(self, live: dict[str, str]) -> None:
        ids = list(live)
        await self._renew_script(keys=[self._key(live[i], "slots") for i in ids], args=[self.leases.lease_s, *ids])

    def _background(self, sent: asyncio.Future[Any], if_down: Callable[[], None] | None = None) -> None:
        """A write whose reply nobody waits for: kept until it comes, a failure noted (and `if_down` run)."""
        self._pending.add(sent)
        sent.add_done_callback(lambda done: self._sent(done, if_down))

    def _sent(self, done: asyncio.Future[Any], if_down: Callable[[], None] | None) -> None:
        self._pending.discard(done)
        if done.cancelled():
            return
        exc = done.exception()
        if exc is None:
            return
        if not isinstance(exc, DOWN):
            log.warning("a background Redis write failed: %r", exc)
            return
        self._failed(exc)
        if if_down is not None:
            if_down()

    async def ping(self) -> bool:
        try:
            await self._redis.send("PING")
        except DOWN as exc:
            self._failed(exc)
            return False
        self._reached()
        return True

    async def idle(self, timeout_s: float = 2.0) -> None:
        """Wait for the writes sent in the background so far (settlements, releases)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)

    async def close(self) -> None:
        await self.leases.close()
        if self.leases.live:  # requests cut at shutdown: their slots go now rather than in lease_s
            live, self.leases.live = self.leases.live, {}
            for lease_id, key in live.items():
                self._background(self._redis.send("ZREM", self._key(key, "slots"), lease_id, flush=False))
        await self.idle()
        await self._redis.close()
