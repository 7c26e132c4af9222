"""The engines' side of a step: what the timeline's samples (the backends' /metrics, the gateway's
in-flight gauge) say over the step's measured window, as report.json's `backend`, token and CPU
intervals and prefix-cache hit rate."""

from __future__ import annotations

from typing import Any

from loadreport.schema import Backend
from loadreport.timeline import Sample


def mean(values: list[float | None]) -> float | None:
    """The mean of the values that were measured, rounded to 0.001 (None: none was)."""
    found = [v for v in values if v is not None]
    return round(sum(found) / len(found), 3) if found else None


def _max(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return round(max(found), 3) if found else None


def backend(inside: list[Sample]) -> Backend:
    """The engines' signals over the window, for the diagnosis."""
    preempted = [s.preemptions_total for s in inside if s.preemptions_total is not None]
    caps = [s.max_num_seqs for s in inside if s.max_num_seqs is not None]
    return Backend.build(
        running_mean=mean([s.running for s in inside]),
        running_max=_max([s.running for s in inside]),
        waiting_mean=mean([s.waiting for s in inside]),
        kv_cache_usage_mean=mean([s.kv_cache_usage for s in inside]),
        kv_cache_usage_max=_max([s.kv_cache_usage for s in inside]),
        preemptions=preempted[-1] - preempted[0] if len(preempted) > 1 else None,
        max_num_seqs=caps[-1] if caps else None,
        num_samples=sum(1 for s in inside if s.running is not None),
        gateway_inflight_mean=mean([s.gateway_inflight for s in inside]),
    )


def prefix_hit_rate(samples: list[Sample], start: float, end: float) -> float | None:
    """The engines' prefix-cache hit rate in [start, end): the growth of
    vllm:prefix_cache_hits_total over that of vllm:prefix_cache_queries_total, from the last
    sample before the window to the last one inside it (None without both counters)."""
    before = [s for s in samples if s.wall < start and s.prefix_cache_queries is not None]
    inside = [s for s in samples if start <= s.wall < end and s.prefix_cache_queries is not None]
    if not inside or (not before and len(inside) < 2):
        return None
    first = before[-1] if before else inside[0]
    last = inside[-1]
    queries = (last.prefix_cache_queries or 0.0) - (first.prefix_cache_queries or 0.0)
    hits = (last.prefix_cache_hits or 0.0) - (first.prefix_cache_hits or 0.0)
    return round(hits / queries, 4) if queries > 0 else None


def engine_figures(samples: list[Sample], start: float, end: float) -> dict[str, Any]:
    """The step's engine figures over [start, end), by report.json's Step field."""
    inside = [s for s in samples if start <= s.wall < end]
    return {
        "token_interval_ms": mean([s.token_interval_ms for s in inside]),  # the GPU's gap between forwards
        "cpu_interval_ms": mean([s.cpu_interval_ms for s in inside]),  # the CPU work per step
        "backend": backend(inside),
        "prefix_cache_hit_rate": prefix_hit_rate(samples, start, end),
    }
