"""The rule every limiter applies, whatever keeps its counts: token buckets refilled at
capacity/60 per second, the 429 and 400 errors, and the clamp that keeps every figure exact."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from gateway.server.errors import ApiError
from gateway.tenants.auth import Principal

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
        f"times n and the number of prompts), more than this key's whole limit of {tpm} tokens per minute, "
        f"so it could never be admitted. Send a max_tokens (times n and the prompts) of at most {room}, "
        "or a shorter prompt.",
        param="max_tokens",
        code="request_exceeds_tpm",
    )


def head_rule(who: Principal, rpm: Bucket | None, num_held: int) -> None:
    """At the headers: raise the 429 that applies, if any (nothing is taken here)."""
    cap = cap_of(who.limits.max_concurrency)
    if cap is not None and num_held >= cap:
        raise concurrency_limited(cap)
    limit = cap_of(who.limits.rpm)
    if rpm is not None and limit is not None and rpm.level < 1:
        raise limited("requests", limit, rpm.seconds_until(1))


def check_fits(who: Principal, estimate: int, budget_tokens: int) -> int | None:
    """The key's tpm (None: no limit), after checking that the estimate fits in it at all (else 400)."""
    limit = cap_of(who.limits.tpm)
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
