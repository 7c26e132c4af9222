"""What a headless run prints: a progress line every few seconds, a final line per step, the table at the end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadreport.collect import not_collected
from loadreport.diagnosis import headline
from loadreport.diagnosis_reading import p50
from loadreport.schedule import LoadSchedule, Phase
from loadreport.schema import Step
from loadreport.settings import Settings
from loadreport.verdict import itl_note, knee_sentence, run_verdict, stop_reason


def _number_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ms(figures: dict[str, Any] | None, key: str = "p50") -> str:
    return _number_ms(figures.get(key) if figures else None)


def _load_words(request_rate: float | None, concurrency: float | None) -> str:
    return f"{request_rate:g} req/s" if request_rate is not None else f"{concurrency:g} users"


def load_text(step: dict[str, Any]) -> str:
    """A step's load as report.json says it: "128 users" (closed loop) or "4 req/s" (open loop)."""
    return _load_words(step.get("request_rate"), step.get("concurrency"))


def _gpu_text(mean_pct: float | None) -> str:
    return "-" if mean_pct is None else f"{mean_pct:.0f}%"


def _tps_text(tps: float | None) -> str:
    return "-" if tps is None else f"{tps:,.0f}"


def _hit_text(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.0f}%"


def _gpu(step: dict[str, Any]) -> str:
    gpu = step.get("gpu_util")
    return _gpu_text(None if gpu is None else gpu["mean"])


def _tps(step: dict[str, Any], key: str = "output_tps") -> str:
    return _tps_text(step.get(key))


def _hit(step: dict[str, Any]) -> str:
    return _hit_text(step.get("prefix_cache_hit_rate"))


def progress_line(step: Step, num_steps: int) -> str:
    """One line per step; a figure settings.json does not collect is left out."""
    flag = "" if step.valid else f"  INVALID: {step.invalid_reason}"
    skip, hits = step.not_collected, step.prefix_cache_hit_rate
    gpu = None if step.gpu_util is None else step.gpu_util.mean
    parts = [f"output {_tps_text(step.output_tps)} tok/s" if "output_tps" not in skip else "", f"{step.rps:.2f} req/s"]
    parts += [f"TTFT p50 {_number_ms(p50(step.ttft_ms))} ms" if "ttft_ms" not in skip else ""]
    parts += [f"TPOT p50 {_number_ms(p50(step.tpot_ms))} ms" if "tpot_ms" not in skip else ""]
    parts += [f"GPU {_gpu_text(gpu)}" if "gpu_util" not in skip else ""]
    parts += [f"prefix-cache hits {_hit_text(hits)}" if hits is not None else ""]
    retries = f", {step.retries} retried" if step.retries else ""
    parts += [f"ok {step.requests_ok} failed {step.requests_failed}{retries}"]
    figures = ", ".join(part for part in parts if part)
    return (
        f"zerogap step {step.index + 1}/{num_steps} {_load_words(step.request_rate, step.concurrency)}: {figures}{flag}"
    )


@dataclass(frozen=True)
class LiveFigures:
    """The current phase so far: output tok/s over the latest seconds (None: none yet), GPU busy."""

    output_tps: float | None
    gpu_util: float | None
    num_ok: int
    num_failed: int


def live_line(
    settings: Settings, plan: LoadSchedule, phase: Phase, run_time_s: float, users: int, live: LiveFigures
) -> str:
    """The progress line printed every few seconds while a phase runs."""
    where = "warm-up" if phase.index < 0 else f"step {phase.index + 1}/{len(plan.steps)}"
    planned = plan.users_for(phase)
    people = f"{users} users" if users == planned else f"{users} of {planned} users"
    load = f"{phase.load:g} req/s, {people}" if plan.open_loop else people
    elapsed_s, length_s = run_time_s - phase.start_s, phase.end_s - phase.start_s
    clock = f"{elapsed_s:.0f} s of {length_s:.0f} s ({max(0.0, length_s - elapsed_s):.0f} s left)"
    skip = not_collected(settings)
    tps = "-" if live.output_tps is None else f"{live.output_tps:,.0f}"
    gpu = "-" if live.gpu_util is None else f"{live.gpu_util:.0f}%"
    parts = [f"output {tps} tok/s" if "output_tps" not in skip else "", f"GPU {gpu}" if "gpu_util" not in skip else ""]
    parts.append(f"{live.num_ok} ok, {live.num_failed} failed")
    return f"zerogap progress: {where}, {load}, {clock}: {', '.join(part for part in parts if part)}"


