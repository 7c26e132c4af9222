"""loadgen/turns.py: which free user sends next in the open-loop modes. Greenlets as the users, as
Locust runs them; the order of events, no clock."""

from __future__ import annotations

import gevent
from gevent.event import Event

from loadgen.turns import Turns


def settle() -> None:
    """Let every greenlet that can run, run (each hand-over is a greenlet woken in turn)."""
    for _ in range(10):
        gevent.sleep(0)


def test_at_most_size_hold_and_the_user_freed_last_goes_first() -> None:
    turns = Turns(size=2)
    release = {name: Event() for name in "abcde"}
    order: list[str] = []

    def user(name: str) -> None:
        with turns.hold():
            order.append(name)
            release[name].wait()

    users = [gevent.spawn(user, name) for name in "abcde"]
    settle()  # a and b hold; c, d and e wait, in that order
    assert order == ["a", "b"] and turns.num_holding == 2 and len(turns.waiting) == 3
    release["a"].set()
    settle()
    assert order == ["a", "b", "e"]  # the last to come first: its connection the warmest
    release["b"].set()
    release["e"].set()
    settle()
    assert order == ["a", "b", "e", "d", "c"]
    release["d"].set()
    release["c"].set()
    gevent.joinall(users, timeout=5)
    assert turns.num_holding == 0 and not turns.waiting


def test_a_user_stopped_while_it_waits_loses_no_turn() -> None:
    turns = Turns(size=1)
    go = Event()
    held: list[str] = []

    def user(name: str) -> None:
        with turns.hold():
            held.append(name)
            go.wait()

    first = gevent.spawn(user, "first")
    stopped = gevent.spawn(user, "stopped")
    settle()
    stopped.kill()  # a step that lowers the users, or the run's end
    later = gevent.spawn(user, "later")
    settle()
    go.set()
    gevent.joinall([first, later], timeout=5)
    assert held == ["first", "later"] and turns.num_holding == 0 and not turns.waiting
