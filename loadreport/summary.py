"""One step's figures from the records and the timeline: report.json's typed Step.

Each step is measured over its window (its last measure_last_seconds). TPS counts
the tokens that arrived in the window; latency figures come from the requests that
ended in it. A step is marked valid: false when its load generator saturated, or when
requests sent in the previous step end inside its window (the window starts less than
one request's duration into the step).

The Step is built strictly (Step.build): a figure of the wrong type raises
pydantic.ValidationError here, where the bug is, not in a reader of report.json.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from loadreport.collect import leave_out
from loadreport.engine_figures import engine_figures, mean
from loadreport.histogram import Histogram
from loadreport.record import INTERRUPTED, Recorder, RequestRecord
from loadreport.schedule import LoadSchedule, Phase
from loadreport.schema import Step
from loadreport.settings import Settings, SloSection
from loadreport.slowest import slowest_requests
from loadreport.timeline import Sample

COMPLETE_SLACK_S = 0.5  # a step that ran to within this of its end counts as complete


@dataclass(frozen=True)
class Window:
    """A step's measured window [start, end) on the wall clock, and the requests that ended in it
    (interrupted ones left out: the run's stop cut them, not the server)."""

    start: float
    end: float
    ended: list[RequestRecord]

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @cached_property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.ended if r.ok]


def measured_window(phase: Phase, run_start: float, run_end: float, recorder: Recorder) -> Window | None:
    """The phase's measured window so far (None: it has not begun)."""
    start = run_start + phase.measure_start_s
    end = min(run_start + phase.end_s, run_end)
    if end - start <= 0:
        return None
    ended = [r for r in recorder.records if start <= r.end < end and r.error_kind != INTERRUPTED]
    return Window(start, end, ended)


def meets_slo(record: RequestRecord, slo: SloSection) -> bool:
    """Goodput's test: TTFT <= slo.ttft_ms and TPOT <= slo.tpot_ms; a request exactly at
    an SLO meets it (compared at 1 ns, so float noise in TPOT's division cannot push a
    request that is exactly at the SLO over it). A one-token answer has no TPOT: only
    its TTFT is tested."""
    ttft_ok = record.ttft_s is not None and _ms(record.ttft_s) <= slo.ttft_ms
    tpot = record.tpot_s
    return ttft_ok and (tpot is None or _ms(tpot) <= slo.tpot_ms)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 6)


def _requests(window: Window, slo: SloSection) -> dict[str, Any]:
    """What the requests that ended in the window say: counts, rates, goodput, token counts."""
    ok, duration = window.ok, window.duration_s
    failed = Counter(r.error_kind for r in window.ended if not r.ok)
    return {
        "requests_ok": len(ok),
        "requests_failed": sum(failed.values()),
        "retries": sum(r.retries for r in window.ended),
        "errors": dict(failed),
        "rps": round(len(ok) / duration, 3),
        "goodput_rps": round(sum(1 for r in ok if meets_slo(r, slo)) / duration, 3),
        "token_count_source": "usage" if ok and all(r.token_source == "usage" for r in ok) else "chunks",
        "input_tokens_mean": mean([float(r.prompt_tokens) for r in ok]),
        "output_tokens_mean": mean([float(r.output_tokens) for r in ok]),
    }


def _tokens(window: Window, recorder: Recorder) -> dict[str, Any]:
    """TPS: the tokens that arrived in the window, whenever their request ended."""
    output = recorder.tokens_between(window.start, window.end)
    prompt = recorder.tokens_between(window.start, window.end, prompt=True)
    return {
        "output_tps": round(output / window.duration_s, 2),
        "total_tps": round((output + prompt) / window.duration_s, 2),
    }


