"""Run folders written by hand: a report.json with chosen figures (checked against the schema the
harness uses), for tests of what reads and renders reports."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadreport.record import Recorder, RequestRecord
from loadreport.schedule import Phase
from loadtest import RunReport

RUN_META: dict[str, Any] = {  # what the harness adds to report.json's "run"
    "base_url": "http://127.0.0.1:8000",
    "model": "m",
    "stopped_early": None,
    "endpoint": "/v1/chat/completions",
    "mode": "closed_loop",
    "prompt_tokens_from": "usage",
    "num_worker_processes": 1,
    "interrupted_requests": 0,
}


def add_steady_requests(recorder: Recorder, phase: Phase, num_users: int, start_s: float) -> None:
    """Each of num_users users streams 10 tokens per request through the phase (the run began at
    start_s): TTFT 100 ms, then one token per 20 ms (E2E 280 ms), the next request at once."""
    for user in range(num_users):
        sent = start_s + phase.start_s + user * 0.01
        while sent + 0.28 <= start_s + phase.end_s:
            record = RequestRecord(sent, sent + 0.28, True, "", 0.1, 0.28, 10, 50, "usage", None)
            record.itl.add_many_ms([20.0] * 9)
            recorder.add(record, [sent + 0.1 + 0.02 * k for k in range(10)])
            sent += 0.28


@dataclass(frozen=True)
class Figures:
    load: float  # users
    output_tps: float
    gpu_mean_pct: float
    ttft_p50_ms: float
    tpot_p50_ms: float


def _latency(p50: float) -> dict[str, float]:
    return {"p50": p50, "p90": p50 * 1.5, "p99": p50 * 2, "mean": p50 * 1.1}


def step(index: int, figures: Figures) -> dict[str, Any]:
    return {
        "index": index, "concurrency": figures.load, "users": int(figures.load),
        "start_s": 10.0 * index, "end_s": 10.0 * index + 10, "duration_s": 5.0, "complete": True,
        "requests_ok": 40 + index, "requests_failed": index, "retries": 0,
        "errors": {"http_500": index} if index else {},
        "output_tps": figures.output_tps, "total_tps": figures.output_tps * 3, "rps": 8.0 + index,
        "ttft_ms": _latency(figures.ttft_p50_ms), "tpot_ms": _latency(figures.tpot_p50_ms),
        "itl_ms": _latency(figures.tpot_p50_ms), "e2e_ms": _latency(figures.ttft_p50_ms * 10),
        "gpu_util": {"mean": figures.gpu_mean_pct, "min": figures.gpu_mean_pct - 5}, "gpu_util_reason": None,
        "goodput_rps": 7.5 + index, "valid": True, "invalid_reason": None, "token_count_source": "usage",
        "input_tokens_mean": 50.0, "output_tokens_mean": 10.0, "loadgen_cpu_percent": 20.0, "send_lag_ms": None,
        "token_interval_ms": 12.0, "cpu_interval_ms": 14.0, "prefix_cache_hit_rate": None, "not_collected": {},
        "backend": {"running_mean": figures.load, "running_max": figures.load, "waiting_mean": 0.0,
                    "kv_cache_usage_mean": 0.3, "kv_cache_usage_max": 0.3, "preemptions": None,
                    "max_num_seqs": None, "num_samples": 5},
    }  # fmt: skip


RUN = {
    "name": "r",
    "started_utc": "2026-11-29T14:30:00Z",
    "started_unix_s": 1795962600.0,
    "ended_utc": "2026-11-29T14:31:00Z",
    "duration_s": 60.0,
    "base_url": "http://127.0.0.1:8000",
    "model": "tiny",
    "stopped_early": None,
    "endpoint": "/v1/chat/completions",
    "mode": "closed_loop",
    "prompt_tokens_from": "tokenize",
    "num_worker_processes": 1,
    "interrupted_requests": 0,
}


def write_report(run_dir: Path, figures: list[Figures], **run: Any) -> Path:
    """run_dir/report.json with one step per Figures (run's fields override RUN's); returns run_dir."""
    report = {
        "zerogap_report": 1,
        "run": {**RUN, "name": run_dir.name, **run},
        "slo": {"ttft_ms": 2000.0, "tpot_ms": 100.0},
        "steps": [step(i, f) for i, f in enumerate(figures)],
        "knee": None,
        "diagnosis": [],
        "errors": {},
        "totals": {"requests_ok": 100, "requests_failed": 1, "requests_interrupted": 0, "output_tokens_ok": 1000},
    }
    RunReport.model_validate(report)  # the same contract a real run's report.json meets
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    return run_dir
