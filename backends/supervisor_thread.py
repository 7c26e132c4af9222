"""A Supervisor run in a background thread, for a program that drives the pool from its
own main thread (`zerogap demo`, `zerogap tune`): start it, wait until every child
answers its health check, and stop the whole pool, process groups included.

    pool = SupervisorThread(Supervisor(specs, hooks, timing, out=log), "tune-pool")
    pool.start("the pool did not come up; see supervisor.log")
    try: ... finally: pool.stop()
"""

from __future__ import annotations

import threading
import time

from backends.supervisor import Supervisor

POLL_S = 0.2
READY_MARGIN_S = 5.0  # past the supervisor's own start-up deadline: its message (in its log) comes first
STOP_MARGIN_S = 30.0  # past its SIGTERM grace: the SIGKILL and the reaping


class SupervisorThread:
    def __init__(self, supervisor: Supervisor, name: str) -> None:
        self.supervisor = supervisor
        self._thread = threading.Thread(target=supervisor.run, name=name, daemon=True)

    @property
    def running(self) -> bool:
        """The supervisor has not returned yet (it returns once it has stopped every child)."""
        return self._thread.is_alive()

    def all_up(self) -> bool:
        children = self.supervisor.children
        return bool(children) and all(child.state == "up" for child in children)

    def start(self, failure: str) -> None:
        """Run the supervisor; return once every child is up. RuntimeError(failure) when the supervisor ends
        first (a child that cannot start: the supervisor stops them all) or its start-up deadline passes."""
        self._thread.start()
        deadline = time.monotonic() + self.supervisor.timing.startup_timeout_s + READY_MARGIN_S
        while not self.all_up():
            if not self.running or time.monotonic() > deadline:
                raise RuntimeError(failure)
            self._thread.join(POLL_S)  # back at once when the supervisor ends

    def stop(self) -> None:
        """Stop every child and wait for the supervisor to finish (at most its grace plus a margin)."""
        self.supervisor.request_stop()
        if self.running:
            self._thread.join(self.supervisor.timing.stop_timeout_s + STOP_MARGIN_S)
