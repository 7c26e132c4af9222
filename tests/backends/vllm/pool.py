"""The real-vLLM tier's shared pieces: the vLLM interpreter (scripts/setup-vllm when
ZEROGAP_VLLM_PYTHON is unset), a tiny-model pool started with `zerogap backends up`,
and the real gateway in front of it, each a subprocess on free ports."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from common.net import wait_http_ok
from common.process_group import stop_process
from common.promtext import sum_samples
from tests.backends.vllm.models import cached_tiny_model
from tests.fixtures.otlp import OtlpReceiver
from tests.support import REPO, zerogap_cmd

UNIFIED = "vllm-tier-unified-key"
KV_TOPIC = "kv"
MODEL = "tiny-llama"
READY_TIMEOUT_S = 300.0
SETUP_TIMEOUT_S = 1800.0


def vllm_interpreter() -> str:
    """ZEROGAP_VLLM_PYTHON (scripts/test exports it), else scripts/setup-vllm (installs once)."""
    python = os.environ.get("ZEROGAP_VLLM_PYTHON")
    if python:
        return python
    result = subprocess.run(
        [str(REPO / "scripts" / "setup-vllm")], capture_output=True, text=True, timeout=SETUP_TIMEOUT_S, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"scripts/setup-vllm failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout.strip().splitlines()[-1]


def write_config(folder: Path, python: str, otlp_url: str = "") -> Path:
    """Every value the gateway and the launcher need; free ports. Not `--enforce-eager`, though
    vLLM's torch.compile warm-up is ~45 of a start's ~65 s on 2 cores: eager, the tiny model's
    engine ran faster than its API server could stream, and the API server closed 18% of the
    connections of 32 users asking 256 tokens (CI, 2026-12-03); compiled, none.
    With otlp_url the replica exports its request spans there (vLLM's --otlp-traces-endpoint, over
    OTLP/HTTP, in batches 0.2 s apart): the tier's trace test reads them."""
    model = cached_tiny_model()  # at one path, so that vLLM's compile cache serves a machine's next run
    (folder / "models").mkdir(parents=True, exist_ok=True)
    (folder / "models" / "tiny").symlink_to(model)  # the tokenizer's files, where the tests read them
    engine_port, gateway_port, kv_port, kv_replay_port = free_ports(4)
    kv_events = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{kv_port}",
                            "replay_endpoint": f"tcp://*:{kv_replay_port}", "topic": KV_TOPIC})  # fmt: skip
    args = ["--kv-events-config", kv_events]  # the KV-event tests subscribe to it (test_kv_events_vllm.py)
    if otlp_url:
        args += ["--otlp-traces-endpoint", f"{otlp_url}/v1/traces"]
    traces = f"extra_args = {json.dumps(args)}"
    otel_env = ', OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "http/protobuf", OTEL_BSP_SCHEDULE_DELAY = "200"'
    text = f"""
[server]
port = {gateway_port}
api_key = "{UNIFIED}"
base_url = "http://127.0.0.1:{gateway_port}/api"

[gateway]
key_store = "keys.db"
health_interval_s = 0.2
load_scrape_interval_s = 0.2

[engine]
model = "{model}"
served_model_name = "{MODEL}"
base_port = {engine_port}
python = "{python}"
max_model_len = 4096
startup_timeout_s = {READY_TIMEOUT_S}
restart_backoff_max_s = 2
stop_timeout_s = 20
env = {{ VLLM_CPU_KVCACHE_SPACE = "1"{otel_env if otlp_url else ""} }}
{traces}

[token_interval]
async_scheduling = true
"""
    path = folder / "config.toml"
    path.write_text(text)
    return path


