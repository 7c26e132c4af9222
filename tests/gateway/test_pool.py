"""gateway/pool.py: the backend each policy chooses."""

from __future__ import annotations

from gateway.pool import Backend, ModelPool


def test_least_load_and_round_robin_choices() -> None:
    a, b, c = Backend("a", "u", "m"), Backend("b", "u", "m"), Backend("c", "u", "m")
    pool = ModelPool("m", [a, b, c], "least_load")
    a.num_reported, b.num_inflight, c.num_reported = 5, 1, 2
    assert pool.choose() is b
    assert pool.choose([b]) is c
    b.healthy = False
    assert pool.choose() is c
    rr = ModelPool("m", [a, b, c], "round_robin")
    assert [rr.choose() for _ in range(4)] == [a, c, c, a]  # b is down; rotation goes on
    a.healthy = c.healthy = False
    assert rr.choose() is None
