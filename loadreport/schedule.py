"""The run's phases in time: an unmeasured warm-up at the first step's load, then each
step held for its duration and measured over its last seconds (the article's advice:
32 -> 128 -> 256, 3 minutes each, average the last 2)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from loadreport.settings import LoadTestSection


@dataclass(frozen=True)
class Phase:
    index: int  # the step's number from 0; -1 for the warm-up
    load: float  # users (closed loop) or requests/s (open loop)
    start_s: float  # from the start of the run
    end_s: float
    measure_start_s: float

    @property
    def measured(self) -> bool:
        return self.index >= 0


@dataclass(frozen=True)
class LoadSchedule:
    """The run's phases from settings.json's load_test: what Locust's shape ticks through and
    what each step's summary measures."""

    phases: tuple[Phase, ...]
    open_loop: bool
    concurrency: int  # open loop: the users that send (most requests in flight)
    spawn_rate: float

    @classmethod
    def from_settings(cls, load: LoadTestSection) -> LoadSchedule:
        open_loop = load.request_rate > 0
        if load.steps:
            loads, duration, measure = list(load.steps), load.step_duration_seconds, load.measure_last_seconds
        else:
            loads = [load.request_rate if open_loop else float(load.concurrency)]
            duration, measure = load.duration_seconds, load.duration_seconds
        phases: list[Phase] = []
        clock = 0.0
        if load.warmup_seconds > 0:
            phases.append(Phase(-1, loads[0], 0.0, load.warmup_seconds, load.warmup_seconds))
            clock = load.warmup_seconds
        for index, value in enumerate(loads):
            end = clock + duration
            phases.append(Phase(index, value, clock, end, end - min(measure, duration)))
            clock = end
        return cls(tuple(phases), open_loop, load.concurrency, load.spawn_rate)

    @property
    def steps(self) -> list[Phase]:
        return [phase for phase in self.phases if phase.measured]

    @property
    def total_s(self) -> float:
        return self.phases[-1].end_s

    def phase_at(self, run_time_s: float) -> Phase | None:
        for phase in self.phases:
            if phase.start_s <= run_time_s < phase.end_s:
                return phase
        return None

    def users_for(self, phase: Phase) -> int:
        return self.concurrency if self.open_loop else int(phase.load)

    def tick(self, run_time_s: float) -> tuple[int, float] | None:
        """What Locust's LoadTestShape.tick returns: (users, spawn rate), or None at the end."""
        phase = self.phase_at(run_time_s)
        if phase is None:
            return None
        users = self.users_for(phase)
        return users, self.spawn_rate if self.spawn_rate > 0 else float(max(users, 1))

    def cut_at(self, run_time_s: float) -> LoadSchedule:
        """The schedule with its last phase ending at run_time_s (a trace's run ends when it does)."""
        last = self.phases[-1]
        phases = (
            *self.phases[:-1],
            replace(last, end_s=run_time_s, measure_start_s=min(last.measure_start_s, run_time_s)),
        )
        return replace(self, phases=phases)

    def rate_at(self, run_time_s: float) -> float:
        """Open loop: the requests/s planned at this moment (0 outside the run)."""
        phase = self.phase_at(run_time_s)
        return phase.load if (phase is not None and self.open_loop) else 0.0
