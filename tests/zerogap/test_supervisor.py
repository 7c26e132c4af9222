"""The shared supervisor core (common/supervisor.py) with real child processes (a small Python script):
restarts with back-off, failed starts counted to the limit, SIGTERM to the whole group on stop, SIGKILL
after the grace for a child that ignores SIGTERM, a second signal forwarded, the ready deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from common.process_group import group_alive, popen_in_group
from common.supervisor import ProcessSupervisor, RestartPolicy, Slot, StartupFailure

# One child per spawn; what it does is the step letter the test's plan gives that spawn:
#   F  exits with code 4 at once (a failed start)
#   O  says it is ready, then exits with code 3 once the supervisor saw it ready (go-PID)
#   S  starts a grandchild in its group; both write term-PID on SIGTERM and exit 0
#   I  ignores SIGTERM
#   D  drains: the first SIGTERM writes draining-PID, the second makes it exit with code 7
#   W  says it is ready, then exits with code 3 once the test writes release-PID
CHILD = r"""
import os, pathlib, signal, subprocess, sys, time
folder, step = pathlib.Path(sys.argv[1]), sys.argv[2]
pid = os.getpid()
if step == "F":
    sys.exit(4)
def on_term(signum, frame):
    if step == "D" and not (folder / f"draining-{pid}").exists():
        (folder / f"draining-{pid}").touch()
        return
    if step == "S":
        (folder / f"term-{pid}").touch()
    sys.exit(7 if step == "D" else 0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if step == "I" else on_term)
if step == "S":
    grandchild = subprocess.Popen([sys.executable, "-c", GRANDCHILD, str(folder)])
    while not (folder / f"grandchild-{grandchild.pid}").exists():
        time.sleep(0.01)
(folder / f"up-{pid}").touch()
release = folder / (f"go-{pid}" if step == "O" else f"release-{pid}")
while not release.exists():
    time.sleep(0.01)
sys.exit(3)
"""
GRANDCHILD = r"""
import os, pathlib, signal, sys, time
folder = pathlib.Path(sys.argv[1])
def on_term(signum, frame):
    (folder / f"term-{os.getpid()}").touch()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
