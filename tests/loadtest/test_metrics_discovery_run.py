"""Issue 24 end to end: the article's settings.json names no metrics URLs, yet a run through a
zerogap gateway has GPU figures and a diagnosis that cites the engines' signals: the harness asks
the gateway for its backends (GET /metrics/backends). Real processes: `zerogap backends up --engine
sim` and `zerogap gateway` from the article's config.toml, `locust -f loadtest/ --headless`."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from tests.article.stack import article_settings, article_stack, write_json
from tests.loadtest.helpers import locust_cmd, read_report
from tests.support import REPO


@pytest.mark.slow
def test_the_articles_settings_through_the_gateway_get_gpu_figures_and_server_signals(tmp_path: Path) -> None:
    with article_stack(tmp_path) as stack:
        settings = article_settings(stack.base_url, tmp_path / "runs", "discovered")  # only shortened
        assert "backend_metrics_urls" not in settings["metrics"]
        done = subprocess.run(locust_cmd(write_json(tmp_path / "settings.json", settings)), cwd=REPO,
                              env=stack.env(), capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"backend metrics from the gateway (http://127.0.0.1:{stack.gateway_port}/metrics/backends): " \
           f"{stack.sim_metrics}" in done.stderr, done.stderr[-3000:]  # fmt: skip
    report = read_report(tmp_path / "runs" / "discovered")
    assert report["run"]["prompt_tokens_from"] == "tokenize"  # the gateway passed /tokenize to the engine
    assert "no /tokenize answered" not in done.stderr
    (step,) = report["steps"]
    assert step["requests_ok"] > 0 and step["not_collected"] == {}
    assert step["gpu_util"] is not None and step["gpu_util"]["mean"] > 0, step.get("gpu_util_reason")
    assert step["backend"]["running_mean"] > 0 and step["backend"]["num_samples"] >= 1
    passed_on = step["backend"]["gateway_inflight_mean"]  # the gateway's own gauge, from its /metrics
    assert passed_on is not None and 0 < passed_on <= step["concurrency"], step["backend"]
    (entry,) = report["diagnosis"]
    assert "no server signals" not in entry["evidence"], entry
    assert "running " in entry["evidence"] and "GPU busy " in entry["evidence"], entry
    with (tmp_path / "runs" / "discovered" / "timeline.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert any(row["gpu_util"] for row in rows) and any(row["gateway_inflight"] for row in rows)
    assert not any("backend_metrics_urls" in row["gpu_util_reason"] for row in rows)
