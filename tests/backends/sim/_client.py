"""A small real HTTP client for the sim's tests: SSE events, metrics samples."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from common.promtext import iter_samples
from tests.sse import DONE, data_of


@dataclass
class StreamResult:
    sent_s: float
    events: list[dict[str, Any]] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)
    first_event_s: float | None = None  # when the first data event (of any kind) arrived
    done: bool = False

    @property
    def ttft_s(self) -> float:
        return self.token_times_s[0] - self.sent_s

    @property
    def tpot_s(self) -> float:
        return (self.token_times_s[-1] - self.token_times_s[0]) / (len(self.token_times_s) - 1)


def _has_token(event: dict[str, Any]) -> bool:
    for choice in event.get("choices", []):
        if choice.get("delta", {}).get("content") or choice.get("text"):
            return True
    return False


async def stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> StreamResult:
    result = StreamResult(time.monotonic())
    async with session.post(url, json={**body, "stream": True}) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        async for raw in response.content:
            payload = data_of(raw)
            if payload is None:
                continue
            if payload == DONE:
                result.done = True
                continue  # read to the end so that the connection is reused
            event = json.loads(payload)
            if result.first_event_s is None:
                result.first_event_s = time.monotonic()
            if _has_token(event):
                result.token_times_s.append(time.monotonic())
            result.events.append(event)
    return result


async def metrics(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """Every sample as 'name{label="v",...}' -> value, and bare 'name' for single-series metrics."""
    async with session.get(f"{base}/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for sample in iter_samples(text):
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
        out[f"{sample.name}{{{labels}}}"] = sample.value
        out.setdefault(sample.name, sample.value)
    return out
