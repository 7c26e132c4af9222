"""deploy/prometheus/run.sh, the documented command: a real Prometheus with zerogap's config,
rules and console dashboards, scraping what config.toml and settings.json describe."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from backends.sim.testing import run_sim_process
from common.net import free_port, wait_http_ok
from common.process_group import stop_process
from tests.deploy.paths import CONSOLE_PAGES, PROMETHEUS, recording_rules
from tests.tools import require_tool


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
    """Run from a folder with a config.toml of one replica and a settings.json: Prometheus scrapes the
    gateway, that one replica (up: a sim serves there) and the load generator at their ports, and no
    DCGM exporter on a machine without a GPU; nothing that config.toml does not run."""
    require_tool("prometheus")
    port, gateway, exporter = free_port(), free_port(), free_port()
    with run_sim_process(model="one") as sim:
        (tmp_path / "config.toml").write_text(
            f'[server]\nport = {gateway}\napi_key = "${{TAOTOKEN_API_KEY}}"\n[engine]\nbase_port = {sim.port}\n'
        )
        (tmp_path / "settings.json").write_text(json.dumps({"metrics": {"exporter_port": exporter}}))
        env = {"PATH": "/usr/bin:/bin", "PROMETHEUS_PORT": str(port), "PROMETHEUS_DATA": str(tmp_path / "data"),
               "PROMETHEUS_GENERATED": str(tmp_path / "gen"), "ZEROGAP_DCGM": "auto"}  # fmt: skip
        with (tmp_path / "log").open("wb") as log:
            proc = subprocess.Popen(
                [str(PROMETHEUS / "run.sh")], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_http_ok(f"{base}/-/ready", 120)
            groups = json.loads(get(f"{base}/api/v1/rules"))["data"]["groups"]
            loaded = {rule["name"] for group in groups for rule in group["rules"]}
            assert loaded == set(recording_rules())
            targets = active_targets(base, want=3)
            scraped = {(t["labels"]["job"], t["labels"].get("backend"), t["scrapeUrl"]) for t in targets}
            assert scraped == {
                ("zerogap-gateway", None, f"http://127.0.0.1:{gateway}/metrics"),
                ("zerogap-backends", "replica0", f"http://127.0.0.1:{sim.port}/metrics"),
                ("zerogap-loadtest", None, f"http://127.0.0.1:{exporter}/metrics"),
            }, scraped
            assert backend_health(base) == "up"
            for page in CONSOLE_PAGES:
                html = get(f"{base}/consoles/{page}")
                assert "error executing template" not in html.lower()
                assert "zgGraph(" in html
            assert (tmp_path / "data").is_dir()
        finally:
            stop_process(proc)
    assert proc.returncode == 0, (tmp_path / "log").read_text()[-2000:]
    assert "scraping: zerogap-gateway" in (tmp_path / "log").read_text()


def backend_health(base: str, timeout_s: float = 30.0) -> str:
    """The backend target's health once Prometheus has scraped it ("unknown" before its first scrape)."""
    deadline = time.monotonic() + timeout_s
    while True:
        targets = json.loads(get(f"{base}/api/v1/targets"))["data"]["activeTargets"]
        (health,) = [t["health"] for t in targets if t["labels"]["job"] == "zerogap-backends"]
        if health != "unknown" or time.monotonic() > deadline:
            return str(health)
        time.sleep(0.5)
