"""gateway/observe/settled.py: requests' metrics applied in batches render exactly as a call per
request would (counters summed per label set, histogram values per bucket, bounds included)."""

from __future__ import annotations

import random

from prometheus_client import generate_latest

from gateway.observe.metrics import DURATION_BUCKETS_S, TPOT_BUCKETS_S, TTFT_BUCKETS_S, GatewayMetrics
from gateway.observe.settled import Settled
from gateway.pool.model_pool import Router
from gateway.pool.routing.registry import POLICIES


def page(m: GatewayMetrics) -> list[str]:
    """The rendered page less the series' creation times; a histogram's sum to 9 significant digits
    (a batch adds its values up before adding them in: the last bits of a float sum differ)."""
    out = []
    for line in generate_latest(m.registry).decode().splitlines():
        if "_created" in line:
            continue
        if "_sum{" in line:
            name, value = line.rsplit(" ", 1)
            line = f"{name} {float(value):.9g}"
        out.append(line)
    return out


def one_by_one(m: GatewayMetrics, s: Settled) -> None:
    """What settle() did per request before the batches."""
    model, backend, key, status, duration_s, ttft_s, tpot_s, prompt, completion = s
    m.requests.labels(model, backend, key, status).inc()
    m.duration.labels(model, backend, status).observe(duration_s)
    if ttft_s is not None:
        m.ttft.labels(model, backend).observe(ttft_s)
    if tpot_s is not None:
        m.tpot.labels(model, backend).observe(tpot_s)
    if prompt or completion:
        m.tokens.labels(model, key, "prompt").inc(prompt)
        m.tokens.labels(model, key, "completion").inc(completion)


def requests(num: int) -> list[Settled]:
    rng = random.Random(7)
    bounds = [*DURATION_BUCKETS_S, *TTFT_BUCKETS_S, *TPOT_BUCKETS_S]
    out: list[Settled] = []
    for _ in range(num):
        stream = rng.random() < 0.7
        value = rng.choice(bounds) if rng.random() < 0.3 else rng.uniform(0, 2)  # on a bound: le includes it
        out.append((
            rng.choice(["m", "n"]), rng.choice(["b0", "b1", "none"]), rng.choice(["k1", "k2"]),
            rng.choice(["200", "499", "502"]), value, value / 3 if stream else None,
            value / 50 if stream and rng.random() < 0.8 else None, rng.randrange(0, 50), rng.randrange(0, 9),
        ))  # fmt: skip
    return out


def test_batches_render_as_a_call_per_request() -> None:
    expected, batched = GatewayMetrics(per_key=True), GatewayMetrics(per_key=True)
    batched.settled.flush_at = 100
    for s in requests(1000):
        one_by_one(expected, s)
        batched.settled.add(s)
    batched.settled.flush()
    assert page(batched) == page(expected)
    assert any(line.startswith("zerogap_requests_total{") for line in page(batched))


async def test_the_page_applies_what_is_pending_and_the_key_label_follows_per_key() -> None:
    m = GatewayMetrics()  # no metrics_key: key="all"
    m.settled.add(("m", "b0", "tenant-a", "200", 0.3, 0.1, 0.01, 5, 7))
    assert 'zerogap_requests_total{backend="b0",key="all",model="m",status="200"} 1.0' not in page(m)
    text = m.render(Router([], next(iter(POLICIES)))).decode()
    assert 'zerogap_requests_total{backend="b0",key="all",model="m",status="200"} 1.0' in text
    assert 'zerogap_tokens_total{key="all",kind="completion",model="m"} 7.0' in text


def test_with_workers_each_request_is_applied_at_once(tmp_path) -> None:
    m = GatewayMetrics(multiprocess_dir=str(tmp_path))
    assert m.settled.flush_at == 1
