"""Failed-auth throttling per client address (gateway/tenants/auth_throttle.py): the count on a clock the
test moves, its bounded tables under a flood of addresses, and a real gateway over HTTP where the
other address is a second loopback address (127.0.0.2) the client binds to."""

from __future__ import annotations

import asyncio
import json
import time
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.tenants.auth_throttle import (
    MAX_ADDRESSES,
    MAX_ADDRESSES_PER_KEY,
    MAX_KNOWN_GOOD,
    AuthThrottle,
    address_group,
)
from gateway.tenants.keys.sqlite import KeyStore
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import UNIFIED, GatewayServer, auth, chat_body, error_of, get, make_config, metric

ADMIN = "admin-throttle-key-0123"
LIMIT = 20
WINDOW_S = 6.0  # the 20 failures of a test fit in it on a busy machine; the test waits it out once


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_the_limit_th_failure_blocks_for_the_window_then_counting_starts_again() -> None:
    clock = Clock()
    throttle = AuthThrottle(3, 10.0, clock)
    assert [throttle.failed("10.0.0.1") for _ in range(2)] == [False, False]
    assert throttle.blocked_for_s("10.0.0.1") == 0
    assert throttle.failed("10.0.0.1") is True  # the third
    assert throttle.blocked_for_s("10.0.0.1") == 10.0 and throttle.blocked_for_s("10.0.0.2") == 0
    clock.now_s += 9.5
    assert throttle.blocked_for_s("10.0.0.1") == pytest.approx(0.5)
    clock.now_s += 0.5
    assert throttle.blocked_for_s("10.0.0.1") == 0
    assert [throttle.failed("10.0.0.1") for _ in range(3)] == [False, False, True]


def test_failures_older_than_the_window_do_not_count() -> None:
    clock = Clock()
    throttle = AuthThrottle(3, 10.0, clock)
    throttle.failed("10.0.0.1")
    throttle.failed("10.0.0.1")
    clock.now_s += 10.0  # the window of the first failure is over: a new one starts
    assert [throttle.failed("10.0.0.1") for _ in range(3)] == [False, False, True]


def test_known_good_keys_and_off() -> None:
    throttle = AuthThrottle(3, 10.0, Clock())
    throttle.succeeded("10.0.0.1", "team-a")
    assert throttle.known_good("10.0.0.1", "team-a")
    assert not throttle.known_good("10.0.0.1", "team-b") and not throttle.known_good("10.0.0.2", "team-a")
    off = AuthThrottle(0, 10.0, Clock())
    assert [off.failed("10.0.0.1") for _ in range(100)] == [False] * 100 and off.num_addresses == 0
    off.succeeded("10.0.0.1", "team-a")
    assert off.num_known_good == 0


