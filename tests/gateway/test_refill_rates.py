"""How fast a key's buckets fill again: rpm requests and tpm tokens per minute, i.e. rpm/60 and
tpm/60 per second, in this process's memory and in Redis's Lua (the rule of gateway/tenants/limits/).
Retry-After is computed apart from the buckets, so these tests read the buckets themselves, on a
clock the test sets (memory) or on Redis's own clock read before and after the script (Redis)."""

from __future__ import annotations

import random

import pytest
import redis

from gateway.server.errors import ApiError
from gateway.tenants.auth import Principal
from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.limits.memory import MemoryLimiter
from gateway.tenants.limits.redis_lua import HEAD, TOKENS
from gateway.tenants.limits.rule import Bucket


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def monotonic(self) -> float:
        return self.now_s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr("gateway.tenants.limits.memory.time", clock)
    return clock


def _admitted(limiter: MemoryLimiter, who: Principal) -> int:
    """How many requests the key may send now, taking them."""
    num_admitted = 0
    while num_admitted < 10_000:
        try:
            limiter.take_head(who)
        except ApiError:
            return num_admitted
        num_admitted += 1
    raise AssertionError("the bucket never ran dry")


def test_rpm_refills_one_request_per_60_over_rpm_seconds(clock: Clock) -> None:
    limiter, who = MemoryLimiter(), Principal("tenant", limits=KeyLimits(rpm=60))
    assert _admitted(limiter, who) == 60  # a full bucket at first
    clock.now_s += 0.99
    assert _admitted(limiter, who) == 0  # just below one request's worth of refill
    clock.now_s += 0.01
    assert _admitted(limiter, who) == 1  # at it
    clock.now_s += 10.0
    assert _admitted(limiter, who) == 10
    clock.now_s += 3600.0
    assert _admitted(limiter, who) == 60  # never above the bucket's size


def test_tpm_refills_tpm_over_60_tokens_per_second(clock: Clock) -> None:
    limiter, who = MemoryLimiter(), Principal("tenant", limits=KeyLimits(tpm=6000))
    limiter.take_tokens(who, 6000, 100)  # the whole minute's tokens
    clock.now_s += 0.99  # 99 tokens back: 100 do not fit yet
    with pytest.raises(ApiError) as refused:
        limiter.take_tokens(who, 100, 100)
    assert refused.value.status == 429
    clock.now_s += 0.01  # 100 tokens back: exactly enough
    limiter.take_tokens(who, 100, 100)
    with pytest.raises(ApiError):
        limiter.take_tokens(who, 1, 1)


def _redis_time_s(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


def _level_after(
    client: redis.Redis, script: str, key: str, args: list[int], capacity: int, idle_s: float
) -> tuple[float, float, float]:
    """Empty the bucket `idle_s` ago (on Redis's clock), run the script, and return the level it
    stored with the least and most refill that the script's own clock reading allows."""
    before_s = _redis_time_s(client)
    client.hset(key, mapping={"level": "0", "ts": repr(before_s - idle_s)})
    client.register_script(script)(keys=[key, key + ":slots"], args=args)
    after_s = _redis_time_s(client)
    level = float(client.hget(key, "level") or b"nan")
    return level, idle_s * capacity / 60, (after_s - before_s + idle_s) * capacity / 60


def test_redis_refills_rpm_at_rpm_over_60_per_second(redis_server: str) -> None:
    client = redis.Redis.from_url(redis_server)
    try:
        level, least, most = _level_after(client, HEAD, "refill:rpm", [60, 0, 5, 0], capacity=60, idle_s=30.0)
    finally:
        client.close()
    assert least - 1 <= level <= most - 1, (level, least - 1, most - 1)  # 30 s at 1 request/s, less the one taken


def test_redis_refills_tpm_at_tpm_over_60_per_second(redis_server: str) -> None:
    client = redis.Redis.from_url(redis_server)
    try:
        level, least, most = _level_after(client, TOKENS, "refill:tpm", [6000, 1000], capacity=6000, idle_s=20.0)
    finally:
        client.close()
    assert least - 1000 <= level <= most - 1000, (level, least - 1000, most - 1000)  # 2,000 back, 1,000 taken


def _python_level(capacity: int, level: float, idle_s: float) -> float:
    bucket = Bucket(float(capacity), level, 0.0)
    bucket.refill(float(capacity), idle_s)
    return bucket.level


@pytest.mark.parametrize("kind", ["rpm", "tpm"])
def test_redis_lua_decides_as_the_python_rule(redis_server: str, kind: str) -> None:
    """One rule, two texts: on 300 random buckets the Lua admits and refuses exactly where the
    Python rule (gateway/tenants/limits/rule.py) does, and leaves the same level, up to the refill of the
    few ms between the test's clock readings (a decision that falls inside them may go either way)."""
    rng = random.Random(20261202)
    client = redis.Redis.from_url(redis_server)
    try:
        for case in range(300):
            capacity = rng.choice([1, 2, 60, 1000, 6000, 10**6])
            level = rng.choice([0.0, 0.5, 0.999, 1.0, rng.uniform(0, capacity), float(capacity)])
            idle_s = rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 90)])
            take = 1 if kind == "rpm" else rng.randint(1, capacity)
            key = f"diff:{kind}:{case}"
            before_s = _redis_time_s(client)
            client.hset(key, mapping={"level": repr(level), "ts": repr(before_s - idle_s)})
            if kind == "rpm":
                admitted = client.register_script(HEAD)(keys=[key, key + ":slots"], args=[capacity, 0, 5, 0])[0] == 1
            else:
                admitted = client.register_script(TOKENS)(keys=[key], args=[capacity, take])[0] == 1
            drift_s = _redis_time_s(client) - before_s
            low, high = _python_level(capacity, level, idle_s), _python_level(capacity, level, idle_s + drift_s)
            stored = float(client.hget(key, "level") or b"nan")
            where = (kind, capacity, level, idle_s, take, low, high, stored)
            if low >= take:
                assert admitted, where
            elif high < take:
                assert not admitted, where
            if admitted:
                assert low - take - 1e-6 <= stored <= high - take + 1e-6, where
            else:
                assert stored == level, where  # a refused request takes nothing
    finally:
        client.close()
