"""The same engine core driven in virtual time: no sleeping, as fast as Python goes.

A step that starts at t ends at t + its modelled duration; its tokens are delivered at
that end; requests that arrived meanwhile are scheduled at the next step, exactly as
in the real-time loop. With an API server modelled ([sim] frontend_*: frontend.py), a
request reaches the engine when the server has parsed it, and each token reaches its
client when the server has sent it on. Used by `zerogap sim plan` and by the tests that
check the served engine against the model.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from backends.sim.engine import words
from backends.sim.engine.core import EngineCore
from backends.sim.engine.frontend import Frontend
from backends.sim.engine.sequence import Sequence
from backends.sim.engine.steps import StepRecord, StepTimeline
from backends.sim.settings import SimSettings


@dataclass(slots=True)
class Arrival:
    t_s: float
    prompt_token_ids: list[int]
    max_tokens: int
    ignore_eos: bool = True
    user: int = 0  # who sent it: closed-loop drivers send the user's next request on finish


@dataclass(slots=True)
class VirtualRequest:
    arrival_s: float  # sent by the client; the client's times (first token, finish) are as it sees them
    num_prompt_tokens: int
    user: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    num_output_tokens: int = 0
    engine_arrival_s: float = 0.0  # past the API server (the engine's own TTFT runs from here)
    engine_first_token_s: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def engine_ttft_s(self) -> float | None:
        """From reaching the engine to the engine's first token: the API server's time left out."""
        return None if self.engine_first_token_s is None else self.engine_first_token_s - self.engine_arrival_s

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
    delivered_s: list[float] | None = None  # each token's arrival at its client, behind an API server

    def num_tokens_between(self, start_s: float, end_s: float) -> int:
        """Tokens that reached their clients in [start_s, end_s): as the engine made them, or,
        behind an API server, as it handed them out (in order: the server is first come, first served)."""
        if self.delivered_s is None:
            return sum(s.num_new_tokens for s in self.steps if start_s <= s.end_s < end_s)
        return bisect.bisect_left(self.delivered_s, end_s) - bisect.bisect_left(self.delivered_s, start_s)


OnFinish = Callable[[VirtualRequest, float], list[Arrival]]
_Queued = tuple[float, int, Arrival]  # (time, order sent, the request): a heap entry


class VirtualEngine:
    def __init__(self, settings: SimSettings) -> None:
        self.core = EngineCore(settings)
        self.frontend = Frontend.of(settings)
        self._order = itertools.count()

    def run(self, arrivals: list[Arrival], until_s: float, on_finish: OnFinish | None = None) -> VirtualRun:
        """Run until until_s of virtual time, or until no work and no arrival is left."""
        run = VirtualRun(delivered_s=None if self.frontend is None else [])
        sent: list[_Queued] = [(a.t_s, next(self._order), a) for a in arrivals]
        heapq.heapify(sent)
        parsed: list[_Queued] = []  # past the API server, by when they reach the engine
        live: dict[int, VirtualRequest] = {}
        timeline = StepTimeline()
        clock = 0.0
        while clock < until_s:
            self._through_frontend(sent, parsed, clock)
            while parsed and parsed[0][0] <= clock:
                t_s, _, arrival = heapq.heappop(parsed)
                self._admit(arrival, t_s, run, live)
            scheduled = self.core.next_step()
            if scheduled is None:
                if not sent and not parsed:
                    break
                timeline.idle()
                clock = max(clock, min(q[0][0] for q in (sent, parsed) if q))
                continue
            start, clock = clock, clock + scheduled.cost.duration_s
            events = self.core.finish(scheduled)
            batch = scheduled.batch
            run.steps.append(timeline.record(start, scheduled.cost, batch.num_seqs, batch.num_tokens, len(events)))
            self._through_frontend(sent, parsed, clock)  # requests sent during the step are ahead of its tokens
            for event in events:
                record = live[event.seq.seq_id]
                t_s = clock
                if self.frontend is not None and run.delivered_s is not None:
                    t_s = self.frontend.deliver(clock)
                    run.delivered_s.append(t_s)
                if record.first_token_s is None:
                    record.first_token_s, record.engine_first_token_s = t_s, clock
                record.num_output_tokens += 1
                if event.finished:
                    record.finish_s = t_s
                    del live[event.seq.seq_id]
                    for nxt in on_finish(record, t_s) if on_finish else []:
                        heapq.heappush(sent, (nxt.t_s, next(self._order), nxt))
        run.end_s = clock
        return run

    def _through_frontend(self, sent: list[_Queued], parsed: list[_Queued], clock: float) -> None:
        """Requests sent by clock go through the API server, in the order they were sent."""
        while sent and sent[0][0] <= clock:
            t_s, order, arrival = heapq.heappop(sent)
            heapq.heappush(parsed, (self.frontend.admit(t_s) if self.frontend else t_s, order, arrival))

    def _admit(self, arrival: Arrival, t_s: float, run: VirtualRun, live: dict[int, VirtualRequest]) -> None:
        seq: Sequence = self.core.new_sequence(arrival.prompt_token_ids, arrival.max_tokens, t_s, arrival.ignore_eos)
        record = VirtualRequest(arrival.t_s, seq.num_prompt_tokens, arrival.user, engine_arrival_s=t_s)
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
