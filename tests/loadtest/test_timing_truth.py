"""The harness's TTFT, TPOT and TPS against the truth, within 3%: the real `locust -f
loadtest/ --headless` against an upstream that records what it did (tests/fixtures/upstream).

The upstream sends the first token 200 ms after a request arrives, then one token per chunk every
20 ms, 20 in all, and notes when it wrote each chunk (time.time(), the machine's one wall clock).
Each request is matched to the upstream's record of it by the trace id it sent (api.traceparent;
requests.csv's trace_id), so that the truth is per request and on the events themselves: TTFT =
the harness's send (requests.csv's sent_s) -> the upstream's write of the first content chunk; TPOT
= (last content chunk written - first) / 19. A busy machine makes the upstream's sleeps overshoot
and its reads of a request late; both are in the truth, so what is judged is the harness's own
error alone: how late it read and dated what had been written. The median error per request must be
within 3% of the median truth, so a constant +8 ms on TTFT (4% of 200 ms) or a TPOT divided by n
instead of n - 1 (5%) fails; and the step's p50s are the medians of its requests (the aggregation).

TPS = tokens written in the step's window / its duration, against the tokens the harness read in
it: within 3% in a step the harness calls valid. Beside other work that starves it of CPU, the
harness reads each chunk late, and a burst read late moves tokens across the window's edges: it
says so by marking the step invalid (its event-loop lag p90 over `metrics.max_loop_lag_ms`, set
here to 10 ms), and its TPS is then held to 25%.

Goodput end to end: the SLO's TPOT (19 ms) is below every request's, so goodput is 0 while every
request succeeds.
"""

from __future__ import annotations

import csv
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from tests.fixtures.upstream import Behavior, Seen, UpstreamServer
from tests.loadtest.helpers import read_report, run_locust, upstream_truth, write_settings

TTFT_S, INTERVAL_S, NUM_TOKENS, USERS = 0.200, 0.020, 20, 3
TOLERANCE = 0.03
STARVED_TPS_TOLERANCE = 0.25  # a step the harness calls invalid: its TPS still near the truth
MAX_LOOP_LAG_MS = 10


def within(measured: float, truth: float, tolerance: float = TOLERANCE) -> bool:
    return abs(measured - truth) <= tolerance * truth


def trace_id_of(seen: Seen) -> str:
    headers = {name.lower(): value for name, value in seen.headers.items()}
    return headers["traceparent"].split("-")[1]


def matched(run_dir: Path, seen: list[Seen], run_start: float, window: tuple[float, float]) -> list[dict[str, Any]]:
    """The window's answered requests (by their end, as the step counts them), each with the
    harness's figures and the upstream's record of it."""
    by_trace = {trace_id_of(s): s for s in seen if s.finished}
    out = []
    with (run_dir / "requests.csv").open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            sent = run_start + float(row["sent_s"])
            end = sent + float(row["e2e_ms"]) / 1000
            if row["ok"] != "1" or not window[0] <= end < window[1]:
                continue
            up = by_trace[row["trace_id"]]  # every answered request was the upstream's
            first_s, last_s = up.chunk_walls[0][0], up.chunk_walls[-1][0]
            ttft_ms, e2e_ms, tokens = float(row["ttft_ms"]), float(row["e2e_ms"]), int(row["output_tokens"])
            out.append({
                "ttft_ms": ttft_ms, "true_ttft_ms": 1000 * (first_s - sent),
                "tpot_ms": (e2e_ms - ttft_ms) / (tokens - 1), "true_tpot_ms": 1000 * (last_s - first_s) / (tokens - 1),
            })  # fmt: skip
    return out


@pytest.mark.slow
def test_ttft_tpot_and_tps_match_the_upstreams_truth(tmp_path: Path) -> None:
    behavior = Behavior(ttft_s=TTFT_S, interval_s=INTERVAL_S, num_output_tokens=NUM_TOKENS)
    with UpstreamServer(behavior) as up:
        settings = write_settings(
            tmp_path / "settings.json", up.url, tmp_path / "runs", "truth", api={"traceparent": True},
            load_test={"steps": [USERS], "warmup_seconds": 1, "step_duration_seconds": 5, "measure_last_seconds": 4},
            workload={"max_output_tokens": NUM_TOKENS}, slo={"ttft_ms": 1000, "tpot_ms": 19},
            metrics={"max_loop_lag_ms": MAX_LOOP_LAG_MS},
        )  # fmt: skip
        result = run_locust(settings)
        seen = list(up.requests)
    assert result.returncode == 0, result.stderr[-3000:]
    report = read_report(tmp_path / "runs" / "truth")
    (step,) = report["steps"]
    assert step["complete"] and step["requests_failed"] == 0 and step["token_count_source"] == "usage"
    run_start = report["run"]["started_unix_s"]
    window = (run_start + step["end_s"] - step["duration_s"], run_start + step["end_s"])
    requests = matched(tmp_path / "runs" / "truth", seen, run_start, window)
    assert len(requests) == step["requests_ok"] >= 10, (len(requests), step["requests_ok"])
    assert all(s.num_tokens_sent == NUM_TOKENS for s in seen if s.finished)

    for figure in ("ttft_ms", "tpot_ms"):
        errors_ms = [r[figure] - r[f"true_{figure}"] for r in requests]
        truth_ms = median(r[f"true_{figure}"] for r in requests)
        assert abs(median(errors_ms)) <= TOLERANCE * truth_ms, (figure, sorted(errors_ms), truth_ms)
        # the step's p50 is its requests' median: between the two middle values (an even count's median is
        # either, or between), give or take the histogram's 0.1 ms resolution
        ours = sorted(r[figure] for r in requests)
        low, high = ours[(len(ours) - 1) // 2], ours[len(ours) // 2]
        assert low - 0.15 <= step[figure]["p50"] <= high + 0.15, (figure, step[figure], low, high)

    truth = upstream_truth(seen, report, step)
    lag = step["loadgen_loop_lag_ms"]
    assert lag is not None and lag["p50"] is not None, step  # the probe ran
    if step["valid"]:
        assert within(step["output_tps"], truth.output_tps), (step["output_tps"], truth, lag)
    else:  # the harness itself says its window's figures are not to be trusted, and why
        assert step["invalid_reason"], step
        assert within(step["output_tps"], truth.output_tps, STARVED_TPS_TOLERANCE), (step["output_tps"], truth, lag)

    assert step["rps"] > 0 and step["goodput_rps"] == 0
