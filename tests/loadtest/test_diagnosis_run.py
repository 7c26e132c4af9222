"""The diagnosis end to end: the real `locust -f loadtest/ --headless` against a real
sim whose batch is capped, read from report.json, the console and report.html."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.sim.testing import run_sim_process
from tests.loadtest.helpers import read_report, run_locust, write_settings


def settings_for(tmp_path: Path, url: str, model: str, name: str, **metrics: object) -> Path:
    return write_settings(
        tmp_path / f"{name}.json", url, tmp_path / "runs", name,
        load_test={"steps": [64], "warmup_seconds": 1, "step_duration_seconds": 4, "measure_last_seconds": 3},
        workload={"model": model, "input_tokens": 64, "max_output_tokens": 16},
        metrics={"backend_metrics_urls": [f"{url}/metrics"], **metrics},
    )  # fmt: skip


@pytest.mark.slow
def test_a_capped_batch_is_diagnosed_and_a_saturated_load_generator_too(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[scheduler]\nmax_num_seqs = 16\n\n[sim]\ntime_scale = 4\n")
    with run_sim_process(model="capped", config=config) as sim:
        result = run_locust(settings_for(tmp_path, sim.url, sim.model, "capped"))
        assert result.returncode == 0, result.stderr[-3000:]
        # The test hook for a saturated load generator: a saturation threshold any CPU use crosses.
        saturated = run_locust(settings_for(tmp_path, sim.url, sim.model, "busy", saturation_cpu_percent=0.01))
    report = read_report(tmp_path / "runs" / "capped")
    (entry,) = report["diagnosis"]
    assert entry["limit"] == "batch_cap", entry
    assert entry["step"] == 0 and entry["concurrency"] == 64
    assert "running 16.0 of a cap of 16" in entry["evidence"], entry  # the cap, from the sim's /v1/models
    assert report["steps"][0]["backend"]["max_num_seqs"] == 16
    assert "limit batch_cap: the batch is full at its cap" in result.stdout
    assert "At the top step (64 users) TPS is limited by batch_cap" in result.stdout
    page = (tmp_path / "runs" / "capped" / "report.html").read_text()
    assert "At the top step (64 users) TPS is limited by batch_cap" in page
    busy = json.loads((tmp_path / "runs" / "busy" / "report.json").read_text())
    assert busy["diagnosis"][0]["limit"] == "load_generator", (busy["diagnosis"], saturated.stderr[-2000:])
    assert "--processes" in busy["diagnosis"][0]["advice"]
