"""Open-loop arrivals: Poisson at the step's rate times this process's share of the users."""

from __future__ import annotations

import itertools
import time

from loadgen.arrivals import Arrivals
from loadreport.schedule import LoadSchedule
from loadreport.settings import LoadTestSection


def plan(rate: float) -> LoadSchedule:
    load = LoadTestSection(request_rate=rate, steps=[], duration_seconds=60, warmup_seconds=0)
    return LoadSchedule.from_settings(load)


def count_arrivals(arrivals: Arrivals, seconds: float) -> list[float]:
    planned: list[float] = []
    deadline = time.time() + seconds
    while time.time() < deadline:
        planned.append(arrivals.take())
    return planned


def test_rate_and_share_set_the_number_of_arrivals() -> None:
    full = count_arrivals(Arrivals(plan(200), time.time(), lambda: 1.0, seed=3), 0.5)
    half = count_arrivals(Arrivals(plan(200), time.time(), lambda: 0.5, seed=3), 0.5)
    assert 60 <= len(full) <= 140  # 100 expected
    assert 25 <= len(half) <= 75  # 50 expected: this process has half the users
    gaps = [b - a for a, b in itertools.pairwise(full)]
    assert len(set(round(g, 6) for g in gaps)) > len(gaps) // 2  # exponential gaps, not a fixed period


def test_a_late_taker_gets_the_planned_time_so_the_lag_shows() -> None:
    arrivals = Arrivals(plan(1000), time.time(), lambda: 1.0, seed=1)
    arrivals.take()
    time.sleep(0.2)  # every user was busy: the next planned sends are in the past
    planned = arrivals.take()
    assert time.time() - planned > 0.15


def test_no_rate_outside_the_run_waits() -> None:
    finished = Arrivals(plan(50), time.time() - 3600, lambda: 1.0)
    started = time.time()
    try:
        import gevent

        with gevent.Timeout(0.2, False):
            finished.take()
    finally:
        assert time.time() - started >= 0.19
