"""Per-step figures from the records and the timeline: the report.json contract.

Each step is measured over its window (its last measure_last_seconds). TPS counts
the tokens that arrived in the window; latency figures come from the requests that
ended in it. A step is marked valid: false when its load generator saturated, or when
requests sent in the previous step end inside its window (the window starts less than
one request's duration into the step).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from typing import Any

from loadreport.collect import leave_out, p50
from loadreport.diagnosis import diagnose
from loadreport.histogram import Histogram
from loadreport.record import INTERRUPTED, Recorder, RequestRecord
from loadreport.schedule import LoadSchedule, Phase
from loadreport.settings import Settings, SloSection
from loadreport.timeline import Sample

KNEE_GROWTH = 0.10


def _mean_min(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"mean": round(sum(values) / len(values), 2), "min": round(min(values), 2)}


def _mean(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return round(sum(found) / len(found), 3) if found else None


def _latencies(records: list[RequestRecord]) -> dict[str, Histogram]:
    hists = {name: Histogram() for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")}
    for record in records:
        if record.ttft_s is not None:
            hists["ttft_ms"].add_ms(record.ttft_s * 1000)
        tpot = record.tpot_s
        if tpot is not None:
            hists["tpot_ms"].add_ms(tpot * 1000)
        hists["itl_ms"].merge(record.itl)
        hists["e2e_ms"].add_ms(record.e2e_s * 1000)
    return hists


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


def _gpu(samples: list[Sample]) -> tuple[dict[str, float] | None, str | None]:
    values = [s.gpu_util for s in samples if s.gpu_util is not None]
    if values:
        return _mean_min(values), None
    reasons = [s.gpu_util_reason for s in samples if s.gpu_util_reason]
    return None, (reasons[-1] if reasons else "no sample in the measured window")


def _validity(settings: Settings, cpu: float | None, lag: Histogram, open_loop: bool) -> list[str]:
    """Why the load generator's figures cannot be trusted (empty: they can)."""
    reasons = []
    limit = settings.metrics.saturation_cpu_percent
    if cpu is not None and cpu >= limit:
        reasons.append(f"load generator CPU {cpu:.0f}% >= {limit:.0f}%: add --processes or workers")
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


def summarize_step(
    settings: Settings,
    plan: LoadSchedule,
    phase: Phase,
    run_start: float,
    run_end: float,
    recorder: Recorder,
    samples: list[Sample],
) -> dict[str, Any] | None:
    start = run_start + phase.measure_start_s
    end = min(run_start + phase.end_s, run_end)
    if end - start <= 0:
        return None
    duration = end - start
    ended = [r for r in recorder.records if start <= r.end < end and r.error_kind != INTERRUPTED]
    ok = [r for r in ended if r.ok]
    failed = Counter(r.error_kind for r in ended if not r.ok)
    hists = _latencies(ok)
    lag = Histogram()
    lag.add_many_ms(r.send_lag_s * 1000 for r in ended if r.send_lag_s is not None)
    output = recorder.tokens_between(start, end)
    prompt = recorder.tokens_between(start, end, prompt=True)
    good = [r for r in ok if meets_slo(r, settings.slo)]
    inside = [s for s in samples if start <= s.wall < end]
    gpu, gpu_reason = _gpu(inside)
    busiest_cpu = recorder.busiest_cpu_between(start, end)
    cpu = None if busiest_cpu is None else round(busiest_cpu, 1)
    reasons = _validity(settings, cpu, lag, plan.open_loop)
    leak = _edge_leak(plan, phase, run_start, ended)
    if leak is not None:
        reasons.append(leak)
    interval = _mean([s.token_interval_ms for s in inside])  # the GPU's gap between forwards
    cpu_interval = _mean([s.cpu_interval_ms for s in inside])  # the CPU work per step
    step: dict[str, Any] = {"index": phase.index}
    step["request_rate" if plan.open_loop else "concurrency"] = phase.load
    step.update(
        users=plan.users_for(phase),
        start_s=round(phase.start_s, 3),
        end_s=round(phase.end_s, 3),
        duration_s=round(duration, 3),
        complete=run_start + phase.end_s <= run_end + 0.5,
        requests_ok=len(ok),
        requests_failed=sum(failed.values()),
        retries=sum(r.retries for r in ended),
        errors=dict(failed),
        output_tps=round(output / duration, 2),
        total_tps=round((output + prompt) / duration, 2),
        rps=round(len(ok) / duration, 3),
        **{name: hist.summary() for name, hist in hists.items()},
        gpu_util=gpu,
        gpu_util_reason=gpu_reason,
        goodput_rps=round(len(good) / duration, 3),
        valid=not reasons,
        invalid_reason="; ".join(reasons) or None,
        token_count_source="usage" if ok and all(r.token_source == "usage" for r in ok) else "chunks",
        input_tokens_mean=_mean([float(r.prompt_tokens) for r in ok]),
        output_tokens_mean=_mean([float(r.output_tokens) for r in ok]),
        loadgen_cpu_percent=cpu,
        send_lag_ms=lag.summary() if plan.open_loop else None,
        token_interval_ms=interval,
        cpu_interval_ms=cpu_interval,
        backend=_backend(inside),
        prefix_cache_hit_rate=prefix_hit_rate(samples, start, end),
    )
    return leave_out(settings, step)


