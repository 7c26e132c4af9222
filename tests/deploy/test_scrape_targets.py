"""deploy/prometheus/scrape_targets.py: Prometheus's targets are what config.toml and settings.json run
(issue 42: with the default one replica, 8101 and DCGM were scraped and always down)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.paths import PROMETHEUS

SCRIPT = PROMETHEUS / "scrape_targets.py"
POOL = """[server]
host = "0.0.0.0"
port = 8300
api_key = "${TAOTOKEN_API_KEY}"
metrics_key = "metrics-key-of-sixteen"
[[backends]]
name = "gpu-a"
url = "http://10.0.0.5:8000"
model = "m"
[[backends]]
name = "gpu-b"
url = "http://10.0.0.6:8001"
model = "m"
"""


def generate(
    tmp_path: Path, config: str, settings: dict[str, Any] | None, *extra: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "config.toml").write_text(config)
    if settings is not None:
        (tmp_path / "settings.json").write_text(json.dumps(settings))
    cmd = [sys.executable, str(SCRIPT), "--out", str(tmp_path / "gen"), *extra]
    env = {"PATH": "/usr/bin:/bin"}  # TAOTOKEN_API_KEY unset: Prometheus may start before it is exported
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)


def jobs(tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    config = yaml.safe_load((tmp_path / "gen" / "prometheus.yml").read_text())
    out = {}
    for job in config["scrape_configs"]:
        (files,) = [c["files"] for c in job["file_sd_configs"]]
        out[job["job_name"]] = [entry for f in files for entry in yaml.safe_load(Path(f).read_text())]
    return out


def test_the_default_config_scrapes_one_replica_and_no_dcgm_without_a_gpu(tmp_path: Path) -> None:
    done = generate(tmp_path, (PROMETHEUS.parent.parent / "config.toml").read_text(), None, "--dcgm", "off")
    assert done.returncode == 0, done.stderr
    assert jobs(tmp_path) == {
        "zerogap-gateway": [{"targets": ["127.0.0.1:8000"]}],
        "zerogap-backends": [{"targets": ["127.0.0.1:8100"], "labels": {"backend": "replica0"}}],
        "zerogap-loadtest": [{"targets": ["127.0.0.1:9646"]}],
    }
    assert "no DCGM exporter" in done.stderr
    rules = yaml.safe_load((tmp_path / "gen" / "prometheus.yml").read_text())["rule_files"]
    assert rules == [str(PROMETHEUS / "rules" / "zerogap.rules.yml")]


def test_a_listed_pool_its_metrics_key_the_exporters_port_and_a_named_dcgm(tmp_path: Path) -> None:
    settings = {"metrics": {"exporter_port": 9700, "exporter_host": "0.0.0.0"}}
    done = generate(tmp_path, POOL, settings, "--dcgm", "10.0.0.5:9400")
    assert done.returncode == 0, done.stderr
    assert jobs(tmp_path) == {
        "zerogap-gateway": [{"targets": ["127.0.0.1:8300"]}],
        "zerogap-backends": [
            {"targets": ["10.0.0.5:8000"], "labels": {"backend": "gpu-a"}},
            {"targets": ["10.0.0.6:8001"], "labels": {"backend": "gpu-b"}},
        ],
        "dcgm": [{"targets": ["10.0.0.5:9400"]}],
        "zerogap-loadtest": [{"targets": ["127.0.0.1:9700"]}],
    }
    config = yaml.safe_load((tmp_path / "gen" / "prometheus.yml").read_text())
    (gateway,) = [job for job in config["scrape_configs"] if job["job_name"] == "zerogap-gateway"]
    key_file = Path(gateway["authorization"]["credentials_file"])
    assert key_file.read_text() == "metrics-key-of-sixteen"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_no_exporter_no_loadtest_job_and_a_bad_config_is_refused(tmp_path: Path) -> None:
    done = generate(tmp_path, POOL, {"metrics": {"exporter_port": 0}}, "--dcgm", "off")
    assert done.returncode == 0 and "zerogap-loadtest" not in jobs(tmp_path)
    bad = generate(tmp_path, "[engine]\nreplicas = 0\n", None)
    assert bad.returncode == 2 and "replicas" in bad.stderr, bad.stderr
