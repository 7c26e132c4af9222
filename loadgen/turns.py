"""Which free user sends next in the open-loop modes (a trace's rows, Poisson arrivals).

At most `size` users at a time hold the next planned send and wait for its time (a burst of sends
due together still goes out together); the other free users wait for a turn, the one freed last
going first, as a client's connection pool hands out the connection used last. The few users a
pace needs then send every request on connections kept alive, instead of the whole pool taking
turns, each user's connection idle for pool / rate seconds (a server's keep-alive timeout closes
it, and the next request's connect lands in its TTFT)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from gevent.event import Event

MAX_HOLDING = 4  # users holding a planned send while they wait for its time, at once


class Turns:
    __slots__ = ("num_holding", "size", "waiting")

    def __init__(self, size: int = MAX_HOLDING) -> None:
        self.size = size
        self.num_holding = 0  # users holding a turn, at most size
        self.waiting: list[Event] = []  # free users waiting for a turn; the last to come goes first

    @contextmanager
    def hold(self) -> Iterator[None]:
        """A turn, for as long as the block runs (take the next send and wait for its time in it)."""
        if self.num_holding < self.size:
            self.num_holding += 1
        else:
            turn = Event()
            self.waiting.append(turn)
            try:
                turn.wait()  # set by a holder leaving: its turn comes with it
            except BaseException:  # the user was stopped while it waited
                if turn.is_set():
                    self._hand_over()
                else:
                    self.waiting.remove(turn)
                raise
        try:
            yield
        finally:
            self._hand_over()

    def _hand_over(self) -> None:
        if self.waiting:
            self.waiting.pop().set()
        else:
            self.num_holding -= 1
