"""Run the stepped Locust harness (`locust -f loadtest/ --headless --settings F`) as a
child process: its output into a log, its line per step (and the reason a run stopped early)
onto the console, Ctrl-C / SIGTERM never leaving it running. Used by `zerogap demo` and `zerogap tune`."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import loadtest
from zerogap.interrupts import interrupts_deferred, raise_if_deferred

RELAYED = ("zerogap step", "zerogap loadtest: ", "Fix: ")  # each step's final line; why a run stopped, and the fix


def _relay_progress(proc: subprocess.Popen[str], log_path: Path, indent: str) -> None:
    """The harness's output into its log; its line per step (not the lines every few seconds) and the
    reason a run stopped early onto the console."""
    assert proc.stdout is not None
    with log_path.open("w", encoding="utf-8") as log:
        for line in proc.stdout:
            log.write(line)
            if line.startswith(RELAYED):
                print(indent + line.rstrip(), flush=True)


def run_locust(settings: Path, env: Mapping[str, str], log_path: Path, indent: str = "  ") -> int:
    """One headless stepped run; returns Locust's exit status (1: some request failed)."""
    locust_dir = Path(next(iter(loadtest.__path__))).resolve()
    argv = [sys.executable, "-m", "locust", "-f", str(locust_dir), "--headless", "--settings", str(settings)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with interrupts_deferred():  # a Ctrl-C now lands after `proc` exists, so it is never left running
        proc = subprocess.Popen(
            argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        relay = threading.Thread(target=_relay_progress, args=(proc, log_path, indent), daemon=True)
        relay.start()
    try:
        raise_if_deferred()
        while proc.poll() is None:  # the main thread stays free to take Ctrl-C / SIGTERM
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(30)
        relay.join(5)
        if proc.stdout is not None and not relay.is_alive():
            proc.stdout.close()
    return proc.returncode
