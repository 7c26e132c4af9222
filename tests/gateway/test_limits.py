"""gateway/limits.py: per-key token buckets (rpm, tpm) in one process."""

from __future__ import annotations

import pytest

from gateway.auth import Principal
from gateway.errors import ApiError
from gateway.limits import RateLimiter


async def test_token_buckets() -> None:
    limiter = RateLimiter()
    who = Principal("k", rpm=1, tpm=100)
    await limiter.admit(who, 30)
    with pytest.raises(ApiError) as exc:
        await limiter.admit(who, 30)
    assert exc.value.status == 429 and exc.value.headers["Retry-After"] in ("60", "59")
    other = Principal("t", tpm=100)
    await limiter.admit(other, 30)
    limiter.settle(other, 30, 130)  # used more than reserved: overdrawn by 30
    with pytest.raises(ApiError) as exc:
        await limiter.admit(other, 1)
    assert exc.value.code == "rate_limit_tokens" and 17 <= int(exc.value.headers["Retry-After"]) <= 19
