"""bench/request_calls.py counts one request's Python calls from the growth of two profiles: the
count is the per-request difference (not the whole profile, not a run's start-up), and the bench
can fail. Real processes under cProfile, real HTTP on free ports."""

from __future__ import annotations

import pstats
import re

import pytest

from bench.request_calls import main, per_request


class Profile(pstats.Stats):
    """A profile with given call counts (pstats' own shape), without running anything."""

    def __init__(self, calls: dict[tuple[str, int, str], int]) -> None:
        self.stats: dict[tuple[str, int, str], tuple[int, int, float, float, dict[object, object]]] = {
            func: (n, n, 0.0, 0.0, {}) for func, n in calls.items()
        }


def test_per_request_is_the_growth_over_the_requests() -> None:
    start = ("a.py", 1, "start")
    handle = ("~", 0, "<built-in method len>")
    before = Profile({start: 7, handle: 10})
    after = Profile({start: 7, handle: 410, ("b.py", 3, "new"): 100})
    rows = dict(per_request(before, after, 100))
    assert rows == {"a.py:1 start": 0.0, "<built-in method len>": 4.0, "b.py:3 new": 1.0}


@pytest.mark.slow
def test_the_gateway_and_the_floor_are_counted_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--requests", "100", "--concurrency", "2", "--max-ratio", "1.0"]) == 1  # the gateway does more
    out = capsys.readouterr().out
    gateway = float(re.search(r"gateway\s+([\d.]+)\n", out).group(1))  # type: ignore[union-attr]
    floor = float(re.search(r"floor\s+([\d.]+)\n", out).group(1))  # type: ignore[union-attr]
    # The floor's request is a few dozen calls (parse, key, write, copy the chunks); a count that took in the
    # warm-up or the start-up would be thousands.
    assert 20 < floor < 200 and floor < gateway < 5000, out
    assert "FAIL: " in out and "the gateway's most called" in out
