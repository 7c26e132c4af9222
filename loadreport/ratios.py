"""Two runs' figures as ratios B/A, step by step, matched by load: what `zerogap report A B`
prints under the two tables (and `zerogap sim plan --compare`, from its own figures)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StepFigures:
    """One step's figures as a ratio line reads them; None where the step did not measure one."""

    load: float  # the users (closed loop) or the request rate (open loop) the step held
    load_unit: str  # "users" or "req/s"
    output_tps: float | None
    gpu_busy_pct: float | None  # mean GPU utilization (busy share of the time), %
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None

    @classmethod
    def of_step(cls, step: dict[str, Any]) -> StepFigures:
        """From one of report.json's steps."""
        rate = "request_rate" in step
        gpu = step.get("gpu_util")
        return cls(
            load=float(step["request_rate"] if rate else step["concurrency"]),
            load_unit="req/s" if rate else "users",
            output_tps=step.get("output_tps"),
            gpu_busy_pct=gpu.get("mean") if isinstance(gpu, dict) else None,
            ttft_p50_ms=_p50(step.get("ttft_ms")),
            tpot_p50_ms=_p50(step.get("tpot_ms")),
        )


def _p50(figures: Any) -> float | None:
    return figures.get("p50") if isinstance(figures, dict) else None


FIGURES = (  # label, attribute, how a value is written, its unit
    ("output TPS", "output_tps", ",.0f", " tok/s"),
    ("GPU busy", "gpu_busy_pct", ".0f", "%"),
    ("TTFT p50", "ttft_p50_ms", ".1f", " ms"),
    ("TPOT p50", "tpot_p50_ms", ".1f", " ms"),
)


def _one(label: str, a: float | None, b: float | None, spec: str, unit: str) -> str:
    shown = f"{'-' if a is None else format(a, spec)} -> {'-' if b is None else format(b, spec)}{unit}"
    ratio = "-" if a is None or b is None or a == 0 else f"{b / a:.2f}x"
    return f"{label} {ratio} ({shown})"


def ratio_line(a: StepFigures, b: StepFigures, label_a: str = "A", label_b: str = "B") -> str:
    """One load's ratios B/A, e.g. `async/sync at 4 users: output TPS 1.50x (100 -> 150 tok/s), GPU busy
    1.20x (50 -> 60%), TTFT p50 0.80x (100.0 -> 80.0 ms), TPOT p50 1.00x (20.0 -> 20.0 ms)`; a figure
    missing on either side (or 0 in A) reads `-`."""
    parts = [_one(name, getattr(a, key), getattr(b, key), spec, unit) for name, key, spec, unit in FIGURES]
    return f"{label_b}/{label_a} at {a.load:g} {a.load_unit}: " + ", ".join(parts)


def _key(figures: StepFigures) -> tuple[str, float]:
    return figures.load_unit, round(figures.load, 9)


def ratio_lines(
    a: Sequence[StepFigures], b: Sequence[StepFigures], label_a: str = "A", label_b: str = "B"
) -> list[str]:
    """A ratio_line per load both runs held (in A's order), then a line naming the loads only one of them held."""
    in_b = {_key(f): f for f in b}
    lines = [ratio_line(f, in_b[_key(f)], label_a, label_b) for f in a if _key(f) in in_b]
    in_a = {_key(f) for f in a}
    only_a = [f"{f.load:g} {f.load_unit}" for f in a if _key(f) not in in_b]
    only_b = [f"{f.load:g} {f.load_unit}" for f in b if _key(f) not in in_a]
    if only_a or only_b:
        lines.append(
            "not compared (held by one run only): "
            + "; ".join(f"{name} {', '.join(loads)}" for name, loads in ((label_a, only_a), (label_b, only_b)) if loads)
        )
    return lines


def report_ratio_lines(a: dict[str, Any], b: dict[str, Any], label_a: str = "A", label_b: str = "B") -> list[str]:
    """ratio_lines of two report.json documents."""
    return ratio_lines(
        [StepFigures.of_step(s) for s in a["steps"]], [StepFigures.of_step(s) for s in b["steps"]], label_a, label_b
    )
