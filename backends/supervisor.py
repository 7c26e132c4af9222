"""Run a pool of server processes: each in its own process group, wait for /health
with a deadline, restart the ones that die (exponential back-off), and stop them all,
process groups included, on Ctrl-C / SIGTERM. Shared by the vLLM and the sim engines.

Policy: a replica that dies before it was ever healthy is a start-up failure (a bad
model path, a busy port, out of memory): retrying cannot fix it, so the whole pool
stops with a message that says what to do. One that dies after it was healthy is
restarted; the gateway's health checks take it out of rotation meanwhile.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from zerogap.net import http_ok, port_is_free
from zerogap.process_group import group_alive, new_group_preexec, signal_group

TAIL_LINES = 200
BACKOFF_START_S = 1.0
POLL_S = 0.2
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
class Child:
    spec: ChildSpec
    proc: subprocess.Popen[bytes] | None = None
    state: str = "idle"  # starting, up, backoff, stopped
    ever_up: bool = False
    num_restarts: int = 0
    backoff_s: float = BACKOFF_START_S
    deadline: float = 0.0
    restart_at: float = 0.0
    up_since: float = 0.0
    next_health_at: float = 0.0
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))


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


class StartupFailure(Exception):
    """A replica that cannot come up; str() says what to do."""


class Supervisor:
    def __init__(self, specs: list[ChildSpec], hooks: Hooks, timing: Timing, out: IO[str] | None = None) -> None:
        self.children = [Child(spec) for spec in specs]
        self.hooks = hooks
        self.timing = timing
        self.out = out or sys.stdout
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._announced_ready = False

    # ---- output -------------------------------------------------------------------
    def say(self, message: str) -> None:
        with self._lock:
            self.out.write(f"zerogap backends: {message}\n")
            self.out.flush()

    def _pump(self, child: Child, stream: IO[bytes]) -> None:
        log = child.spec.log_file.open("a", encoding="utf-8") if child.spec.log_file else None
        try:
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                child.tail.append(line)
                self.hooks.on_line(child, line)
                with self._lock:
                    self.out.write(f"[{child.spec.name}] {line}\n")
                    self.out.flush()
                if log:
                    log.write(line + "\n")
                    log.flush()
        finally:
            stream.close()
            if log:
                log.close()

    # ---- one child ----------------------------------------------------------------
    def _spawn(self, child: Child) -> None:
        spec = child.spec
        child.tail.clear()
        self.hooks.on_start(child)
        proc = subprocess.Popen(
            spec.argv,
            env=spec.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as a whole
            preexec_fn=new_group_preexec(),
        )
        child.proc = proc
        child.state = "starting"
        child.deadline = time.monotonic() + self.timing.startup_timeout_s
        child.next_health_at = time.monotonic() + HEALTH_POLL_S
        assert proc.stdout is not None
        threading.Thread(target=self._pump, args=(child, proc.stdout), daemon=True).start()

    def _reap_group(self, child: Child) -> None:
        """After the leader exits: the rest of its group (vLLM's engine core) goes too."""
        if child.proc is None:
            return
        pgid = child.proc.pid
        signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + min(self.timing.stop_timeout_s, 10.0)
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        signal_group(pgid, signal.SIGKILL)

    def _check_starting(self, child: Child, now: float) -> None:
        assert child.proc is not None
        code = child.proc.poll()
        if code is not None:
            self._died(child, code)
            return
        if now >= child.next_health_at:
            child.next_health_at = now + HEALTH_POLL_S
            if http_ok(child.spec.url + child.spec.health_path):
                child.state, child.up_since = "up", now
                was_restart = child.ever_up
                child.ever_up = True
                if was_restart:
                    self.say(f"{child.spec.name} is back up at {child.spec.url} (restart #{child.num_restarts})")
                return
        if now >= child.deadline:
            raise StartupFailure(
                f"{child.spec.name} did not answer {child.spec.health_path} on {child.spec.url} within "
                f"{self.timing.startup_timeout_s:.0f} s. Read its output above; if it is only slow, raise "
                "[engine].startup_timeout_s in config.toml."
            )

    def _died(self, child: Child, code: int | None) -> None:
        self._reap_group(child)
        advice = self.hooks.diagnose(child, code)
        if not child.ever_up:
            head = f"{child.spec.name} exited with code {code} before it was ready"
            raise StartupFailure(f"{head}: {advice}" if advice else f"{head}; its last lines are above.")
        if child.state == "up" and time.monotonic() - child.up_since > 2 * self.timing.backoff_max_s:
            child.backoff_s = BACKOFF_START_S  # it had been healthy for a while: start the back-off over
        child.state = "backoff"
        child.restart_at = time.monotonic() + child.backoff_s
        self.say(
            f"{child.spec.name} exited (code {code}); restarting in {child.backoff_s:.0f} s. "
            "The gateway's health checks keep it out of rotation meanwhile." + (f" Cause: {advice}" if advice else "")
        )
        child.backoff_s = min(child.backoff_s * 2, self.timing.backoff_max_s)

    def _check(self, child: Child, now: float) -> None:
        if child.state == "starting":
            self._check_starting(child, now)
        elif child.state == "up":
            assert child.proc is not None
            code = child.proc.poll()
            if code is not None:
                self._died(child, code)
        elif child.state == "backoff" and now >= child.restart_at:
            if not port_is_free(child.spec.host, child.spec.port):
                child.restart_at = now + 1.0  # the old process may still hold it
                return
            child.num_restarts += 1
            self._spawn(child)

    # ---- the pool -----------------------------------------------------------------
    def request_stop(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self._stop.set()

    def start_all(self) -> None:
        for child in self.children:
            if not port_is_free(child.spec.host, child.spec.port):
                raise StartupFailure(
                    f"port {child.spec.port} on {child.spec.host} is already in use (another program, or "
                    f"replicas still running from an earlier `zerogap backends up`). Stop it, or set "
                    f"[engine].base_port to a free port."
                )
        for child in self.children:
            self._spawn(child)

    def poll_once(self) -> None:
        now = time.monotonic()
        for child in self.children:
            self._check(child, now)
        if not self._announced_ready and all(c.state == "up" for c in self.children):
            self._announced_ready = True
            text = self.hooks.on_ready(self.children)
            with self._lock:  # not interleaved with the replicas' own lines
                self.out.write(text + "\n")
                self.out.flush()

    def run(self) -> int:
        """Until Ctrl-C / SIGTERM (0) or a start-up failure (1). Always stops every child."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self.request_stop)
            signal.signal(signal.SIGTERM, self.request_stop)
        try:
            self.start_all()
            while not self._stop.is_set():
                self.poll_once()
                self._stop.wait(POLL_S)
        except StartupFailure as exc:
            self.say(str(exc))
            self.stop_all()
            return 1
        self.say(f"stopping {len(self.children)} replica(s)")
        self.stop_all()
        self.say("all replicas stopped")
        return 0

    def stop_all(self) -> None:
        groups = [c.proc.pid for c in self.children if c.proc is not None]
        for pgid in groups:
            signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.timing.stop_timeout_s
        while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
            for child in self.children:
                if child.proc is not None:
                    child.proc.poll()  # reap the leader so its group can empty
            time.sleep(0.1)
        for pgid in groups:
            if group_alive(pgid):
                self.say(f"process group {pgid} did not stop within {self.timing.stop_timeout_s:.0f} s: killing it")
                signal_group(pgid, signal.SIGKILL)
        for child in self.children:
            if child.proc is not None:
                child.proc.wait()
            child.state = "stopped"
