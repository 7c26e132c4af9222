"""[logging].log_tps: every [logging].log_interval_s the gateway logs the output tokens/s
it relayed (completion tokens from usage, counted in zerogap_tokens_total) and its
requests/s, once per gateway process:

    zerogap.gateway: relayed 3,398 output tok/s, 13.2 req/s (last 10 s)

An idle gateway logs nothing: one line when an interval finishes no request after one that
did, then silence until requests finish again (a request's tokens count when it ends, so a
long stream still in flight is not yet in the figures)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from prometheus_client import Counter

log = logging.getLogger("zerogap.gateway")


def counter_total(counter: Counter, **match: str) -> float:
    """The counter's _total summed over the label sets that match."""
    total = 0.0
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in match.items()):
                total += sample.value
    return total


class RateLog:
    """The line for each interval, from the counters' growth since the last tick: the rates, one
    idle line when requests stop finishing, then None (nothing to log) while they do not."""

    def __init__(self, tokens: Counter, requests: Counter, now_s: float, flush: Callable[[], None]) -> None:
        self.tokens, self.requests = tokens, requests
        self.flush = flush  # applies the requests' metrics kept for a batch (observe/settled.py) first
        self.last_tokens, self.last_requests = self._totals()
        self.last_s = now_s
        self.idle = True  # a gateway that has served nothing yet has nothing to say

    def _totals(self) -> tuple[float, float]:
        self.flush()
        return counter_total(self.tokens, kind="completion"), counter_total(self.requests)

    def tick(self, now_s: float) -> str | None:
        num_tokens, num_requests = self._totals()
        span_s = max(now_s - self.last_s, 1e-9)
        new_tokens, new_requests = num_tokens - self.last_tokens, num_requests - self.last_requests
        self.last_tokens, self.last_requests, self.last_s = num_tokens, num_requests, now_s
        if new_tokens == 0 and new_requests == 0:
            was_idle, self.idle = self.idle, True
            return None if was_idle else f"idle: no request finished in the last {span_s:.0f} s"
        self.idle = False
        tps, rps = new_tokens / span_s, new_requests / span_s
        return f"relayed {tps:,.0f} output tok/s, {rps:.1f} req/s (last {span_s:.0f} s)"


async def log_rates_forever(tokens: Counter, requests: Counter, interval_s: float, flush: Callable[[], None]) -> None:
    rates = RateLog(tokens, requests, time.monotonic(), flush)
    while True:
        await asyncio.sleep(interval_s)
        line = rates.tick(time.monotonic())
        if line is not None:
            log.info("%s", line)
