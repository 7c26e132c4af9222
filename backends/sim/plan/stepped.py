"""A stepped closed-loop run in virtual time, shaped as the harness runs one: a warm-up at
the first step's users, then each step's users (added at its start over spawn_s, as
Locust spawns them; surplus users stop at their next request), each user's next request a
random 0..2 x [sim].client_gap_ms after its last response. Each step is measured over its
window (its last measure_s) as the harness measures it.

A continuous run keeps what a step inherits from the one before (requests in flight,
users whose requests end together because they started together), which a fresh engine
per step does not: the forward model of `zerogap sim calibrate`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from backends.sim.plan.pool_predict import Predicted
from backends.sim.plan.virtual import Arrival, VirtualEngine, VirtualRequest, VirtualRun, random_prompt
from backends.sim.settings import SimSettings


@dataclass(frozen=True, slots=True)
class Step:
    users: int
    step_s: float  # how long the step holds
    measure_s: float  # its window: the last measure_s


@dataclass(frozen=True, slots=True)
class Schedule:
    steps: tuple[Step, ...]
    prompt_tokens: int
    output_tokens: int
    warmup_s: float = 0.0
    spawn_s: float = 1.0

    def start_s(self, k: int) -> float:
        return self.warmup_s + sum(s.step_s for s in self.steps[:k])

    @property
    def end_s(self) -> float:
        return self.start_s(len(self.steps))

    def users_at(self, t_s: float) -> int:
        for k in range(len(self.steps) - 1, -1, -1):
            if t_s >= self.start_s(k):
                return self.steps[k].users
        return self.steps[0].users


def simulate(settings: SimSettings, schedule: Schedule, seed: int = 0) -> VirtualRun:
    rng = random.Random(seed)
    gap_s = settings.cost.client_gap_ms * settings.time_scale / 1000.0

    def arrival(t_s: float, user: int) -> Arrival:
        return Arrival(t_s, random_prompt(rng, schedule.prompt_tokens), schedule.output_tokens, user=user)

    first = schedule.steps[0].users
    starts = [arrival(schedule.spawn_s * i / first, i) for i in range(first)]
    for k, step in enumerate(schedule.steps):
        before = schedule.steps[k - 1].users if k else first
        added = max(step.users - before, 1)
        t0 = schedule.start_s(k)
        starts += [arrival(t0 + schedule.spawn_s * (i - before) / added, i) for i in range(before, step.users)]

    def on_finish(record: VirtualRequest, t_s: float) -> list[Arrival]:
        t_next = t_s + (rng.uniform(0.0, 2.0 * gap_s) if gap_s > 0 else 0.0)
        return [arrival(t_next, record.user)] if record.user < schedule.users_at(t_next) else []

    return VirtualEngine(settings).run(starts, schedule.end_s, on_finish)


def measure(run: VirtualRun, start_s: float, end_s: float) -> Predicted:
    """One window [start_s, end_s) of a run, as the harness measures a step."""
    span = max(end_s - start_s, 1e-9)
    steps = [s for s in run.steps if start_s <= s.end_s < end_s]
    ended = [r for r in run.requests if r.finish_s is not None and start_s <= r.finish_s < end_s]
    ttfts = [r.ttft_s for r in ended if r.ttft_s is not None]
    engine_ttfts = [r.engine_ttft_s for r in ended if r.engine_ttft_s is not None]
    tpots = [r.tpot_s for r in ended if r.tpot_s is not None]
    return Predicted(
        output_tps=run.num_tokens_between(start_s, end_s) / span,
        ttft_p50_ms=1000.0 * float(np.percentile(ttfts, 50)) if ttfts else None,
        tpot_p50_ms=1000.0 * float(np.percentile(tpots, 50)) if tpots else None,
        gpu_busy=sum(s.forward_s for s in steps) / span,
        cpu_interval_ms=1000.0 * float(np.mean([s.cpu_s for s in steps])) if steps else 0.0,
        running_mean=sum(s.num_seqs * s.duration_s for s in steps) / span,
        num_requests=len(ended),
        ttft_mean_ms=1000.0 * float(np.mean(ttfts)) if ttfts else None,
        tpot_mean_ms=1000.0 * float(np.mean(tpots)) if tpots else None,
        engine_ttft_p50_ms=1000.0 * float(np.percentile(engine_ttfts, 50)) if engine_ttfts else None,
        engine_ttft_mean_ms=1000.0 * float(np.mean(engine_ttfts)) if engine_ttfts else None,
    )


def measure_steps(run: VirtualRun, schedule: Schedule) -> list[Predicted]:
    out = []
    for k, step in enumerate(schedule.steps):
        end = schedule.start_s(k) + step.step_s
        out.append(measure(run, end - step.measure_s, end))
    return out
