"""A live zerogap stack for the dashboard tests, all real processes on free loopback ports:
simulated engines (`zerogap sim`), the gateway (`zerogap gateway`) with virtual keys made by
`zerogap keys create`, the Locust harness (`locust -f loadtest/ --headless`), and Debian's
Prometheus running a generated copy of deploy/prometheus/prometheus.yml (same jobs and rules,
targets moved to the live ports)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.net import free_port, wait_for_port, wait_http_ok
from common.process_group import stop_process
from tests.deploy.paths import CONSOLES, LIBRARIES, PROMETHEUS, REPO
from tests.support import zerogap_cmd
from tests.tools import require_tool

MODEL = "tiny-sim"
UNIFIED_KEY = "sk-deploy-live-unified"
METRICS_KEY = "metrics-deploy-live-key"  # [server].metrics_key; Prometheus sends it from a file


@dataclass
class Stack:
    workdir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    sims: dict[str, int] = field(default_factory=dict)  # backend name -> port
    gateway_port: int = 0
    prometheus_port: int = 0
    loadtest_port: int = 0
    keys: dict[str, str] = field(default_factory=dict)  # key name -> secret
    metrics_key: str = ""  # the gateway's [server].metrics_key, when it has one

    @property
    def metrics_auth(self) -> dict[str, str]:
        """The header GET /metrics of the gateway needs."""
        return {"Authorization": f"Bearer {self.metrics_key}"} if self.metrics_key else {}

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    def spawn(
        self, name: str, cmd: list[str], port: int, timeout_s: float = 120.0, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = self.workdir / f"{name}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        try:
            wait_for_port(port, timeout_s, proc)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{name} did not start: {exc}\n{log.read_text(errors='replace')[-3000:]}") from exc
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)

    def tail_logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in self.logs if p.exists())


def start_sim(stack: Stack, name: str, scheduling: str) -> subprocess.Popen[bytes]:
    port = free_port()
    stack.sims[name] = port
    cmd = zerogap_cmd("sim", "--config", str(stack.workdir / "sim.toml"), "--port", str(port), "--model", MODEL)
    return stack.spawn(name, [*cmd, "--scheduling", scheduling, "--time-scale", "1"], port)


def gateway_config(stack: Stack) -> str:
    lines = [
        "[server]",
        'host = "127.0.0.1"',
        f"port = {stack.gateway_port}",
        f'api_key = "{UNIFIED_KEY}"',
        f'base_url = "{stack.gateway_url}/api"',
        f'metrics_key = "{stack.metrics_key}"',
        "[gateway]",
        'key_store = "keys.db"',
        "health_interval_s = 5",  # a killed backend is found by the requests that fail on it
        "max_retries = 2",
        # the Routing dashboards read its decisions and its match ratio (cache_aware, the hash that
        # holds across processes, knows no engine's cache contents: it records no match ratio)
        'routing = "cache_aware_local"',
    ]
    for name, port in stack.sims.items():
        lines += ["[[backends]]", f'name = "{name}"', f'url = "http://127.0.0.1:{port}"', f'model = "{MODEL}"']
    return "\n".join(lines) + "\n"


def create_key(stack: Stack, name: str, *flags: str) -> str:
    cmd = zerogap_cmd("keys", "--config", str(stack.workdir / "gateway.toml"), "create", "--name", name, *flags)
    done = subprocess.run(cmd, cwd=stack.workdir, capture_output=True, text=True, timeout=60, check=True)
    secret = done.stdout.strip().splitlines()[-1]
    stack.keys[name] = secret
    return secret


def start_gateway(stack: Stack) -> None:
    stack.gateway_port = free_port()
    stack.metrics_key = METRICS_KEY
    (stack.workdir / "gateway.toml").write_text(gateway_config(stack))
    create_key(stack, "team-a")
    create_key(stack, "limited", "--rpm", "2")
    stack.spawn("gateway", zerogap_cmd("gateway", "--config", str(stack.workdir / "gateway.toml")), stack.gateway_port)
    wait_http_ok(f"{stack.gateway_url}/ready", 120)


def start_locust(stack: Stack, steps: list[int], step_s: float) -> subprocess.Popen[bytes]:
    """The real harness, `locust -f loadtest/ --headless`, streaming through the unified key;
    its exporter (zerogap_loadtest_*) on a free port (stack.loadtest_port, when one was chosen before)."""
    stack.loadtest_port = stack.loadtest_port or free_port()
    load_test = {"warmup_seconds": 0, "steps": steps, "step_duration_seconds": step_s}
    load_test["measure_last_seconds"] = step_s / 2
    settings: dict[str, Any] = {
        "api": {"base_url": f"{stack.gateway_url}/api", "api_key_env": "ZEROGAP_LIVE_KEY"},
        "load_test": load_test,
        "workload": {
            "model": MODEL,
            "input_tokens": 32,
            "max_output_tokens": 24,
            "prompt_tokens_from": "approx",
            "prefix_groups": 4,  # shared prefixes: affinity decisions and prefix-cache hits on the dashboards
            "prefix_tokens": 128,
        },
        "metrics": {
            "backend_metrics_urls": [f"http://127.0.0.1:{port}/metrics" for port in stack.sims.values()],
            "exporter_port": stack.loadtest_port,
        },
        "output": {"dir": str(stack.workdir / "runs")},
    }
    path = stack.workdir / "settings.json"
    path.write_text(json.dumps(settings))
    cmd = [sys.executable, "-m", "locust", "-f", str(REPO / "loadtest"), "--headless", "--settings", str(path)]
    env = {**os.environ, "ZEROGAP_LIVE_KEY": UNIFIED_KEY}
    return stack.spawn("locust", cmd, stack.loadtest_port, timeout_s=60, env=env)


def prometheus_config(stack: Stack, interval: str = "1s") -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with the live targets, a 1 s interval and absolute rule paths;
    the gateway job sends the gateway's metrics key (from a file, as compose and k8s do)."""
    config: dict[str, Any] = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    config["global"].update(scrape_interval=interval, evaluation_interval=interval)
    config["rule_files"] = [str((PROMETHEUS / f).resolve()) for f in config["rule_files"]]
    dead = f"127.0.0.1:{free_port()}"  # no DCGM exporter here: a closed port
    targets: dict[str, list[dict[str, Any]]] = {
        "zerogap-gateway": [{"targets": [f"127.0.0.1:{stack.gateway_port}"]}],
        "zerogap-backends": [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"backend": name}} for name, port in stack.sims.items()
        ],
        "dcgm": [{"targets": [dead]}],
        "zerogap-loadtest": [{"targets": [f"127.0.0.1:{stack.loadtest_port}" if stack.loadtest_port else dead]}],
    }
    for job in config["scrape_configs"]:
        job.pop("file_sd_configs", None)
        job["static_configs"] = targets[job["job_name"]]
    if stack.metrics_key:
        key_file = stack.workdir / "metrics-key"
        key_file.write_text(stack.metrics_key)
        key_file.chmod(0o600)
        (gateway,) = [job for job in config["scrape_configs"] if job["job_name"] == "zerogap-gateway"]
        gateway["authorization"] = {"credentials_file": str(key_file)}
    return config


def start_prometheus(stack: Stack, interval: str = "1s") -> None:
    binary = require_tool("prometheus")
    stack.prometheus_port = free_port()
    config = stack.workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(stack, interval), sort_keys=False))
    consoles = stack.workdir / "consoles"  # a copy, so that a test can add a page of its own
    shutil.copytree(CONSOLES, consoles)
    cmd = [
        binary,
        f"--config.file={config}",
        f"--web.listen-address=127.0.0.1:{stack.prometheus_port}",
        f"--web.console.templates={consoles}",
        f"--web.console.libraries={LIBRARIES}",
        f"--storage.tsdb.path={stack.workdir / 'tsdb'}",
    ]
    stack.spawn("prometheus", cmd, stack.prometheus_port)
    wait_http_ok(f"{stack.prometheus_url}/-/ready", 120)


def prom_api(stack: Stack, path: str, **params: str) -> Any:
    """GET Prometheus's HTTP API; returns its `data`, or raises with its error."""
    url = f"{stack.prometheus_url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:
        body = json.load(exc)
    if body.get("status") != "success":
        raise AssertionError(f"{params}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def repo_relative(path: Path) -> str:
    return str(path.relative_to(REPO))
