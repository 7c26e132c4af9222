"""`zerogap demo` end to end, as a user runs it: real sims, a real gateway and the real
Locust harness in subprocesses, with short steps so the test stays quick."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import zerogap_cmd

SHORT = ["--steps", "4,16", "--step-seconds", "8", "--measure-seconds", "6", "--warmup-seconds", "1"]


def _ports_in(text: str) -> list[int]:
    gateway = re.search(r"gateway on http://127\.0\.0\.1:(\d+)", text)
    sims = re.search(r"sims on ports \[(\d+), (\d+)\]", text)
    assert gateway and sims, text
    return [int(gateway.group(1)), int(sims.group(1)), int(sims.group(2))]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_demo_compares_the_two_pools_and_stops_everything(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run(
        zerogap_cmd("demo", "--out", str(out), "--time-scale", "4", *SHORT),
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert f"report at {out / 'report.html'}" in result.stdout
    for name in ("baseline", "zerogap"):
        assert f"{name} (" in result.stdout
        report = json.loads((out / name / "report.json").read_text())
        assert [s["concurrency"] for s in report["steps"]] == [4, 16]
        assert all(s["output_tps"] > 0 for s in report["steps"])
    baseline = json.loads((out / "baseline" / "report.json").read_text())["steps"][-1]
    zerogap = json.loads((out / "zerogap" / "report.json").read_text())["steps"][-1]
    assert zerogap["output_tps"] > 1.2 * baseline["output_tps"]
    assert zerogap["gpu_util"]["mean"] > baseline["gpu_util"]["mean"] + 15
    assert (out / "compare.png").stat().st_size > 10_000
    assert "zerogap / baseline TPS:" in result.stdout
    time.sleep(0.5)
    assert not any(_listening(port) for port in _ports_in(result.stdout))


@pytest.mark.slow
def test_demo_ctrl_c_stops_everything_it_started(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        zerogap_cmd("demo", "--out", str(tmp_path / "demo"), *SHORT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + 60
    while "== baseline" not in seen and time.monotonic() < deadline:
        seen += proc.stdout.readline()
    ports = _ports_in(seen)
    assert all(_listening(port) for port in ports)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "interrupted; stopping everything" in err
    assert "Traceback" not in out + err
    assert not any(_listening(port) for port in ports)
    left = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]
    assert left == [], left


def test_demo_rejects_bad_steps() -> None:
    result = subprocess.run(zerogap_cmd("demo", "--steps", "0,x"), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "give positive concurrencies" in result.stderr
    assert "Traceback" not in result.stderr
