"""What a step reports when settings.json turns a metric off: metrics.collect_tps /
collect_ttft / collect_tpot / collect_gpu_util false, or workload.stream false (a
non-streamed answer has no token timing). Such a figure is null in report.json and
its reason is under the step's `not_collected`; the console and report.html leave it out."""

from __future__ import annotations

from typing import Any

from loadreport.settings import Settings

NOT_STREAMED = "workload.stream is false: a non-streamed answer has no token timing (TTFT = E2E)"


def not_collected(settings: Settings) -> dict[str, str]:
    """Step figure -> why it is not collected."""
    metrics, out = settings.metrics, dict[str, str]()
    if not metrics.collect_tps:
        out |= dict.fromkeys(("output_tps", "total_tps"), "metrics.collect_tps is false")
    if not metrics.collect_ttft:
        out |= dict.fromkeys(("ttft_ms", "ttfa_ms", "reasoning_ms"), "metrics.collect_ttft is false")
    if not settings.workload.stream:
        out |= dict.fromkeys(("tpot_ms", "itl_ms"), NOT_STREAMED)
    if not metrics.collect_tpot:
        out |= dict.fromkeys(("tpot_ms", "itl_ms"), "metrics.collect_tpot is false")
    if not metrics.collect_gpu_util:
        out["gpu_util"] = "metrics.collect_gpu_util is false"
    return out


def leave_out(settings: Settings, step: dict[str, Any]) -> dict[str, Any]:
    """The step with each figure that is not collected set to null, and the reasons beside."""
    reasons = not_collected(settings)
    for key in reasons:
        step[key] = None
    step["not_collected"] = reasons
    if "tpot_ms" in reasons:
        step["tpot_ms_reason"] = reasons["tpot_ms"]
        step["itl_ms_reason"] = reasons["itl_ms"]
    if "gpu_util" in reasons:
        step["gpu_util_reason"] = reasons["gpu_util"]
    return step


def p50(step: dict[str, Any], key: str, pct: str = "p50") -> float | None:
    """A latency percentile of a step, None when absent or not collected."""
    figures = step.get(key)
    return figures.get(pct) if figures else None


TIMELINE_COLUMNS = {
    "output_tps": ("output_tps",),
    "total_tps": ("total_tps",),
    "ttft_ms": ("ttft_p50_ms",),
    "tpot_ms": ("tpot_p50_ms",),
    "gpu_util": ("gpu_util",),
}


def blank_uncollected(settings: Settings, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """timeline.csv's rows with the columns of figures that are not collected left empty."""
    columns = [column for key in not_collected(settings) for column in TIMELINE_COLUMNS.get(key, ())]
    for row in rows:
        for column in columns:
            row[column] = None
    return rows
