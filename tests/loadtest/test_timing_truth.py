"""The harness's TTFT, TPOT and TPS against the truth, within 3%: the real `locust -f
loadtest/ --headless` against an upstream that records what it did (tests/fixtures/upstream).

The upstream sends the first token 200 ms after a request arrives, then one token per
chunk every 20 ms, 20 in all. Truth is per request, on the upstream's clock (its sleeps
overshoot on a busy machine; the nominal schedule is not the truth): TTFT = arrival ->
first content chunk, TPOT = (last - first chunk) / 19, TPS = tokens written in the step's
window / its duration. Each p50 must be within 3%, so a constant +8 ms on TTFT (4% of
200 ms) or a TPOT divided by n instead of n - 1 (5%) fails. Three users keep the machine's
load out of the figures; p50s, not maxima, are compared.

Goodput end to end: the SLO's TPOT (19 ms) is below every request's, so goodput is 0
while every request succeeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.loadtest.helpers import read_report, run_locust, upstream_truth, write_settings

TTFT_S, INTERVAL_S, NUM_TOKENS, USERS = 0.200, 0.020, 20, 3
TOLERANCE = 0.03


def within(measured: float, truth: float) -> bool:
    return abs(measured - truth) <= TOLERANCE * truth


@pytest.mark.slow
def test_ttft_tpot_and_tps_match_the_upstreams_truth(tmp_path: Path) -> None:
    behavior = Behavior(ttft_s=TTFT_S, interval_s=INTERVAL_S, num_output_tokens=NUM_TOKENS)
    with UpstreamServer(behavior) as up:
        settings = write_settings(
            tmp_path / "settings.json", up.url, tmp_path / "runs", "truth",
            load_test={"steps": [USERS], "warmup_seconds": 1, "step_duration_seconds": 5, "measure_last_seconds": 4},
            workload={"max_output_tokens": NUM_TOKENS}, slo={"ttft_ms": 1000, "tpot_ms": 19},
        )  # fmt: skip
        result = run_locust(settings)
        seen = list(up.requests)
    assert result.returncode == 0, result.stderr[-3000:]
    report = read_report(tmp_path / "runs" / "truth")
    (step,) = report["steps"]
    assert step["complete"] and step["requests_failed"] == 0 and step["token_count_source"] == "usage"
    truth = upstream_truth(seen, report, step)
    # The upstream dates a request by its last write, the harness by its last read: at each edge of the
    # window a user's request may fall on one side for one and on the other for the other. A user has one
    # request in flight, and the users run in step (same schedule), so the counts differ by USERS at most.
    assert truth.num_requests >= 10, truth
    assert abs(truth.num_requests - step["requests_ok"]) <= USERS, (truth, step["requests_ok"])
    assert truth.num_tokens == {NUM_TOKENS}, truth
    assert within(step["ttft_ms"]["p50"], truth.ttft_ms), (step["ttft_ms"], truth)
    assert within(step["tpot_ms"]["p50"], truth.tpot_ms), (step["tpot_ms"], truth)
    assert within(step["output_tps"], truth.output_tps), (step["output_tps"], truth)

    assert step["rps"] > 0 and step["goodput_rps"] == 0
