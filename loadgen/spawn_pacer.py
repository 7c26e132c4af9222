"""Users start at load_test.spawn_rate, one after another, not in Locust's bursts.

Locust's dispatcher starts floor(spawn_rate) users in the same instant, once a second
(locust/dispatch.py: `_user_count_per_dispatch_iteration`), so `spawn_rate: 32` starts 32 users
together. Their first requests reach the engine together and a closed loop keeps them in step:
the engine runs one step with every request's prefill and no decode, its steps stay full
while they would otherwise be short, and TTFT hangs on the clients' turnaround (measured
against the sim at 32 streams: TTFT +3%, the token interval +1% over vLLM's own client, whose
ramp is spread). Each user's on_start therefore waits for its turn: the users of one burst
start evenly over the burst's period.

Spacing: in one process (LocalRunner) 1 / spawn_rate, what the user asked for. A worker
(--processes, --worker) gets its share of each burst and does not know how many workers share
it: it spreads its share over the burst's period (floor(rate) / rate seconds), which is the
same spacing for a full burst and never a burst for a partial one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import gevent
from gevent.event import Event


class _Burst:
    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.num_users = 0
        self.gathered = Event()


class SpawnPacer:
    def __init__(
        self,
        spawn_rate: float,
        one_process: bool,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = gevent.sleep,
    ) -> None:
        """spawn_rate 0 = all at once (as asked): no waiting."""
        self.spawn_rate = spawn_rate
        self.one_process = one_process
        self.period_s = max(1, math.floor(spawn_rate)) / spawn_rate if spawn_rate > 0 else 0.0
        self.clock, self.sleep = clock, sleep
        self.burst: _Burst | None = None

    def wait_turn(self) -> None:
        """Called by each user as it starts; returns at its turn. Locust starts a burst's users
        in one loop without yielding, so when the first of them runs, the rest are queued behind
        it: the first yields once, and by then every user of the burst has joined."""
        if self.spawn_rate <= 0:
            return
        burst, position = self._join()
        if position == 0:
            try:
                gevent.sleep(0)
            finally:
                self.burst = None
                burst.gathered.set()
        else:
            burst.gathered.wait()
        delay_s = burst.start_s + position * self.spacing_s(burst.num_users) - self.clock()
        if delay_s > 0:
            self.sleep(delay_s)

    def spacing_s(self, num_users: int) -> float:
        if self.one_process:
            return 1.0 / self.spawn_rate
        return self.period_s / max(num_users, 1)

    def _join(self) -> tuple[_Burst, int]:
        if self.burst is None:
            self.burst = _Burst(self.clock())
        burst = self.burst
        burst.num_users += 1
        return burst, burst.num_users - 1
