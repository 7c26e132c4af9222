"""bench/limiter_cost.py runs each limiter's cycle and prints its table (no timing is checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import limiter_cost
from tests.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]


def test_each_limiter_and_a_previous_tree_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    require_tool("redis-server")
    argv = ["--requests", "40", "--concurrency", "8", "--rounds", "2", "--previous", str(ROOT)]
    assert limiter_cost.main(argv) == 0
    out = capsys.readouterr().out
    for name in ("memory", "redis", "previous"):
        assert f"| {name} | " in out
    assert "redis vs previous, CPU per request" in out and "NOTE" not in out  # Redis answered every request


def test_a_previous_tree_is_loaded_under_its_own_name() -> None:
    from gateway.tenants.limits.redis import RedisLimiter

    previous = limiter_cost.previous_redis_limiter(ROOT)
    assert previous is not RedisLimiter and previous.__module__ == "previous_limits_redis"
