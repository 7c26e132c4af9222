"""gateway/tenants/limits/'s rule (rpm, tpm, max_concurrency) as each of its three keepers applies it:
this process's memory, the workers' shared SQLite file, and a real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gateway.server.errors import ApiError
from gateway.tenants.auth import Principal
from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.limits.base import Limiter
from gateway.tenants.limits.memory import MemoryLimiter
from gateway.tenants.limits.redis import RedisLimiter
from gateway.tenants.limits.rule import MAX_COUNT, estimate_tokens
from gateway.tenants.limits.sqlite import SqliteLimiter

# Slots held in these tests are never meant to lapse: a lease far longer than any starved event
# loop (0.3 s lapsed under 4 pytest workers in CI and freed a slot the test still held).
HELD_LEASE_S = 60.0
LEASE_S = 1.0  # the one test of a lapse: short, and still long beside a renewal every lease_s / 3
Factory = Callable[..., Limiter]


@pytest.fixture(params=["memory", "file", "redis"])
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Factory]:
    """Makes limiters that share their counts (as the workers or pods of one gateway do)."""
    made: list[Limiter] = []

    def new(lease_s: float = HELD_LEASE_S) -> Limiter:
        if request.param == "memory":
            limiter: Limiter = made[0] if made else MemoryLimiter()  # one process: one memory
        elif request.param == "file":
            limiter = SqliteLimiter(tmp_path / "limits.db", lease_s)
        else:
            limiter = RedisLimiter(request.getfixturevalue("redis_server"), lease_s)
        made.append(limiter)
        return limiter

    yield new
    for limiter in {id(x): x for x in made}.values():
        await limiter.close()


def key(**limits: int) -> Principal:
    """A key with a fresh name (the Redis server is shared by the module's tests)."""
    return Principal(f"k{uuid.uuid4().hex[:8]}", limits=KeyLimits(**limits))


async def settled(limiter: Limiter) -> None:
    if isinstance(limiter, RedisLimiter):
        await limiter.idle()


async def refusal(check: object) -> ApiError:
    with pytest.raises(ApiError) as exc:
        await check  # type: ignore[misc]
    return exc.value


async def test_rpm_and_tpm_buckets(make: Factory) -> None:
    limiter = make()
    who = key(rpm=1)
    assert await limiter.admit(who) is None  # no max_concurrency: no slot
    err = await refusal(limiter.admit(who))
    assert err.status == 429 and err.code == "rate_limit_requests" and err.headers["Retry-After"] in ("60", "59")

    other = key(tpm=100)
    await limiter.reserve(other, 30, 0)
    limiter.settle(other, 30, 130)  # used more than reserved: overdrawn by 30
    await settled(limiter)
    err = await refusal(limiter.reserve(other, 1, 0))  # needs 31 tokens of refill: 18.6 s
    assert err.code == "rate_limit_tokens" and 17 <= int(err.headers["Retry-After"]) <= 19, err.headers


async def test_the_whole_estimate_must_be_in_the_bucket(make: Factory) -> None:
    limiter = make()
    who = key(tpm=1000)
    await limiter.reserve(who, 600, 500)
    err = await refusal(limiter.reserve(who, 600, 500))  # 400 left: a bucket "above 0" is not enough
    assert err.status == 429 and err.code == "rate_limit_tokens"
    await limiter.reserve(who, 400, 300)
    err = await refusal(limiter.reserve(who, 1, 0))
    assert err.code == "rate_limit_tokens"


async def test_an_estimate_above_the_whole_tpm_is_a_400(make: Factory) -> None:
    limiter = make()
    who = key(tpm=1000)
    err = await refusal(limiter.reserve(who, 1001, 1000))  # prompt 1 + budget 1000
    assert err.status == 400 and err.code == "request_exceeds_tpm" and err.param == "max_tokens"
    assert "1000 tokens per minute" in err.message and "at most 999" in err.message, err.message
    await limiter.reserve(who, 1000, 999)  # the whole bucket fits, and is untouched by the refusal


async def test_concurrency_slots(make: Factory) -> None:
    a, b = make(), make()  # two processes of one gateway
    who = key(max_concurrency=2)
    first, second = await a.admit(who), await b.admit(who)
    assert first is not None and second is not None
    err = await refusal(a.admit(who))
    assert err.status == 429 and err.code == "concurrency_limit" and err.headers["Retry-After"] == "1"
    assert "at most 2 requests in flight" in err.message and "max_concurrency" in err.message
    a.release(first)
    a.release(first)  # a second release of the same slot frees nothing more
    await settled(a)
    third = await b.admit(who)
    assert third is not None
    err = await refusal(a.admit(who))
    assert err.code == "concurrency_limit"
    b.release(second)
    b.release(third)
    await settled(b)
    assert all([await a.admit(who), await b.admit(who)])


async def test_a_refused_request_takes_neither_a_token_nor_a_slot(make: Factory) -> None:
    limiter = make()
    capped = key(rpm=2, max_concurrency=1)
    slot = await limiter.admit(capped)
    assert slot is not None
    assert (await refusal(limiter.admit(capped))).code == "concurrency_limit"  # takes no rpm token
    limiter.release(slot)
    await settled(limiter)
    slot = await limiter.admit(capped)  # the second rpm token is still there
    assert slot is not None
    limiter.release(slot)
    await settled(limiter)
    assert (await refusal(limiter.admit(capped))).code == "rate_limit_requests"


async def test_huge_integers_neither_overflow_nor_raise(make: Factory) -> None:
    limiter = make()
    huge = 10**400
    who = key(rpm=huge, tpm=huge, max_concurrency=huge)
    slot = await limiter.admit(who)
    assert slot is not None
    await limiter.reserve(who, huge, huge)  # clamped to MAX_COUNT on both sides: it fits
    limiter.settle(who, huge, 10 * huge)
    limiter.settle(who, 0, huge)
    limiter.release(slot)
    await settled(limiter)
    small = key(tpm=1000)
    err = await refusal(limiter.reserve(small, huge, huge))
    assert err.status == 400 and err.code == "request_exceeds_tpm"
    limiter.settle(small, huge, -huge)  # a bogus figure gives back no more than the bucket holds
    await settled(limiter)
    await limiter.reserve(small, 1000, 0)
    assert estimate_tokens(10**6, huge) == MAX_COUNT


async def renewals(limiter: Limiter, count: int) -> None:
    """Returns once the limiter has renewed its leases `count` more times (an event, not a clock)."""
    leases = limiter.leases  # type: ignore[attr-defined]
    renew, done, seen = leases._renew, asyncio.Event(), [0]

    async def counted(live: dict[str, str]) -> None:
        await renew(live)
        seen[0] += 1
        if seen[0] >= count:
            done.set()

    leases._renew = counted
    await asyncio.wait_for(done.wait(), 30 * LEASE_S)


@pytest.mark.parametrize("make", ["file", "redis"], indirect=True)  # one process's memory has no leases
async def test_a_lease_its_process_stops_renewing_lapses(make: Factory) -> None:
    holder, other = make(LEASE_S), make(LEASE_S)
    who = key(max_concurrency=1)
    assert await holder.admit(who) is not None
    await renewals(holder, 4)  # lease_s / 3 apart: past the first expiry, renewed each time: still held
    assert (await refusal(other.admit(who))).code == "concurrency_limit"
    await holder.leases.close()  # type: ignore[attr-defined]  # the holder stops renewing, as if killed
    deadline = time.monotonic() + 10 * LEASE_S + 5
    while True:
        try:
            slot = await other.admit(who)
        except ApiError:
            assert time.monotonic() < deadline, "the lapsed lease was never freed"
            await asyncio.sleep(LEASE_S / 5)
            continue
        assert slot is not None
        break


@pytest.mark.parametrize("make", ["file", "redis"], indirect=True)
@pytest.mark.parametrize("taken", [False, True], ids=["not_yet_dropped", "taken_by_another"])
async def test_a_late_renewal_does_not_bring_a_lapsed_lease_back(make: Factory, taken: bool) -> None:
    """A lease renewed after it expired (its process's event loop starved past the lease) has lapsed:
    its slot is free for another request whether or not the store dropped its row yet, and the late
    renewal brings neither it back nor a second slot for the key."""
    lease_s = 0.2
    holder, other = make(lease_s), make(HELD_LEASE_S)
    who = key(max_concurrency=1)
    held = await holder.admit(who)
    assert held is not None
    await holder.leases.close()  # type: ignore[attr-defined]  # renewed only below, by hand
    await asyncio.sleep(2 * lease_s)  # lapsed: its expiry was set at admission, lease_s on
    slot = await other.admit(who) if taken else None
    await holder.leases._renew(dict(holder.leases.live))  # type: ignore[attr-defined]  # too late
    if taken:
        assert (await refusal(other.admit(who))).code == "concurrency_limit"  # one slot: the other's
        assert slot is not None
        other.release(slot)
        await settled(other)
    slot = await other.admit(who)  # free: the lapsed lease did not come back
    assert slot is not None