@dataclass
class Pool:
    folder: Path
    config: Path
    backends: subprocess.Popen[bytes]
    gateway: subprocess.Popen[bytes] | None
    engine_port: int
    gateway_port: int
    log: IO[str]
    otlp: OtlpReceiver | None = None  # where the replica's spans go

    @property
    def output(self) -> str:
        return (self.folder / "backends.log").read_text(errors="replace")

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"

    def wait_output(self, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if needle in self.output:
                return
            if self.backends.poll() is not None:
                pytest.fail(f"zerogap backends up exited ({self.backends.returncode}):\n{self.output[-4000:]}")
            time.sleep(0.25)
        pytest.fail(f"no {needle!r} in the launcher's output within {timeout_s} s:\n{self.output[-4000:]}")


def free_ports(n: int) -> list[int]:
    """n free ports, all different (each held while the next is picked)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def kv_events_ports(config: Path) -> tuple[int, int]:
    """The replica's KV-event publisher and replay ports."""
    found = re.search(r'tcp://\*:(\d+)\\", \\"replay_endpoint\\": \\"tcp://\*:(\d+)', config.read_text())
    assert found, "no --kv-events-config in the tier's config"
    return int(found.group(1)), int(found.group(2))


def ports_of(config: Path) -> tuple[int, int]:
    text = config.read_text()
    engine = re.search(r"base_port = (\d+)", text)
    gateway = re.search(r"^port = (\d+)", text, re.M)
    assert engine and gateway
    return int(engine.group(1)), int(gateway.group(1))


def launch_pool(folder: Path) -> Pool:
    """`zerogap backends up` started; the replica is not ready yet (see until_ready)."""
    otlp = OtlpReceiver().start()
    config = write_config(folder, vllm_interpreter(), otlp.url)
    engine_port, gateway_port = ports_of(config)
    log = (folder / "backends.log").open("w")
    cmd = zerogap_cmd("backends", "up", "--engine", "vllm", "--config", str(config))
    backends = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
    return Pool(folder, config, backends, None, engine_port, gateway_port, log, otlp)


def until_ready(pool: Pool) -> Pool:
    """Waits for the launched replica, then starts the gateway in front of it (once)."""
    if pool.gateway is not None:
        return pool
    pool.wait_output("zerogap backends: ready:", READY_TIMEOUT_S)
    gateway_log = (pool.folder / "gateway.log").open("w")
    pool.gateway = subprocess.Popen(
        zerogap_cmd("gateway", "--config", str(pool.config)),
        stdout=gateway_log,
        stderr=subprocess.STDOUT,
        cwd=pool.folder,
    )
    gateway_log.close()
    wait_http_ok(pool.gateway_url + "/ready", 120)
    return pool


def start_pool(folder: Path) -> Pool:
    return until_ready(launch_pool(folder))


def stop_pool(pool: Pool) -> int | None:
    if pool.gateway is not None:
        stop_process(pool.gateway)
    stop_process(pool.backends, timeout_s=60)
    pool.log.close()
    if pool.otlp is not None:
        pool.otlp.stop()
    return pool.backends.returncode


def replica_group(pool: Pool) -> tuple[int, set[int]]:
    """The vLLM replica's leader pid and every pid in its process group."""
    (leader,) = psutil.Process(pool.backends.pid).children()  # one replica: one child
    group = {p.pid for p in psutil.process_iter() if _pgid(p.pid) == leader.pid}
    return leader.pid, group


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def stop_pool_checked(pool: Pool) -> None:
    """SIGTERM to `zerogap backends up` ends it with 0 and leaves no process of the replica behind."""
    if pool.gateway is not None:
        stop_process(pool.gateway)
    try:
        _, group = replica_group(pool)
        pool.backends.send_signal(signal.SIGTERM)
        assert pool.backends.wait(60) == 0
        assert "all replicas stopped" in pool.output
        orphans = [pid for pid in group if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        assert not orphans, f"processes outlived the stop: {orphans}"
    finally:
        stop_process(pool.backends, timeout_s=60)
        pool.log.close()
        if pool.otlp is not None:
            pool.otlp.stop()


def post(url: str, body: dict[str, Any], timeout_s: float = 60) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {UNIFIED}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        result: dict[str, Any] = json.load(response)
        return result


def metric(base_url: str, name: str, labels: dict[str, str] | None = None, absent: float | None = None) -> float:
    """Sum of a metric over its label sets that include `labels`, from base_url's /metrics (the
    replica's or the gateway's); `absent` when there is no such sample (None: that fails the test)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    total = sum_samples(text, name, labels)
    if total is None:
        if absent is not None:
            return absent
        raise AssertionError(f"{name} {labels or ''} not in {base_url}/metrics")
    return total
