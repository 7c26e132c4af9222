"""The same engine core driven in virtual time: no sleeping, as fast as Python goes.

A step that starts at t ends at t + its modelled duration; its tokens are delivered at
that end; requests that arrived meanwhile are scheduled at the next step, exactly as
in the real-time loop. Used by `zerogap sim plan` and by the tests that check the
served engine against the model.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from backends.sim import words
from backends.sim.core import EngineCore
from backends.sim.sequence import Sequence
from backends.sim.settings import SimSettings
from backends.sim.steps import StepRecord, StepTimeline


@dataclass(slots=True)
class Arrival:
    t_s: float
    prompt_token_ids: list[int]
    max_tokens: int
    ignore_eos: bool = True
    user: int = 0  # who sent it: closed-loop drivers send the user's next request on finish


@dataclass(slots=True)
class VirtualRequest:
    arrival_s: float
    num_prompt_tokens: int
    user: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    num_output_tokens: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if self.finish_s is None or self.first_token_s is None or self.num_output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.num_output_tokens - 1)


@dataclass
class VirtualRun:
    requests: list[VirtualRequest] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    end_s: float = 0.0


OnFinish = Callable[[VirtualRequest, float], list[Arrival]]


class VirtualEngine:
    def __init__(self, settings: SimSettings) -> None:
        self.core = EngineCore(settings)
        self._order = itertools.count()

    def run(self, arrivals: list[Arrival], until_s: float, on_finish: OnFinish | None = None) -> VirtualRun:
        """Run until until_s of virtual time, or until no work and no arrival is left."""
        run = VirtualRun()
        pending: list[tuple[float, int, Arrival]] = [(a.t_s, next(self._order), a) for a in arrivals]
        heapq.heapify(pending)
        live: dict[int, VirtualRequest] = {}
        timeline = StepTimeline()
        clock = 0.0
        while clock < until_s:
            while pending and pending[0][0] <= clock:
                self._admit(heapq.heappop(pending)[2], run, live)
            scheduled = self.core.next_step()
            if scheduled is None:
                if not pending:
                    break
                timeline.idle()
                clock = max(clock, pending[0][0])
                continue
            start, clock = clock, clock + scheduled.cost.duration_s
            events = self.core.finish(scheduled)
            batch = scheduled.batch
            run.steps.append(timeline.record(start, scheduled.cost, batch.num_seqs, batch.num_tokens, len(events)))
            for event in events:
                record = live[event.seq.seq_id]
                if record.first_token_s is None:
                    record.first_token_s = clock
                record.num_output_tokens += 1
                if event.finished:
                    record.finish_s = clock
                    del live[event.seq.seq_id]
                    for nxt in on_finish(record, clock) if on_finish else []:
                        heapq.heappush(pending, (nxt.t_s, next(self._order), nxt))
        run.end_s = clock
        return run

    def _admit(self, arrival: Arrival, run: VirtualRun, live: dict[int, VirtualRequest]) -> None:
        seq: Sequence = self.core.new_sequence(
            arrival.prompt_token_ids, arrival.max_tokens, arrival.t_s, arrival.ignore_eos
        )
        record = VirtualRequest(arrival.t_s, seq.num_prompt_tokens, arrival.user)
        live[seq.seq_id] = record
        run.requests.append(record)
        self.core.add(seq)


def random_prompt(rng: random.Random, num_tokens: int) -> list[int]:
    """Distinct prompts (no prefix-cache hits) of an exact token length."""
    return [rng.randrange(len(words.WORDS), words.VOCAB_SIZE) for _ in range(num_tokens)]


def closed_loop(
    settings: SimSettings,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    duration_s: float,
    gap_s: float | None = None,
    ramp_s: float = 0.0,
    seed: int = 0,
) -> VirtualRun:
    """concurrency users, started evenly over ramp_s (as Locust's spawn rate does), each
    sending its next request a gap after its last one ended: gap_s exactly when given, else
    drawn uniformly from [0, 2 x [sim].client_gap_ms] (a load generator's turnaround varies,
    so the request lands anywhere in the engine's step, as it does against a served engine)."""
    rng = random.Random(seed)
    mean_gap_s = settings.cost.client_gap_ms * settings.time_scale / 1000.0

    def gap() -> float:
        if gap_s is not None:
            return gap_s
        return rng.uniform(0.0, 2.0 * mean_gap_s) if mean_gap_s > 0 else 0.0

    def arrival(t_s: float, user: int) -> Arrival:
        return Arrival(t_s, random_prompt(rng, prompt_tokens), output_tokens, user=user)

    def on_finish(record: VirtualRequest, t_s: float) -> list[Arrival]:
        return [arrival(t_s + gap(), record.user)]

    starts = [arrival(ramp_s * i / concurrency, i) for i in range(concurrency)]
    return VirtualEngine(settings).run(starts, duration_s, on_finish)