(folder / f"grandchild-{os.getpid()}").touch()
time.sleep(600)
"""
WAIT_S = 60.0  # generous: the machine may be busy; every wait ends as soon as its event happens


class Recorder(ProcessSupervisor[Slot]):
    """The core running CHILD, recording what it is told (with the time) and waking waiters at each."""

    def __init__(self, folder: Path, plan: str, policy: RestartPolicy) -> None:
        super().__init__([Slot(name="c0")], policy)
        self.folder, self.plan = folder, plan
        self.events: list[tuple[float, str, object]] = []
        self.changed = threading.Condition()
        self.pids: list[int] = []

    def record(self, what: str, detail: object = None) -> None:
        with self.changed:
            self.events.append((time.monotonic(), what, detail))
            self.changed.notify_all()

    def seen(self, what: str) -> list[tuple[float, object]]:
        with self.changed:
            return [(at, detail) for at, name, detail in self.events if name == what]

    def restarts(self) -> list[tuple[float, int | None, float]]:
        """(when, exit code, back-off) of each restart the core announced."""
        return [(at, *cast(tuple[int | None, float], detail)) for at, detail in self.seen("restart")]

    def wait_until(self, predicate: Callable[[], bool], what: str) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, WAIT_S), f"{what} did not happen; events: {self.events}"

    def spawn(self, child: Slot) -> subprocess.Popen[bytes]:
        step = self.plan[min(len(self.pids), len(self.plan) - 1)]
        code = CHILD.replace("GRANDCHILD", repr(GRANDCHILD))
        proc = popen_in_group([sys.executable, "-c", code, str(self.folder), step], dict(os.environ))
        self.pids.append(proc.pid)
        self.record("spawn", step)
        return proc

    def is_ready(self, child: Slot, now: float) -> bool:
        assert child.proc is not None
        return (self.folder / f"up-{child.proc.pid}").exists()

    def on_up(self, child: Slot, again: bool) -> None:
        assert child.proc is not None
        (self.folder / f"go-{child.proc.pid}").touch()
        self.record("up", again)

    def on_restart(self, child: Slot, code: int | None, delay_s: float) -> None:
        self.record("restart", (code, delay_s))

    def on_kill(self, child: Slot) -> None:
        self.record("kill", child.name)

    def report(self, message: str) -> None:
        self.record("gave up", message)


def policy(**fields: Any) -> RestartPolicy:
    """Restart at once, never give up, 30 s to stop; unless fields say otherwise."""
    values: dict[str, Any] = {"backoff_start_s": 0.0, "backoff_max_s": 0.0, "max_failed_starts": 100}
    return RestartPolicy(**{**values, "stop_grace_s": 30.0, **fields})


def run_in_thread(sup: Recorder) -> tuple[threading.Thread, list[int]]:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(sup.run()), daemon=True)
    thread.start()
    return thread, codes


def wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


def test_a_child_that_dies_after_it_was_ready_is_restarted_after_a_doubling_back_off(tmp_path: Path) -> None:
    """Back-off 0.25, 0.5, 1.0, then capped at 1.0; each restart waits at least its back-off."""
    sup = Recorder(tmp_path, "O", policy(backoff_start_s=0.25, backoff_max_s=1.0, max_failed_starts=1))
    thread, codes = run_in_thread(sup)
    try:
        sup.wait_until(lambda: len(sup.seen("spawn")) >= 6, "five restarts")
    finally:
        sup.request_stop()
        thread.join(WAIT_S)
    assert codes == [0]
    restarts, spawns = sup.restarts()[:5], sup.seen("spawn")
    assert [(code, delay_s) for _, code, delay_s in restarts] == [(3, 0.25), (3, 0.5), (3, 1.0), (3, 1.0), (3, 1.0)]
    for (exited_at, _, delay_s), (spawned_at, _) in zip(restarts, spawns[1:6], strict=True):
        assert spawned_at - exited_at >= delay_s  # a lower bound: a slow machine only waits longer
    assert [again for _, again in sup.seen("up")[:3]] == [False, True, True]
    assert not sup.seen("gave up")


def test_the_back_off_starts_over_once_a_child_was_up_for_twice_its_cap(tmp_path: Path) -> None:
    """Two quick deaths take the back-off to 0.5 s then 1.0 s; the third child stays up past 2 x 1.0 s,
    so its death waits 0.25 s again."""
    sup = Recorder(tmp_path, "OOW", policy(backoff_start_s=0.25, backoff_max_s=1.0))
    thread, codes = run_in_thread(sup)
    try:
        sup.wait_until(lambda: len(sup.seen("up")) == 3, "the third child ready")
        child = sup.children[0]
        while time.monotonic() - child.up_since <= 2.0:
            time.sleep(0.05)  # the condition is time itself: up for more than 2 x backoff_max_s
        (tmp_path / f"release-{sup.pids[2]}").touch()
        sup.wait_until(lambda: len(sup.seen("restart")) == 3, "the third restart")
    finally:
        sup.request_stop()
        thread.join(WAIT_S)
    assert codes == [0]
    assert [delay_s for _, _, delay_s in sup.restarts()] == [0.25, 0.5, 0.25]


def test_failed_starts_in_a_row_stop_the_supervisor_and_an_exit_after_ready_counts_them_anew(tmp_path: Path) -> None:
    """Limit 3: two failed starts, one that was ready (the count starts over), then three more: given up
    at the sixth start, with every child stopped and the subclass's message reported."""
    sup = Recorder(tmp_path, "FFOFFFO", policy(max_failed_starts=3))
    assert sup.run() == 1
    assert [step for _, step in sup.seen("spawn")] == ["F", "F", "O", "F", "F", "F"]
    assert [detail for _, detail in sup.seen("gave up")] == ["c0 keeps exiting at start (code 4)"]
    assert [c.state for c in sup.children] == ["stopped"]


