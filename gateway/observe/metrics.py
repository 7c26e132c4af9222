"""The gateway's Prometheus metrics (zerogap_*), in a registry owned by the app.

Labels: model, backend, key (the key's name, never its secret), status (HTTP code;
499 = the client went away). Gauges of backends are set when /metrics is read.

The key label names tenants, so it carries their names only where [server].metrics_key guards
/metrics (per_key): without it every series has key="all" (ALL_KEYS), the same names and other
labels, so dashboards still read them, summed over the keys.

With several workers (`--workers N`) PROMETHEUS_MULTIPROC_DIR names a folder where each worker
writes its values; /metrics then sums counters and histograms over the workers (the backend
gauges: in-flight summed, up and reported load the maximum over live workers), and each worker
also sets its backend gauges every second, since any worker may be the one asked.
"""

from __future__ import annotations

import asyncio
import os
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.observe.settled import FLUSH_AT, SettledMetrics
from gateway.pool.flights import CAUSES as EJECTION_CAUSES
from gateway.pool.flights import Cause
from gateway.pool.model_pool import Backend, Router
from gateway.pool.routing.metrics import RouteMetrics

M = TypeVar("M", bound=MetricWrapperBase)


class Labeled(Generic[M]):
    """A labelled metric whose child per label values is looked up once, then kept: prometheus-client's
    labels() costs microseconds per call, and each request makes several."""

    __slots__ = ("_children", "metric")

    def __init__(self, metric: M) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class KeyLabeled(Labeled[M]):
    """A Labeled metric with a key label (at key_index) that is ALL_KEYS unless per_key."""

    __slots__ = ("_key_index", "_per_key")

    def __init__(self, metric: M, key_index: int, per_key: bool) -> None:
        super().__init__(metric)
        self._key_index, self._per_key = key_index, per_key

    def labels(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            shown = values
            if not self._per_key:
                i = self._key_index
                shown = (*values[:i], ALL_KEYS, *values[i + 1 :])
            child = self._children[values] = self.metric.labels(*shown)
        return child


ALL_KEYS = "all"  # the key label without [server].metrics_key

TTFT_BUCKETS_S = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0,
)  # fmt: skip
TPOT_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0,
)  # fmt: skip
DURATION_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip


