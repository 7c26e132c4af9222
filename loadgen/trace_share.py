"""A trace replayed by several load-generator processes (`--processes N`, or `--master` with
`--worker`s): each worker sends its share of the rows at the same planned times.

Once every worker's users have started (the master's spawning_complete), the master takes time 0 and
sends each worker that runs users its share (index, count: it sends the rows whose index in the trace
% count == index) with time 0 on the wall clock. A worker's users wait for that message (loadgen/replay.py),
so a worker that started first does not run ahead. Workers on other machines need clocks in step (NTP):
a skew shows as send lag. The master ends the run once it holds one record per row (a worker ships its
records with its stats reports).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from locust.env import Environment
from locust.runners import MasterRunner, Runner, WorkerRunner

from loadgen.run import Run

log = logging.getLogger("zerogap.loadtest")
SHARE_MESSAGE = "zerogap_trace_share"


class TraceShare:
    def __init__(self, current: Callable[[], Run | None]) -> None:
        self.current = current  # the run in progress, if any
        self.pending: dict[str, Any] | None = None  # a worker's share that came before its run was ready
        self.announced: Run | None = None  # the master's run whose time 0 was sent

    def install(self, runner: Runner | None) -> None:
        if isinstance(runner, WorkerRunner):
            runner.register_message(SHARE_MESSAGE, self.on_share)

    # the master's side

    def announce(self, runner: MasterRunner, run: Run, start: float) -> int:
        """Send each worker that runs users its share and time 0 (once a run); the number of workers sharing."""
        if self.announced is run:
            return 0
        self.announced = run
        clients = sorted(runner.clients.all, key=lambda client: str(client.id))
        sharing = [c for c in clients if sum((c.user_classes_count or {}).values()) > 0] or clients
        for index, client in enumerate(sharing):
            data = {"start": start, "index": index, "count": len(sharing)}
            runner.send_message(SHARE_MESSAGE, data, client_id=client.id)
        log.info("zerogap: the trace is shared by %d worker(s), time 0 at %.3f", len(sharing), start)
        return len(sharing)

    # the worker's side

    def on_share(self, environment: Environment, msg: Any, **_: Any) -> None:
        self.pending = dict(msg.data or {})
        run = self.current()
        if run is not None and run.replay is not None:
            self.apply(run)

    def apply(self, run: Run) -> None:
        """The share that came, if one did: this worker's rows, and time 0."""
        data, self.pending = self.pending, None
        if data is None or run.replay is None:
            self.pending = data
            return
        run.replay.share(int(data["index"]), int(data["count"]))
        run.replay.start(float(data["start"]))
        run.start_s = run.replay.run_start
