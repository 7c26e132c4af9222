"""One supervisor of child processes, shared by `zerogap gateway --workers N` (gateway/workers.py) and
`zerogap backends up` (backends/supervisor.py); a subclass says how to start a child and what to tell
the user, this core does the rest:

- start: each child leads its own process group (common/process_group.py). It is "starting" until
  is_ready() says so (at once by default), then "up"; not ready within ready_timeout_s: give up.
- restart: a child that exits has the rest of its group stopped, then is started again after its
  back-off (from backoff_start_s, doubled each time up to backoff_max_s; started over once it had
  been up for 2 x backoff_max_s).
- failed starts: an exit before the child was ready, or within settle_s of its start, is a failed
  start; max_failed_starts of them in a row (over all children; an exit that is not one starts the
  count over) and the supervisor gives up (StartupFailure, whose text says what to do). With
  retry_once_ready, a child that has been ready before is retried however its restarts fail.
- stop: the first SIGINT / SIGTERM (or request_stop()) ends the watch: SIGTERM to every group,
  stop_grace_s to exit, then SIGKILL of every group still there. A second one is forwarded to every
  group at once (a gateway worker takes it as "do not wait for the drain").
"""

from __future__ import annotations

import math
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Generic, TypeVar

from common.process_group import group_alive, signal_group

POLL_S = 0.2
PORT_RETRY_S = 1.0  # may_restart() said "not yet" (the old process may still hold its port)
REAP_GRACE_S = 10.0  # after a child exits: how long the rest of its group has, after SIGTERM
GROUP_POLL_S = 0.1


@dataclass(frozen=True)
class RestartPolicy:
    backoff_start_s: float = 1.0
    backoff_max_s: float = 60.0
    settle_s: float = 0.0
    max_failed_starts: int = 1
    retry_once_ready: bool = False
    ready_timeout_s: float = math.inf
    stop_grace_s: float = 30.0


@dataclass(kw_only=True)
class Slot:
    """One supervised child: the process in it now, and its history."""

    name: str = ""
    proc: subprocess.Popen[bytes] | None = None
    state: str = "idle"  # starting, up, backoff, stopped
    ever_up: bool = False
    num_restarts: int = 0
    backoff_s: float = 0.0
    started_at: float = 0.0
    ready_by: float = 0.0
    up_since: float = 0.0
    restart_at: float = 0.0


class StartupFailure(Exception):
    """Children that cannot start: the supervisor gives up. str() says what to do."""


S = TypeVar("S", bound=Slot)


