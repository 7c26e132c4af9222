"""Bounded background load on the live gateway: streams through the unified key and a named
key, a rate-limited key, and clients that hang up mid-stream. Stops on request or at a deadline."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from tests.deploy.stack import MODEL, UNIFIED_KEY, Stack


@dataclass
class Load:
    stack: Stack
    max_seconds: float = 120.0
    stop: threading.Event = field(default_factory=threading.Event)
    statuses: Counter[str] = field(default_factory=Counter)
    thread: threading.Thread | None = None

    def start(self) -> Load:
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="deploy-load", daemon=True)
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)

    async def _main(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            workers = [self._streams(session, UNIFIED_KEY, deadline, hang_up=False) for _ in range(2)]
            workers += [self._streams(session, self.stack.keys["team-a"], deadline, hang_up=False)]
            workers += [self._streams(session, self.stack.keys["team-a"], deadline, hang_up=True)]
            workers += [self._paced(session, self.stack.keys["limited"], deadline, every_s=0.5)]
            await asyncio.gather(*workers)

    def _running(self, deadline: float) -> bool:
        return not self.stop.is_set() and time.monotonic() < deadline

    async def _streams(self, session: aiohttp.ClientSession, key: str, deadline: float, hang_up: bool) -> None:
        while self._running(deadline):
            await self._one(session, key, hang_up)
            if hang_up:
                await asyncio.sleep(0.3)

    async def _paced(self, session: aiohttp.ClientSession, key: str, deadline: float, every_s: float) -> None:
        while self._running(deadline):
            await self._one(session, key, hang_up=False)
            await asyncio.sleep(every_s)

    async def _one(self, session: aiohttp.ClientSession, key: str, hang_up: bool) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me about the token interval."}],
            "max_tokens": 24,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        headers = {"Authorization": f"Bearer {key}"}
        try:
            async with session.post(
                f"{self.stack.gateway_url}/v1/chat/completions", json=body, headers=headers
            ) as resp:
                self.statuses[str(resp.status)] += 1
                chunks = 0
                async for _line in resp.content:
                    chunks += 1
                    if hang_up and chunks >= 3:
                        self.statuses["hung up"] += 1
                        return  # leaving the block closes the connection mid-stream
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.statuses[type(exc).__name__] += 1
            await asyncio.sleep(0.2)
