"""The soak's clients: a loop per client over a weighted mix of requests, each checked for what a
client must see, and tallied per report interval."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

KEY = "soak-unified-key"
MODEL = "soak"
REQUEST_TIMEOUT_S = 30.0
DONE = b"data: [DONE]"

# kind -> weight (percent)
MIX = {"stream": 70, "whole": 10, "cancel": 8, "upstream_500": 4, "upstream_reset": 3, "bad": 5}


@dataclass
class Tally:
    start_s: float
    span_s: float = 0.0
    num_requests: int = 0
    num_good_failed: int = 0
    num_bad_5xx: int = 0
    num_hung: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    ttft_s: list[float] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    def count(self, kind: str, ok: bool, what: str = "") -> None:
        self.num_requests += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        if not ok:
            if kind == "bad":
                self.num_bad_5xx += 1
            else:
                self.num_good_failed += 1
            if len(self.examples) < 5:
                self.examples.append(f"{kind}: {what[:200]}")

    def ttft_ms(self, q: float) -> float:
        if not self.ttft_s:
            return float("nan")
        ordered = sorted(self.ttft_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def merge(self, other: Tally) -> None:
        self.num_requests += other.num_requests
        self.num_good_failed += other.num_good_failed
        self.num_bad_5xx += other.num_bad_5xx
        self.num_hung += other.num_hung
        for k, v in other.by_kind.items():
            self.by_kind[k] = self.by_kind.get(k, 0) + v
        self.ttft_s += other.ttft_s
        self.examples += other.examples[: max(0, 5 - len(self.examples))]

    def summary(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.by_kind.items()))


def chat(stream: bool, num_tokens: int, **extra: object) -> dict[str, object]:
    messages = [{"role": "user", "content": "soak the gateway for a while"}]
    body = {"model": MODEL, "messages": messages, "stream": stream, "max_tokens": num_tokens, "ignore_eos": True}
    return {**body, **extra}


HEADERS = {"Authorization": f"Bearer {KEY}"}
BAD = [  # (body bytes, headers): each must get a 4xx
    (b"{not json", {**HEADERS, "Content-Type": "application/json"}),
    (json.dumps({"messages": []}).encode(), {**HEADERS, "Content-Type": "application/json"}),
    (json.dumps({"model": "no-such-model", "messages": []}).encode(), {**HEADERS, "Content-Type": "application/json"}),
    (json.dumps(chat(True, 4)).encode(), {"Authorization": "Bearer wrong", "Content-Type": "application/json"}),
    (json.dumps(chat(True, 4)).encode(), {**HEADERS, "Content-Type": "text/plain"}),
]


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str, rng: random.Random) -> None:
        self.session = session
        self.url = url + "/v1/chat/completions"
        self.rng = rng

    async def stream(self, tally: Tally) -> None:
        t0_s = time.monotonic()
        async with self.session.post(self.url, json=chat(True, self.rng.randint(8, 32)), headers=HEADERS) as resp:
            first_s = None
            body = b""
            async for chunk in resp.content.iter_any():
                if first_s is None and b'"content":" t' in chunk:
                    first_s = time.monotonic()
                body += chunk
        ok = resp.status == 200 and body.rstrip().endswith(DONE) and b'"error"' not in body
        tally.count("stream", ok, f"{resp.status} {body[-200:]!r}")
        if ok and first_s is not None:
            tally.ttft_s.append(first_s - t0_s)

    async def whole(self, tally: Tally) -> None:
        async with self.session.post(self.url, json=chat(False, self.rng.randint(8, 32)), headers=HEADERS) as resp:
            body = await resp.read()
        tally.count("whole", resp.status == 200 and b'"choices"' in body, f"{resp.status} {body[:200]!r}")

    async def cancel(self, tally: Tally) -> None:
        async with self.session.post(self.url, json=chat(True, 64), headers=HEADERS) as resp:
            await resp.content.readany()
            await asyncio.sleep(self.rng.uniform(0, 0.3))
            resp.close()  # hang up mid-stream
        tally.count("cancel", resp.status == 200, str(resp.status))

    async def upstream_error(self, tally: Tally, kind: str) -> None:
        ask = {"fail_status": 500} if kind == "upstream_500" else {"close_after_tokens": 2}
        async with self.session.post(self.url, json=chat(True, 16, fixture=ask), headers=HEADERS) as resp:
            body = await resp.read()
        if kind == "upstream_500":  # retried, then a clean 502 with the error body
            ok = resp.status == 502 and body.startswith(b'{"error"')
        else:  # continued on another backend (whole: t0 .. t15), or, where none could, the error event
            whole = all(b'"content":" t%d"' % i in body for i in range(16)) and b'"error"' not in body
            ok = resp.status == 200 and body.rstrip().endswith(DONE) and (whole or b'"error"' in body)
        tally.count(kind, ok, f"{resp.status} {body[-200:]!r}")

    async def bad(self, tally: Tally) -> None:
        data, headers = self.rng.choice(BAD)
        async with self.session.post(self.url, data=data, headers=headers) as resp:
            await resp.read()
        tally.count("bad", 400 <= resp.status < 500, f"{resp.status} for {data[:60]!r}")

    async def one(self, tally: Tally) -> None:
        kind = self.rng.choices(list(MIX), weights=list(MIX.values()))[0]
        run: Callable[[Tally], Awaitable[None]] = {
            "stream": self.stream,
            "whole": self.whole,
            "cancel": self.cancel,
            "bad": self.bad,
        }.get(kind) or (lambda t: self.upstream_error(t, kind))
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await run(tally)
        except TimeoutError:
            tally.num_hung += 1
            tally.num_requests += 1
            if len(tally.examples) < 5:
                tally.examples.append(f"{kind}: no answer within {REQUEST_TIMEOUT_S} s")
        except aiohttp.ClientError as exc:
            tally.count(kind, False, f"{type(exc).__name__}: {exc}")


async def run_clients(
    url: str, concurrency: int, end_s: float, rng: random.Random, current: Callable[[], Tally]
) -> None:
    """`concurrency` clients until end_s; each request is tallied in current() (the report interval
    it ends in)."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def loop(seed: int) -> None:
            client = Client(session, url, random.Random(seed))
            await asyncio.sleep(client.rng.uniform(0, 2))  # spread the start
            while time.monotonic() < end_s:
                await client.one(current())

        await asyncio.gather(*(loop(rng.randrange(1 << 30)) for _ in range(concurrency)))
