"""The run's measured part of report.json: each step's figures, the knee (where more load only
queues) and the diagnosis (why TPS stops growing), as typed models."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadreport.diagnosis import diagnose_steps
from loadreport.diagnosis_reading import p50
from loadreport.record import Recorder
from loadreport.schedule import LoadSchedule
from loadreport.schema import Diagnosis, Knee, Step
from loadreport.settings import Settings
from loadreport.summary import summarize_step
from loadreport.timeline import Sample

KNEE_GROWTH = 0.10  # TPS grows less than 10% to the next step: the knee


@dataclass(frozen=True)
class RunSummary:
    steps: list[Step]
    knee: Knee | None
    diagnosis: list[Diagnosis]

    def to_json(self) -> dict[str, Any]:
        """report.json's steps, knee and diagnosis, as the file holds them."""
        return {
            "steps": [step.to_json() for step in self.steps],
            "knee": None if self.knee is None else self.knee.to_json(),
            "diagnosis": [entry.to_json() for entry in self.diagnosis],
        }


def _latency_ms(step: Step) -> float:
    """What the knee compares: TPOT p50 plus TTFT p50 (E2E p50 when TTFT is not collected)."""
    return (p50(step.tpot_ms) or 0.0) + (p50(step.ttft_ms) or p50(step.e2e_ms) or 0.0)


def find_knee(steps: Sequence[Step]) -> Knee | None:
    """The step after which TPS grows less than 10% while latency grows."""
    for here, after in itertools.pairwise(steps):
        if not here.output_tps or after.output_tps is None:
            continue
        growth = after.output_tps / here.output_tps - 1.0
        if growth < KNEE_GROWTH and _latency_ms(after) > _latency_ms(here):
            return Knee.build(
                step=here.index,
                load=here.load,
                tps_growth_to_next=round(growth, 4),
                text=f"TPS grows {growth * 100:.1f}% after {here.load} while latency grows: more load only queues",
            )
    return None


def summarize_run(
    settings: Settings,
    plan: LoadSchedule,
    run_start: float,
    run_end: float,
    recorder: Recorder,
    samples: list[Sample],
    final: Mapping[int, Step] | None = None,
) -> RunSummary:
    """final: steps already summarized (index -> step), used as they are: the figures their console
    line printed are the report's."""
    final = final or {}
    summaries = (
        final.get(phase.index) or summarize_step(settings, plan, phase, run_start, run_end, recorder, samples)
        for phase in plan.steps
    )
    steps = [step for step in summaries if step is not None]
    return RunSummary(steps, find_knee(steps), diagnose_steps(steps))
