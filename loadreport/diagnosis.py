"""Why TPS stops growing: one entry per step, read from the step's own figures.

Pure (no I/O): the input is report.json's steps (typed Steps, each with its `backend` signals
from the timeline), the output is report.json's `diagnosis` list (diagnose_steps: typed Diagnosis
entries; diagnose: the same from steps read from a file). The first rule that holds
names the step's limit (one of loadreport.schema.LIMITS); `evidence` cites the figures it read,
`advice` the config.toml / settings.json change to try. Thresholds are module constants.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import ValidationError

from loadreport.diagnosis_reading import Reading, as_step, at_engines, p50, pct
from loadreport.schema import LIMITS, Diagnosis, Limit, Step

__all__ = ["LIMITS", "diagnose", "diagnose_steps", "headline"]

TPS_GROWTH = 0.10  # TPS still grows: the next step has 10% more (the knee's threshold)
ERROR_SHARE = 0.02  # 2% of requests failed
CAP_FULL = 0.90  # running >= 90% of the cap
KV_FULL = 0.90  # KV-cache usage >= 90%
GPU_BUSY_PCT = 85.0  # GPU busy at or above: compute-bound
BATCH_FULL = 0.90  # running >= 90% of the users: the engines hold the whole load
IN_TRANSIT = 0.70  # running + waiting < 70% of the users: held before the engines ...
IN_TRANSIT_GROWTH = 0.20  # ... and that share fell by 20 points from the step before ...
FEW_AT_ENGINES = 0.40  # ... or under 40% at the engines (no fixed HTTP/tokenizer share is that large)
TTFT_GROWTH = 2.0  # prefill: TTFT p50 doubles from the step before ...
TPOT_HOLDS = 1.25  # ... while TPOT p50 grows less than 25%

Found = tuple[str, str] | None  # (evidence, advice)
Rule = Callable[[Reading], Found]


def _errors(s: Reading) -> Found:
    ok, failed = s.step.requests_ok, s.step.requests_failed
    if not failed or failed < ERROR_SHARE * (ok + failed):
        return None
    kinds = ", ".join(f"{k} {v}" for k, v in s.step.errors.items()) or "see report.json errors"
    return (
        f"{failed} of {ok + failed} requests failed ({kinds})",
        "read the errors: 429 -> raise the key's rpm/tpm; timeouts -> api.timeout_seconds in settings.json "
        "or [gateway] timeouts in config.toml; 5xx -> the engines' logs; or lower the load",
    )


def _load_generator(s: Reading) -> Found:
    if s.step.valid:
        return None
    return (
        f"the load generator saturated: {s.step.invalid_reason}",
        "more load-generator processes (locust -f loadtest/ --headless --processes N, or --master/--worker "
        "on more machines); raise the open-files limit (ulimit -n 65536)",
    )


def _still_growing(s: Reading) -> Found:
    here, after = s.step.output_tps, None if s.after is None else s.after.output_tps
    if s.after is None or not here or after is None:
        return None
    growth = after / here - 1.0
    if growth < TPS_GROWTH:
        return None
    nxt = s.after.concurrency if s.after.concurrency is not None else s.after.request_rate
    return (f"output TPS grows {growth * 100:.0f}% from here to {nxt:g}; {s.figures()}", "none: more load pays")


def _kv_cache(s: Reading) -> Found:
    below_cap = s.cap is not None and s.running is not None and s.running < CAP_FULL * s.cap
    full = s.kv is not None and s.kv >= KV_FULL
    held = full or (s.kv is None and below_cap)  # a KV usage that is known and low holds nothing back
    if not (s.preemptions > 0 or (s.queued() and held)):
        return None
    return (
        f"the KV cache holds the batch: {s.figures()}",
        "[engine] max_model_len shorter, gpu_memory_utilization higher (0.95), more [engine] replicas or "
        "tensor_parallel_size = 2 (the sim: [sim] kv_cache_blocks)",
    )


def _batch_cap(s: Reading) -> Found:
    if not s.queued() or s.running is None:
        return None
    if s.cap is not None:
        peak_at_cap = s.running_max is not None and s.running_max >= s.cap
        at_cap, cap, how = s.running >= CAP_FULL * s.cap or peak_at_cap, s.cap, "the engines' max_num_seqs"
    else:
        peak = s.running_max or s.running
        at_cap, cap, how = s.running >= CAP_FULL * peak, round(peak), "inferred: running is flat while requests wait"
    if not at_cap:
        return None
    kv = f"; KV cache at {pct(s.kv)} leaves room" if s.kv is not None else ""
    per_replica = f"{cap:g}" if s.cap is None else "the current value"
    return (
        f"the batch is full at its cap ({how}): {s.figures()}{kv}",
        f"[scheduler] max_num_seqs above {per_replica} (e.g. double it) if the KV cache allows",
    )


def _held_in_front(s: Reading) -> tuple[float, str] | None:
    """The share of the users' requests at the engines, and how it compares with the step before,
    when the rest are held in front of an engine that is not busy (no queue, the batch not full,
    the GPU not busy). A fixed share in transit is the HTTP and tokenizer time of short requests,
    not a limit: the share must have fallen by 20 points from the step before, or be under 40%."""
    share = at_engines(s.step)
    before = at_engines(s.before) if s.before is not None else None
    if share is None or share >= IN_TRANSIT:
        return None
    if share >= FEW_AT_ENGINES and (before is None or share > before - IN_TRANSIT_GROWTH):
        return None
    batch = min(s.users or 0.0, s.cap or s.users or 0.0)
    busy = s.queued() or (s.running is not None and s.running >= BATCH_FULL * batch)
    if busy or (s.gpu_pct is not None and s.gpu_pct >= GPU_BUSY_PCT):
        return None
    return share, "" if before is None else f" ({before * 100:.0f}% at the step before)"


HeldBy = Literal["frontend", "gateway", "load_generator"]


def _held_by(s: Reading) -> HeldBy | None:
    """Where the users' requests that the engines' step loop does not hold are, the larger part:
    between two requests in the load generator (users - its in-flight figure), in zerogap's
    gateway (the load generator's in-flight - the gateway's, which counts those it passed to the
    engines), or in the engines' API servers (the gateway's - the engines' running and waiting).
    A figure not measured merges its parts into the next (no gateway gauge: all past the load
    generator are the API servers'); equal parts name the engines' servers, then the gateway."""
    if s.users is None:
        return None
    at_engine = (s.running or 0.0) + (s.waiting or 0.0)
    sent = s.users if s.client_inflight is None else s.client_inflight
    passed = sent if s.gateway_inflight is None else s.gateway_inflight
    parts: dict[HeldBy, float] = {"frontend": passed - at_engine, "gateway": sent - passed,
                                  "load_generator": s.users - sent}  # fmt: skip
    return max(parts, key=lambda name: parts[name])


def _load_generator_holds(s: Reading) -> Found:
    held = _held_in_front(s)
    if held is None or _held_by(s) != "load_generator":
        return None
    share, before = held
    assert s.users is not None and s.client_inflight is not None  # _held_by said so
    return (
        f"only {share * 100:.0f}% of the users' requests are at the engines{before}, and the load generator had "
        f"only {s.client_inflight:.1f} of {s.users:g} users' requests in flight: the rest of the time its users "
        f"were between requests, in its own hands (a starved or saturated client); {s.figures()}",
        "the load generator: a machine of its own, or more processes (locust -f loadtest/ --headless "
        "--processes N); check what else runs beside it",
    )


def _gateway(s: Reading) -> Found:
    held = _held_in_front(s)
    if held is None or _held_by(s) != "gateway":
        return None
    share, before = held
    sent = "" if s.client_inflight is None else f" (the load generator had {s.client_inflight:.1f} in flight)"
    return (
        f"only {share * 100:.0f}% of the users' requests are at the engines{before}, and the gateway has passed "
        f"on only {s.gateway_inflight:.1f} of {s.users:g}{sent}: the rest are held in zerogap's gateway; "
        f"{s.figures()}",
        "the gateway: more processes (zerogap gateway --workers N), check its CPU and [gateway] limits",
    )


def _frontend(s: Reading) -> Found:
    held = _held_in_front(s)
    if held is None or _held_by(s) != "frontend":
        return None
    share, before = held
    gauge = (
        " (no gateway in-flight figure: a zerogap gateway in front is told apart by its /metrics)"
        if s.gateway_inflight is None
        else f" (the gateway passed on {s.gateway_inflight:.1f})"
    )
    return (
        f"only {share * 100:.0f}% of the users' requests are at the engines{before} while the engines are not "
        f"busy: the rest are held between the load generator and the engines' step loop, in the engines' own "
        f"API servers{gauge}; {s.figures()}",
        "more API server processes per engine ([token_interval] api_server_count = 2 or more; vLLM's "
        "--api-server-count), [token_interval] detokenizer_async = true, fewer chunks per answer (vLLM: "
        '[engine] extra_args = ["--stream-interval", "8"]), more [engine] replicas',
    )


def _prefill(s: Reading) -> Found:
    advice = "[scheduler] max_num_batched_tokens higher (more prefill per step); TPOT jitter: enable_chunked_prefill"
    if s.queued():
        room = s.cap is not None and s.running is not None and s.running < CAP_FULL * s.cap
        if room and s.kv is not None and s.kv < KV_FULL:
            return (f"requests wait while the batch and the KV cache have room: prefill admits them slowly; "
                    f"{s.figures()}", advice)  # fmt: skip
        return None
    if s.before is None:
        return None
    ttft, ttft_before = p50(s.step.ttft_ms), p50(s.before.ttft_ms)  # None: not collected
    tpot, tpot_before = p50(s.step.tpot_ms), p50(s.before.tpot_ms)
    if ttft is None or tpot is None or not ttft_before or not tpot_before:
        return None
    if ttft < TTFT_GROWTH * ttft_before or tpot >= TPOT_HOLDS * tpot_before:
        return None
    return (
        f"TTFT p50 {ttft_before:.1f} -> {ttft:.1f} ms while TPOT p50 holds ({tpot_before:.1f} -> {tpot:.1f} ms): "
        f"prefill is squeezed by decode; {s.figures()}",
        advice,
    )


def _compute(s: Reading) -> Found:
    if s.gpu_pct is None or s.gpu_pct < GPU_BUSY_PCT:
        return None
    return (f"the GPU is busy: {s.figures()}", "compute: this pool's ceiling; add replicas ([engine] replicas) or GPUs")


def _token_interval(s: Reading) -> Found:
    if s.gpu_pct is None:
        return None
    if s.running is not None and s.users is not None:
        if s.running < BATCH_FULL * min(s.users, s.cap or s.users):
            return None  # the batch is not full: the GPU idles for want of work
    return (
        f"the GPU idles between steps with the batch full: {s.figures()}",
        "hide the token interval (the article's fixes): [token_interval] async_scheduling = true "
        "(overlap_token_interval = true), slot_reuse = true, detokenizer_async = true",
    )


RULES: tuple[tuple[Limit, Rule], ...] = (
    ("errors", _errors),
    ("load_generator", _load_generator),
    ("none", _still_growing),
    ("kv_cache", _kv_cache),
    ("batch_cap", _batch_cap),
    ("load_generator", _load_generator_holds),
    ("gateway", _gateway),
    ("frontend", _frontend),
    ("prefill", _prefill),
    ("compute", _compute),
    ("token_interval", _token_interval),
)


def diagnose_step(step: Step, before: Step | None, after: Step | None) -> Diagnosis:
    s = Reading(step, before, after)
    concurrency = step.concurrency if step.concurrency is not None else float(step.users)
    entry: dict[str, Any] = {"step": step.index, "concurrency": concurrency}
    if step.request_rate is not None:
        entry["request_rate"] = step.request_rate
    for name, rule in RULES:
        found = rule(s)
        if found is not None:
            evidence, advice = found
            return Diagnosis(**entry, limit=name, evidence=evidence, advice=advice)
    return Diagnosis(
        **entry,
        limit="none",
        evidence=f"no saturated resource: {s.figures()}",
        advice="none: raise the load (add a higher step) to find the limit",
    )


def diagnose_steps(steps: Sequence[Step]) -> list[Diagnosis]:
    """One entry per step, in the steps' order."""
    return [
        diagnose_step(step, steps[i - 1] if i else None, steps[i + 1] if i + 1 < len(steps) else None)
        for i, step in enumerate(steps)
    ]


def diagnose(steps: Sequence[Step | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """report.json's `diagnosis` from steps as a reader holds them: read from a report.json (dicts,
    typed here by as_step) or partial ones (`zerogap tune --virtual`). One entry per step, as the file
    holds it. Steps whose figures do not match the schema (a file edited by hand, or written by a
    zerogap with a bug) get one entry each that says so, instead of no diagnosis. Code that holds
    typed Steps (the harness: loadreport/run_summary.py) calls diagnose_steps."""
    try:
        typed = [as_step(step) for step in steps]
    except ValidationError as exc:
        return [_unread(step, exc) for step in steps]
    return [entry.model_dump(exclude_unset=True) for entry in diagnose_steps(typed)]


def _unread(step: Step | Mapping[str, Any], exc: ValidationError) -> dict[str, Any]:
    figures = step.model_dump() if isinstance(step, Step) else step
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return {
        "step": figures.get("index"),
        "concurrency": figures.get("concurrency", figures.get("users")),
        "limit": "none",
        "evidence": f"not diagnosed: the steps do not match report.json's schema ({where}: {first['msg']}); "
        "please report this",
        "advice": "none",
    }


def headline(diagnosis: Sequence[Diagnosis | Mapping[str, Any]]) -> str:
    """One sentence: the limit at the top step."""
    if not diagnosis:
        return "No step was measured, so there is no diagnosis."
    last = diagnosis[-1]
    top = last if isinstance(last, Diagnosis) else Diagnosis.model_validate(last)
    where = f"{top.request_rate:g} req/s" if top.request_rate is not None else f"{top.concurrency:g} users"
    if top.limit == "none":
        return f"At the top step ({where}) nothing limits TPS yet: {top.evidence}."
    return f"At the top step ({where}) TPS is limited by {top.limit}: {top.evidence}. Try: {top.advice}."
