"""The prefix policies' metrics: decisions by reason, the matched share of each prompt (for a
policy that knows what a backend holds), and the size of its block tables (entries and bytes,
per backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.pool.routing.policy import REASONS, Route

if TYPE_CHECKING:
    from gateway.pool.model_pool import Backend, Router

MATCH_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


class RouteMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.decisions = Counter(
            "zerogap_route_decisions",
            "Prefix routing decisions: affinity (the prompt's home or longest match), balance (that one too loaded), "
            "no_match",
            ["model", "reason"],
            registry=r,
        )
        self.match_ratio = Histogram(
            "zerogap_route_prefix_match_ratio",
            "Share of a request's hashed prompt blocks that the chosen backend's table held (cache_aware_local)",
            ["model"],
            buckets=MATCH_BUCKETS,
            registry=r,
        )
        self.table_blocks = Gauge(
            "zerogap_route_prefix_table_blocks",
            "Block hashes the router remembers for the backend (cache_aware_local: max_blocks_per_backend)",
            ["backend", "model"],
            registry=r,
            multiprocess_mode="livesum",  # each worker process keeps its own tables
        )
        self.table_bytes = Gauge(
            "zerogap_route_prefix_table_bytes",
            "Memory of the backend's block table (its dict plus the hashes)",
            ["backend", "model"],
            registry=r,
            multiprocess_mode="livesum",  # each worker process keeps its own tables
        )

    def start_at_zero(self, router: Router) -> None:
        for model, pool in router.pools.items():
            if pool.policy.by_prefix:
                for reason in REASONS:
                    self.decisions.labels(model, reason)
                self.match_ratio.labels(model)  # at 0 (cache_aware observes none: it knows no table)

    def observe(self, model: str, route: Route[Backend]) -> None:
        self.decisions.labels(model, route.reason).inc()
        if route.num_blocks:
            self.match_ratio.labels(model).observe(route.num_matched / route.num_blocks)

    def render(self, router: Router) -> None:
        for model, pool in router.pools.items():
            if not pool.policy.keeps_tables:
                continue
            sizes = pool.policy.table_sizes()
            for b in pool.backends:
                num_blocks, num_bytes = sizes.get(b.name, (0, 0))
                self.table_blocks.labels(b.name, model).set(num_blocks)
                self.table_bytes.labels(b.name, model).set(num_bytes)
