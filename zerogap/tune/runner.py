"""A candidate in real time: start its pool, run the stepped Locust harness against it
(as `locust -f loadtest/ --headless` with a settings.json tune writes), stop the pool."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from backends.sim.settings import settings_from_config
from loadtest import diagnose
from zerogap.locust_run import run_locust
from zerogap.tune.grid import Candidate
from zerogap.tune.pool import CandidatePool
from zerogap.tune.rank import Result
from zerogap.tune.trial import Trial

KEY_ENV = "ZEROGAP_TUNE_KEY"


def harness_settings(pool: CandidatePool, trial: Trial, candidate: Candidate, out_dir: Path, name: str) -> str:
    """settings.json for one candidate's stepped run, as JSON text."""
    time_scale = settings_from_config(candidate.config).time_scale
    slo_ttft_s, slo_tpot_s = trial.slo_s(time_scale)
    sim = trial.engine == "sim"
    gpu = {"source": "backend_metrics", "backend_metric": "zerogap_sim_gpu_busy_ratio"} if sim else {"source": "nvml"}
    settings = {
        "api": {"base_url": pool.base_url, "api_key_env": KEY_ENV if pool.replicas > 1 else "", "endpoint": "chat"},
        "load_test": {
            "concurrency": trial.steps[0],
            "duration_seconds": trial.step_s,
            "request_rate": 0,
            "warmup_seconds": trial.warmup_s,
            "steps": list(trial.steps),
            "step_duration_seconds": trial.step_s,
            "measure_last_seconds": trial.measure_s,
            "drain_seconds": 0,  # the pool stops next: its streams need not end (up to 30 s a candidate)
        },
        "workload": {
            "model": candidate.config.engine.client_model_name() or "model",
            "input_tokens": trial.input_tokens,
            "max_output_tokens": trial.output_tokens,
            "ignore_eos": True,
            "tokenize_url": f"{pool.metrics_urls[0].removesuffix('/metrics')}/tokenize",
        },
        "metrics": {
            "sample_interval_ms": 500 if trial.step_s < 20 else 1000,
            "gpu_util": gpu,
            "backend_metrics_urls": pool.metrics_urls,
            "exporter_port": 0,
        },
        "slo": {"ttft_ms": slo_ttft_s * 1000.0, "tpot_ms": slo_tpot_s * 1000.0},
        "output": {"dir": str(out_dir), "run_name": name},
    }
    return json.dumps(settings, indent=2)


def run_real(candidate: Candidate, trial: Trial, out_dir: Path, name: str) -> Result:
    """RuntimeError when the pool did not come up or the load test failed."""
    started = time.monotonic()
    folder = out_dir / name
    pool = CandidatePool(candidate.config, trial.engine, folder / "pool")
    try:
        pool.start()
        settings = folder / "settings.json"
        settings.write_text(harness_settings(pool, trial, candidate, folder, "run"), encoding="utf-8")
        returncode = run_locust(settings, {**os.environ, KEY_ENV: pool.key}, folder / "locust.log", indent="    ")
    finally:
        pool.stop()
    report_path = folder / "run" / "report.json"
    # Locust exits 1 when any request failed: the run still counts (its report says how many).
    if returncode not in (0, 1) or not report_path.exists():
        raise RuntimeError(
            f"the load test of {candidate.label} failed (exit {returncode}); see {folder / 'locust.log'}"
        )
    report = json.loads(report_path.read_text(encoding="utf-8"))
    steps: list[dict[str, Any]] = report["steps"]
    cap = candidate.config.scheduler.max_num_seqs * candidate.config.engine.replicas
    for step in steps:  # vLLM does not say its cap; tune knows the one it started the pool with
        backend = step.setdefault("backend", {})
        if backend.get("max_num_seqs") is None:
            backend["max_num_seqs"] = cap
    diagnosis = diagnose(steps)
    return Result(candidate, steps, diagnosis, time.monotonic() - started, str(folder / "run"))
