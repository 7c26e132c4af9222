"""Per-key requests/min and tokens/min limits: token buckets in memory (one process);
gateway/shared_limits.py keeps the same buckets in Redis for several processes.

rpm: a bucket of `rpm` requests, refilled at rpm/60 per second; each request takes one.
tpm: a bucket of `tpm` tokens, refilled at tpm/60 per second. A request is admitted while
the bucket is not empty; it then reserves an estimate (prompt bytes / 4 + max_tokens) and,
when it ends, the reservation is replaced by the real prompt + completion tokens of the
backend's usage. A key that overdraws waits until the bucket refills (Retry-After says how long).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Protocol

from gateway.auth import Principal
from gateway.errors import ApiError


@dataclass
class Bucket:
    capacity: float
    level: float
    updated_s: float = field(default_factory=time.monotonic)

    def refill(self, capacity: float, now_s: float) -> None:
        self.capacity = capacity
        self.level = min(capacity, self.level + (now_s - self.updated_s) * capacity / 60.0)
        self.updated_s = now_s

    def seconds_until(self, level: float) -> float:
        return max(0.0, (level - self.level) * 60.0 / self.capacity)


def estimate_tokens(body_bytes: int, max_tokens: int | None) -> int:
    return math.ceil(body_bytes / 4) + (max_tokens or 0)


def limited(kind: str, limit: int, retry_after_s: float) -> ApiError:
    seconds = max(1, math.ceil(retry_after_s))
    return ApiError(
        429,
        f"Rate limit reached: this key may use {limit} {kind} per minute. Retry after {seconds} s.",
        "rate_limit_error",
        code=f"rate_limit_{'requests' if kind == 'requests' else 'tokens'}",
        headers={"Retry-After": str(seconds)},
    )


class Limiter(Protocol):
    async def admit(self, who: Principal, estimate: int) -> None:
        """Take one request and reserve `estimate` tokens, or raise ApiError 429."""
        ...

    def settle(self, who: Principal, estimate: int, actual: int) -> None:
        """Replace a request's reservation by what it used (may finish in the background)."""
        ...

    async def close(self) -> None: ...


class RateLimiter:
    """The limits of one process, in memory."""

    def __init__(self) -> None:
        self._rpm: dict[str, Bucket] = {}
        self._tpm: dict[str, Bucket] = {}

    async def admit(self, who: Principal, estimate: int) -> None:
        self.take(who, estimate)

    async def close(self) -> None:
        return None

    def take(self, who: Principal, estimate: int) -> None:
        """Take one request and reserve `estimate` tokens, or raise ApiError 429."""
        now = time.monotonic()
        rpm = self._bucket(self._rpm, who.name, who.rpm, now)
        tpm = self._bucket(self._tpm, who.name, who.tpm, now)
        if rpm is not None and who.rpm is not None and rpm.level < 1:
            raise limited("requests", who.rpm, rpm.seconds_until(1))
        if tpm is not None and who.tpm is not None and tpm.level <= 0:
            raise limited("tokens", who.tpm, tpm.seconds_until(1e-9))
        if rpm is not None:
            rpm.level -= 1
        if tpm is not None:
            tpm.level -= estimate

    def settle(self, who: Principal, estimate: int, actual: int) -> None:
        """Replace a request's reservation by what it used."""
        bucket = self._tpm.get(who.name)
        if bucket is not None and who.tpm is not None:
            bucket.level = min(bucket.capacity, bucket.level + estimate - actual)

    @staticmethod
    def _bucket(buckets: dict[str, Bucket], name: str, limit: int | None, now: float) -> Bucket | None:
        if limit is None:
            buckets.pop(name, None)
            return None
        bucket = buckets.get(name)
        if bucket is None:
            bucket = buckets[name] = Bucket(float(limit), float(limit), now)
        else:
            bucket.refill(float(limit), now)
        return bucket
