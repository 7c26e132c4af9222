"""What `zerogap sim calibrate` fits to: the steps of stepped load-test runs, read from
their run folders (report.json, timeline.csv and settings.json, as the harness writes them).

A step becomes an Observation: the load it held (users, prompt and output tokens) and what
was measured over its window (output TPS, TPOT p50, TTFT p50, GPU busy, the engine's own
signals where its /metrics had them). Open-loop steps and steps without a successful
request are left out, with the reason, since the model's virtual load is a closed loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadreport import ReportError, read_report

OUTSIDE_MIN = 0.1  # the share of users outside the engine below which the sampled gauges cannot tell


class CalibrationError(Exception):
    """Input that cannot be fitted; str() says what to do."""


@dataclass(frozen=True, slots=True)
class Observation:
    run: str  # the run folder's name
    index: int  # the step's index in its run
    users: int
    prompt_tokens: int
    output_tokens: int
    output_tps: float
    tpot_p50_ms: float | None
    ttft_p50_ms: float | None
    e2e_p50_ms: float | None
    tpot_mean_ms: float | None  # the means are what the fit matches (smoother than the p50s)
    ttft_mean_ms: float | None
    gpu_busy: float | None  # 0-1; None: the run had no GPU figure
    cpu_interval_ms: float | None  # the engine's CPU work per step (the sim exports it; vLLM does not)
    running_mean: float | None
    waiting_mean: float | None
    kv_usage_mean: float | None  # 0-1
    max_num_seqs: int | None  # what the engines said their cap was
    measure_s: float
    step_s: float  # how long the step held (the window is its last measure_s)
    warmup_s: float  # the run's warm-up before its first step
    steady: bool = True  # False: TPS moved within the window (timeline.csv); the step counts half
    rps: float | None = None  # requests that ended in the window, per second
    client_inflight_mean: float | None = None  # requests in flight at the load generator (sent, not wholly back)

    @property
    def ttft_fitted_ms(self) -> float | None:
        """The TTFT figure the fit matches: the mean, else the p50."""
        return self.ttft_mean_ms or self.ttft_p50_ms

    @property
    def in_engine_mean(self) -> float | None:
        """Requests the engine held (running + waiting, from its gauges); None where they were not read."""
        return None if self.running_mean is None else self.running_mean + (self.waiting_mean or 0.0)

    @property
    def outside_engine_ms(self) -> float | None:
        """Each request's time in flight but outside the engine (an API server's queue, HTTP), by Little's
        law: (requests in flight at the load generator - in the engine) / requests per second; 0 under
        OUTSIDE_MIN of the users. None where the engine's gauges were not read; without the load
        generator's figure (older reports) every user counts as in flight, which also counts its turnaround."""
        inside = self.in_engine_mean
        if inside is None or not self.rps:
            return None
        in_flight = self.client_inflight_mean if self.client_inflight_mean is not None else float(self.users)
        outside = in_flight - inside
        if outside < OUTSIDE_MIN * self.users:
            return 0.0  # the sampled gauges cannot tell so small a share from their own noise
        return 1000.0 * outside / self.rps

    @property
    def label(self) -> str:
        return f"{self.run}#{self.index}"


ENGINE_TTFT_MIN_SHARE = 0.2  # below this share of a TTFT the engine's part cannot be told from the rest


def engine_ttft_ms(o: Observation, measured: float | None, gauges_read: bool) -> float | None:
    """The part of a measured TTFT (the client's) that the engine accounts for: less each request's time
    outside the engine, which the model has no place for (it is in the client gap). None where that leaves
    under ENGINE_TTFT_MIN_SHARE of it, or where other steps had the engine's gauges and this one did not:
    the TTFT is then the API server's, and fitting the prefill cost to it would overload the modelled
    engine (beside two busy loops vLLM's API server held 98% of a 16-user step: 11 ms per prompt token)."""
    if measured is None:
        return None
    outside = o.outside_engine_ms
    if outside is None:
        return None if gauges_read else measured
    left = measured - outside
    return left if left >= ENGINE_TTFT_MIN_SHARE * measured else None


def gauges_read(observations: list[Observation]) -> bool:
    return any(o.outside_engine_ms is not None for o in observations)


@dataclass
class Runs:
    observations: list[Observation]
    notes: list[str]


