"""The engine core: scheduler + cost model + the synthetic model, with no clock.

next_step() schedules a step (the batch the scheduler picks and how long it takes);
finish() applies it when its time has come. engine.py drives it in real time, virtual.py in virtual time.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

from backends.sim.engine import words
from backends.sim.engine.block_manager import BlockManager
from backends.sim.engine.cost_model import CostModel, StepCost
from backends.sim.engine.scheduler import Batch, Scheduler, TokenEvent
from backends.sim.engine.sequence import Sequence
from backends.sim.settings import SimSettings


@dataclass(frozen=True, slots=True)
class ScheduledStep:
    """A step decided but not yet run: the batch schedule() picked and its modelled cost."""

    batch: Batch
    cost: StepCost


class EngineCore:
    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        c = settings.cost
        self.blocks = BlockManager(
            c.kv_cache_blocks, c.block_size, c.enable_prefix_caching, record_events=c.kv_events_endpoint is not None
        )
        self.scheduler = Scheduler(
            self.blocks,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_model_len=settings.max_model_len,
            enable_chunked_prefill=settings.enable_chunked_prefill,
        )
        self.cost = CostModel(settings)
        self._ids = itertools.count()
        self._rng = random.Random(c.seed)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def new_sequence(
        self,
        prompt_token_ids: list[int],
        max_tokens: int,
        arrival_s: float,
        ignore_eos: bool = False,
        stop_ids: frozenset[int] = frozenset(),
    ) -> Sequence:
        p = self.settings.cost.eos_probability
        eos_at = None
        if p > 0 and not ignore_eos:
            eos_at = 1 + int(self._rng.expovariate(-math.log1p(-p)))  # geometric: EOS chance p per token
        return Sequence(next(self._ids), prompt_token_ids, max_tokens, arrival_s, ignore_eos, stop_ids, eos_at)

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def abort(self, seq: Sequence) -> None:
        self.scheduler.abort(seq)

    def next_step(self) -> ScheduledStep | None:
        """The next step, or None when there is nothing to run."""
        if not self.scheduler.has_work:
            return None
        batch = self.scheduler.schedule()
        if not batch.items:
            return None
        return ScheduledStep(batch, self.cost.step(batch))

    def finish(self, step: ScheduledStep) -> list[TokenEvent]:
        return self.scheduler.postprocess(step.batch, _sample)


def _sample(seq: Sequence) -> int:
    return words.output_token(seq.seq_id, seq.num_output_tokens)
