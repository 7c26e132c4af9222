"""Typed report.json steps for the diagnosis's tests: every figure the schema has, the ones
a test names set, the rest a healthy step's (no errors, valid, no queue)."""

from __future__ import annotations

from typing import Any

from loadreport.diagnosis import diagnose_step
from loadreport.schema import LIMITS, Backend, GpuUtil, Latency, Step


def latency(p50: float | None) -> Latency:
    return Latency(p50=p50, p90=p50, p99=p50, mean=p50)


def step(
    users: int = 64,
    tps: float = 1000.0,
    running: float | None = 64.0,
    waiting: float | None = 0.0,
    gpu: float | None = 60.0,
    **extra: Any,
) -> Step:
    """A closed-loop step at `users`; `request_rate=R` makes it an open-loop one."""
    backend = Backend(
        running_mean=running,
        running_max=extra.pop("running_max", running),
        waiting_mean=waiting,
        kv_cache_usage_mean=extra.pop("kv", 0.2),
        kv_cache_usage_max=None,
        preemptions=extra.pop("preemptions", None),
        max_num_seqs=extra.pop("cap", None),
        num_samples=extra.pop("num_samples", None),
        gateway_inflight_mean=extra.pop("gateway_inflight", None),
    )
    rate = extra.pop("request_rate", None)
    figures: dict[str, Any] = {
        "index": 0,
        "concurrency": None if rate is not None else float(users),
        "request_rate": rate,
        "users": users,
        "start_s": 0.0,
        "end_s": 10.0,
        "duration_s": 8.0,
        "complete": True,
        "requests_ok": 100,
        "requests_failed": 0,
        "retries": 0,
        "errors": {},
        "output_tps": tps,
        "total_tps": tps * 2,
        "rps": 10.0,
        "ttft_ms": latency(extra.pop("ttft_p50", 50.0)),
        "tpot_ms": latency(extra.pop("tpot_p50", 20.0)),
        "itl_ms": latency(20.0),
        "e2e_ms": latency(1000.0),
        "gpu_util": None if gpu is None else GpuUtil(mean=gpu, min=gpu - 5),
        "gpu_util_reason": None if gpu is not None else "no GPU signal",
        "goodput_rps": 10.0,
        "valid": True,
        "invalid_reason": None,
        "token_count_source": "usage",
        "input_tokens_mean": 128.0,
        "output_tokens_mean": 64.0,
        "loadgen_cpu_percent": 20.0,
        "send_lag_ms": None,
        "token_interval_ms": 4.0,
        "cpu_interval_ms": 5.0,
        "backend": backend,
        "prefix_cache_hit_rate": None,
        "not_collected": {},
    }
    figures.update(extra)
    return Step(**figures)


def limit(one: Step, before: Step | None = None, after: Step | None = None) -> str:
    entry = diagnose_step(one, before, after)
    assert entry.limit in LIMITS and entry.evidence and entry.advice
    return entry.limit