def test_an_exit_within_settle_s_of_the_start_is_a_failed_start(tmp_path: Path) -> None:
    """A child seen ready that exits within settle_s (600 s here) still counts: given up after 2."""
    sup = Recorder(tmp_path, "O", policy(max_failed_starts=2, settle_s=600.0))
    assert sup.run() == 1
    assert len(sup.seen("spawn")) == 2 and len(sup.seen("up")) == 2
    assert [detail for _, detail in sup.seen("gave up")] == ["c0 keeps exiting at start (code 3)"]


def test_retry_once_ready_retries_a_child_that_was_ready_however_its_restarts_fail(tmp_path: Path) -> None:
    sup = Recorder(tmp_path, "OF", policy(max_failed_starts=1, retry_once_ready=True))
    thread, codes = run_in_thread(sup)
    try:
        sup.wait_until(lambda: len(sup.seen("restart")) >= 4, "four restarts")
    finally:
        sup.request_stop()
        thread.join(WAIT_S)
    assert codes == [0] and not sup.seen("gave up")
    assert [(code, delay_s) for _, code, delay_s in sup.restarts()[:3]] == [(3, 0.0), (4, 0.0), (4, 0.0)]


def test_stop_sends_sigterm_to_the_whole_group(tmp_path: Path) -> None:
    sup = Recorder(tmp_path, "S", policy())
    thread, codes = run_in_thread(sup)
    try:
        sup.wait_until(lambda: bool(sup.seen("up")), "the child ready")
        grandchildren = [int(p.name.split("-")[1]) for p in tmp_path.glob("grandchild-*")]
        assert len(grandchildren) == 1
    finally:
        sup.request_stop()
        thread.join(WAIT_S)
    assert codes == [0] and not sup.seen("kill")
    terms = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("term-*"))
    assert terms == sorted([sup.pids[0], grandchildren[0]])  # both got SIGTERM (not SIGKILL) from the stop
    assert not group_alive(sup.pids[0])


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    sup = Recorder(tmp_path, "I", policy(stop_grace_s=1.0))
    thread, codes = run_in_thread(sup)
    sup.wait_until(lambda: bool(sup.seen("up")), "the child ready")
    asked_at = time.monotonic()
    sup.request_stop()
    thread.join(WAIT_S)
    assert not thread.is_alive() and codes == [0]
    kills = sup.seen("kill")
    assert [detail for _, detail in kills] == ["c0"]
    assert kills[0][0] - asked_at >= 1.0  # it had its grace
    proc = sup.children[0].proc
    assert proc is not None and proc.returncode == -signal.SIGKILL
    assert not group_alive(proc.pid)


def test_the_first_signal_stops_gracefully_and_a_second_is_forwarded(tmp_path: Path) -> None:
    """Real SIGTERMs to this process, with run() in the main thread: the first sends the child SIGTERM (it
    starts draining), the second is forwarded to it at once (it exits with 7), not killed after the grace."""
    sup = Recorder(tmp_path, "D", policy(stop_grace_s=WAIT_S))
    pid = os.getpid()

    def signals() -> None:
        sup.wait_until(lambda: bool(sup.seen("up")), "the child ready")
        os.kill(pid, signal.SIGTERM)
        wait_for_file(tmp_path / f"draining-{sup.pids[0]}")
        os.kill(pid, signal.SIGTERM)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    sender = threading.Thread(target=signals, daemon=True)
    sender.start()
    try:
        code = sup.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    sender.join(WAIT_S)
    assert code == 0 and not sup.seen("kill")
    proc = sup.children[0].proc
    assert proc is not None and proc.returncode == 7


def test_a_child_not_ready_within_ready_timeout_s_makes_it_give_up(tmp_path: Path) -> None:
    sup = Recorder(tmp_path, "I", policy(ready_timeout_s=1.0, stop_grace_s=1.0))
    sup.is_ready = lambda child, now: False  # type: ignore[method-assign]
    sup.start_all()
    deadline = time.monotonic() + WAIT_S
    with pytest.raises(StartupFailure, match=r"^c0 was not ready within 1 s$"):
        while time.monotonic() < deadline:
            sup.poll_once()
            time.sleep(0.05)
    sup.stop_all()  # it ignores SIGTERM: killed after the grace
    proc = sup.children[0].proc
    assert proc is not None and not group_alive(proc.pid)
