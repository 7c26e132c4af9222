"""[logging].log_tps: every [logging].log_interval_s the gateway logs the output tokens/s
it relayed (completion tokens from usage, counted in zerogap_tokens_total) and its
requests/s, once per gateway process:

    zerogap.gateway: relayed 3,398 output tok/s, 13.2 req/s (last 10 s)
"""

from __future__ import annotations

import asyncio
import logging
import time

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


async def log_rates_forever(tokens: Counter, requests: Counter, interval_s: float) -> None:
    last_tokens, last_requests = counter_total(tokens, kind="completion"), counter_total(requests)
    last_at = time.monotonic()
    while True:
        await asyncio.sleep(interval_s)
        now = time.monotonic()
        num_tokens, num_requests = counter_total(tokens, kind="completion"), counter_total(requests)
        span_s = max(now - last_at, 1e-9)
        log.info(
            "relayed %s output tok/s, %.1f req/s (last %.0f s)",
            f"{(num_tokens - last_tokens) / span_s:,.0f}",
            (num_requests - last_requests) / span_s,
            span_s,
        )
        last_tokens, last_requests, last_at = num_tokens, num_requests, now