def _latencies(ok: list[RequestRecord]) -> dict[str, Any]:
    hists = {name: Histogram() for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")}
    for record in ok:
        if record.ttft_s is not None:
            hists["ttft_ms"].add_ms(record.ttft_s * 1000)
        tpot = record.tpot_s
        if tpot is not None:
            hists["tpot_ms"].add_ms(tpot * 1000)
        hists["itl_ms"].merge(record.itl)
        hists["e2e_ms"].add_ms(record.e2e_s * 1000)
    return {name: hist.summary() for name, hist in hists.items()}


def _answers(ok: list[RequestRecord]) -> dict[str, Any]:
    """A reasoning model's figures (TTFA, the time spent reasoning, its tokens) and the engines' cached
    prompt tokens, over the requests that reported them (null when none did)."""
    ttfa, reasoning = Histogram(), Histogram()
    for record in ok:
        if record.ttfa_s is not None:
            ttfa.add_ms(record.ttfa_s * 1000)
            if record.ttft_s is not None and record.reasoning_tokens:
                reasoning.add_ms((record.ttfa_s - record.ttft_s) * 1000)
    # a server that reports cached tokens reports them on each request, or leaves out the details when
    # none hit (the sim, vLLM without --enable-prompt-tokens-details on some of its paths): 0 for those
    cached = ok if any(r.cached_tokens is not None for r in ok) else []
    prompt_of_cached = sum(r.prompt_tokens for r in cached)
    return {
        "ttfa_ms": ttfa.summary() if ttfa.count else None,
        "reasoning_ms": reasoning.summary() if reasoning.count else None,
        "reasoning_tokens_mean": mean([float(r.reasoning_tokens) for r in ok if r.reasoning_tokens is not None]),
        "cached_tokens_mean": mean([float(r.cached_tokens or 0) for r in cached]) if cached else None,
        "cached_prompt_share": (
            round(sum(r.cached_tokens or 0 for r in cached) / prompt_of_cached, 4) if prompt_of_cached else None
        ),
    }


def _gpu(samples: list[Sample], window: Window) -> dict[str, Any]:
    inside = [s for s in samples if window.start <= s.wall < window.end]
    values = [s.gpu_util for s in inside if s.gpu_util is not None]
    if values:
        gpu = {"mean": round(sum(values) / len(values), 2), "min": round(min(values), 2)}
        return {"gpu_util": gpu, "gpu_util_reason": None}
    reasons = [s.gpu_util_reason for s in inside if s.gpu_util_reason]
    return {"gpu_util": None, "gpu_util_reason": reasons[-1] if reasons else "no sample in the measured window"}


def _saturation(
    settings: Settings, cpu: float | None, loop_lag: Histogram | None, lag: Histogram, open_loop: bool
) -> list[str]:
    """Why the load generator's figures cannot be trusted (empty: they can)."""
    reasons = []
    limit = settings.metrics.saturation_cpu_percent
    if cpu is not None and cpu >= limit:
        reasons.append(f"load generator CPU {cpu:.0f}% >= {limit:.0f}%: add --processes or workers")
    loop_lag_p90 = None if loop_lag is None else loop_lag.percentile(90)
    max_loop_lag_ms = settings.metrics.max_loop_lag_ms
    if loop_lag_p90 is not None and loop_lag_p90 > max_loop_lag_ms:
        reasons.append(
            f"load generator event-loop lag p90 {loop_lag_p90:.1f} ms > {max_loop_lag_ms:g} ms: it read chunks late"
            " (the machine's cores were busy with other work): run it on a machine of its own or with fewer"
            " processes beside it"
        )
    lag_p90 = lag.percentile(90)
    if open_loop and lag_p90 is not None and lag_p90 > settings.metrics.max_send_lag_ms:
        reasons.append(f"send lag p90 {lag_p90:.1f} ms > {settings.metrics.max_send_lag_ms:.0f} ms: too few users")
    return reasons


def _previous_load(plan: LoadSchedule, phase: Phase) -> float | None:
    before = [p for p in plan.phases if p.end_s <= phase.start_s]
    return before[-1].load if before else None


def _edge_leak(plan: LoadSchedule, phase: Phase, run_start: float, ended: list[RequestRecord]) -> str | None:
    """Requests measured in the window that were sent before the step began carry the
    previous step's load: the window starts less than one request's duration into the step."""
    if _previous_load(plan, phase) in (None, phase.load):
        return None
    step_start = run_start + phase.start_s
    leaked = [r for r in ended if r.start < step_start]
    if not leaked:
        return None
    lead_s = phase.measure_start_s - phase.start_s
    longest_s = max(r.end - r.start for r in ended)
    return (
        f"window shorter than a request: {len(leaked)} of the {len(ended)} requests measured were sent in the "
        f"previous step (the window starts {lead_s:.1f} s into the step; requests take up to {longest_s:.1f} s): "
        "make step_duration_seconds - measure_last_seconds longer than a request"
    )


def client_inflight_mean(records: list[RequestRecord], start: float, end: float) -> float | None:
    """The requests sent and not yet wholly received, mean over [start, end): each request's time in
    flight inside the window, summed, over the window's length (exact, whichever process sent it).
    A user not in flight is between two requests, in the load generator's own hands."""
    if end <= start:
        return None
    held_s = sum(max(0.0, min(r.end, end) - max(r.start, start)) for r in records)
    return round(held_s / (end - start), 2)


def _load_generator(
    settings: Settings, plan: LoadSchedule, phase: Phase, run_start: float, recorder: Recorder, window: Window
) -> dict[str, Any]:
    """The load generator's own figures, and whether they let the step's figures be trusted."""
    lag = Histogram()
    lag.add_many_ms(r.send_lag_s * 1000 for r in window.ended if r.send_lag_s is not None)
    busiest_cpu = recorder.busiest_cpu_between(window.start, window.end)
    cpu = None if busiest_cpu is None else round(busiest_cpu, 1)
    loop_lag = recorder.worst_loop_lag_between(window.start, window.end)
    reasons = _saturation(settings, cpu, loop_lag, lag, plan.open_loop)
    leak = _edge_leak(plan, phase, run_start, window.ended)
    if leak is not None:
        reasons.append(leak)
    return {
        "valid": not reasons,
        "invalid_reason": "; ".join(reasons) or None,
        "loadgen_cpu_percent": cpu,
        "loadgen_loop_lag_ms": None if loop_lag is None else loop_lag.summary(),
        "client_inflight_mean": client_inflight_mean(recorder.records, window.start, window.end),
        "send_lag_ms": lag.summary() if plan.open_loop else None,
    }


def summarize_step(
    settings: Settings,
    plan: LoadSchedule,
    phase: Phase,
    run_start: float,
    run_end: float,
    recorder: Recorder,
    samples: list[Sample],
) -> Step | None:
    """The phase's figures over its measured window (up to run_end), None when the window has not begun."""
    window = measured_window(phase, run_start, run_end, recorder)
    if window is None:
        return None
    figures = {
        "index": phase.index,
        ("request_rate" if plan.open_loop else "concurrency"): phase.load,
        "users": plan.users_for(phase),
        "start_s": round(phase.start_s, 3),
        "end_s": round(phase.end_s, 3),
        "duration_s": round(window.duration_s, 3),
        "complete": run_start + phase.end_s <= run_end + COMPLETE_SLACK_S,
        **_requests(window, settings.slo),
        **_tokens(window, recorder),
        **_latencies(window.ok),
        **_answers(window.ok),
        **_gpu(samples, window),
        **_load_generator(settings, plan, phase, run_start, recorder, window),
        **engine_figures(samples, window.start, window.end),
    }
    slowest = slowest_requests(window.ended, run_start)
    if slowest is not None:  # api.traceparent: absent otherwise
        figures["slowest_requests"] = slowest
    return Step.build(**leave_out(settings, figures))
