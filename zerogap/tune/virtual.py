"""`zerogap tune --virtual`: each candidate in virtual time, with the sim's own
scheduler and cost model (as `zerogap sim plan`), summarised as report.json's steps
so that the diagnosis and the ranking read them as they read a real run."""

from __future__ import annotations

import time
from typing import Any

from backends.sim.plan.sweep import summarise
from backends.sim.plan.virtual import VirtualRun, closed_loop
from backends.sim.settings import settings_from_config
from loadtest import diagnose
from zerogap.tune.grid import Candidate
from zerogap.tune.rank import Result
from zerogap.tune.trial import Trial


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _goodput(run: VirtualRun, start_s: float, end_s: float, ttft_s: float, tpot_s: float) -> float:
    good = 0
    for r in run.requests:
        if r.finish_s is None or not start_s < r.finish_s <= end_s:
            continue
        if (r.ttft_s or 0.0) <= ttft_s and (r.tpot_s or 0.0) <= tpot_s:
            good += 1
    return good / max(end_s - start_s, 1e-9)


def virtual_step(index: int, concurrency: int, trial: Trial, candidate: Candidate) -> dict[str, Any]:
    settings = settings_from_config(candidate.config)
    ramp = min(trial.warmup_s, trial.step_s - trial.measure_s)
    run = closed_loop(settings, concurrency, trial.input_tokens, trial.output_tokens, trial.step_s, ramp_s=ramp)
    start = trial.step_s - trial.measure_s
    s = summarise(run, settings.mode, concurrency, start, trial.step_s)
    slo_ttft_s, slo_tpot_s = trial.slo_s(settings.time_scale)
    running = s.batch_mean
    return {
        "index": index,
        "concurrency": concurrency,
        "users": concurrency,
        "duration_s": trial.measure_s,
        "requests_ok": round(s.rps * trial.measure_s),
        "requests_failed": 0,
        "errors": {},
        "output_tps": round(s.output_tps, 2),
        "rps": round(s.rps, 3),
        "goodput_rps": round(_goodput(run, start, trial.step_s, slo_ttft_s, slo_tpot_s), 3),
        "ttft_ms": {"p50": _ms(s.ttft_p50_s), "p99": _ms(s.ttft_p99_s)},
        "tpot_ms": {"p50": _ms(s.tpot_p50_s), "mean": _ms(s.tpot_mean_s)},
        "gpu_util": {"mean": round(s.gpu_busy * 100, 2), "min": round(s.gpu_busy * 100, 2)},
        "token_interval_ms": round(s.token_interval_ms, 3),  # the GPU's idle gap between two forwards
        "cpu_interval_ms": round(s.cpu_interval_ms, 3),  # the CPU work per step, hidden or not
        "valid": True,
        "invalid_reason": None,
        "backend": {
            "running_mean": round(running, 3),
            "running_max": round(running, 3),
            "waiting_mean": round(max(0.0, concurrency - running), 3),  # closed loop: every user is in the engine
            "max_num_seqs": settings.max_num_seqs,
        },
    }


def run_virtual(candidate: Candidate, trial: Trial) -> Result:
    started = time.monotonic()
    steps = [virtual_step(i, load, trial, candidate) for i, load in enumerate(trial.steps)]
    return Result(candidate, steps, diagnose(steps), time.monotonic() - started)
