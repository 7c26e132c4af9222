"""The soak bench (bench/soak.py) for 2 minutes: no leak, no failed good request, no 5xx for a
bad one, no hung client. 128 streams (the bench itself takes 512; CI has 2 cores)."""

from __future__ import annotations

import math

import pytest

from bench.soak import GROWTH_LIMIT, SoakOptions, median_read, run_soak

CONCURRENCY = 128
NAN = float("nan")


def test_a_report_is_the_median_of_the_samples_read() -> None:
    """A scrape that failed is NaN; statistics.median sorts it anywhere (3.0 and 4.5 here)."""
    assert median_read((1.0, NAN, 5.0, 3.0, 7.0)) == 4.0
    assert median_read((NAN, 9.0, 8.0, 1.0)) == 8.0
    assert math.isnan(median_read((NAN, NAN)))


@pytest.mark.slow
def test_soak_two_minutes() -> None:
    result = run_soak(SoakOptions(CONCURRENCY, duration_s=120, report_s=10, warmup_s=40, interval_s=0.05))
    total = sum(r.tally.num_requests for r in result.reports)
    assert total > 20 * 120, f"only {total} requests in 2 minutes: the soak did not load the gateway"
    assert sum(r.tally.num_good_failed for r in result.reports) == 0, result.failures
    assert sum(r.tally.num_bad_5xx for r in result.reports) == 0, result.failures
    assert sum(r.tally.num_hung for r in result.reports) == 0, result.failures
    assert result.num_outlier_ejections == 0, result.failures  # both backends equally noisy: no outlier
    # Checked by hand: a leak of 1 KB a request read +14.7 % here, and a reference cycle per
    # streamed request (freed only by the collector's rare full pass) +26 %; without them +0.1 %.
    assert result.rss_growth < GROWTH_LIMIT, f"RSS grew {result.rss_growth:+.1%} after the warm-up"
    after = [r for r in result.reports if r.end_s > 40]
    # Two sockets a stream, plus idle keep-alive connections: a leak of one per request is thousands.
    assert max(r.num_fds for r in after) < 4 * CONCURRENCY + 64
    # Each client has one request in progress at most, and a request two tasks at most (uvicorn's and the
    # stream's watch on its client), so the tasks stay under 2 per client plus the gateway's own (7-8
    # measured) at any load; a leak passes that. (Their growth over the run is no measure: the requests
    # in progress follow the clients' pace, which busy loops beside the run change: x1.12 with no leak.)
    assert max(r.num_tasks for r in after) < 2 * CONCURRENCY + 32
