"""The trial every candidate of one tune runs: the engine, the load steps and their timing,
the workload and the SLOs (zerogap.tune.estimate says how long it takes; grid.py makes the
candidates; tune.json writes it under its "plan" key)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Trial:
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
