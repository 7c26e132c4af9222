"""Server-side signals on the load test's timeline: GPU utilization (NVML, a
Prometheus / DCGM-exporter query, or the backends' own /metrics) and the backends'
running / waiting / KV-cache usage / token interval (the GPU's gap between forwards)
and CPU interval (the CPU work per step), read from their /metrics."""

from __future__ import annotations

import http.client
import json
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import gevent

from common.promtext import sums_by_name
from loadreport.settings import MetricsSection

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
TOKEN_INTERVAL = "zerogap_sim_token_interval_seconds"  # the GPU's idle gap between two forwards
CPU_INTERVAL = "zerogap_sim_cpu_interval_seconds"  # the CPU work per step, hidden or not
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"  # tokens found in the prefix cache (vLLM and the sim)
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"  # tokens looked up
NOT_COLLECTED_GPU = "metrics.collect_gpu_util is false"


@dataclass
class BackendScrape:
    values: dict[str, list[float]] = field(default_factory=dict)  # metric -> one value per backend
    errors: list[str] = field(default_factory=list)

    def total(self, name: str) -> float | None:
        found = self.values.get(name)
        return sum(found) if found else None

    def mean(self, name: str) -> float | None:
        found = self.values.get(name)
        return sum(found) / len(found) if found else None


FAILED = (OSError, ValueError, http.client.HTTPException)  # URLError and timeouts are OSErrors


def _get(url: str, timeout_s: float) -> str:
    """The whole answer within timeout_s: urllib's timeout bounds each socket call only, and a
    busy server that sends its page in pieces (vLLM's API server, measured: 4.8 s for one 53 KB
    /metrics with a 2 s timeout) would hold the sampler for as long as it likes."""
    with gevent.Timeout(timeout_s, TimeoutError(f"no complete answer within {timeout_s:g} s")):
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            data: bytes = response.read()
            return data.decode("utf-8", "replace")


def _scrape_one(url: str, names: set[str], timeout_s: float) -> dict[str, float] | str:
    try:
        return sums_by_name(_get(url, timeout_s), names)
    except FAILED as exc:
        return f"{url}: {exc}"


def scrape_backends(urls: list[str], names: set[str], timeout_s: float) -> BackendScrape:
    """Sum each wanted metric's samples per backend (over its labels); the backends at once,
    so that one slow backend delays the sample by timeout_s at most, not by one per backend."""
    scrape = BackendScrape()
    jobs = [gevent.spawn(_scrape_one, url, names, timeout_s) for url in urls]
    gevent.joinall(jobs)
    for url, job in zip(urls, jobs, strict=True):
        per_backend = job.value
        if not isinstance(per_backend, dict):
            scrape.errors.append(per_backend or f"{url}: {job.exception}")
            continue
        for name, value in per_backend.items():
            scrape.values.setdefault(name, []).append(value)
    return scrape


def models_url(metrics_url: str) -> str:
    """A backend's /v1/models, next to its /metrics."""
    parts = urllib.parse.urlsplit(metrics_url)
    path = parts.path.removesuffix("metrics").rstrip("/") + "/v1/models"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def scheduler_cap(metrics_urls: list[str], timeout_s: float) -> int | None:
    """The engines' summed max_num_seqs, where every one says it in /v1/models (the sim does;
    vLLM does not: None, and the diagnosis infers the cap from a flat running count)."""
    total = 0
    for url in metrics_urls:
        try:
            card = json.loads(_get(models_url(url), timeout_s))["data"][0]
            total += int(card["max_num_seqs"])
        except (*FAILED, KeyError, IndexError, TypeError):
            return None
    return total or None


class GpuUtil:
    """GPU utilization in percent from the configured source; (None, reason) when unavailable."""

    def __init__(self, metrics: MetricsSection) -> None:
        self.settings = metrics.gpu_util
        self.collect = metrics.collect_gpu_util
        self.timeout_s = metrics.scrape_timeout_seconds
        self.has_backends = bool(metrics.backend_metrics_urls)
        self.no_backends = "metrics.backend_metrics_urls is empty"
        self._nvml: list[Any] | None = None
        self._nvml_error = ""

    def use_backends(self, urls: list[str], why_none: str) -> None:
        """The backends found at the run's start (settings.json's or the gateway's), and why there are none."""
        self.has_backends, self.no_backends = bool(urls), why_none

    def metric_names(self) -> set[str]:
        wanted = self.collect and self.settings.source == "backend_metrics"
        return {self.settings.backend_metric} if wanted else set()

    def sample(self, scrape: BackendScrape) -> tuple[float | None, str]:
        source = self.settings.source
        if not self.collect:
            return None, NOT_COLLECTED_GPU
        if source == "none":
            return None, 'metrics.gpu_util.source is "none"'
        if source == "backend_metrics":
            return self._from_backends(scrape)
        if source == "prometheus":
            return self._from_prometheus()
        return self._from_nvml()

    def _from_backends(self, scrape: BackendScrape) -> tuple[float | None, str]:
        if not self.has_backends:
            return None, self.no_backends
        value = scrape.mean(self.settings.backend_metric)
        if value is None:
            why = "; ".join(scrape.errors) or "no backend exports it"
            return None, f"{self.settings.backend_metric}: {why}"
        return (value * 100.0 if self.settings.backend_metric_unit == "ratio" else value), ""

    def _from_prometheus(self) -> tuple[float | None, str]:
        query = urllib.parse.urlencode({"query": self.settings.prometheus_query})
        url = f"{self.settings.prometheus_url.rstrip('/')}/api/v1/query?{query}"
        try:
            answer = json.loads(_get(url, self.timeout_s))
            values = [float(item["value"][1]) for item in answer["data"]["result"]]
        except (*FAILED, KeyError, TypeError) as exc:
            return None, f"prometheus query failed: {exc}"
        if not values:
            return None, f"prometheus query {self.settings.prometheus_query!r} returned no series"
        mean = sum(values) / len(values)
        return (mean * 100.0 if self.settings.prometheus_unit == "ratio" else mean), ""

    def _from_nvml(self) -> tuple[float | None, str]:
        handles = self._nvml_handles()
        if not handles:
            return None, f"nvml: {self._nvml_error or 'no GPU found'}"
        import pynvml

        try:
            rates = [float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) for handle in handles]
        except pynvml.NVMLError as exc:
            return None, f"nvml: {exc}"
        return sum(rates) / len(rates), ""

    def _nvml_handles(self) -> list[Any]:
        if self._nvml is not None:
            return self._nvml
        self._nvml = []
        try:
            import pynvml

            pynvml.nvmlInit()
            indexes = self.settings.nvml_devices or list(range(pynvml.nvmlDeviceGetCount()))
            self._nvml = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in indexes]
        except Exception as exc:  # pynvml raises NVMLError subclasses, or ImportError/OSError without a driver
            self._nvml_error = str(exc) or type(exc).__name__
        return self._nvml
