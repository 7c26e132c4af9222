"""Goodput: only the successful requests within both SLOs (TTFT and TPOT) count, and a
request exactly at an SLO meets it (README: "within"). Records of known timing go
through the step summary that writes report.json; the counts are exact."""

from __future__ import annotations

from loadreport.record import Recorder, RequestRecord
from loadreport.schedule import LoadSchedule
from loadreport.settings import parse_settings
from loadreport.summary import summarize_step

START = 1_000_000.0
SETTINGS = parse_settings(
    '{"load_test": {"steps": [4], "warmup_seconds": 0, "step_duration_seconds": 10, "measure_last_seconds": 5},'
    ' "slo": {"ttft_ms": 300, "tpot_ms": 25}}'
)

# (how many, ok, TTFT s, E2E s, output tokens); TPOT = (E2E - TTFT) / (tokens - 1)
REQUESTS = [
    (3, True, 0.100, 0.100 + 10 * 0.020, 11),  # well within both: good
    (2, True, 0.300, 0.550, 11),  # exactly at both SLOs (TPOT 0.25 / 10 = 25.000000000000004 ms in floats): good
    (1, True, 0.1, 0.1, 1),  # one token: no TPOT, TTFT within: good
    (1, True, 0.3001, 0.3001 + 10 * 0.020, 11),  # TTFT 0.1 ms over: not good
    (2, True, 0.100, 0.100 + 10 * 0.0251, 11),  # TPOT 0.1 ms over: not good
    (1, True, 0.500, 0.500 + 10 * 0.050, 11),  # over both: not good
    (1, True, 0.400, 0.400, 1),  # one token, TTFT over: not good
    (2, False, None, 0.010, 0),  # failed: neither ok nor good
]
NUM_GOOD, NUM_OK = 3 + 2 + 1, 3 + 2 + 1 + 1 + 2 + 1 + 1


def recorder_of(requests: list[tuple[int, bool, float | None, float, int]]) -> Recorder:
    """Every request ends inside the step's measured window (its last 5 s)."""
    recorder, sent = Recorder(), START + 6.0
    for count, ok, ttft_s, e2e_s, tokens in requests:
        for _ in range(count):
            kind = "" if ok else "HTTP 503"
            record = RequestRecord(sent, sent + e2e_s, ok, kind, ttft_s, e2e_s, tokens, 20, "usage", None)
            recorder.records.append(record)
            sent += 0.25
    return recorder


def test_goodput_counts_only_requests_within_both_slos() -> None:
    plan = LoadSchedule.from_settings(SETTINGS.load_test)
    step = summarize_step(SETTINGS, plan, plan.steps[0], START, START + plan.total_s, recorder_of(REQUESTS), [])
    assert step is not None and step.duration_s == 5.0
    assert step.requests_ok == NUM_OK and step.requests_failed == 2
    assert step.rps == NUM_OK / 5.0
    assert step.goodput_rps == NUM_GOOD / 5.0  # 6 of the 11 successful requests


def test_goodput_edge_is_inclusive() -> None:
    """The requests exactly at both SLOs alone: every one of them counts."""
    plan = LoadSchedule.from_settings(SETTINGS.load_test)
    step = summarize_step(SETTINGS, plan, plan.steps[0], START, START + plan.total_s, recorder_of(REQUESTS[1:2]), [])
    assert step is not None and step.goodput_rps == step.rps == 2 / 5.0
