"""Open-loop arrivals: a Poisson process of planned send times per process, at the
step's request rate times this process's share of the users. A free user takes the
next planned time, waits for it, and sends (which free user: loadgen/turns.py, the one freed
last, on its kept-alive connection); when every user is busy the planned time
passes, and the lag between planned and actual send is recorded (and a step whose
lag grows is marked invalid: more users are needed)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import gevent

from loadgen.turns import Turns
from loadreport.schedule import LoadSchedule

_IDLE_POLL_S = 0.05


class Arrivals:
    def __init__(
        self, plan: LoadSchedule, run_start: float, share: Callable[[], float], seed: int | None = None
    ) -> None:
        self.plan = plan
        self.run_start = run_start
        self.share = share
        self.rng = random.Random(seed)
        self.next_planned: float | None = None
        self.turns = Turns()

    def _rate(self, wall: float) -> float:
        return self.plan.rate_at(wall - self.run_start) * self.share()

    def take(self) -> float:
        """Block until the next planned send; return the planned wall-clock time."""
        with self.turns.hold():
            return self._take()

    def _take(self) -> float:
        while True:
            now = time.time()
            rate = self._rate(now if self.next_planned is None else max(now, self.next_planned))
            if rate > 0:
                break
            self.next_planned = None
            gevent.sleep(_IDLE_POLL_S)
        base = now if self.next_planned is None else self.next_planned
        planned = base + self.rng.expovariate(rate)
        self.next_planned = planned
        delay = planned - time.time()
        if delay > 0:
            gevent.sleep(delay)
        return planned