def read_runs(run_dirs: list[Path]) -> Runs:
    """Every usable step of every run; CalibrationError when none is."""
    observations: list[Observation] = []
    notes: list[str] = []
    for run_dir in run_dirs:
        try:
            report, rows = read_report(run_dir)
        except ReportError as exc:
            raise CalibrationError(str(exc)) from None
        workload = _workload(run_dir)
        steps = report["steps"]
        warmup_s = float(steps[0].get("start_s") or 0.0) if steps else 0.0
        for step in steps:
            observation, why = _observation(run_dir.name, step, rows, workload, warmup_s)
            if observation is None:
                notes.append(f"{run_dir.name} step {step.get('index')}: left out ({why})")
            else:
                observations.append(observation)
    if not observations:
        raise CalibrationError(
            "no step of these runs can be fitted (closed-loop steps with successful requests are needed): "
            + "; ".join(notes or ["the runs have no steps"])
        )
    return Runs(observations, notes)


def _workload(run_dir: Path) -> dict[str, Any]:
    """settings.json's workload section (the run writes it), or {} when the file is missing or odd."""
    try:
        workload = json.loads((run_dir / "settings.json").read_text(encoding="utf-8")).get("workload", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return workload if isinstance(workload, dict) else {}


def _p50(figures: Any, key: str = "p50") -> float | None:
    value = figures.get(key) if isinstance(figures, dict) else None
    return float(value) if isinstance(value, int | float) and value > 0 else None


def _observation(
    run: str, step: dict[str, Any], rows: list[dict[str, Any]], workload: dict[str, Any], warmup_s: float
) -> tuple[Observation | None, str]:
    if step.get("concurrency") is None:
        return None, "an open-loop step: calibrate fits closed-loop (users) steps"
    if not step.get("requests_ok") or not step.get("output_tps"):
        return None, "no successful request in its window"
    prompt = step.get("input_tokens_mean") or workload.get("prompt_tokens") or workload.get("input_tokens")
    output = step.get("output_tokens_mean") or workload.get("max_output_tokens")
    if not prompt or not output:
        return None, "its prompt and output lengths are unknown (no input_tokens_mean / output_tokens_mean)"
    gpu = step.get("gpu_util")
    backend = step.get("backend") or {}
    cap = backend.get("max_num_seqs")
    index = int(step["index"])
    return (
        Observation(
            run=run,
            index=index,
            users=int(step["concurrency"]),
            prompt_tokens=max(1, round(float(prompt))),
            output_tokens=max(1, round(float(output))),
            output_tps=float(step["output_tps"]),
            tpot_p50_ms=_p50(step.get("tpot_ms")),
            ttft_p50_ms=_p50(step.get("ttft_ms")),
            e2e_p50_ms=_p50(step.get("e2e_ms")),
            tpot_mean_ms=_p50(step.get("tpot_ms"), "mean"),
            ttft_mean_ms=_p50(step.get("ttft_ms"), "mean"),
            gpu_busy=float(gpu["mean"]) / 100.0 if isinstance(gpu, dict) and gpu.get("mean") is not None else None,
            cpu_interval_ms=step.get("cpu_interval_ms"),
            running_mean=backend.get("running_mean"),
            waiting_mean=backend.get("waiting_mean"),
            kv_usage_mean=backend.get("kv_cache_usage_mean"),
            max_num_seqs=int(cap) if cap else None,
            measure_s=float(step.get("duration_s") or 0.0),
            step_s=float(step["end_s"]) - float(step["start_s"]),
            warmup_s=warmup_s,
            steady=_steady(rows, float(step["end_s"]), float(step.get("duration_s") or 0.0)),
            rps=float(step["rps"]) if step.get("rps") else None,
            client_inflight_mean=step.get("client_inflight_mean"),
        ),
        "",
    )


def _steady(rows: list[dict[str, Any]], end_s: float, window_s: float, tolerance: float = 0.2) -> bool:
    """The window's two halves had output TPS within tolerance of each other (True without a timeline)."""
    start_s = end_s - window_s
    middle = start_s + window_s / 2
    halves: list[list[float]] = [[], []]
    for row in rows:
        t, tps = row.get("time_s"), row.get("output_tps")
        if t is None or tps is None or not start_s < t <= end_s:
            continue
        halves[0 if t <= middle else 1].append(float(tps))
    if not halves[0] or not halves[1]:
        return True
    first, second = (sum(h) / len(h) for h in halves)
    return abs(second - first) <= tolerance * max(first, second, 1e-9)
