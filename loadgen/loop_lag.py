"""The load generator's event-loop lag probe: how late each process wakes a timer (loadreport's
step summary judges a step by it). Imports gevent only, not Locust."""

from __future__ import annotations

import time

import gevent

from loadreport.record import Recorder

LOOP_LAG_PERIOD_S = 0.025  # how often the loop-lag probe wakes (40 a second: ~0.1 % of a core)


def probe_loop_lag(recorder: Recorder, process_name: str) -> None:
    """How late this process's event loop wakes a greenlet (a timer due now, run later): the delay a
    chunk that has arrived waits before the harness reads it and dates it. A starved process (the
    machine's cores busy with other work) reads every chunk late, so its TTFT and TPOT cannot be
    trusted even when its own CPU is low: the step's `loadgen_loop_lag_ms` and validity."""
    while True:
        due_s = time.monotonic() + LOOP_LAG_PERIOD_S
        gevent.sleep(LOOP_LAG_PERIOD_S)
        recorder.add_loop_lag(process_name, time.time(), 1000.0 * max(0.0, time.monotonic() - due_s))
