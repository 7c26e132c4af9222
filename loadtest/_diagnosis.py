"""Why TPS stops growing: one entry per step, read from the step's own figures.

Pure (no I/O): the input is report.json's steps (each with its `backend` signals from
the timeline), the output is report.json's `diagnosis` list. The first rule that
holds names the step's limit; `evidence` cites the figures it read, `advice` the
config.toml / settings.json change to try. Thresholds are module constants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loadtest._collect import p50

LIMITS = (
    "none",
    "batch_cap",
    "kv_cache",
    "token_interval",
    "compute",
    "prefill",
    "load_generator",
    "gateway",
    "errors",
)
TPS_GROWTH = 0.10  # TPS still grows: the next step has 10% more (the knee's threshold)
ERROR_SHARE = 0.02  # 2% of requests failed
WAITING_MIN = 1.0  # requests queued at the engines, mean over the window, at least ...
WAITING_SHARE = 0.10  # ... and 10% of the users (a few arrivals between two steps are no queue)
CAP_FULL = 0.90  # running >= 90% of the cap
KV_FULL = 0.90  # KV-cache usage >= 90%
GPU_BUSY_PCT = 85.0  # GPU busy at or above: compute-bound
BATCH_FULL = 0.90  # running >= 90% of the users: the engines hold the whole load
IN_TRANSIT = 0.70  # running + waiting < 70% of the users: held before the engines ...
IN_TRANSIT_GROWTH = 0.20  # ... and that share fell by 20 points from the step before
TTFT_GROWTH = 2.0  # prefill: TTFT p50 doubles from the step before ...
TPOT_HOLDS = 1.25  # ... while TPOT p50 grows less than 25%
FEW_SAMPLES = 3  # fewer scrapes of the engines in a window than this: the evidence says so

Entry = dict[str, Any]
Rule = Callable[["Step"], tuple[str, str] | None]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _pct(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio * 100:.0f}%"


class Step:
    """One step's figures, with the step before and after it (None at the ends)."""

    def __init__(self, step: dict[str, Any], before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        self.raw, self.before, self.after = step, before, after
        backend = step.get("backend") or {}
        self.running = _num(backend.get("running_mean"))
        self.running_max = _num(backend.get("running_max"))
        self.waiting = _num(backend.get("waiting_mean"))
        self.kv = _num(backend.get("kv_cache_usage_max")) or _num(backend.get("kv_cache_usage_mean"))
        self.preemptions = _num(backend.get("preemptions")) or 0.0
        self.cap = _num(backend.get("max_num_seqs"))
        self.num_samples = _num(backend.get("num_samples"))
        self.cpu_interval_ms = _num(step.get("cpu_interval_ms"))
        gpu = step.get("gpu_util")
        self.gpu_pct = _num(gpu.get("mean")) if isinstance(gpu, dict) else None
        self.interval_ms = _num(step.get("token_interval_ms"))
        self.users = _num(step.get("users")) or _num(step.get("concurrency"))

    def figures(self) -> str:
        """The server-side evidence, as far as it is known."""
        parts = []
        if self.running is not None:
            cap = f" of a cap of {self.cap:g}" if self.cap else ""
            parts.append(f"running {self.running:.1f}{cap}")
        if self.waiting is not None:
            parts.append(f"waiting {self.waiting:.1f}")
        if self.kv is not None:
            parts.append(f"KV cache {_pct(self.kv)}")
        if self.preemptions:
            parts.append(f"{self.preemptions:g} preemptions")
        if self.gpu_pct is not None:
            parts.append(f"GPU busy {self.gpu_pct:.0f}%")
        if self.interval_ms is not None:
            parts.append(f"token interval (GPU idle per step) {self.interval_ms:.1f} ms")
        if self.cpu_interval_ms is not None:
            parts.append(f"CPU per step {self.cpu_interval_ms:.1f} ms")
        if not parts:
            return "no server signals (set metrics.backend_metrics_urls)"
        if self.num_samples is not None and self.num_samples < FEW_SAMPLES:
            parts.append(f"engines read by {self.num_samples:g} scrape(s) only: lengthen the step's measured "
                         "window or lower metrics.sample_interval_ms")  # fmt: skip
        return ", ".join(parts)

    def queued(self) -> bool:
        if self.waiting is None:
            return False
        base = self.users or (self.waiting + (self.running or 0.0))
        return self.waiting >= max(WAITING_MIN, WAITING_SHARE * base)


def _errors(s: Step) -> tuple[str, str] | None:
    ok, failed = s.raw.get("requests_ok", 0), s.raw.get("requests_failed", 0)
    if not failed or failed < ERROR_SHARE * (ok + failed):
        return None
    kinds = ", ".join(f"{k} {v}" for k, v in (s.raw.get("errors") or {}).items()) or "see report.json errors"
    return (
        f"{failed} of {ok + failed} requests failed ({kinds})",
        "read the errors: 429 -> raise the key's rpm/tpm; timeouts -> api.timeout_seconds in settings.json "
        "or [gateway] timeouts in config.toml; 5xx -> the engines' logs; or lower the load",
    )


def _load_generator(s: Step) -> tuple[str, str] | None:
    if s.raw.get("valid", True):
        return None
    return (
        f"the load generator saturated: {s.raw.get('invalid_reason')}",
        "more load-generator processes (locust -f loadtest/ --headless --processes N, or --master/--worker "
        "on more machines); raise the open-files limit (ulimit -n 65536)",
    )


def _still_growing(s: Step) -> tuple[str, str] | None:
    if s.after is None or not s.raw.get("output_tps") or s.after.get("output_tps") is None:
        return None
    growth = s.after["output_tps"] / s.raw["output_tps"] - 1.0
    if growth < TPS_GROWTH:
        return None
    nxt = s.after.get("concurrency", s.after.get("request_rate"))
    return (f"output TPS grows {growth * 100:.0f}% from here to {nxt:g}; {s.figures()}", "none: more load pays")


def _kv_cache(s: Step) -> tuple[str, str] | None:
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


def _batch_cap(s: Step) -> tuple[str, str] | None:
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
    kv = f"; KV cache at {_pct(s.kv)} leaves room" if s.kv is not None else ""
    per_replica = f"{cap:g}" if s.cap is None else "the current value"
    return (
        f"the batch is full at its cap ({how}): {s.figures()}{kv}",
        f"[scheduler] max_num_seqs above {per_replica} (e.g. double it) if the KV cache allows",
    )


def _at_engines(step: dict[str, Any]) -> float | None:
    """The share of the users' requests that the engines hold (running + waiting)."""
    backend = step.get("backend") or {}
    running, users = _num(backend.get("running_mean")), _num(step.get("users")) or _num(step.get("concurrency"))
    if running is None or not users or "concurrency" not in step:
        return None
    return (running + (_num(backend.get("waiting_mean")) or 0.0)) / users


def _gateway(s: Step) -> tuple[str, str] | None:
    """Requests held between the load generator and the engines, more so than at the step before
    (a fixed share in transit is the HTTP and tokenizer time of short requests, not a limit)."""
    share, before = _at_engines(s.raw), _at_engines(s.before) if s.before else None
    if share is None or before is None or share >= IN_TRANSIT or share > before - IN_TRANSIT_GROWTH:
        return None
    return (
        f"only {share * 100:.0f}% of the users' requests are at the engines ({before * 100:.0f}% at the step "
        f"before): the rest are held between the load generator and the engines; {s.figures()}",
        "the gateway: more processes (zerogap gateway --workers N), check its CPU and [gateway] limits",
    )


def _prefill(s: Step) -> tuple[str, str] | None:
    advice = "[scheduler] max_num_batched_tokens higher (more prefill per step); TPOT jitter: enable_chunked_prefill"
    if s.queued():
        room = s.cap is not None and s.running is not None and s.running < CAP_FULL * s.cap
        if room and s.kv is not None and s.kv < KV_FULL:
            return (f"requests wait while the batch and the KV cache have room: prefill admits them slowly; "
                    f"{s.figures()}", advice)  # fmt: skip
        return None
    if s.before is None:
        return None
    ttft, ttft_before = _num(p50(s.raw, "ttft_ms")), _num(p50(s.before, "ttft_ms"))  # None: not collected
    tpot, tpot_before = _num(p50(s.raw, "tpot_ms")), _num(p50(s.before, "tpot_ms"))
    if ttft is None or tpot is None or not ttft_before or not tpot_before:
        return None
    if ttft < TTFT_GROWTH * ttft_before or tpot >= TPOT_HOLDS * tpot_before:
        return None
    return (
        f"TTFT p50 {ttft_before:.1f} -> {ttft:.1f} ms while TPOT p50 holds ({tpot_before:.1f} -> {tpot:.1f} ms): "
        f"prefill is squeezed by decode; {s.figures()}",
        advice,
    )


def _compute(s: Step) -> tuple[str, str] | None:
    if s.gpu_pct is None or s.gpu_pct < GPU_BUSY_PCT:
        return None
    return (f"the GPU is busy: {s.figures()}", "compute: this pool's ceiling; add replicas ([engine] replicas) or GPUs")


def _token_interval(s: Step) -> tuple[str, str] | None:
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


RULES: tuple[tuple[str, Rule], ...] = (
    ("errors", _errors),
    ("load_generator", _load_generator),
    ("none", _still_growing),
    ("kv_cache", _kv_cache),
    ("batch_cap", _batch_cap),
    ("gateway", _gateway),
    ("prefill", _prefill),
    ("compute", _compute),
    ("token_interval", _token_interval),
)


def diagnose_step(step: dict[str, Any], before: dict[str, Any] | None, after: dict[str, Any] | None) -> Entry:
    s = Step(step, before, after)
    entry: Entry = {"step": step.get("index"), "concurrency": step.get("concurrency", step.get("users"))}
    if "request_rate" in step:
        entry["request_rate"] = step["request_rate"]
    for name, rule in RULES:
        found = rule(s)
        if found is not None:
            evidence, advice = found
            return {**entry, "limit": name, "evidence": evidence, "advice": advice}
    return {
        **entry,
        "limit": "none",
        "evidence": f"no saturated resource: {s.figures()}",
        "advice": "none: raise the load (add a higher step) to find the limit",
    }


def diagnose(steps: list[dict[str, Any]]) -> list[Entry]:
    """One entry per step, in the steps' order."""
    return [
        diagnose_step(step, steps[i - 1] if i else None, steps[i + 1] if i + 1 < len(steps) else None)
        for i, step in enumerate(steps)
    ]


def headline(diagnosis: list[Entry]) -> str:
    """One sentence: the limit at the top step."""
    if not diagnosis:
        return "No step was measured, so there is no diagnosis."
    top = diagnosis[-1]
    load = top.get("request_rate")
    where = f"{load:g} req/s" if load is not None else f"{top['concurrency']:g} users"
    if top["limit"] == "none":
        return f"At the top step ({where}) nothing limits TPS yet: {top['evidence']}."
    return f"At the top step ({where}) TPS is limited by {top['limit']}: {top['evidence']}. Try: {top['advice']}."
