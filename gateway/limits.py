"""Per-key limits: requests/min (rpm), tokens/min (tpm) and requests in flight (max_concurrency).

One rule, three places that keep the counts: this process's memory (RateLimiter, here), the
workers' shared SQLite file (gateway/file_limits.py) and Redis (gateway/shared_limits.py). The
Python rule is written once, below (head_rule, tpm_rule); Redis runs the same rule in Lua.

At the headers, before the body is read (`admit`): one request from the rpm bucket (rpm
requests, refilled at rpm/60 per second) and one concurrency slot, both or neither. A slot is
held until the request really ends (`release`, in a finally); in the shared file and Redis it is
a lease that its process renews, so that a process that dies cannot hold it for longer than
[gateway].concurrency_lease_s.

After the body is parsed (`reserve`): the tpm bucket (tpm tokens, refilled at tpm/60 per
second) must hold the request's whole estimate (prompt bytes / 4 + its completion budget); the
estimate is then taken, and when the request ends it is replaced by what the request used
(`settle`). An estimate larger than the whole bucket could never be admitted: 400 at once,
saying which max_tokens would fit, rather than a 429 that no wait would clear.

Every figure is clamped to MAX_COUNT before it meets a float, so no integer a client, a key or
a backend brings can overflow a bucket.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

from gateway.auth import Principal
from gateway.errors import ApiError

MAX_COUNT = 2**53  # exact in a float and in a Lua double; larger limits and estimates are clamped to it
SLOT_RETRY_AFTER_S = 1  # when a slot frees is unknown: ask the client to try again soon


def clamp(n: int) -> int:
    """n within [0, MAX_COUNT]."""
    return max(0, min(n, MAX_COUNT))


def cap_of(limit: int | None) -> int | None:
    """A key's limit as the buckets use it: None (no limit) or an integer in [1, MAX_COUNT]."""
    return None if limit is None else max(1, clamp(limit))


def estimate_tokens(body_bytes: int, budget_tokens: int) -> int:
    """What a request may cost before it runs: its prompt (about 4 bytes a token) and the
    completion tokens it may ask for (Call.budget_tokens: (max_tokens or the default) x n)."""
    return clamp(math.ceil(body_bytes / 4) + max(0, budget_tokens))


@dataclass
class Bucket:
    capacity: float
    level: float
    updated_s: float = field(default_factory=time.monotonic)

    def refill(self, capacity: float, now_s: float) -> None:
        self.capacity = capacity
        self.level = min(capacity, self.level + max(0.0, now_s - self.updated_s) * capacity / 60.0)
        self.updated_s = now_s

    def seconds_until(self, level: float) -> float:
        return max(0.0, (level - self.level) * 60.0 / self.capacity)


@dataclass
class Slot:
    """One request's place among its key's max_concurrency. `local`: counted in this process's
    memory (no shared store, or the shared one was down when it was taken)."""

    key: str
    lease_id: str
    local: bool = False
    released: bool = False


_lease_numbers = itertools.count()


def new_slot(key: str, prefix: str, local: bool = False) -> Slot:
    return Slot(key, f"{prefix}:{next(_lease_numbers)}", local)


def limited(kind: str, limit: int, retry_after_s: float) -> ApiError:
    seconds = max(1, math.ceil(min(retry_after_s, 86_400.0)))
    return ApiError(
        429,
        f"Rate limit reached: this key may use {limit} {kind} per minute. Retry after {seconds} s.",
        "rate_limit_error",
        code=f"rate_limit_{'requests' if kind == 'requests' else 'tokens'}",
        headers={"Retry-After": str(seconds)},
    )


def concurrency_limited(cap: int) -> ApiError:
    return ApiError(
        429,
        f"Concurrency limit reached: this key may have at most {cap} requests in flight at once "
        f"(max_concurrency), and {cap} are running. Wait for one of them to finish before sending "
        f"another, or ask for a higher max_concurrency.",
        "rate_limit_error",
        code="concurrency_limit",
        headers={"Retry-After": str(SLOT_RETRY_AFTER_S)},
    )


