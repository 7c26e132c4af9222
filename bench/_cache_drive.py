"""bench/cache_routing.py's load: closed-loop streams of chat requests, each user's requests in
turn to the gateway URLs it is given (two processes: fed alternately), TTFT and tokens counted in
a measured window."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from loadtest import Workload

KEY = "bench-unified-key"
MODEL = "sim-model"
TOKEN = re.compile(rb'"content":"[^"]')  # a chunk with text (the chat stream opens with an empty one)


@dataclass
class Window:
    start_s: float
    end_s: float
    ttft_s: list[float] = field(default_factory=list)
    num_tokens: int = 0
    num_errors: int = 0

    def inside(self, t: float) -> bool:
        return self.start_s <= t < self.end_s


async def one_request(session: aiohttp.ClientSession, url: str, body: bytes, w: Window) -> int:
    """Stream one answer; its completion tokens (from usage), counted when it ends in the window."""
    start = time.monotonic()
    first, tail = True, b""
    async with session.post(url, data=body) as resp:
        if resp.status != 200:
            w.num_errors += 1
            await resp.read()
            return 0
        async for data in resp.content.iter_any():
            if first and TOKEN.search(data):
                first = False
                if w.inside(start):
                    w.ttft_s.append(time.monotonic() - start)
            tail = (tail + data)[-4096:]
    tokens = _completion_tokens(tail)
    if w.inside(time.monotonic()):
        w.num_tokens += tokens
    return tokens


def _completion_tokens(tail: bytes) -> int:
    for line in reversed(tail.split(b"\n")):
        if line.startswith(b"data: {") and b'"usage"' in line:
            usage = json.loads(line[6:]).get("usage") or {}
            return int(usage.get("completion_tokens") or 0)
    return 0


async def stream_loop(
    session: aiohttp.ClientSession, urls: list[str], workload: Workload, w: Window, delay_s: float, first: int
) -> None:
    """One user, request after request; with several gateway URLs, each request goes to the next."""
    user = workload.session()
    turn = itertools.cycle(urls[first % len(urls) :] + urls[: first % len(urls)])
    await asyncio.sleep(delay_s)
    while time.monotonic() < w.end_s:
        try:
            user.answered(await one_request(session, next(turn), user.body(MODEL), w))
        except (aiohttp.ClientError, OSError):
            w.num_errors += 1
            await asyncio.sleep(0.05)


async def drive(
    urls: list[str], workload: Workload, args: argparse.Namespace, warmup_s: float, measure_s: float,
    at_start: Callable[[], Any],
) -> Window:  # fmt: skip
    """args.streams streams for warmup_s, then measure_s measured (at_start runs in between)."""
    now = time.monotonic()
    w = Window(now + warmup_s, now + warmup_s + measure_s)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=warmup_s + measure_s + 60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=headers, timeout=timeout) as s:
        tasks = [
            asyncio.ensure_future(stream_loop(s, urls, workload, w, i * args.spread_s / args.streams, i))
            for i in range(args.streams)
        ]
        await asyncio.sleep(max(0.0, w.start_s - time.monotonic()))
        await asyncio.to_thread(at_start)
        await asyncio.wait(tasks, timeout=warmup_s + measure_s + 60)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return w
