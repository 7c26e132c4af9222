"""Each relayed request's metrics (zerogap_requests_total, the duration, TTFT and TPOT histograms,
zerogap_tokens_total), kept as one tuple per request and applied to the Prometheus metrics in
batches: before /metrics is rendered, and every FLUSH_AT requests.

prometheus-client's inc() and observe() take a lock and search the buckets per call; at several
calls per request that was ~5 % of the gateway's CPU per request with 4-token answers (a py-spy
profile, bench/PERF_NOTES.md). A batch adds the counters up per label set and the histograms'
observations per bucket (bisect, as observe() picks a bucket: the first bound >= the value), and
applies each sum once. The rendered page is the same as with a call per request.

With several workers (`--workers N`) any worker may answer /metrics and the others' values are
read from their files: each request's metrics are then applied at once (flush_at 1).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from typing import Any, Protocol

FLUSH_AT = 1024  # requests kept before they are applied (a bounded list; /metrics applies them first)

# model, backend, key, status, duration_s, ttft_s (None: not a stream's), tpot_s (None), prompt, completion
Settled = tuple[str, str, str, str, float, float | None, float | None, int, int]


class Targets(Protocol):
    """The metrics a batch is applied to (GatewayMetrics has them; each a labelled family)."""

    requests: Any
    tokens: Any
    duration: Any
    ttft: Any
    tpot: Any


class SettledMetrics:
    """The requests' metrics not yet applied to `metrics`' Prometheus objects."""

    __slots__ = ("_metrics", "_pending", "flush_at")

    def __init__(self, metrics: Targets, flush_at: int = FLUSH_AT) -> None:
        self._metrics = metrics
        self._pending: list[Settled] = []
        self.flush_at = flush_at

    @property
    def num_pending(self) -> int:
        """Requests settled and not yet applied."""
        return len(self._pending)

    def add(self, settled: Settled) -> None:
        pending = self._pending
        pending.append(settled)
        if len(pending) >= self.flush_at:
            self.flush()

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        m = self._metrics
        requests: Counter[tuple[str, ...]] = Counter()
        tokens: Counter[tuple[str, ...]] = Counter()
        observed: dict[tuple[Any, tuple[str, ...]], list[float]] = {}
        for model, backend, key, status, duration_s, ttft_s, tpot_s, prompt, completion in pending:
            requests[(model, backend, key, status)] += 1
            observed.setdefault((m.duration, (model, backend, status)), []).append(duration_s)
            if ttft_s is not None:
                observed.setdefault((m.ttft, (model, backend)), []).append(ttft_s)
            if tpot_s is not None:
                observed.setdefault((m.tpot, (model, backend)), []).append(tpot_s)
            if prompt or completion:
                tokens[(model, key, "prompt")] += prompt
                tokens[(model, key, "completion")] += completion
        for labels, num in requests.items():
            m.requests.labels(*labels).inc(num)
        for labels, num in tokens.items():
            m.tokens.labels(*labels).inc(num)
        for (labeled, labels), values in observed.items():
            observe_all(labeled, labels, values)


def observe_all(labeled: Any, labels: tuple[str, ...], values: list[float]) -> None:
    """What observe(v) for each of `values` would record, one increment per bucket touched."""
    child = labeled.labels(*labels)
    bounds, buckets, total = (getattr(child, name, None) for name in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None:  # a prometheus-client of another shape
        for value in values:
            child.observe(value)
        return
    per_bucket: Counter[int] = Counter(bisect_left(bounds, value) for value in values)
    total.inc(sum(values))
    for index, num in per_bucket.items():
        buckets[index].inc(num)