HEADER = (
    f"{'load':>14} {'out tok/s':>10} {'tot tok/s':>10} {'req/s':>7} {'TTFT p50':>9} {'p99':>8} "
    f"{'TPOT p50':>9} {'p99':>7} {'ITL p50':>8} {'GPU':>5} {'gap':>6} {'CPU':>6} {'hit':>5} {'good/s':>7} {'fail':>5} "
    f"{'valid':>5}"
)


def _interval(step: dict[str, Any], key: str) -> str:
    value = step.get(key)
    return "-" if value is None else f"{value:.1f}"


def table(report: dict[str, Any]) -> str:
    """The steps' table, their diagnosis and the notes; a run with no step measured says what stopped it
    and what it cannot tell, with no empty table."""
    reason = stop_reason(report)
    if not report["steps"]:
        errors = ", ".join(f"{kind} {count}" for kind, count in (report.get("errors") or {}).items())
        return "\n".join([*run_verdict(report), *([f"failed requests by kind: {errors}"] if errors else [])])
    lines = [HEADER]
    for step in report["steps"]:
        lines.append(
            f"{load_text(step):>14} {_tps(step):>10} {_tps(step, 'total_tps'):>10} {step['rps']:>7.2f} "
            f"{_ms(step['ttft_ms']):>9} {_ms(step['ttft_ms'], 'p99'):>8} {_ms(step['tpot_ms']):>9} "
            f"{_ms(step['tpot_ms'], 'p99'):>7} {_ms(step['itl_ms']):>8} {_gpu(step):>5} "
            f"{_interval(step, 'token_interval_ms'):>6} {_interval(step, 'cpu_interval_ms'):>6} {_hit(step):>5} "
            f"{step['goodput_rps']:>7.2f} {step['requests_failed']:>5} {'yes' if step['valid'] else 'NO':>5}"
        )
    for entry in report.get("diagnosis") or []:
        load = entry.get("request_rate", entry["concurrency"])
        lines.append(f"{load:>14g} limit {entry['limit']}: {entry['evidence']}")
        if entry["limit"] != "none":
            lines.append(f"{'':>14} try: {entry['advice']}")
    knee = knee_sentence(report)
    lines.append(knee[0].lower() + knee[1:])
    lines += run_verdict(report)
    if reason is not None:
        lines.append(f"Stopped early: {reason}. The steps after that point were not run.")
    sources = {step["token_count_source"] for step in report["steps"]}
    if "chunks" in sources:
        lines.append("note: the server sent no usage for some requests; their tokens are counted chunks")
    if any(step.get("token_interval_ms") is not None for step in report["steps"]):
        lines.append(
            "gap: the token interval, the GPU's idle time between two forwards; "
            "CPU: the CPU work per step, hidden behind the forward or not (both from the backends, ms)"
        )
    skipped = report["steps"][0].get("not_collected") if report["steps"] else None
    if skipped:
        reasons = sorted(set(skipped.values()))
        lines.append(f"not collected ({', '.join(sorted(skipped))}): {'; '.join(reasons)}")
    lines.append("latencies in ms (0.1 ms resolution); hit: the engines' prefix-cache hit rate")
    itl = itl_note(report)
    if itl is not None:
        lines.append(itl)
    if report.get("diagnosis"):
        lines.append(headline(report["diagnosis"]))
    return "\n".join(lines)
