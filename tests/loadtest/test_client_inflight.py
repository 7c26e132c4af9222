"""The load generator's own in-flight figure (loadreport/summary.client_inflight_mean): each
request's time in flight inside the step's window, summed, over the window's length; every
record counts, also those that ended after the window or began before it."""

from __future__ import annotations

import pytest

from loadreport.diagnosis import diagnose_steps
from loadreport.record import Recorder, RequestRecord
from loadreport.run_summary import summarize_run
from loadreport.schedule import LoadSchedule
from loadreport.settings import parse_settings
from loadreport.summary import client_inflight_mean
from tests.loadtest.diagnosis_steps import limit, step
from tests.loadtest.report_files import add_steady_requests


def record(start: float, end: float) -> RequestRecord:
    return RequestRecord(start, end, True, "", 0.1, end - start, 10, 50, "usage", None)


def test_time_in_flight_inside_the_window_over_its_length() -> None:
    records = [record(5, 15), record(12, 14), record(18, 30), record(0, 9), record(21, 25), record(8, 25)]
    # in [10, 20): 5 + 2 + 2 + 0 + 0 + 10 = 19 s over 10 s
    assert client_inflight_mean(records, 10.0, 20.0) == 1.9
    assert client_inflight_mean([], 10.0, 20.0) == 0.0
    assert client_inflight_mean(records, 20.0, 20.0) is None


def test_a_step_of_back_to_back_users_has_every_user_in_flight() -> None:
    """add_steady_requests: each user sends its next request the moment the last ends."""
    settings = parse_settings(
        '{"load_test": {"steps": [4, 16], "warmup_seconds": 0, "step_duration_seconds": 10, "measure_last_seconds": 5}}'
    )
    plan = LoadSchedule.from_settings(settings.load_test)
    recorder = Recorder()
    for phase in plan.steps:
        add_steady_requests(recorder, phase, plan.users_for(phase), 1000.0)
    summary = summarize_run(settings, plan, 1000.0, 1000.0 + plan.total_s, recorder, [])
    assert [s.client_inflight_mean for s in summary.steps] == [pytest.approx(4, abs=0.3), pytest.approx(16, abs=1.2)]


def test_the_larger_part_of_the_requests_not_at_the_engines_names_who_holds_them() -> None:
    """64 users, 20 at the engines; the load generator had c in flight, the gateway passed on g.
    Between requests in the load generator: 64 - c; in the gateway: c - g; in the engines' API
    servers: g - 20. Equal parts: the API servers', then the gateway's."""

    def held(g: float, c: float) -> str:
        return limit(step(running=20.0, gpu=40.0, gateway_inflight=g, client_inflight_mean=c))

    assert held(g=42.0, c=42.0) == "frontend"  # 22, 0, 22
    assert held(g=42.0, c=41.9) == "load_generator"  # 22, -0.1, 22.1
    assert held(g=20.0, c=42.0) == "gateway"  # 0, 22, 22
    assert held(g=20.0, c=41.9) == "load_generator"  # 0, 21.9, 22.1
    assert held(g=35.0, c=50.0) == "frontend"  # 15, 15, 14
    assert held(g=34.9, c=50.0) == "gateway"  # 14.9, 15.1, 14
    # no gateway gauge: all past the load generator are the API servers'
    assert limit(step(running=20.0, gpu=40.0, client_inflight_mean=42.0)) == "frontend"  # 22, 0, 22
    assert limit(step(running=20.0, gpu=40.0, client_inflight_mean=41.9)) == "load_generator"
    # TPS still grows by 10% at the next step: no limit yet, whoever holds the requests
    assert limit(step(running=20.0, gpu=40.0, client_inflight_mean=30.0), after=step(users=128, tps=1100.0)) == "none"
    (entry,) = diagnose_steps([step(running=20.0, gpu=40.0, gateway_inflight=30.0, client_inflight_mean=36.0)])
    assert entry.limit == "load_generator"  # 10, 6, 28
    assert "the load generator had only 36.0 of 64 users' requests in flight" in entry.evidence, entry.evidence
    assert "load generator in flight 36.0" in entry.evidence and "--processes" in entry.advice
    (entry,) = diagnose_steps([step(running=20.0, gpu=40.0, gateway_inflight=30.0, client_inflight_mean=60.0)])
    assert entry.limit == "gateway" and "(the load generator had 60.0 in flight)" in entry.evidence, entry.evidence
