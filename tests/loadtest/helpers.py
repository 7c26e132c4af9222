"""Running the real `locust -f loadtest/` as a subprocess against a real upstream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from loadtest import RunReport
from tests.support import REPO

LOCUST = str(Path(sys.executable).with_name("locust"))


def write_settings(path: Path, base_url: str, out_dir: Path, run_name: str, **sections: dict[str, Any]) -> Path:
    """A small settings.json: tiny steps, no exporter, no key unless a section says so."""
    settings: dict[str, Any] = {
        "api": {"base_url": base_url, "api_key_env": ""},
        "load_test": {"steps": [2, 4], "warmup_seconds": 1, "step_duration_seconds": 4, "measure_last_seconds": 3},
        "workload": {"model": "test-model", "input_tokens": 20, "max_output_tokens": 20},
        "metrics": {"sample_interval_ms": 250, "exporter_port": 0},
        "output": {"dir": str(out_dir), "run_name": run_name},
    }
    for name, values in sections.items():
        settings[name] = {**settings.get(name, {}), **values}
    path.write_text(json.dumps(settings), encoding="utf-8")
    return path


def locust_cmd(settings: Path, *extra: str) -> list[str]:
    return [LOCUST, "-f", str(REPO / "loadtest"), "--headless", "--settings", str(settings), *extra]


def run_locust(
    settings: Path, *extra: str, env: dict[str, str] | None = None, timeout_s: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        locust_cmd(settings, *extra),
        cwd=REPO,
        env=env if env is not None else dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def check_few_failed(result: subprocess.CompletedProcess[str], step: dict[str, Any], share: float) -> None:
    """At most `share` of the step's requests failed, and Locust's exit status agrees: 1 when one
    failed, else 0 (a real engine on 2 busy cores drops a connection now and then)."""
    num_failed = step["requests_failed"]
    assert num_failed <= share * (step["requests_ok"] + num_failed), result.stderr[-3000:]
    assert result.returncode == (1 if num_failed else 0), result.stderr[-3000:]


def read_report(run_dir: Path) -> dict[str, Any]:
    """The run's report.json, validated against its schema (loadtest.RunReport)."""
    report: dict[str, Any] = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    RunReport.model_validate(report)
    return report


def within(measured: float, truth: float, tolerance: float = 0.10) -> bool:
    return abs(measured - truth) <= tolerance * truth
