"""/metrics: vLLM's metric names (label model_name) plus the sim's own gauges.

A custom collector: the step loop only bumps plain counters and bucket counts (a
bisect per token), and the Prometheus families are built at scrape time.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.sim.engine.core import EngineCore
from backends.sim.engine.steps import StepRecord
from backends.sim.server.window import BusyWindow

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class PromHistogram:
    """A Prometheus histogram's buckets, count and sum, rendered as vLLM names them (the sim's
    own: prometheus_client's registry would cost more per token than the step it measures)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.total += value * count

    def family(self, name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=["model_name"])
        cumulative, buckets = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
        family.add_metric(labels, buckets, self.total)
        return family


class SimMetrics(Collector):
    def __init__(self, model_name: str, core: EngineCore, window: BusyWindow) -> None:
        self.model_name = model_name
        self.core = core
        self.window = window
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {}
        self.ttft = PromHistogram(TTFT_BUCKETS)
        self.itl = PromHistogram(ITL_BUCKETS)
        self.e2e = PromHistogram(E2E_BUCKETS)
        self.iteration_tokens = PromHistogram(ITERATION_BUCKETS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def on_first_token(self, ttft_s: float, num_prompt_tokens: int) -> None:
        self.ttft.observe(ttft_s)
        self.prompt_tokens += num_prompt_tokens

    def on_finish(self, e2e_s: float, reason: str) -> None:
        self.e2e.observe(e2e_s)
        self.finished[reason] = self.finished.get(reason, 0) + 1

    def on_abort(self) -> None:
        self.finished["abort"] = self.finished.get("abort", 0) + 1

    def on_step(self, step: StepRecord) -> None:
        self.iteration_tokens.observe(step.num_tokens)
        self.generation_tokens += step.num_new_tokens

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        labels = [self.model_name]
        core, window, now = self.core, self.window, time.monotonic()
        blocks = core.blocks
        yield _gauge("vllm:num_requests_running", "Requests in the running batch.", labels, core.num_running)
        yield _gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", labels, core.num_waiting)
        yield _gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = full).", labels, blocks.usage)
        yield _counter("vllm:prompt_tokens", "Prefill tokens processed.", labels, self.prompt_tokens)
        yield _counter("vllm:generation_tokens", "Generation tokens processed.", labels, self.generation_tokens)
        yield _counter("vllm:num_preemptions", "Cumulative preemptions.", labels, core.scheduler.num_preemptions_total)
        yield _counter("vllm:prefix_cache_queries", "Prefix-cache queries, in tokens.", labels, blocks.num_queries)
        yield _counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens.", labels, blocks.num_hits)
        success = CounterMetricFamily(
            "vllm:request_success", "Finished requests by reason.", labels=["model_name", "finished_reason"]
        )
        for reason, count in sorted(self.finished.items()):
            success.add_metric([*labels, reason], count)
        yield success
        yield self.ttft.family("vllm:time_to_first_token_seconds", "Time to first token.", labels)
        yield self.itl.family("vllm:inter_token_latency_seconds", "Inter-token latency.", labels)
        yield self.e2e.family("vllm:e2e_request_latency_seconds", "End-to-end request latency.", labels)
        yield self.iteration_tokens.family("vllm:iteration_tokens_total", "Tokens per engine step.", labels)
        yield _gauge(
            "zerogap_sim_gpu_busy_ratio",
            "Modelled forward time / wall time over the recent window.",
            labels,
            window.busy_ratio(now),
        )
        yield _gauge(
            "zerogap_sim_token_interval_seconds",
            "Token interval as the GPU sees it: mean idle time between two forwards over the recent window.",
            labels,
            window.mean_gap_s(now),
        )
        yield _gauge(
            "zerogap_sim_cpu_interval_seconds",
            "CPU work per step (the token interval's work, hidden by async scheduling or not), recent mean.",
            labels,
            window.mean_cpu_s(now),
        )


def _gauge(name: str, doc: str, labels: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["model_name"])
    family.add_metric(labels, value)
    return family


def _counter(name: str, doc: str, labels: list[str], value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["model_name"])
    family.add_metric(labels, value)
    return family
