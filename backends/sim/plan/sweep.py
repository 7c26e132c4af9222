"""`zerogap sim plan --concurrency ...`: a concurrency sweep in virtual time, each load on a
fresh engine, summarised per step (the capacity answer, --users, is capacity.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from backends.sim.plan.virtual import VirtualRun, closed_loop
from backends.sim.settings import SimSettings


@dataclass(frozen=True, slots=True)
class StepSummary:
    mode: str
    concurrency: int
    output_tps: float
    rps: float
    ttft_p50_s: float | None  # None: no request got its first token in the window
    ttft_p99_s: float | None
    tpot_mean_s: float | None  # None: no request finished in the window (hold the step longer)
    tpot_p50_s: float | None  # the median request's mean time per output token (the harness's TPOT p50)
    gpu_busy: float
    token_interval_ms: float  # the GPU's mean idle gap between two forwards
    cpu_interval_ms: float  # the CPU work per step, hidden or not
    forward_ms: float
    step_ms: float
    batch_mean: float

    def as_dict(self) -> dict[str, float | int | str | None]:
        return asdict(self)


def summarise(run: VirtualRun, mode: str, concurrency: int, start_s: float, end_s: float) -> StepSummary:
    """Measure the window [start_s, end_s] of a virtual run."""
    span = max(end_s - start_s, 1e-9)
    steps = [s for s in run.steps if start_s < s.end_s <= end_s]
    ttfts = [r.ttft_s for r in run.requests if r.first_token_s is not None and start_s < r.first_token_s <= end_s]
    tpots = [r.tpot_s for r in run.requests if r.finish_s is not None and start_s < r.finish_s <= end_s]
    done = sum(1 for r in run.requests if r.finish_s is not None and start_s < r.finish_s <= end_s)

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else 0.0

    ttft_arr = np.asarray([t for t in ttfts if t is not None])
    tpot_list = [t for t in tpots if t is not None]
    return StepSummary(
        mode=mode,
        concurrency=concurrency,
        output_tps=sum(s.num_new_tokens for s in steps) / span,
        rps=done / span,
        ttft_p50_s=float(np.percentile(ttft_arr, 50)) if ttft_arr.size else None,
        ttft_p99_s=float(np.percentile(ttft_arr, 99)) if ttft_arr.size else None,
        tpot_mean_s=mean(tpot_list) if tpot_list else None,
        tpot_p50_s=float(np.percentile(tpot_list, 50)) if tpot_list else None,
        gpu_busy=sum(s.forward_s for s in steps) / span,
        token_interval_ms=1000 * mean([s.gap_s for s in steps if s.gap_s is not None]),
        cpu_interval_ms=1000 * mean([s.cpu_s for s in steps]),
        forward_ms=1000 * mean([s.forward_s for s in steps]),
        step_ms=1000 * mean([s.duration_s for s in steps]),
        batch_mean=mean([float(s.num_seqs) for s in steps]),
    )


def run_sweep(
    settings: SimSettings,
    concurrencies: list[int],
    prompt_tokens: int,
    output_tokens: int,
    step_duration_s: float,
    measure_last_s: float,
    ramp_s: float = 10.0,
) -> list[StepSummary]:
    """Each step on a fresh engine: users started over ramp_s, measured over the last measure_last_s."""
    out = []
    for concurrency in concurrencies:
        ramp = min(ramp_s, step_duration_s - measure_last_s)
        run = closed_loop(settings, concurrency, prompt_tokens, output_tokens, step_duration_s, ramp_s=ramp)
        start = step_duration_s - measure_last_s
        out.append(summarise(run, settings.mode, concurrency, start, step_duration_s))
    return out


COLUMNS = (  # heading, attribute, width, format spec, multiplier (seconds -> ms)
    ("mode", "mode", 16, "", 1.0),
    ("concurrency", "concurrency", 11, "d", 1.0),
    ("output_tps", "output_tps", 10, ".0f", 1.0),
    ("rps", "rps", 7, ".2f", 1.0),
    ("ttft_p50_ms", "ttft_p50_s", 11, ".1f", 1000.0),
    ("ttft_p99_ms", "ttft_p99_s", 11, ".1f", 1000.0),
    ("tpot_p50_ms", "tpot_p50_s", 11, ".2f", 1000.0),
    ("gpu_busy", "gpu_busy", 8, ".1%", 1.0),
    ("token_interval_ms", "token_interval_ms", 17, ".1f", 1.0),
    ("cpu_interval_ms", "cpu_interval_ms", 15, ".1f", 1.0),
    ("forward_ms", "forward_ms", 10, ".1f", 1.0),
    ("step_ms", "step_ms", 7, ".1f", 1.0),
    ("batch_mean", "batch_mean", 10, ".1f", 1.0),
)


def format_table(rows: list[StepSummary]) -> str:
    """One line per step, every time in ms."""
    lines = [" ".join(heading.rjust(width) for heading, _, width, _, _ in COLUMNS)]
    for row in rows:
        cells = []
        for _, name, width, spec, scale in COLUMNS:
            value = getattr(row, name)
            if value is not None and scale != 1.0:
                value *= scale
            cells.append("-".rjust(width) if value is None else format(value, spec).rjust(width))
        lines.append(" ".join(cells))
    if any(row.tpot_mean_s is None for row in rows):
        lines.append("-: no request finished in the measured window; hold the step longer (--step-duration-s).")
    return "\n".join(lines)
