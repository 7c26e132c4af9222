"""Concurrent streams of one key against a real gateway, for the max_concurrency tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import aiohttp

from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.keys.sqlite import KeyStore
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import auth, chat_body, error_of

SLOW = 0.5  # s between two tokens while the test holds its streams open; set to 0 to let them end
NUM_TOKENS = 40  # a held stream lasts 20 s at least: far longer than the refusals take


class Outcome:
    """One streamed request: its status, headers and body (read once the test lets streams end)."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


async def streams(urls: Sequence[str], key: str, up: UpstreamServer) -> list[Outcome]:
    """One stream per url, all at once, each on its own connection. Once every status is known,
    the upstream is sped up so that the admitted streams end; their bodies are read to the end."""
    num_known = 0
    all_known = asyncio.Event()

    async def one(session: aiohttp.ClientSession, url: str) -> Outcome:
        nonlocal num_known
        async with session.post(url + "/v1/chat/completions", json=chat_body(), headers=auth(key)) as resp:
            num_known += 1
            if num_known == len(urls):
                up.behavior.interval_s = 0
                all_known.set()
            await all_known.wait()
            return Outcome(resp.status, dict(resp.headers), await resp.read())

    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        return list(await asyncio.gather(*(one(session, url) for url in urls)))


def check_split(outcomes: list[Outcome], cap: int) -> None:
    ok = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status != 200]
    assert len(ok) == cap and all(o.body.endswith(b"data: [DONE]\n\n") for o in ok), [o.status for o in outcomes]
    for o in refused:
        assert o.status == 429 and o.headers["Retry-After"] == "1", (o.status, o.body)
        err = error_of(o.body)
        assert err["code"] == "concurrency_limit" and err["type"] == "rate_limit_error"
        assert f"at most {cap} requests in flight" in err["message"]


def new_key(config_dir: Path, name: str, cap: int) -> str:
    store = KeyStore(config_dir / "keys.db")
    try:
        return store.create(name, limits=KeyLimits(max_concurrency=cap))
    finally:
        store.close()


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    """Until check() is true (a connection refused counts as not yet: a restarted worker may still
    be starting); fails after timeout_s."""
    start = time.monotonic()
    while True:
        try:
            if await check():
                return
        except aiohttp.ClientConnectorError:
            pass
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s"
        await asyncio.sleep(0.1)


async def status_of(url: str, key: str) -> int:
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        async with s.post(url + "/v1/chat/completions", json=chat_body(), headers=auth(key)) as resp:
            return resp.status  # leaving closes the connection: a stream admitted here ends


async def status_is(url: str, key: str, status: int) -> bool:
    return await status_of(url, key) == status