class GatewayMetrics:
    def __init__(self, multiprocess_dir: str | None = None, per_key: bool = False) -> None:
        """multiprocess_dir: the folder of --workers (PROMETHEUS_MULTIPROC_DIR), or None for one process;
        per_key: the key label names each key (/metrics is guarded), else it is ALL_KEYS."""
        self.multiprocess_dir = multiprocess_dir
        self.per_key = per_key
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = KeyLabeled(
            Counter("zerogap_requests", "Requests answered", ["model", "backend", "key", "status"], registry=r),
            2,
            per_key,
        )
        self.duration = Labeled(
            Histogram(
                "zerogap_request_duration_seconds",
                "Time from request to last byte",
                ["model", "backend", "status"],
                buckets=DURATION_BUCKETS_S,
                registry=r,
            )
        )
        self.ttft = Labeled(
            Histogram(
                "zerogap_time_to_first_token_seconds",
                "Time from request to the first streamed chunk",
                ["model", "backend"],
                buckets=TTFT_BUCKETS_S,
                registry=r,
            )
        )
        self.tpot = Labeled(
            Histogram(
                "zerogap_time_per_output_token_seconds",
                "(last chunk - first chunk) / (completion tokens - 1), per streamed request",
                ["model", "backend"],
                buckets=TPOT_BUCKETS_S,
                registry=r,
            )
        )
        self.tokens = KeyLabeled(
            Counter("zerogap_tokens", "Tokens from usage", ["model", "key", "kind"], registry=r), 1, per_key
        )
        self.backend_up = Gauge(
            "zerogap_backend_up",
            "1 if the backend passes health checks",
            ["backend", "model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.backend_inflight = Gauge(
            "zerogap_backend_inflight",
            "Requests this gateway has in flight there",
            ["backend", "model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.backend_load = Gauge(
            "zerogap_backend_reported_load",
            "running + waiting that the backend reports",
            ["backend", "model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.retries = Labeled(
            Counter("zerogap_retries", "Requests retried on another backend", ["model", "backend"], registry=r)
        )
        self.continuations = Labeled(
            Counter(
                "zerogap_continuations",
                "Streams broken after their first token, by why (broken, idle, ejected) and what came of it"
                " (continued on another backend, failed: none could, not_continued: n > 1, tool calls, off...)",
                ["model", "reason", "outcome"],
                registry=r,
            )
        )
        self.continuation_prompt_tokens = Labeled(
            Counter(
                "zerogap_continuation_prompt_tokens",
                "Prompt tokens the continuations sent (the original prompt and the text so far, prefilled"
                " again): the gateway's cost, not the tenant's",
                ["model"],
                registry=r,
            )
        )
        self.upstream_errors = Labeled(
            Counter("zerogap_upstream_errors", "Failed upstream attempts", ["model", "backend", "status"], registry=r)
        )
        self.ratelimited = KeyLabeled(
            Counter("zerogap_ratelimited", "Requests refused by a limit", ["model", "key", "limit"], registry=r),
            1,
            per_key,
        )
        self.limits_down = Labeled(
            Counter(
                "zerogap_limits_backend_down",
                "Requests of limited keys while Redis was unreachable, by [gateway].on_redis_down (local: counted "
                "in this process only; refuse: answered 503)",
                ["mode"],
                registry=r,
            )
        )
        self.ejections = Labeled(
            Counter(
                "zerogap_backend_ejections",
                "Times a backend left the pool: health (failed checks in a row), outlier (failure rate against its "
                "peers, or connection failures in a row), connect (refused)",
                ["model", "backend", "cause"],
                registry=r,
            )
        )
        self.pending_dropped = Labeled(
            Counter(
                "zerogap_outlier_pending_dropped",
                "5xx answers whose request never settled (the client left during its retry): dropped uncounted",
                ["model", "backend"],
                registry=r,
            )
        )
        self.panic_attempts = Labeled(
            Counter(
                "zerogap_panic_attempts",
                "Attempts sent to a backend out of the pool because none of its model was healthy (panic routing)",
                ["model", "backend"],
                registry=r,
            )
        )
        self.auth_failures = Labeled(
            Counter(
                "zerogap_auth_failures",
                "Failed authentications (401) by reason: missing, malformed, invalid, expired (never key or address)",
                ["reason"],
                registry=r,
            )
        )
        self.http_refused = Labeled(
            Counter(
                "zerogap_http_refused",
                "Requests and connections the HTTP limits refused before the app ([server] max_header_bytes, "
                "header_timeout_s, body_timeout_s, max_connections); reason: the error's code, or "
                "silent_connection (no byte within header_timeout_s, closed without an answer)",
                ["reason"],
                registry=r,
            )
        )
        self.auth_throttled = Counter(
            "zerogap_auth_throttled",
            "Requests answered 429: their address failed authentication too often ([gateway].auth_failures_limit)",
            registry=r,
        )
        self.key_store_up = Gauge(
            "zerogap_key_store_up",
            "1 while the key store's periodic refresh succeeds, 0 while it fails (see [gateway].on_store_down)",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.key_store_down_requests = Labeled(
            Counter(
                "zerogap_key_store_down_requests",
                "Virtual-key requests while the key store was unreachable: served_cached or refused (503)",
                ["action"],
                registry=r,
            )
        )
        self.route = RouteMetrics(r)
        self.tasks = Gauge(
            "zerogap_event_loop_tasks",
            "asyncio tasks alive (flat under steady load; growth is a leak)",
            registry=r,
            multiprocess_mode="livesum",
        )
        # each relayed request's requests, duration, ttft, tpot and tokens, applied in batches (settled.py)
        self.settled = SettledMetrics(self, 1 if multiprocess_dir else FLUSH_AT)

    def start_at_zero(self, router: Router) -> None:
        """Each backend's retry and connect-error series exist from the start at 0, so that
        Prometheus's rate() and increase() see their first increment too."""
        for b in router.backends:
            self.retries.labels(b.model, b.name)
            self.panic_attempts.labels(b.model, b.name)
            self.pending_dropped.labels(b.model, b.name)
            for cause in EJECTION_CAUSES:
                self.ejections.labels(b.model, b.name, cause)
            self.upstream_errors.labels(b.model, b.name, "connect")
        self.route.start_at_zero(router)

    def outlier_dropped(self, backend: Backend, num: int) -> None:
        self.pending_dropped.labels(backend.model, backend.name).inc(num)

    def ejected(self, backend: Backend, cause: Cause) -> None:
        self.ejections.labels(backend.model, backend.name, cause).inc()

    def set_backend_gauges(self, router: Router) -> None:
        for b in router.backends:
            self.backend_up.labels(b.name, b.model).set(1 if b.healthy else 0)
            self.backend_inflight.labels(b.name, b.model).set(b.num_inflight)
            self.backend_load.labels(b.name, b.model).set(b.num_reported)
        self.route.render(router)
        self.tasks.set(len(asyncio.all_tasks()))

    def render(self, router: Router) -> bytes:
        self.settled.flush()
        self.set_backend_gauges(router)
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, self.multiprocess_dir)
        return generate_latest(merged)


def multiprocess_dir() -> str | None:
    """The folder `zerogap gateway --workers N` gave its workers, if this process is one of them."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
