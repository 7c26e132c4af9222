"""`zerogap sim plan --compare`: each fix against the baseline as ratio lines (output TPS,
GPU busy, TTFT p50, TPOT p50), the same lines `zerogap report A B` prints for two runs."""

from __future__ import annotations

from backends.sim.plan.sweep import StepSummary
from loadreport import StepFigures, ratio_lines


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


def figures(row: StepSummary) -> StepFigures:
    return StepFigures(
        load=float(row.concurrency),
        load_unit="users",
        output_tps=row.output_tps,
        gpu_busy_pct=100.0 * row.gpu_busy,
        ttft_p50_ms=_ms(row.ttft_p50_s),
        tpot_p50_ms=_ms(row.tpot_p50_s),
    )


def compare_lines(rows: list[StepSummary]) -> list[str]:
    """Every mode after the first against the first (the baseline), load by load."""
    modes: dict[str, list[StepSummary]] = {}
    for row in rows:
        modes.setdefault(row.mode, []).append(row)
    names = list(modes)
    if len(names) < 2:
        return []
    base = [figures(r) for r in modes[names[0]]]
    lines = []
    for name in names[1:]:
        lines += ratio_lines(base, [figures(r) for r in modes[name]], names[0], name)
    return lines
