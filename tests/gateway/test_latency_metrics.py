"""The gateway's latency histograms in value, against an upstream of known timing.

The upstream sends the first token 300 ms after a request arrives, then one token every
45 ms, 20 in all. Truth is what the upstream recorded doing (its sleeps overshoot on a
busy machine), per request, and what the client saw:
- zerogap_time_to_first_token_seconds and zerogap_request_duration_seconds lie between
  the upstream's view (arrival -> first chunk / [DONE] written) and the client's (send ->
  first chunk / end of body read), as the gateway stands between the two;
- zerogap_time_per_output_token_seconds reads the upstream's (last - first chunk) / (20 - 1)
  within 2.5%, half the 5% of a TPOT divided by n instead of n - 1;
- each lands in the right bucket: a TTFT taken at the last chunk (~1.2 s) must fail.
"""

from __future__ import annotations

import asyncio
import time
from statistics import mean

import aiohttp

from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, get, make_config, metric

TTFT_S, INTERVAL_S, NUM_TOKENS, NUM_REQUESTS = 0.300, 0.045, 20, 4
TPOT_TOLERANCE = 0.025  # half the 5% of a TPOT divided by n instead of n - 1
SLACK_S = 0.001  # the clocks: time.time() upstream, monotonic in the gateway and the client


async def timed_stream(url: str) -> tuple[float, float]:
    """(send -> first chunk, send -> end of body) as the client sees them."""
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = time.monotonic()
        async with session.post(url, json=chat_body(), headers=auth()) as resp:
            assert resp.status == 200
            first = None
            async for _ in resp.content.iter_any():
                first = first or time.monotonic()
        end = time.monotonic()
    assert first is not None
    return first - start, end - start


def histogram(text: bytes, name: str) -> float:
    """The mean of backend b0's series; its count must be one per request."""
    count = metric(text, name + "_count", backend="b0")
    assert count == NUM_REQUESTS, (name, count)
    return metric(text, name + "_sum", backend="b0") / count


def bucket(text: bytes, name: str, le: str) -> float:
    return metric(text, name + "_bucket", backend="b0", le=le)


async def test_ttft_tpot_and_duration_histograms_read_the_upstreams_timing(tmp_path) -> None:
    behavior = Behavior(ttft_s=TTFT_S, interval_s=INTERVAL_S, num_output_tokens=NUM_TOKENS)
    with UpstreamServer(behavior, model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
            url = gs.url + "/v1/chat/completions"
            client = await asyncio.gather(*(timed_stream(url) for _ in range(NUM_REQUESTS)))
            _, text = await get(gs.url + "/metrics")
        seen = list(up.requests)
    assert len(seen) == NUM_REQUESTS and all(s.finished and s.num_tokens_sent == NUM_TOKENS for s in seen)

    ttft = histogram(text, "zerogap_time_to_first_token_seconds")
    upstream_ttft, client_ttft = mean(s.ttft_s or 0.0 for s in seen), mean(c[0] for c in client)
    assert upstream_ttft - SLACK_S <= ttft <= client_ttft + SLACK_S, (upstream_ttft, ttft, client_ttft)
    assert bucket(text, "zerogap_time_to_first_token_seconds", "0.2") == 0
    assert bucket(text, "zerogap_time_to_first_token_seconds", "0.5") == NUM_REQUESTS

    tpot, upstream_tpot = histogram(text, "zerogap_time_per_output_token_seconds"), mean(s.tpot_s or 0 for s in seen)
    assert abs(tpot - upstream_tpot) <= TPOT_TOLERANCE * upstream_tpot, (tpot, upstream_tpot)
    assert bucket(text, "zerogap_time_per_output_token_seconds", "0.04") == 0
    assert bucket(text, "zerogap_time_per_output_token_seconds", "0.075") == NUM_REQUESTS

    duration = histogram(text, "zerogap_request_duration_seconds")
    upstream_e2e, client_e2e = mean((s.done_wall or 0.0) - s.arrived_wall for s in seen), mean(c[1] for c in client)
    assert upstream_e2e - SLACK_S <= duration <= client_e2e + SLACK_S, (upstream_e2e, duration, client_e2e)
    assert bucket(text, "zerogap_request_duration_seconds", "1.0") == 0
    assert bucket(text, "zerogap_request_duration_seconds", "2.5") == NUM_REQUESTS