def exceeds_tpm(tpm: int, estimate: int, budget_tokens: int) -> ApiError:
    room = max(0, tpm - (estimate - budget_tokens))
    return ApiError(
        400,
        f"This request may use up to {estimate} tokens (its prompt and a completion budget of "
        f"{budget_tokens} tokens: max_tokens, or the gateway's default_max_tokens when it names none, "
        f"times n), more than this key's whole limit of {tpm} tokens per minute, so it could never be "
        f"admitted. Send a max_tokens (times n) of at most {room}, or a shorter prompt.",
        param="max_tokens",
        code="request_exceeds_tpm",
    )


def head_rule(who: Principal, rpm: Bucket | None, num_held: int) -> None:
    """At the headers: raise the 429 that applies, if any (nothing is taken here)."""
    cap = cap_of(who.max_concurrency)
    if cap is not None and num_held >= cap:
        raise concurrency_limited(cap)
    limit = cap_of(who.rpm)
    if rpm is not None and limit is not None and rpm.level < 1:
        raise limited("requests", limit, rpm.seconds_until(1))


def check_fits(who: Principal, estimate: int, budget_tokens: int) -> int | None:
    """The key's tpm (None: no limit), after checking that the estimate fits in it at all (else 400)."""
    limit = cap_of(who.tpm)
    if limit is not None and estimate > limit:
        raise exceeds_tpm(limit, estimate, budget_tokens)
    return limit


def tpm_rule(who: Principal, tpm: Bucket, estimate: int, budget_tokens: int) -> None:
    """After the body: raise the 400 or 429 that applies, if any (nothing is taken here)."""
    limit = check_fits(who, estimate, budget_tokens)
    if limit is not None and tpm.level < estimate:
        raise limited("tokens", limit, tpm.seconds_until(estimate))


def settled_level(bucket: Bucket, estimate: int, actual: int) -> float:
    """The bucket's level once a reservation of `estimate` is replaced by `actual` tokens used."""
    return min(bucket.capacity, bucket.level + clamp(estimate) - clamp(actual))


class Limiter(Protocol):
    async def admit(self, who: Principal) -> Slot | None:
        """At the headers: take one request (rpm) and a concurrency slot (when the key has a
        max_concurrency: returned, to be released), or raise ApiError 429 (or 503, Redis down
        with on_redis_down = "refuse")."""
        ...

    async def reserve(self, who: Principal, estimate: int, budget_tokens: int) -> None:
        """After the body: reserve `estimate` tokens of the key's tpm, or raise ApiError 429/400."""
        ...

    def settle(self, who: Principal, estimate: int, actual: int) -> None:
        """Replace a request's reservation by what it used (may finish in the background)."""
        ...

    def release(self, slot: Slot) -> None:
        """The request of this slot has ended (a second call does nothing)."""
        ...

    async def close(self) -> None: ...


def limited_at_head(who: Principal) -> bool:
    return who.rpm is not None or who.max_concurrency is not None


class RateLimiter:
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
        rpm = _bucket(self._rpm, who.name, who.rpm, now)
        capped = who.max_concurrency is not None
        head_rule(who, rpm, self._held.get(who.name, 0) if capped else 0)
        if rpm is not None:
            rpm.level -= 1
        if not capped:
            return None
        self._held[who.name] = self._held.get(who.name, 0) + 1
        return new_slot(who.name, "mem", local=True)

    def take_tokens(self, who: Principal, estimate: int, budget_tokens: int) -> None:
        tpm = _bucket(self._tpm, who.name, who.tpm, time.monotonic())
        if tpm is None:
            return
        estimate = clamp(estimate)
        tpm_rule(who, tpm, estimate, budget_tokens)
        tpm.level -= estimate

    def settle(self, who: Principal, estimate: int, actual: int) -> None:
        bucket = self._tpm.get(who.name)
        if bucket is not None and who.tpm is not None:
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
