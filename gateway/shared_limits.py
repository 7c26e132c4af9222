"""The rate limits of gateway/limits.py kept in Redis, so that every gateway process that uses
the same [gateway].redis_url counts against the same buckets. Each admission is one atomic Lua
script (the buckets refill on Redis's clock). If Redis cannot be reached the process falls back
to its own in-memory buckets and logs a warning (at most every 10 s)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.auth import Principal
from gateway.limits import RateLimiter, limited

log = logging.getLogger("zerogap.gateway.limits")

REFILL = """
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function level(key, cap, t)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local l = tonumber(v[1]) or cap
  local ts = tonumber(v[2]) or t
  return math.min(cap, l + math.max(0, t - ts) * cap / 60)
end
local function store(key, l, t)
  redis.call('HSET', key, 'level', tostring(l), 'ts', tostring(t))
  redis.call('EXPIRE', key, 3600)
end
"""

ADMIT = (
    REFILL
    + """
local t = now()
local rpm, tpm, estimate = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local r, k
if rpm > 0 then r = level(KEYS[1], rpm, t) end
if tpm > 0 then k = level(KEYS[2], tpm, t) end
if r and r < 1 then return {0, 'rpm', tostring((1 - r) * 60 / rpm)} end
if k and k <= 0 then return {0, 'tpm', tostring((0.000001 - k) * 60 / tpm)} end
if r then store(KEYS[1], r - 1, t) end
if k then store(KEYS[2], k - estimate, t) end
return {1, '', '0'}
"""
)

SETTLE = (
    REFILL
    + """
local t = now()
local cap, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
store(KEYS[1], math.min(cap, level(KEYS[1], cap, t) + delta), t)
return 1
"""
)


class SharedLimiter:
    def __init__(self, url: str) -> None:
        self._redis: Any = aioredis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
        self._admit = self._redis.register_script(ADMIT)
        self._settle = self._redis.register_script(SETTLE)
        self._local = RateLimiter()
        self._pending: set[asyncio.Task[None]] = set()
        self._warned_s = 0.0

    @staticmethod
    def _keys(name: str) -> list[str]:
        return [f"zerogap:limit:{name}:rpm", f"zerogap:limit:{name}:tpm"]

    def _warn(self, exc: Exception) -> None:
        if time.monotonic() - self._warned_s > 10:
            self._warned_s = time.monotonic()
            log.warning("Redis rate limits unavailable (%s); counting in this process only", exc)

    async def admit(self, who: Principal, estimate: int) -> None:
        try:
            ok, kind, wait_s = await self._admit(keys=self._keys(who.name), args=[who.rpm or 0, who.tpm or 0, estimate])
        except (RedisError, OSError) as exc:
            self._warn(exc)
            self._local.take(who, estimate)
            return
        if not int(ok):
            rpm = kind == b"rpm"
            limit = who.rpm if rpm else who.tpm
            raise limited("requests" if rpm else "tokens", limit or 0, float(wait_s))

    def settle(self, who: Principal, estimate: int, actual: int) -> None:
        if who.tpm is None or estimate == actual:
            return
        task = asyncio.ensure_future(self._settle_now(who, estimate, actual))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _settle_now(self, who: Principal, estimate: int, actual: int) -> None:
        try:
            await self._settle(keys=self._keys(who.name)[1:], args=[who.tpm or 0, estimate - actual])
        except (RedisError, OSError) as exc:
            self._warn(exc)
            self._local.settle(who, estimate, actual)

    async def ping(self) -> bool:
        try:
            await self._redis.ping()
            return True
        except (RedisError, OSError) as exc:
            self._warn(exc)
            return False

    async def close(self) -> None:
        if self._pending:
            await asyncio.wait(self._pending, timeout=2)
        await self._redis.aclose()
