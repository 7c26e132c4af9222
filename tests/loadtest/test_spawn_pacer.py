"""loadgen/spawn_pacer.py: the users of one of Locust's bursts start one by one at the asked rate.

The users are greenlets started in one loop, as Locust's runner starts a burst; the clock
stands still and each user's wait is recorded instead of slept, so the figures are exact.
The real Locust run (local and over two worker processes) is test_spawn_rate_run.py.
"""

from __future__ import annotations

import gevent
import pytest

from loadgen.spawn_pacer import SpawnPacer


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def burst(pacer: SpawnPacer, num_users: int) -> list[float]:
    """Start num_users greenlets in one loop (no yield between them) and return each one's wait."""
    waits: dict[object, float] = {}
    pacer.sleep = lambda delay_s: waits.__setitem__(gevent.getcurrent(), delay_s)
    greenlets = [gevent.spawn(pacer.wait_turn) for _ in range(num_users)]
    gevent.joinall(greenlets, timeout=5, raise_error=True)
    assert all(g.dead for g in greenlets)
    return [waits.get(g, 0.0) for g in greenlets]


def test_one_process_starts_a_burst_at_the_asked_rate() -> None:
    pacer = SpawnPacer(32, one_process=True, clock=Clock())
    waits = burst(pacer, 32)
    assert waits == pytest.approx([index / 32 for index in range(32)])


def test_a_partial_burst_in_one_process_keeps_the_rate() -> None:
    """64 users asked at 100/s: Locust starts all 64 at once; they start 10 ms apart."""
    pacer = SpawnPacer(100, one_process=True, clock=Clock())
    assert burst(pacer, 64) == pytest.approx([index / 100 for index in range(64)])


def test_a_worker_spreads_its_share_over_the_bursts_period() -> None:
    """Two workers at 32/s: each gets 16 users a second and starts them 1/16 s apart."""
    pacer = SpawnPacer(32, one_process=False, clock=Clock())
    assert burst(pacer, 16) == pytest.approx([index / 16 for index in range(16)])


def test_a_fractional_rate_uses_locusts_period() -> None:
    """2.5/s: Locust starts 2 users every 0.8 s; a worker with both spaces them 0.4 s apart."""
    pacer = SpawnPacer(2.5, one_process=False, clock=Clock())
    assert burst(pacer, 2) == pytest.approx([0.0, 0.4])
    assert SpawnPacer(2.5, one_process=True, clock=Clock()).spacing_s(2) == pytest.approx(0.4)


def test_each_burst_starts_its_own_count() -> None:
    clock = Clock()
    pacer = SpawnPacer(8, one_process=True, clock=clock)
    assert burst(pacer, 8) == pytest.approx([index / 8 for index in range(8)])
    clock.now_s += 1.5  # the next burst (Locust sends one a second; this one came late)
    assert burst(pacer, 4) == pytest.approx([index / 8 for index in range(4)])


def test_a_user_past_its_turn_does_not_wait() -> None:
    """A starved process: 0.25 s went by while the burst gathered; who is past its turn goes at once."""
    clock = Clock()
    pacer = SpawnPacer(10, one_process=True, clock=clock)
    waits: list[float] = []
    pacer.sleep = waits.append
    users = [gevent.spawn(pacer.wait_turn) for _ in range(4)]
    gevent.spawn(lambda: setattr(clock, "now_s", clock.now_s + 0.25))  # runs while the burst gathers
    gevent.joinall(users, timeout=5, raise_error=True)
    assert waits == pytest.approx([0.05])  # turns at 0, 0.1, 0.2, 0.3 s


def test_spawn_rate_zero_is_all_at_once() -> None:
    pacer = SpawnPacer(0, one_process=True, clock=Clock())
    assert burst(pacer, 16) == [0.0] * 16


def test_a_killed_first_user_does_not_hold_the_rest() -> None:
    """Locust stops a user (a step down, the run's end) while it gathers its burst: the others
    of the burst still get their turns."""
    pacer = SpawnPacer(4, one_process=True, clock=Clock())
    waits: list[float] = []
    pacer.sleep = waits.append
    first = gevent.spawn(pacer.wait_turn)
    others = [gevent.spawn(pacer.wait_turn) for _ in range(3)]
    gevent.sleep(0)  # the first runs and yields; the others join the burst
    first.kill()
    gevent.joinall(others, timeout=5, raise_error=True)
    assert all(g.dead for g in others)
    assert waits == pytest.approx([0.25, 0.5, 0.75])
