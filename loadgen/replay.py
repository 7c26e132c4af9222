"""Trace replay: the trace's requests sent open-loop at their times, once each.

The trace's time 0 is when its pool of users has started (`start`, at Locust's spawning_complete:
a pool that is still starting would lag behind the first rows). A free user takes the next row,
builds its body (before waiting, so the build costs no lag), waits for the row's planned time
(time 0 + timestamp / trace_speed) and sends; which free user takes it: loadgen/turns.py (the few
users a trace's pace needs send on connections kept alive, not one user per row with a new
connection each, its connect in the request's TTFT). When every user is busy the planned time passes and the
lag between planned and actual send is recorded: the step is then marked invalid, as in the Poisson
mode (more users: load_test.concurrency). The run ends once every row has been sent and answered
(`finished`).

With several load-generator processes (`--processes N`, or workers on other machines) each worker
replays its share of the rows (`share`: the rows whose index % count == its index) at the same planned
times, from the time 0 the master sends (loadgen/trace_share.py): a worker's users wait for it, however
long the other workers take to start.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gevent
from gevent.event import Event

from loadgen.traces import Trace, TraceRow
from loadgen.turns import Turns

START_WAIT_S = 30.0  # the users wait this long at most for the pool to start (then time 0 is now)


class TraceReplay:
    def __init__(self, trace: Trace, speed: float, body: Callable[[TraceRow], bytes]) -> None:
        self.trace = trace
        self.speed = speed
        self.run_start = time.time()  # time 0, once started
        self.body = body
        self.started = Event()
        self.start_wait_s: float | None = START_WAIT_S  # None: wait for time 0 however long (a worker)
        self.rows = trace.rows  # the rows this process sends (its share)
        self.next_index = 0
        self.pending = 0  # taken and not yet answered
        self.turns = Turns()

    def start(self, now: float) -> None:
        """Time 0 of the trace is now (once)."""
        if not self.started.is_set():
            self.run_start = now
            self.started.set()

    def share(self, index: int, count: int) -> None:
        """This process sends the rows whose index in the trace % count == index (one of count workers)."""
        self.rows = self.trace.rows[index::count]

    def planned(self, row: TraceRow) -> float:
        """The row's planned send on the wall clock."""
        return self.run_start + row.at_s / self.speed

    def take(self) -> tuple[float, TraceRow, bytes] | None:
        """The next row's planned send time, the row and its body, once that time has come; None when
        every row has been taken. Call `answered` when its request has ended."""
        if not self.started.wait(self.start_wait_s):
            self.start(time.time())
        with self.turns.hold():
            rows = self.rows
            if self.next_index >= len(rows):
                return None
            row = rows[self.next_index]
            self.next_index += 1
            self.pending += 1
            body = self.body(row)
            planned = self.planned(row)
            delay = planned - time.time()
            if delay > 0:
                gevent.sleep(delay)
            return planned, row, body

    def answered(self) -> None:
        self.pending -= 1

    @property
    def finished(self) -> bool:
        return self.next_index >= len(self.rows) and self.pending <= 0

    @property
    def end_s(self) -> float:
        """The last planned send, from the run's start."""
        return self.trace.span_s / self.speed
