"""Run a pool of server processes (the replicas of `zerogap backends up`, shared by the vLLM and the
sim engines) on the shared supervisor core (common/supervisor.py: process groups, restarts with
exponential back-off, the stop on Ctrl-C / SIGTERM). What is a replica's own: its /health wait with
a deadline, its output (printed with its name, kept as a tail, optionally logged to a file), and the
messages.

Policy: a replica that dies before it was ever healthy is a start-up failure (a bad
model path, a busy port, out of memory): retrying cannot fix it, so the whole pool
stops with a message that says what to do. One that dies after it was healthy is
restarted; the gateway's health checks take it out of rotation meanwhile.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from common.net import http_ok, port_is_free
from common.process_group import popen_in_group
from common.supervisor import ProcessSupervisor, RestartPolicy, Slot, StartupFailure

__all__ = ["Child", "ChildSpec", "Hooks", "StartupFailure", "Supervisor", "Timing"]

TAIL_LINES = 200
BACKOFF_START_S = 1.0
HEALTH_POLL_S = 0.5


@dataclass
class ChildSpec:
    name: str
    argv: list[str]
    host: str
    port: int
    env: dict[str, str]
    health_path: str = "/health"
    log_file: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class Child(Slot):
    spec: ChildSpec
    next_health_at: float = 0.0
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))

    def __post_init__(self) -> None:
        self.name = self.spec.name


@dataclass
class Hooks:
    """What differs between engines: reading their output and explaining their failures
    (diagnose: advice from the child's last lines, "" when nothing is recognised)."""

    on_line: Callable[[Child, str], None] = lambda child, line: None
    diagnose: Callable[[Child, int | None], str] = lambda child, code: ""
    on_ready: Callable[[list[Child]], str] = lambda children: ""  # text to print once all are up
    on_start: Callable[[Child], None] = lambda child: None


@dataclass
class Timing:
    startup_timeout_s: float = 900.0
    backoff_max_s: float = 60.0
    stop_timeout_s: float = 30.0


class Supervisor(ProcessSupervisor[Child]):
    def __init__(self, specs: list[ChildSpec], hooks: Hooks, timing: Timing, out: IO[str] | None = None) -> None:
        policy = RestartPolicy(
            backoff_start_s=BACKOFF_START_S,
            backoff_max_s=timing.backoff_max_s,
            retry_once_ready=True,  # one that was healthy before failed for a passing reason: try again
            ready_timeout_s=timing.startup_timeout_s,
            stop_grace_s=timing.stop_timeout_s,
        )
        super().__init__([Child(spec) for spec in specs], policy)
        self.hooks = hooks
        self.timing = timing
        self.out = out or sys.stdout
        self._lock = threading.Lock()
        self._announced_ready = False
        self._advice: dict[str, str] = {}

    # ---- output -------------------------------------------------------------------
    def say(self, message: str) -> None:
        self._write(f"zerogap backends: {message}")

    def _write(self, text: str) -> None:
        with self._lock:  # not interleaved with the replicas' own lines
            self.out.write(text + "\n")
            self.out.flush()

    def _pump(self, child: Child, stream: IO[bytes]) -> None:
        log = child.spec.log_file.open("a", encoding="utf-8") if child.spec.log_file else None
        try:
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                child.tail.append(line)
                self.hooks.on_line(child, line)
                self._write(f"[{child.spec.name}] {line}")
                if log:
                    log.write(line + "\n")
                    log.flush()
        finally:
            stream.close()
            if log:
                log.close()

    # ---- the core's questions -------------------------------------------------------
    def spawn(self, child: Child) -> subprocess.Popen[bytes]:
        child.tail.clear()
        self.hooks.on_start(child)
        proc = popen_in_group(child.spec.argv, child.spec.env, capture_output=True)
        child.next_health_at = time.monotonic() + HEALTH_POLL_S
        assert proc.stdout is not None
        threading.Thread(target=self._pump, args=(child, proc.stdout), daemon=True).start()
        return proc

    def is_ready(self, child: Child, now: float) -> bool:
        if now < child.next_health_at:
            return False
        child.next_health_at = now + HEALTH_POLL_S
        return http_ok(child.spec.url + child.spec.health_path)

    def on_up(self, child: Child, again: bool) -> None:
        if again:
            self.say(f"{child.spec.name} is back up at {child.spec.url} (restart #{child.num_restarts})")

    def not_ready_message(self, child: Child) -> str:
        return (
            f"{child.spec.name} did not answer {child.spec.health_path} on {child.spec.url} within "
            f"{self.timing.startup_timeout_s:.0f} s. Read its output above; if it is only slow, raise "
            "[engine].startup_timeout_s in config.toml."
        )

    def on_exit(self, child: Child, code: int | None) -> None:
        self._advice[child.spec.name] = self.hooks.diagnose(child, code)

    def failed_start_message(self, child: Child, code: int | None) -> str:
        advice = self._advice[child.spec.name]
        head = f"{child.spec.name} exited with code {code} before it was ready"
        return f"{head}: {advice}" if advice else f"{head}; its last lines are above."

    def on_restart(self, child: Child, code: int | None, delay_s: float) -> None:
        advice = self._advice[child.spec.name]
        self.say(
            f"{child.spec.name} exited (code {code}); restarting in {delay_s:.0f} s. "
            "The gateway's health checks keep it out of rotation meanwhile." + (f" Cause: {advice}" if advice else "")
        )

    def may_restart(self, child: Child) -> bool:
        return port_is_free(child.spec.host, child.spec.port)  # the old process may still hold it

    def on_kill(self, child: Child) -> None:
        assert child.proc is not None
        self.say(f"process group {child.proc.pid} did not stop within {self.timing.stop_timeout_s:.0f} s: killing it")

    def report(self, message: str) -> None:
        self.say(message)

    def on_stopping(self) -> None:
        self.say(f"stopping {len(self.children)} replica(s)")

    def on_stopped(self, asked: bool) -> None:
        if asked:
            self.say("all replicas stopped")

    # ---- the pool -----------------------------------------------------------------
    def start_all(self) -> None:
        for child in self.children:
            if not port_is_free(child.spec.host, child.spec.port):
                raise StartupFailure(
                    f"port {child.spec.port} on {child.spec.host} is already in use (another program, or "
                    f"replicas still running from an earlier `zerogap backends up`). Stop it, or set "
                    f"[engine].base_port to a free port."
                )
        super().start_all()

    def poll_once(self) -> None:
        super().poll_once()
        if not self._announced_ready and all(c.state == "up" for c in self.children):
            self._announced_ready = True
            self._write(self.hooks.on_ready(self.children))