def test_ipv6_counts_by_its_64() -> None:
    assert address_group("2001:db8:1:2:aaaa::1") == address_group("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert address_group("2001:db8:1:3::1") != address_group("2001:db8:1:2::1")
    assert address_group("::ffff:10.1.2.3") == "10.1.2.3"
    assert address_group("10.1.2.3") == "10.1.2.3" and address_group(None) == "unknown"
    throttle = AuthThrottle(2, 10.0, Clock())
    throttle.failed("2001:db8::1")
    throttle.failed("2001:db8::2")
    assert throttle.blocked_for_s("2001:db8::ffff") > 0


def address(i: int, first: int = 10) -> str:
    return f"{first}.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"


def test_tables_stay_bounded_under_a_flood_of_addresses() -> None:
    """80,000 addresses fail (and a key of its own works from each) within one window: each table
    keeps 32,768 (its bound), the blocked address that keeps trying among them, in under 24 MiB."""
    clock = Clock()
    throttle = AuthThrottle(2, 10.0, clock)
    throttle.failed("192.0.2.1")
    throttle.failed("192.0.2.1")  # blocked
    tracemalloc.start()
    try:
        for i in range(80_000):
            throttle.failed(address(i))
            throttle.succeeded(address(i), f"team-{i}")
            if i % 500 == 0:
                assert throttle.blocked_for_s("192.0.2.1") > 0  # seen again: it stays in the table
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert throttle.num_addresses == MAX_ADDRESSES and throttle.num_known_good == MAX_KNOWN_GOOD
    assert throttle.blocked_for_s("192.0.2.1") > 0
    assert peak_bytes < 24 * 2**20, peak_bytes
    clock.now_s += 10.0  # all windows over: the next failure clears the table of them
    throttle.failed("10.9.9.9")
    assert throttle.num_addresses == 1


def test_a_client_churning_addresses_with_its_key_keeps_only_its_own_entries() -> None:
    """One key from 100,000 addresses (more than the whole table): that key keeps its latest
    MAX_ADDRESSES_PER_KEY; another key's address, seen before, is still known good, and passes
    its block."""
    throttle = AuthThrottle(2, 10.0, Clock())
    throttle.succeeded("192.0.2.1", "office")
    for i in range(100_000):
        throttle.succeeded(address(i), "churner")
    assert throttle.known_good("192.0.2.1", "office")
    assert throttle.num_known_good == 1 + MAX_ADDRESSES_PER_KEY
    assert throttle.known_good(address(99_999), "churner") and not throttle.known_good(address(0), "churner")


def test_a_key_keeps_the_addresses_it_uses_most_recently() -> None:
    throttle = AuthThrottle(2, 10.0, Clock(), max_addresses_per_key=3)
    for host in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        throttle.succeeded(host, "team")
    throttle.succeeded("10.0.0.1", "team")  # used again: the least recently used is now .2
    throttle.succeeded("10.0.0.4", "team")
    assert [throttle.known_good(f"10.0.0.{i}", "team") for i in range(1, 5)] == [True, False, True, True]


def test_a_client_churning_keys_cannot_flush_another_keys_entries() -> None:
    """A client holding more keys than the table holds pairs uses each from its one address: the
    table stays at its bound, and the keys seen before it (one address each, as many as its) keep
    theirs."""
    throttle = AuthThrottle(2, 10.0, Clock(), max_known_good=1000)
    throttle.succeeded("192.0.2.1", "office")
    throttle.succeeded("192.0.2.2", "shop")
    for i in range(5000):
        throttle.succeeded("198.51.100.7", f"stolen-{i}")
    assert throttle.num_known_good == 1000
    assert throttle.known_good("192.0.2.1", "office") and throttle.known_good("192.0.2.2", "shop")


def test_past_the_total_the_key_with_the_most_addresses_gives_one_up() -> None:
    throttle = AuthThrottle(2, 10.0, Clock(), max_known_good=6, max_addresses_per_key=100)
    throttle.succeeded("192.0.2.1", "office")
    for i in range(10):  # the churner grows to 5, then each new address pushes out its own oldest
        throttle.succeeded(address(i), "churner")
    assert throttle.num_known_good == 6 and throttle.known_good("192.0.2.1", "office")
    assert [throttle.known_good(address(i), "churner") for i in range(10)] == [False] * 5 + [True] * 5


# --- a real gateway ------------------------------------------------------------------------------


async def send(url: str, headers: dict[str, str], source: str = "127.0.0.1", body: Any = None) -> Any:
    """(status, headers, body) of a request sent from the loopback address `source`."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0), force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=20)) as s:
        method = "POST" if body is not None else "GET"
        async with s.request(method, url, json=body, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.read()


def gateway_config(tmp_path: Path, upstream_url: str, **settings: Any) -> Any:
    gateway = {"auth_failures_limit": LIMIT, "auth_failure_window_s": WINDOW_S, **settings}
    return make_config(tmp_path, [("b0", upstream_url, "m")], gateway=gateway, admin_key=ADMIN)


BAD = [  # 20 failures of every kind: (headers, reason)
    *[({}, "missing")] * 3,
    *[({"Authorization": "Basic abc"}, "malformed")] * 3,
    *[({"Authorization": "Bearer"}, "malformed")] * 2,
    *[(auth(f"zg-guess-{i}"), "invalid") for i in range(10)],
]


async def test_failures_from_one_address_get_429_and_others_are_unaffected(tmp_path) -> None:
    with UpstreamServer(model="m") as up, GatewayServer(gateway_config(tmp_path, up.url)) as gs:
        store = KeyStore(gs.config.resolve_path(gs.config.gateway.key_store))
        used, fresh = store.create("used"), store.create("fresh")
        expired = store.create("old", expires_at=time.time() - 1)
        store.close()
        chat = gs.url + "/v1/chat/completions"
        assert (await send(chat, auth(used), body=chat_body(stream=False)))[0] == 200  # known from this address
        bad = [*BAD, (auth(expired), "expired"), (auth(expired), "expired")]
        assert len(bad) == LIMIT
        start_s = time.monotonic()
        for headers, _ in bad:
            status, _, raw = await send(chat, headers, body=chat_body(stream=False))
            assert status == 401 and error_of(raw)["code"] == "invalid_api_key"
        assert time.monotonic() - start_s < WINDOW_S  # else the test, not the gateway, is wrong

        throttled = [
            await send(chat, auth("zg-guess-21"), body=chat_body(stream=False)),  # the 21st failure
            await send(chat, auth(fresh), body=chat_body(stream=False)),  # valid, never used from here
            await send(chat, auth(UNIFIED), body=chat_body(stream=False)),  # the same: no oracle for a guess
            await send(gs.url + "/v1/models", {}),
            await send(gs.url + "/admin/keys", auth(ADMIN)),
        ]
        for status, headers, raw in throttled:
            err = error_of(raw)
            assert status == 429 and err["code"] == "too_many_auth_failures" and err["type"] == "rate_limit_error"
            assert "auth_failures_limit" in err["message"]
            assert 1 <= int(headers["Retry-After"]) <= WINDOW_S
        assert len({raw for _, _, raw in throttled[:3]}) == 1  # right or wrong key: the same answer
        assert (await send(chat, auth(used), body=chat_body(stream=False)))[0] == 200  # known here: served

        other = "127.0.0.2"
        assert (await send(chat, auth("zg-guess-x"), other, chat_body(stream=False)))[0] == 401
        assert (await send(chat, auth(fresh), other, chat_body(stream=False)))[0] == 200

        text = (await get(gs.url + "/metrics"))[1]
        for reason in ("missing", "malformed", "invalid", "expired"):
            expected = sum(1 for _, r in bad if r == reason) + (reason == "invalid")  # + the other address's
            assert metric(text, "zerogap_auth_failures_total", reason=reason) == expected, reason
        assert metric(text, "zerogap_auth_throttled_total") == len(throttled)
        assert b"127.0.0" not in text and b"zg-guess" not in text and fresh.encode() not in text

        await asyncio.sleep(int(throttled[0][1]["Retry-After"]))  # what the gateway said to wait
        assert (await send(chat, auth("zg-guess-22"), body=chat_body(stream=False)))[0] == 401  # counted afresh
        assert (await send(chat, auth(fresh), body=chat_body(stream=False)))[0] == 200


async def test_admin_key_guesses_are_throttled(tmp_path) -> None:
    """The admin API's key counts against the same per-address limit; the admin key, once it has
    worked from an address, still works there while that address is blocked."""
    with UpstreamServer(model="m") as up, GatewayServer(gateway_config(tmp_path, up.url)) as gs:
        keys_url = gs.url + "/admin/keys"
        assert (await send(keys_url, auth(ADMIN)))[0] == 200
        statuses = [(await send(keys_url, auth(f"admin-guess-{i:08d}")))[0] for i in range(LIMIT + 1)]
        assert statuses == [401] * LIMIT + [429]
        status, _, raw = await send(keys_url, auth(ADMIN))
        assert status == 200 and json.loads(raw)["object"] == "list"
        assert (await send(keys_url, auth(ADMIN), "127.0.0.2"))[0] == 200
        text = (await get(gs.url + "/metrics"))[1]
        assert metric(text, "zerogap_auth_failures_total", reason="invalid") == LIMIT
        assert metric(text, "zerogap_auth_throttled_total") == 1


async def test_throttling_off(tmp_path) -> None:
    with UpstreamServer(model="m") as up, GatewayServer(gateway_config(tmp_path, up.url, auth_failures_limit=0)) as gs:
        statuses = [(await send(gs.url + "/v1/models", auth(f"zg-{i}")))[0] for i in range(LIMIT + 5)]
        assert statuses == [401] * (LIMIT + 5)
        assert gs.gw.auth.throttle.num_addresses == 0
