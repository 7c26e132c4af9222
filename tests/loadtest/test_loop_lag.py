"""The load generator's event-loop lag: measured by a probe greenlet, carried from the workers to the
master, and a step whose harness woke late is marked invalid (its chunks were dated late)."""

from __future__ import annotations

import time

import gevent

from loadgen.loop_lag import LOOP_LAG_PERIOD_S, probe_loop_lag
from loadreport.histogram import Histogram
from loadreport.record import Recorder, RequestRecord
from loadreport.run_summary import summarize_run
from loadreport.schedule import LoadSchedule
from loadreport.settings import parse_settings

START = 1_000_000.0
BLOCK_S = 0.3


def test_the_probe_sees_a_blocked_loop() -> None:
    """A greenlet that holds the loop (a blocking call: what a starved process looks like from inside)
    delays the probe's next wake by about as long: recorded as one lag of at least the block."""
    recorder = Recorder()
    probe = gevent.spawn(probe_loop_lag, recorder, "host:1")
    try:
        gevent.sleep(3 * LOOP_LAG_PERIOD_S)  # the probe has woken on time at least once
        time.sleep(BLOCK_S)  # holds the hub: no greenlet runs
        gevent.sleep(3 * LOOP_LAG_PERIOD_S)
    finally:
        probe.kill()
    lags = Histogram()
    for hist in recorder.loop_lag["host:1"].values():
        lags.merge(hist)
    assert lags.count >= 3
    assert lags.max_ms >= 1000 * BLOCK_S - 1000 * LOOP_LAG_PERIOD_S, lags.summary()
    assert lags.min_ms < 1000 * BLOCK_S / 2, lags.summary()  # the wakes around it were not late by the block


def test_the_lag_travels_to_the_master_and_the_worst_process_counts() -> None:
    worker = Recorder()
    for i in range(10):
        worker.add_loop_lag("host:2", START + i, 40.0)
    master = Recorder()
    for i in range(10):
        master.add_loop_lag("host:1", START + i, 1.0)
    master.ingest(worker.drain())
    assert worker.loop_lag == {}
    worst = master.worst_loop_lag_between(START, START + 10)
    assert worst is not None and worst.percentile(90) == 40.0
    assert master.worst_loop_lag_between(START + 20, START + 30) is None


def summarize_with_lag(lag_ms: float, max_loop_lag_ms: float) -> tuple[bool, str | None, dict | None]:
    settings = parse_settings(f'{{"metrics": {{"max_loop_lag_ms": {max_loop_lag_ms}}}}}')
    plan = LoadSchedule.from_settings(parse_settings('{"load_test": {"steps": [1], "warmup_seconds": 0}}').load_test)
    recorder = Recorder()
    sent = START + plan.total_s - 2.0
    recorder.add(RequestRecord(sent, sent + 1.0, True, "", 0.1, 1.0, 10, 50, "usage", None), [sent + 1.0])
    for i in range(40):  # the probe's samples over the last 4 s (the default window): 6 of 10 at 1 ms
        recorder.add_loop_lag("host:1", START + plan.total_s - 4.0 + 0.1 * i, 1.0 if i % 10 < 6 else lag_ms)
    step = summarize_run(settings, plan, START, START + plan.total_s, recorder, []).steps[0]
    lag = step.loadgen_loop_lag_ms
    return step.valid, step.invalid_reason, None if lag is None else lag.model_dump()


def test_a_step_whose_harness_woke_late_is_invalid() -> None:
    valid, reason, lag = summarize_with_lag(30.0, 25.0)
    assert valid is False and reason is not None
    assert "event-loop lag p90 30.0 ms > 25 ms" in reason and "busy with other work" in reason
    assert lag is not None and lag["p90"] == 30.0 and lag["p50"] == 1.0  # the p90 judges, not the p50


def test_a_lag_under_the_limit_keeps_the_step_valid() -> None:
    valid, reason, lag = summarize_with_lag(24.0, 25.0)
    assert valid is True and reason is None
    assert lag is not None and lag["p90"] == 24.0
