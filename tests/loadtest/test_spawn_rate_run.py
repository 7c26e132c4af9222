"""The real `locust -f loadtest/ --headless` starts its users at load_test.spawn_rate, one by
one, not in Locust's bursts (loadgen/spawn_pacer.py; Locust alone starts floor(rate) users in
the same instant, once a second).

The upstream holds each request 1.5 s before its first token, so the first USERS requests it
sees are the users' first ones. At 16 users per second they arrive over 15/16 s; in a burst,
within a few ms. The bounds are half the planned spread (a wait never ends early; only a
starved first user, late to its own turn, could shorten it).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from statistics import median

import pytest

from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.loadtest.helpers import read_report, run_locust, write_settings

USERS, SPAWN_RATE = 16, 16.0
PLANNED_SPREAD_S = (USERS - 1) / SPAWN_RATE


def first_arrivals(tmp_path: Path, *extra: str) -> list[float]:
    behavior = Behavior(ttft_s=1.5, interval_s=0.05, num_output_tokens=4)
    with UpstreamServer(behavior) as up:
        settings = write_settings(
            tmp_path / "settings.json", up.url, tmp_path / "runs", "spawn",
            load_test={"steps": [USERS], "spawn_rate": SPAWN_RATE, "warmup_seconds": 1,
                       "step_duration_seconds": 3, "measure_last_seconds": 2},
            workload={"max_output_tokens": 4},
        )  # fmt: skip
        result = run_locust(settings, *extra)
        seen = list(up.requests)
    assert result.returncode == 0, result.stderr[-3000:]
    (step,) = read_report(tmp_path / "runs" / "spawn")["steps"]
    assert step["requests_failed"] == 0, step
    arrivals = sorted(s.arrived_wall for s in seen)
    assert len(arrivals) >= USERS, arrivals
    return arrivals[:USERS]


@pytest.mark.slow
def test_one_process_starts_its_users_one_by_one(tmp_path: Path) -> None:
    arrivals = first_arrivals(tmp_path)
    gaps = [after - before for before, after in itertools.pairwise(arrivals)]
    assert arrivals[-1] - arrivals[0] >= PLANNED_SPREAD_S / 2, gaps
    assert median(gaps) >= 0.5 / SPAWN_RATE, gaps  # evenly: not a few bursts


@pytest.mark.slow
def test_worker_processes_start_their_users_one_by_one(tmp_path: Path) -> None:
    """Each worker gets half of each burst and spreads it over the burst's second."""
    arrivals = first_arrivals(tmp_path, "--processes", "2")
    assert arrivals[-1] - arrivals[0] >= PLANNED_SPREAD_S / 2, arrivals
