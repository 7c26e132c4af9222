"""deploy/prometheus/run.sh, the documented command: a real Prometheus with zerogap's config,
rules and console dashboards (nothing to scrape here, so every target is down)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.deploy.paths import CONSOLE_PAGES, PROMETHEUS, recording_rules
from tests.tools import require_tool
from zerogap.net import free_port, wait_http_ok
from zerogap.process_group import stop_process


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: str = resp.read().decode()
        return body


def active_targets(base: str, want: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """Prometheus discovers targets a moment after it is ready (file_sd included): poll."""
    deadline = time.monotonic() + timeout_s
    while True:
        targets: list[dict[str, Any]] = json.loads(get(f"{base}/api/v1/targets"))["data"]["activeTargets"]
        if len(targets) >= want or time.monotonic() > deadline:
            return targets
        time.sleep(0.2)


def test_run_sh_serves_rules_targets_and_dashboards(tmp_path: Path) -> None:
    require_tool("prometheus")
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "PROMETHEUS_PORT": str(port), "PROMETHEUS_DATA": str(tmp_path / "data")}
    with (tmp_path / "log").open("wb") as log:
        proc = subprocess.Popen([str(PROMETHEUS / "run.sh")], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{base}/-/ready", 120)
        groups = json.loads(get(f"{base}/api/v1/rules"))["data"]["groups"]
        loaded = {rule["name"] for group in groups for rule in group["rules"]}
        assert loaded == set(recording_rules())
        targets = active_targets(base, want=5)
        jobs = {t["labels"]["job"] for t in targets}
        assert jobs == {"zerogap-gateway", "zerogap-backends", "dcgm", "zerogap-loadtest"}
        backends = {t["labels"].get("backend") for t in targets if t["labels"]["job"] == "zerogap-backends"}
        assert backends == {"replica0", "replica1"}
        for page in CONSOLE_PAGES:
            html = get(f"{base}/consoles/{page}")
            assert "error executing template" not in html.lower()
            assert "zgGraph(" in html
        assert (tmp_path / "data").is_dir()
    finally:
        stop_process(proc)
    assert proc.returncode == 0, (tmp_path / "log").read_text()[-2000:]