def prefix_hit_rate(samples: list[Sample], start: float, end: float) -> float | None:
    """The engines' prefix-cache hit rate in [start, end): the growth of
    vllm:prefix_cache_hits_total over that of vllm:prefix_cache_queries_total, from the last
    sample before the window to the last one inside it (None without both counters)."""
    before = [s for s in samples if s.wall < start and s.prefix_cache_queries is not None]
    inside = [s for s in samples if start <= s.wall < end and s.prefix_cache_queries is not None]
    if not inside or (not before and len(inside) < 2):
        return None
    first = before[-1] if before else inside[0]
    last = inside[-1]
    queries = (last.prefix_cache_queries or 0.0) - (first.prefix_cache_queries or 0.0)
    hits = (last.prefix_cache_hits or 0.0) - (first.prefix_cache_hits or 0.0)
    return round(hits / queries, 4) if queries > 0 else None


def _max(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return round(max(found), 3) if found else None


def _backend(inside: list[Sample]) -> dict[str, Any]:
    """The engines' signals over the window, for the diagnosis."""
    preempted = [s.preemptions_total for s in inside if s.preemptions_total is not None]
    caps = [s.max_num_seqs for s in inside if s.max_num_seqs is not None]
    return {
        "running_mean": _mean([s.running for s in inside]),
        "running_max": _max([s.running for s in inside]),
        "waiting_mean": _mean([s.waiting for s in inside]),
        "kv_cache_usage_mean": _mean([s.kv_cache_usage for s in inside]),
        "kv_cache_usage_max": _max([s.kv_cache_usage for s in inside]),
        "preemptions": preempted[-1] - preempted[0] if len(preempted) > 1 else None,
        "max_num_seqs": caps[-1] if caps else None,
        "num_samples": sum(1 for s in inside if s.running is not None),
        "gateway_inflight_mean": _mean([s.gateway_inflight for s in inside]),
    }


def find_knee(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The step after which TPS grows less than 10% while latency grows."""
    for here, after in itertools.pairwise(steps):
        if not here["output_tps"] or after["output_tps"] is None:
            continue
        growth = after["output_tps"] / here["output_tps"] - 1.0
        latency_here = (p50(here, "tpot_ms") or 0.0) + (p50(here, "ttft_ms") or p50(here, "e2e_ms") or 0.0)
        latency_after = (p50(after, "tpot_ms") or 0.0) + (p50(after, "ttft_ms") or p50(after, "e2e_ms") or 0.0)
        if growth < KNEE_GROWTH and latency_after > latency_here:
            load = here.get("concurrency", here.get("request_rate"))
            return {
                "step": here["index"],
                "load": load,
                "tps_growth_to_next": round(growth, 4),
                "text": f"TPS grows {growth * 100:.1f}% after {load} while latency grows: more load only queues",
            }
    return None


def summarize_run(
    settings: Settings,
    plan: LoadSchedule,
    run_start: float,
    run_end: float,
    recorder: Recorder,
    samples: list[Sample],
    final: Mapping[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """final: steps already summarized (index -> step), used as they are: the figures their console
    line printed are the report's."""
    final = final or {}
    summaries = (
        final.get(phase.index) or summarize_step(settings, plan, phase, run_start, run_end, recorder, samples)
        for phase in plan.steps
    )
    steps = [step for step in summaries if step is not None]
    return {"steps": steps, "knee": find_knee(steps), "diagnosis": diagnose(steps)}
