"""Where an engine step's time goes: the GPU forward and the CPU token interval.

    forward  = forward_fixed + forward_per_seq * decoding seqs + forward_per_prefill_token * prefill tokens
    interval = interval_fixed
             + interval_per_seq * seqs in the batch                  (append, stop checks, stream)
             + interval_schedule_per_seq * rescheduled seqs           (baseline: all; slot reuse: changed)
             + interval_detokenize_per_seq * seqs  (only when detokenizer_async is off)
    step     = forward + interval                        (synchronous)
             = max(forward, interval) + async_overhead   (async scheduling)

Every time is multiplied by time_scale. See backends/sim/README.md for the calibration.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.sim.engine.scheduler import Batch
from backends.sim.settings import SimSettings


@dataclass(frozen=True, slots=True)
class StepCost:
    forward_s: float
    interval_s: float
    duration_s: float


class CostModel:
    def __init__(self, settings: SimSettings) -> None:
        c = settings.cost
        ms = settings.time_scale / 1000.0
        self.async_scheduling = settings.async_scheduling
        self.slot_reuse = settings.slot_reuse
        self.forward_fixed_s = c.forward_fixed_ms * ms
        self.forward_per_seq_s = c.forward_per_seq_ms * ms
        self.forward_per_prefill_token_s = c.forward_per_prefill_token_ms * ms
        self.interval_fixed_s = c.interval_fixed_ms * ms
        per_seq = c.interval_per_seq_ms + (0.0 if settings.detokenizer_async else c.interval_detokenize_per_seq_ms)
        self.interval_per_seq_s = per_seq * ms
        self.interval_schedule_per_seq_s = c.interval_schedule_per_seq_ms * ms
        self.async_overhead_s = c.async_overhead_ms * ms

    def forward_s(self, num_decode_seqs: int, num_prefill_tokens: int) -> float:
        return (
            self.forward_fixed_s
            + self.forward_per_seq_s * num_decode_seqs
            + self.forward_per_prefill_token_s * num_prefill_tokens
        )

    def interval_s(self, num_seqs: int, num_changed: int) -> float:
        rescheduled = min(num_changed, num_seqs) if self.slot_reuse else num_seqs
        return (
            self.interval_fixed_s + self.interval_per_seq_s * num_seqs + self.interval_schedule_per_seq_s * rescheduled
        )

    def step(self, batch: Batch) -> StepCost:
        forward = self.forward_s(batch.num_decode_seqs, batch.num_prefill_tokens)
        interval = self.interval_s(batch.num_seqs, batch.num_changed)
        if self.async_scheduling:
            duration = max(forward, interval) + self.async_overhead_s
        else:
            duration = forward + interval
        return StepCost(forward, interval, duration)
