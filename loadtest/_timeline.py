"""The run's one timeline: server-side samples taken live every sample_interval_ms
(users, GPU utilization, backend queues, load-generator CPU), joined at the end with
the client-side figures of the same intervals (TPS, TTFT, TPOT) from the records."""

from __future__ import annotations

import bisect
import csv
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gevent

from loadtest._gateway_inflight import GatewayInflight
from loadtest._histogram import Histogram
from loadtest._metrics_discovery import metrics_urls
from loadtest._plan import Plan
from loadtest._record import Recorder
from loadtest._settings import MetricsSection
from loadtest._signals import (
    CPU_INTERVAL,
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    RUNNING,
    TOKEN_INTERVAL,
    WAITING,
    GpuUtil,
    scheduler_cap,
    scrape_backends,
)

log = logging.getLogger("zerogap.loadtest")


@dataclass
class Sample:
    wall: float
    users: int
    gpu_util: float | None
    gpu_util_reason: str
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None
    token_interval_ms: float | None  # the GPU's idle gap between two forwards
    cpu_interval_ms: float | None = None  # the CPU work per step, hidden or not
    preemptions_total: float | None = None
    max_num_seqs: int | None = None  # the engines' summed cap, where they say it
    prefix_cache_hits: float | None = None  # counters summed over the backends (tokens)
    prefix_cache_queries: float | None = None
    gateway_inflight: float | None = None  # what zerogap's gateway had passed on to the engines


class Sampler:
    """Takes one Sample per call; the caller runs it every sample_interval_ms. The backends scraped are
    settings.json's metrics.backend_metrics_urls or, where it is absent, those the zerogap gateway at
    gateway_url (the run's base URL) lists, asked once at the first sample; a zerogap gateway there
    also gives its own in-flight figure (loadtest/_gateway_inflight.py)."""

    def __init__(self, metrics: MetricsSection, gateway_url: str | None = None) -> None:
        self.metrics = metrics
        self.gateway_url = gateway_url
        self.urls: list[str] | None = None  # found at the first sample
        self.gpu = GpuUtil(metrics)
        self.names = {
            RUNNING,
            WAITING,
            KV_USAGE,
            TOKEN_INTERVAL,
            CPU_INTERVAL,
            PREEMPTIONS,
            PREFIX_HITS,
            PREFIX_QUERIES,
        }
        self.names |= self.gpu.metric_names()
        self.samples: list[Sample] = []
        self.cap: int | None = None
        self.cap_tries = 3  # asked until known, a few times at most
        self.gateway = GatewayInflight(gateway_url, metrics.gateway_metrics_key_env, metrics.scrape_timeout_seconds)

    def backend_urls(self) -> list[str]:
        """The backends' /metrics URLs, found once (and said in the log when the gateway was asked)."""
        if self.urls is None:
            found = metrics_urls(self.metrics, self.gateway_url)
            if found.asked:
                (log.info if found.urls else log.warning)("zerogap: %s", found.note)
            self.urls = found.urls
            self.gpu.use_backends(found.urls, found.note)
        return self.urls

    def _cap(self, urls: list[str]) -> int | None:
        if self.cap is None and self.cap_tries > 0 and urls:
            self.cap_tries -= 1
            self.cap = scheduler_cap(urls, self.metrics.scrape_timeout_seconds)
        return self.cap

    def sample(self, users: int) -> Sample:
        urls = self.backend_urls()
        gateway = gevent.spawn(self.gateway.sample)  # beside the backends: one timeout bounds both
        scrape = scrape_backends(urls, self.names, self.metrics.scrape_timeout_seconds)
        gateway.join()
        wall = time.time()  # when the answers came: what they say is that recent (a busy server answers late)
        gpu, reason = self.gpu.sample(scrape)
        interval, cpu_interval = scrape.mean(TOKEN_INTERVAL), scrape.mean(CPU_INTERVAL)
        sample = Sample(
            wall=wall,
            users=users,
            gpu_util=None if gpu is None else round(gpu, 2),
            gpu_util_reason=reason,
            running=scrape.total(RUNNING),
            waiting=scrape.total(WAITING),
            kv_cache_usage=scrape.mean(KV_USAGE),
            token_interval_ms=None if interval is None else interval * 1000.0,
            preemptions_total=scrape.total(PREEMPTIONS),
            cpu_interval_ms=None if cpu_interval is None else cpu_interval * 1000.0,
            max_num_seqs=self._cap(urls),
            prefix_cache_hits=scrape.total(PREFIX_HITS),
            prefix_cache_queries=scrape.total(PREFIX_QUERIES),
            gateway_inflight=gateway.value,
        )
        self.samples.append(sample)
        return sample