class ProcessSupervisor(Generic[S]):
    def __init__(self, children: list[S], policy: RestartPolicy) -> None:
        self.children = children
        self.policy = policy
        self.num_failed_starts = 0  # in a row, over all children
        self._stop = threading.Event()
        for child in children:
            child.backoff_s = policy.backoff_start_s

    # ---- what a subclass says --------------------------------------------------------
    def spawn(self, child: S) -> subprocess.Popen[bytes]:
        """Start the child's process (common.process_group.popen_in_group)."""
        raise NotImplementedError

    def is_ready(self, child: S, now: float) -> bool:
        return True

    def on_up(self, child: S, again: bool) -> None:
        """The child became ready; again: it had been ready before (a restart)."""

    def may_restart(self, child: S) -> bool:
        return True

    def on_exit(self, child: S, code: int | None) -> None:
        """The child exited (its group is stopped); before it is restarted or the supervisor gives up."""

    def on_restart(self, child: S, code: int | None, delay_s: float) -> None:
        """The child exited and is started again in delay_s."""

    def failed_start_message(self, child: S, code: int | None) -> str:
        return f"{child.name} keeps exiting at start (code {code})"

    def not_ready_message(self, child: S) -> str:
        return f"{child.name} was not ready within {self.policy.ready_timeout_s:.0f} s"

    def on_kill(self, child: S) -> None:
        """The child's group did not stop within stop_grace_s after SIGTERM: it gets SIGKILL now."""

    def report(self, message: str) -> None:
        """The supervisor gives up (message: why, and what to do)."""

    def on_stopping(self) -> None:
        """A stop was asked for: the children are about to get SIGTERM."""

    def on_stopped(self, asked: bool) -> None:
        """Every child has exited; asked: after a stop that was asked for (not after giving up)."""

    # ---- signals -------------------------------------------------------------------
    def request_stop(self, signum: int = 0, frame: FrameType | None = None) -> None:
        """The first call ends the watch (run() then stops every child); a second forwards SIGTERM now."""
        if self._stop.is_set():
            self.signal_all(signal.SIGTERM)
        self._stop.set()

    def signal_all(self, sig: int) -> None:
        for child in self.children:
            if child.proc is not None and child.state != "stopped":
                signal_group(child.proc.pid, sig)

    # ---- the watch -----------------------------------------------------------------
    def run(self) -> int:
        """Until a stop is asked for (0) or the supervisor gives up (1); always stops every child.
        In the main thread, SIGINT and SIGTERM ask for the stop."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self.request_stop)
            signal.signal(signal.SIGTERM, self.request_stop)
        code = 1
        try:
            self.start_all()
            while not self._stop.is_set():
                self.poll_once()
                self._stop.wait(POLL_S)
            code = 0
        except StartupFailure as exc:
            self.report(str(exc))
        finally:
            if code == 0:
                self.on_stopping()
            self.stop_all()
            self.on_stopped(code == 0)
        return code

    def start_all(self) -> None:
        for child in self.children:
            self._start(child)

    def poll_once(self) -> None:
        """Check every child once: readiness, exits, restarts due. StartupFailure when giving up."""
        for child in self.children:
            if self._stop.is_set():
                return  # no restarts once a stop was asked for
            self._check(child, time.monotonic())

    def _start(self, child: S) -> None:
        child.proc = self.spawn(child)
        now = time.monotonic()
        child.state, child.started_at, child.ready_by = "starting", now, now + self.policy.ready_timeout_s

    def _check(self, child: S, now: float) -> None:
        if child.state in ("starting", "up"):
            assert child.proc is not None
            code = child.proc.poll()
            if code is not None:
                self._exited(child, code)
            elif child.state == "starting":
                self._check_starting(child, now)
        if child.state == "backoff" and time.monotonic() >= child.restart_at:
            if not self.may_restart(child):
                child.restart_at = time.monotonic() + PORT_RETRY_S
                return
            child.num_restarts += 1
            self._start(child)

    def _check_starting(self, child: S, now: float) -> None:
        if self.is_ready(child, now):
            again = child.ever_up
            child.state, child.up_since, child.ever_up = "up", now, True
            self.on_up(child, again)
        elif now >= child.ready_by:
            raise StartupFailure(self.not_ready_message(child))

    def _exited(self, child: S, code: int | None) -> None:
        self._reap_group(child)
        self.on_exit(child, code)
        now = time.monotonic()
        failed = child.state == "starting" or now - child.started_at < self.policy.settle_s
        if not failed:
            self.num_failed_starts = 0
        elif not (self.policy.retry_once_ready and child.ever_up):
            self.num_failed_starts += 1
            if self.num_failed_starts >= self.policy.max_failed_starts:
                raise StartupFailure(self.failed_start_message(child, code))
        if child.state == "up" and now - child.up_since > 2 * self.policy.backoff_max_s:
            child.backoff_s = self.policy.backoff_start_s  # it had been up for a while: start the back-off over
        child.state, child.restart_at = "backoff", now + child.backoff_s
        self.on_restart(child, code, child.backoff_s)
        child.backoff_s = min(child.backoff_s * 2, self.policy.backoff_max_s)

    def _reap_group(self, child: S) -> None:
        """After the leader exits: the rest of its group (vLLM's engine core) goes too."""
        assert child.proc is not None
        pgid = child.proc.pid
        signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + min(self.policy.stop_grace_s, REAP_GRACE_S)
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(GROUP_POLL_S)
        signal_group(pgid, signal.SIGKILL)

    # ---- the stop ------------------------------------------------------------------
    def stop_all(self) -> None:
        """SIGTERM to every child's group; SIGKILL to each still there after stop_grace_s; all reaped."""
        started = [child for child in self.children if child.proc is not None]
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.policy.stop_grace_s
        while self._any_group_alive(started) and time.monotonic() < deadline:
            time.sleep(GROUP_POLL_S)
        for child in started:
            assert child.proc is not None
            if group_alive(child.proc.pid):
                self.on_kill(child)
                signal_group(child.proc.pid, signal.SIGKILL)
        for child in started:
            assert child.proc is not None
            child.proc.wait()
        for child in self.children:
            child.state = "stopped"

    @staticmethod
    def _any_group_alive(children: list[S]) -> bool:
        alive = False
        for child in children:
            assert child.proc is not None
            child.proc.poll()  # reap the leader, so that its group can empty
            alive = group_alive(child.proc.pid) or alive
        return alive
