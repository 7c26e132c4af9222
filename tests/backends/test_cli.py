"""`zerogap backends up` as users run it: a real subprocess, real simulated engines on
free ports, real signals. Failures a user causes end in a message, not a traceback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from common.net import free_port
from common.process_group import stop_process
from tests.support import wait_until, zerogap_cmd


def write_config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(body)
    return path


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(zerogap_cmd("backends", *args), capture_output=True, text=True, timeout=60, cwd=cwd)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def test_missing_config_file(tmp_path) -> None:
    result = run("up", "--config", str(tmp_path / "nope.toml"), cwd=tmp_path)
    assert result.returncode == 2
    assert "no such file" in result.stderr and "Traceback" not in result.stderr


def test_missing_model_path(tmp_path) -> None:
    config = write_config(tmp_path, f'[engine]\nmodel = "models/tiny"\nbase_port = {free_port()}\n')
    (tmp_path / "models").mkdir()
    result = run("up", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "zerogap tiny-model models/tiny" in result.stderr
    assert "Traceback" not in result.stderr


def test_vllm_not_installed(tmp_path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    body = f'[engine]\nmodel = "m"\npython = "{sys.executable}"\nbase_port = {free_port()}\n'
    result = run("up", "--config", str(write_config(tmp_path, body)), cwd=tmp_path)
    assert result.returncode == 2
    assert "vLLM is not installed" in result.stderr and "scripts/setup-vllm" in result.stderr


def test_busy_port(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = write_config(tmp_path, f'[engine]\nmodel = "tiny"\nbase_port = {port}\n')
        result = run("up", "--engine", "sim", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.stdout
    assert "[engine].base_port" in result.stdout


def replica_pids(up: psutil.Process) -> dict[int, int]:
    """port -> pid of each `zerogap sim` child."""
    pids = {}
    for child in up.children():
        cmd = child.cmdline()
        if "--port" in cmd:
            pids[int(cmd[cmd.index("--port") + 1])] = child.pid
    return pids


@pytest.mark.slow
def test_sim_pool_restarts_a_killed_replica_and_stops_clean(tmp_path) -> None:
    base = free_port()
    while not all(_free(base + i) for i in range(2)):
        base = free_port()
    config = write_config(
        tmp_path,
        f'[engine]\nmodel = "tiny"\nserved_model_name = "tiny-llama"\nreplicas = 2\nbase_port = {base}\n'
        "restart_backoff_max_s = 4\n",
    )
    log = (tmp_path / "up.log").open("w")
    cmd = zerogap_cmd("backends", "up", "--engine", "sim", "--config", str(config), "--log-dir", str(tmp_path))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    output = lambda: (tmp_path / "up.log").read_text()  # noqa: E731
    try:
        wait_until(lambda: "ready: 2 replica(s) of 'tiny-llama'" in output(), "the pool", 60)
        for port in (base, base + 1):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                assert [m["id"] for m in json.load(r)["data"]] == ["tiny-llama"]
        pids = replica_pids(psutil.Process(proc.pid))
        assert sorted(pids) == [base, base + 1]
        os.kill(pids[base + 1], signal.SIGKILL)
        wait_until(lambda: "replica1 exited (code -9); restarting in 1 s" in output(), "the restart notice", 10)
        wait_until(lambda: "replica1 is back up" in output(), "the restart", 30)
        assert healthy(base + 1) and healthy(base)
        assert (tmp_path / "replica1.log").exists()
        survivors = list(replica_pids(psutil.Process(proc.pid)).values())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        stop_process(proc)
        log.close()
    assert "all replicas stopped" in output()
    assert not [pid for pid in survivors if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not healthy(base) and not healthy(base + 1)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.slow
def test_replicas_do_not_outlive_a_killed_launcher(tmp_path) -> None:
    """SIGKILL leaves no chance to clean up: the kernel's parent-death signal stops the replica."""
    port = free_port()
    config = write_config(tmp_path, f'[engine]\nmodel = "tiny"\nbase_port = {port}\n')
    cmd = zerogap_cmd("backends", "up", "--engine", "sim", "--config", str(config))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        wait_until(lambda: healthy(port), "the sim replica", 60)
        (replica,) = replica_pids(psutil.Process(proc.pid)).values()
        proc.kill()
        proc.wait(10)
        wait_until(lambda: not psutil.pid_exists(replica) or psutil.Process(replica).status() == "zombie", "exit", 15)
    finally:
        stop_process(proc)
    assert not healthy(port)