COLUMNS = [
    "time_s",
    "phase",
    "users",
    "output_tps",
    "total_tps",
    "rps",
    "ttft_p50_ms",
    "tpot_p50_ms",
    "gpu_util",
    "gpu_util_reason",
    "backend_running",
    "backend_waiting",
    "kv_cache_usage",
    "token_interval_ms",
    "cpu_interval_ms",
    "preemptions_total",
    "loadgen_cpu_percent",
    "gateway_inflight",
]


def _phase_name(plan: Plan, run_time_s: float) -> str:
    phase = plan.phase_at(run_time_s)
    if phase is None:
        return "end"
    return "warmup" if phase.index < 0 else f"step{phase.index}"


def build_rows(samples: list[Sample], recorder: Recorder, plan: Plan, run_start: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    records = sorted((r for r in recorder.records if r.ok), key=lambda r: r.end)
    ends = [r.end for r in records]
    previous = run_start
    for sample in samples:
        span = sample.wall - previous
        if span <= 0:
            continue
        done = records[bisect.bisect_left(ends, previous) : bisect.bisect_left(ends, sample.wall)]
        ttft, tpot = Histogram(), Histogram()
        for record in done:
            if record.ttft_s is not None:
                ttft.add_ms(record.ttft_s * 1000)
            if record.tpot_s is not None:
                tpot.add_ms(record.tpot_s * 1000)
        output = recorder.tokens_between(previous, sample.wall)
        prompt = recorder.tokens_between(previous, sample.wall, prompt=True)
        cpu = recorder.busiest_cpu_between(previous, sample.wall)
        values = asdict(sample)
        rows.append(
            {
                "time_s": round(sample.wall - run_start, 3),
                "phase": _phase_name(plan, sample.wall - run_start - 1e-6),
                "users": sample.users,
                "output_tps": round(output / span, 2),
                "total_tps": round((output + prompt) / span, 2),
                "rps": round(len(done) / span, 3),
                "ttft_p50_ms": ttft.percentile(50),
                "tpot_p50_ms": tpot.percentile(50),
                "gpu_util": values["gpu_util"],
                "gpu_util_reason": values["gpu_util_reason"],
                "backend_running": values["running"],
                "backend_waiting": values["waiting"],
                "kv_cache_usage": values["kv_cache_usage"],
                "token_interval_ms": values["token_interval_ms"],
                "cpu_interval_ms": values["cpu_interval_ms"],
                "preemptions_total": values["preemptions_total"],
                "loadgen_cpu_percent": None if cpu is None else round(cpu, 1),
                "gateway_inflight": values["gateway_inflight"],
            }
        )
        previous = sample.wall
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: "" if row.get(key) is None else row[key] for key in COLUMNS})


def read_csv(path: Path) -> list[dict[str, Any]]:
    """timeline.csv back into rows: numbers as floats, empty cells as None."""
    rows: list[dict[str, Any]] = []
    with path.open(newline="", encoding="utf-8") as handle:
        for raw in csv.DictReader(handle):
            row: dict[str, Any] = {}
            for key, text in raw.items():
                if key in ("phase", "gpu_util_reason"):
                    row[key] = text
                else:
                    row[key] = float(text) if text not in ("", None) else None
            rows.append(row)
    return rows
