"""The article's files on a real stack: `zerogap backends up --engine sim` and `zerogap
gateway`, both from the article's config.toml, and `locust -f loadtest/` from its
settings.json. The copies change only what the article leaves to the reader (host,
port, base_url) and, for the tests' time, the durations and output length."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.net import free_port
from common.process_group import stop_process
from tests.support import REPO, zerogap_cmd

ARTICLE = REPO / "tests" / "fixtures" / "article"
SECRET = "sk-article-reader-0042"
MODEL = "your-model-name"  # the article's [engine].model: the name the pool serves


def article_config(gateway_port: int, base_port: int, log_interval_s: float = 1.0) -> str:
    """The article's config.toml with its host, port and base_url changed, on free ports;
    log lines every log_interval_s instead of 10 s."""
    text = (ARTICLE / "config.toml").read_text(encoding="utf-8")
    text = text.replace('host = "0.0.0.0"', 'host = "127.0.0.1"').replace("port = 8000", f"port = {gateway_port}")
    text = text.replace('"https://taotoken.net/api"', f'"http://127.0.0.1:{gateway_port}/api"')
    text = text.replace("[engine]\n", f"[engine]\nbase_port = {base_port}\n")
    return text.replace("[logging]\n", f"[logging]\nlog_interval_s = {log_interval_s}\n")


def article_settings(base_url: str, out_dir: Path, run_name: str, **sections: dict[str, Any]) -> dict[str, Any]:
    """The article's settings.json with its base_url changed, a short run (1 s warm-up, 4 s at
    8 users, 32 output tokens), the run folder in out_dir; sections override fields."""
    settings: dict[str, Any] = json.loads((ARTICLE / "settings.json").read_text(encoding="utf-8"))
    settings["api"]["base_url"] = base_url
    settings["load_test"].update(concurrency=8, warmup_seconds=1, duration_seconds=4)
    settings["workload"]["max_output_tokens"] = 32
    settings["output"] = {"dir": str(out_dir), "run_name": run_name}
    settings["metrics"]["exporter_port"] = 0
    for name, values in sections.items():
        settings[name] = {**settings.get(name, {}), **values}
    return settings


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{proc.args!r} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s} s:\n{log.read_text(errors='replace')[-3000:]}")


@dataclass
class Stack:
    workdir: Path
    gateway_port: int
    base_port: int
    backends_log: Path
    gateway_log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}/api"

    @property
    def sim_metrics(self) -> str:
        return f"http://127.0.0.1:{self.base_port}/metrics"

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "TAOTOKEN_API_KEY": SECRET, **extra}


@contextmanager
def article_stack(workdir: Path) -> Iterator[Stack]:
    stack = Stack(workdir, free_port(), free_port(), workdir / "backends.log", workdir / "gateway.log")
    config = workdir / "config.toml"
    config.write_text(article_config(stack.gateway_port, stack.base_port), encoding="utf-8")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with stack.backends_log.open("wb") as sink:
            argv = zerogap_cmd("backends", "up", "--engine", "sim", "--config", str(config))
            backends = subprocess.Popen(argv, cwd=workdir, env=stack.env(), stdout=sink, stderr=subprocess.STDOUT)
        procs.append(backends)
        wait_http(f"http://127.0.0.1:{stack.base_port}/health", backends, stack.backends_log)
        with stack.gateway_log.open("wb") as sink:
            gateway = subprocess.Popen(zerogap_cmd("gateway", "--config", str(config)), cwd=workdir, env=stack.env(),
                                       stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
        procs.append(gateway)
        wait_http(f"http://127.0.0.1:{stack.gateway_port}/ready", gateway, stack.gateway_log)
        yield stack
    finally:
        for proc in reversed(procs):
            stop_process(proc)
