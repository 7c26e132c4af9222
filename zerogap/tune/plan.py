"""What one tune runs per candidate: the steps, their timing, the workload, the SLOs."""

from __future__ import annotations

from dataclasses import dataclass

STARTUP_S = {"sim": 3.0, "vllm": 90.0}  # a replica's start, for the estimate
HARNESS_S = 6.0  # Locust's start and the run folder's writing, per candidate


@dataclass(frozen=True)
class TunePlan:
    engine: str  # sim | vllm
    steps: tuple[int, ...]
    step_s: float
    measure_s: float
    warmup_s: float
    input_tokens: int
    output_tokens: int
    slo_ttft_ms: float
    slo_tpot_ms: float
    virtual: bool = False

    def slo_s(self, time_scale: float = 1.0) -> tuple[float, float]:
        """The SLOs in seconds; a time-scaled sim's latencies are stretched by its time scale, so are they."""
        scale = time_scale if self.engine == "sim" else 1.0
        return self.slo_ttft_ms * scale / 1000.0, self.slo_tpot_ms * scale / 1000.0

    def estimate_s(self, num_candidates: int) -> float:
        """Wall time, roughly: virtual runs go as fast as Python does."""
        if self.virtual:
            return 0.05 * num_candidates * len(self.steps) * self.step_s / 10.0
        per = STARTUP_S[self.engine] + HARNESS_S + self.warmup_s + self.step_s * len(self.steps)
        return per * num_candidates
