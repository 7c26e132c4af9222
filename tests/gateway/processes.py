"""`zerogap gateway` as a real subprocess (optionally --workers N), and reading its /metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

from common.net import wait_for_port
from common.process_group import stop_process
from tests.support import zerogap_cmd

UNIFIED = "unified-proc-secret-9"
START_TIMEOUT_S = 120.0
POLL_S = 0.05


def write_config(path: Path, port: int, upstream_url: str, gateway: dict[str, Any], server: str = "") -> Path:
    lines = [
        "[server]",
        f'port = {port}\napi_key = "{UNIFIED}"\nbase_url = "http://127.0.0.1:{port}/api"\n{server}',
        "[gateway]",
        'key_store = "keys.db"\nhealth_interval_s = 0.2\nload_scrape_interval_s = 0.1',
        *(f"{k} = {json.dumps(v)}" for k, v in gateway.items()),
        "[[backends]]",
        f'name = "b0"\nurl = "{upstream_url}"\nmodel = "m"',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


class GatewayProcess:
    def __init__(self, config: Path, port: int, workers: int = 1, env: dict[str, str] | None = None) -> None:
        self.config, self.port, self.workers = config, port, workers
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = config.with_suffix(f".{port}.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayProcess:
        args = ["gateway", "--config", str(self.config), "--port", str(self.port), "--workers", str(self.workers)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(zerogap_cmd(*args), env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip
        deadline_s = time.monotonic() + START_TIMEOUT_S
        wait_for_port(self.port, START_TIMEOUT_S, self.proc)
        if self.workers > 1:  # the port answers once the first worker listens: wait for the others too
            self._wait_until_serving(deadline_s)
        return self

    def worker_pids(self) -> list[int]:
        assert self.proc is not None
        return sorted(c.pid for c in psutil.Process(self.proc.pid).children())

    def serving(self) -> bool:
        """`workers` workers, each listening on the port (uvicorn listens once its app has started)."""
        pids = self.worker_pids()
        try:
            sockets = [psutil.Process(pid).net_connections("tcp") for pid in pids]
        except psutil.NoSuchProcess:  # one just exited
            return False
        listening = [any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in s) for s in sockets]
        return len(pids) == self.workers and all(listening)

    def _wait_until_serving(self, deadline_s: float) -> None:
        assert self.proc is not None
        while True:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(f"the gateway exited with {code} before its {self.workers} workers listened")
            if self.serving():
                return
            if time.monotonic() > deadline_s:
                raise TimeoutError(f"not all {self.workers} workers listened on port {self.port} in time")
            time.sleep(POLL_S)

    def kill(self) -> None:
        """SIGKILL the gateway and its workers at once (no flush, no drain)."""
        assert self.proc is not None
        procs = [psutil.Process(self.proc.pid), *(psutil.Process(p) for p in self.worker_pids())]
        for p in procs:
            p.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        _, alive = psutil.wait_procs(procs, timeout=10)  # until none of them holds the port
        assert not alive, alive

    def interrupt(self, timeout_s: float = 30) -> int:
        """Ctrl-C as a terminal sends it: SIGINT to the whole process group; the exit code."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGINT)
        return int(self.proc.wait(timeout_s))

    def stop(self) -> int:
        assert self.proc is not None
        stop_process(self.proc, 30)
        return int(self.proc.returncode)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()


def call(url: str, key: str | None = None, body: Any = None, method: str | None = None) -> tuple[int, Any]:
    """One request on a fresh connection; (status, parsed JSON or text)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data, headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def chat(base: str, key: str) -> tuple[int, Any]:
    return call(base + "/v1/chat/completions", key, {"model": "m", "messages": [{"role": "user", "content": "a b c"}]})


def metric_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
