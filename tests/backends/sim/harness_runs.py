"""Stepped load-test runs against a simulated engine, in virtual time, written as the harness
writes them (report.json valid against loadtest.RunReport, timeline.csv, settings.json).

What it imitates from `locust -f loadtest/` against `zerogap sim`: one continuous run
(warm-up, then each step's users added at its start over one second and the surplus users
stopped at their next request), each user's next request sent a random 0..2 x gap after
its last response, TTFT / TPOT / e2e from the requests that ended in a step's window
(the last measure_s of it), output TPS from the tokens that arrived in it, and the engine's
gauges sampled every second (GPU busy as the sim exports it: forward time over the last
5 s; the running count; the CPU interval). Fast enough for the fast tier, so the fit can
be tested on engines whose parameters are known.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backends.sim.engine.steps import StepRecord
from backends.sim.plan import stepped
from backends.sim.plan.stepped import Schedule, Step
from backends.sim.plan.virtual import VirtualRun
from backends.sim.settings import SimSettings
from loadreport.timeline import write_csv
from loadtest import RunReport

SAMPLE_S = 1.0
BUSY_WINDOW_S = 5.0


@dataclass(frozen=True)
class Stepped:
    steps: tuple[int, ...]
    prompt_tokens: int
    output_tokens: int
    step_s: float = 20.0
    measure_s: float = 15.0
    warmup_s: float = 5.0
    client_gap_ms: float = 2.0
    seed: int = 0

    def users_at(self, t_s: float) -> int:
        if t_s < self.warmup_s:
            return self.steps[0]
        k = min(int((t_s - self.warmup_s) // self.step_s), len(self.steps) - 1)
        return self.steps[k]

    @property
    def end_s(self) -> float:
        return self.warmup_s + self.step_s * len(self.steps)


def simulate(settings: SimSettings, load: Stepped) -> VirtualRun:
    steps = tuple(Step(users, load.step_s, load.measure_s) for users in load.steps)
    schedule = Schedule(steps, load.prompt_tokens, load.output_tokens, warmup_s=load.warmup_s)
    return stepped.simulate(settings.with_flags(client_gap_ms=load.client_gap_ms), schedule, load.seed)


def _latency(values_ms: list[float]) -> dict[str, float] | None:
    if not values_ms:
        return None
    a = np.asarray(values_ms)
    return {k: round(float(np.percentile(a, q)), 3) for k, q in (("p50", 50), ("p90", 90), ("p99", 99))} | {
        "mean": round(float(a.mean()), 3)
    }


def _samples(run: VirtualRun, load: Stepped) -> list[dict[str, float]]:
    out = []
    t = SAMPLE_S
    while t <= load.end_s + 1e-9:
        recent = [s for s in run.steps if t - BUSY_WINDOW_S < s.end_s <= t]
        span = min(BUSY_WINDOW_S, t)
        current = _step_at(run.steps, t)
        out.append(
            {
                "t": t,
                "busy": sum(s.forward_s for s in recent) / span,
                "running": float(current.num_seqs) if current else 0.0,
                "cpu_ms": 1000.0 * float(np.mean([s.cpu_s for s in recent])) if recent else 0.0,
                "tokens": float(run.num_tokens_between(t - SAMPLE_S, t)),
                "in_flight": float(sum(r.arrival_s <= t < (r.finish_s or math.inf) for r in run.requests)),
            }
        )
        t += SAMPLE_S
    return out


def _step_at(steps: list[StepRecord], t: float) -> StepRecord | None:
    for s in steps:
        if s.start_s <= t < s.end_s:
            return s
    return None


def _step(
    index: int, load: Stepped, settings: SimSettings, run: VirtualRun, samples: list[dict[str, float]]
) -> dict[str, Any]:
    end = load.warmup_s + (index + 1) * load.step_s
    start = end - load.measure_s
    ended = [r for r in run.requests if r.finish_s is not None and start <= r.finish_s < end]
    tokens = run.num_tokens_between(start, end)
    prompt = sum(r.num_prompt_tokens for r in ended)
    inside = [s for s in samples if start <= s["t"] < end]
    busy = [100.0 * s["busy"] for s in inside]
    running = [s["running"] for s in inside]
    in_flight = [s["in_flight"] for s in inside]
    return {
        "index": index,
        "concurrency": load.steps[index],
        "users": load.steps[index],
        "start_s": round(end - load.step_s, 3),
        "end_s": round(end, 3),
        "duration_s": load.measure_s,
        "complete": True,
        "requests_ok": len(ended),
        "requests_failed": 0,
        "retries": 0,
        "errors": {},
        "output_tps": round(tokens / load.measure_s, 2),
        "total_tps": round((tokens + prompt) / load.measure_s, 2),
        "rps": round(len(ended) / load.measure_s, 3),
        "ttft_ms": _latency([1000 * r.ttft_s for r in ended if r.ttft_s is not None]),
        "tpot_ms": _latency([1000 * r.tpot_s for r in ended if r.tpot_s is not None]),
        "itl_ms": None,
        "e2e_ms": _latency([1000 * (r.finish_s - r.arrival_s) for r in ended if r.finish_s is not None]),
        "gpu_util": {"mean": round(float(np.mean(busy)), 2), "min": round(min(busy), 2)} if busy else None,
        "gpu_util_reason": None,
        "goodput_rps": round(len(ended) / load.measure_s, 3),
        "valid": True,
        "invalid_reason": None,
        "token_count_source": "usage",
        "input_tokens_mean": float(load.prompt_tokens),
        "output_tokens_mean": float(np.mean([r.num_output_tokens for r in ended])) if ended else None,
        "loadgen_cpu_percent": 10.0,
        "send_lag_ms": None,
        "token_interval_ms": None,
        "cpu_interval_ms": round(float(np.mean([s["cpu_ms"] for s in inside])), 4) if inside else None,
        "backend": {
            "running_mean": float(np.mean(running)) if running else None,
            "running_max": max(running) if running else None,
            "waiting_mean": 0.0,
            "kv_cache_usage_mean": None,
            "kv_cache_usage_max": None,
            "preemptions": 0.0,
            "max_num_seqs": settings.max_num_seqs,
            "num_samples": len(inside),
        },
        "client_inflight_mean": float(np.mean(in_flight)) if in_flight else None,
        "prefix_cache_hit_rate": None,
        "not_collected": {},
    }


def write_run(run_dir: Path, settings: SimSettings, load: Stepped, engine_signals: bool = True) -> Path:
    """Simulate the stepped run and write its folder; engine_signals=False leaves GPU busy and the
    CPU interval out (as a run against vLLM without a GPU source has them)."""
    run = simulate(settings, load)
    samples = _samples(run, load)
    steps = [_step(i, load, settings, run, samples) for i in range(len(load.steps))]
    if not engine_signals:
        for step in steps:
            step["gpu_util"], step["gpu_util_reason"] = None, "gpu_util.source is none"
            step["cpu_interval_ms"] = None
    totals = {
        "requests_ok": len(run.requests),
        "requests_failed": 0,
        "requests_interrupted": 0,
        "output_tokens_ok": sum(r.num_output_tokens for r in run.requests),
    }
    run_meta = {
            "name": run_dir.name, "started_utc": "2026-01-01T00:00:00Z", "started_unix_s": 0.0,
            "ended_utc": "2026-01-01T00:01:00Z", "duration_s": load.end_s, "base_url": "virtual://sim",
            "model": "sim-model", "stopped_early": None, "endpoint": "chat", "mode": "closed_loop",
            "prompt_tokens_from": "tokenize", "num_worker_processes": 1, "interrupted_requests": 0,
    }  # fmt: skip
    report = {
        "zerogap_report": 1,
        "run": run_meta,
        "slo": {"ttft_ms": 2000.0, "tpot_ms": 100.0},
        "steps": steps,
        "knee": None,
        "diagnosis": [],
        "errors": {},
        "totals": totals,
    }
    RunReport.model_validate(report)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    write_csv([_row(s, load, engine_signals) for s in samples], run_dir / "timeline.csv")
    workload = {"prompt_tokens": load.prompt_tokens, "max_output_tokens": load.output_tokens}
    (run_dir / "settings.json").write_text(json.dumps({"workload": workload}), encoding="utf-8")
    return run_dir


def _row(sample: dict[str, float], load: Stepped, signals: bool) -> dict[str, Any]:
    t = sample["t"]
    k = min(int((t - load.warmup_s) // load.step_s), len(load.steps) - 1)
    phase = "warmup" if t < load.warmup_s else f"step{k}"
    return {
        "time_s": round(t, 3), "phase": phase, "users": load.users_at(t - 1e-9),
        "output_tps": sample["tokens"] / SAMPLE_S, "gpu_util": round(100 * sample["busy"], 2) if signals else None,
        "gpu_util_reason": "" if signals else "gpu_util.source is none", "backend_running": sample["running"],
        "cpu_interval_ms": sample["cpu_ms"] if signals else None,
    }  # fmt: skip
