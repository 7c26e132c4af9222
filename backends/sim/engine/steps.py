"""What one engine step did, as plain data, and where its forward sat on the GPU.

A step runs from start_s to end_s (= start_s + its modelled duration); its tokens are
delivered at end_s. The modelled forward is the step's last forward_s seconds, so
before it the GPU waits for the CPU: the whole interval with synchronous scheduling,
only the part that async scheduling cannot hide otherwise. The token interval the
article means (what the GPU sees) is then measured between two recorded forwards:
this step's forward start minus the previous step's forward end. The CPU work of the
step (cpu_s, hidden or not) is recorded beside it.

The real-time loop (engine.py) and the virtual-time loop (virtual.py) record their
steps with the same StepTimeline, so `zerogap sim plan` and the served engine's
/metrics read the same quantity.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.sim.engine.cost_model import StepCost


@dataclass(frozen=True, slots=True)
class StepRecord:
    start_s: float
    forward_start_s: float
    end_s: float  # the forward's end: the step's tokens are delivered now
    cpu_s: float  # the step's CPU work (the token interval of the cost model), hidden or not
    gap_s: float | None  # GPU idle since the previous forward ended; None: the engine was idle before
    num_seqs: int
    num_tokens: int  # tokens computed (prefill + decode)
    num_new_tokens: int  # tokens sampled

    @property
    def forward_s(self) -> float:
        return self.end_s - self.forward_start_s

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class StepTimeline:
    """Places each step's forward and measures the GPU's gap since the last one."""

    def __init__(self) -> None:
        self.last_forward_end_s: float | None = None

    def idle(self) -> None:
        """The engine ran out of work: the next step's wait is not a token interval."""
        self.last_forward_end_s = None

    def record(self, start_s: float, cost: StepCost, num_seqs: int, num_tokens: int, num_new_tokens: int) -> StepRecord:
        end_s = start_s + cost.duration_s
        forward_start_s = end_s - cost.forward_s
        last = self.last_forward_end_s
        gap_s = None if last is None else forward_start_s - last
        self.last_forward_end_s = end_s
        return StepRecord(start_s, forward_start_s, end_s, cost.interval_s, gap_s, num_seqs, num_tokens, num_new_tokens)
