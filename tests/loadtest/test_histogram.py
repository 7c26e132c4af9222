"""Histograms at 0.1 ms resolution (Locust rounds to whole ms under 100 ms)."""

from __future__ import annotations

from loadreport.histogram import Histogram, summarize


def test_tenth_of_a_millisecond_apart_stays_apart() -> None:
    hist = Histogram()
    hist.add_many_ms([4.7, 4.8, 4.9])
    assert hist.percentile(34) == 4.8
    assert hist.percentile(100) == 4.9
    assert hist.percentile(1) == 4.7


def test_percentiles_and_exact_mean() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100 ms
    figures = summarize(values)
    assert figures == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "mean": 50.5}


def test_empty_histogram_has_no_figures() -> None:
    assert Histogram().summary() == {"p50": None, "p90": None, "p99": None, "mean": None}


def test_merge_and_wire_round_trip_add_up() -> None:
    first, second = Histogram(), Histogram()
    first.add_many_ms([1.0, 2.0, 3.0])
    second.add_many_ms([10.04, 20.0])
    first.merge(Histogram.from_wire(second.to_wire()))
    assert first.count == 5
    assert abs(first.sum_ms - 36.04) < 1e-9
    assert first.percentile(80) == 10.0
    assert (first.min_ms, first.max_ms) == (1.0, 20.0)
