"""Running the real `locust -f loadtest/` as a subprocess against a real upstream."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from common.net import free_port
from loadtest import RunReport
from tests.fixtures.upstream import Seen
from tests.support import REPO

LOCUST = str(Path(sys.executable).with_name("locust"))


def write_settings(path: Path, base_url: str, out_dir: Path, run_name: str, **sections: dict[str, Any]) -> Path:
    """A small settings.json: tiny steps, no exporter, no key unless a section says so, and no PNGs
    (output.plots: matplotlib's import and two plots are ~3 s of CPU a run, and few of the runs here
    look at them; tests/loadtest/test_report.py draws them)."""
    settings: dict[str, Any] = {
        "api": {"base_url": base_url, "api_key_env": ""},
        "load_test": {"steps": [2, 4], "warmup_seconds": 1, "step_duration_seconds": 4, "measure_last_seconds": 3},
        "workload": {"model": "test-model", "input_tokens": 20, "max_output_tokens": 20},
        "metrics": {"sample_interval_ms": 250, "exporter_port": 0},
        "output": {"dir": str(out_dir), "run_name": run_name, "plots": False},
    }
    for name, values in sections.items():
        settings[name] = {**settings.get(name, {}), **values}
    path.write_text(json.dumps(settings), encoding="utf-8")
    return path


def locust_cmd(settings: Path, *extra: str) -> list[str]:
    if "--processes" in extra:  # the master's port, 5557 by default, free for tests run side by side
        port = str(free_port())  # the forked workers dial --master-port
        extra = (*extra, "--master-bind-port", port, "--master-port", port)
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
    failed in the step, or outside its window (its error report then lists it), else 0 (a real
    engine on 2 busy cores drops a connection now and then)."""
    num_failed = step["requests_failed"]
    assert num_failed <= share * (step["requests_ok"] + num_failed), result.stderr[-3000:]
    failed_in_run = num_failed > 0 or re.search(r"^\s*[1-9]\d*\s+POST ", result.stderr, re.MULTILINE) is not None
    assert result.returncode == (1 if failed_in_run else 0), result.stderr[-3000:]


def read_report(run_dir: Path) -> dict[str, Any]:
    """The run's report.json, validated against its schema (loadtest.RunReport)."""
    report: dict[str, Any] = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    RunReport.model_validate(report)
    return report


def within(measured: float, truth: float, tolerance: float = 0.10) -> bool:
    return abs(measured - truth) <= tolerance * truth


@dataclass(frozen=True)
class Truth:
    """A step's figures as the upstream lived them (tests/fixtures/upstream records its own timing):
    its sleeps overshoot on a busy machine, so the nominal schedule is not the truth."""

    num_requests: int  # finished in the step's window
    num_tokens: frozenset[int]  # the output lengths of those requests
    ttft_ms: float  # p50
    tpot_ms: float  # p50
    output_tps: float  # tokens written in the window / its duration


def upstream_truth(seen: list[Seen], report: dict[str, Any], step: dict[str, Any]) -> Truth:
    end = report["run"]["started_unix_s"] + step["end_s"]
    start = end - step["duration_s"]
    inside = [s for s in seen if s.finished and s.done_wall is not None and start <= s.done_wall < end]
    assert inside, f"the upstream finished no request in step {step['index']}'s window"
    written = sum(num for s in seen for wall, num in s.chunk_walls if start <= wall < end)
    return Truth(
        num_requests=len(inside),
        num_tokens=frozenset(s.num_tokens_sent for s in inside),
        ttft_ms=median(1000 * (s.ttft_s or 0.0) for s in inside),
        tpot_ms=median(1000 * (s.tpot_s or 0.0) for s in inside),
        output_tps=written / step["duration_s"],
    )
