"""report.json as typed models: the contract other tools read. loadtest/report.schema.json is
RunReport's JSON Schema, published in loadtest/README.md (a test keeps it current). Unknown keys
are refused: the schema lists every field there is.

The harness builds each Step (loadreport/summary.py) and the whole RunReport (loadreport/report.py)
with `model_validate(..., strict=True)`: a figure of the wrong type (a str where a number goes, a
float where an int goes) raises pydantic.ValidationError where it is built. That is zerogap's own
bug, caught by its tests, not a report.json with a wrong figure in it. Readers of a report.json
from disk validate leniently (JSON numbers, older reports: loadreport/diagnosis_reading.as_step).
report.json holds the fields that were set (`to_json`): a figure the run does not have (the
request rate of a closed-loop step, the reasons of figures that were collected) is absent, not null."""

from __future__ import annotations

import json
from typing import Any, Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field

Limit = Literal[
    "none",
    "batch_cap",
    "kv_cache",
    "token_interval",
    "compute",
    "prefill",
    "load_generator",
    "gateway",
    "frontend",
    "errors",
]
LIMITS: tuple[Limit, ...] = get_args(Limit)  # the diagnosis's limit names, in one place


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @classmethod
    def build(cls, **figures: Any) -> Self:
        """The model from figures zerogap computed, strictly typed: a wrong type raises ValidationError."""
        return cls.model_validate(figures, strict=True)

    def to_json(self) -> dict[str, Any]:
        """The model as report.json holds it: the fields that were set, as JSON values."""
        return self.model_dump(mode="json", exclude_unset=True)


class Latency(_Model):
    """Percentiles of one latency over the step's successful requests, in ms (null: no sample)."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None


class GpuUtil(_Model):
    """GPU utilization over the step's window, in percent (in the sim: its busy time)."""

    mean: float
    min: float


class Backend(_Model):
    """The engines' own signals over the step's window (what /metrics exported), for the diagnosis."""

    running_mean: float | None
    running_max: float | None
    waiting_mean: float | None
    kv_cache_usage_mean: float | None
    kv_cache_usage_max: float | None
    preemptions: float | None
    max_num_seqs: int | None = Field(description="the engines' summed cap of running requests")
    num_samples: int | None = None  # the scrapes that read the engines in the window
    gateway_inflight_mean: float | None = Field(
        None, description="requests zerogap's gateway had in flight at the engines (zerogap_backend_inflight)"
    )


class SlowRequest(_Model):
    """One of a step's slowest requests: where to find it in requests.csv (sent_s) and in the trace store
    (trace_id)."""

    sent_s: float = Field(description="its send, from the run's start (requests.csv's sent_s)")
    ttft_ms: float | None = Field(description="null: no content came")
    e2e_ms: float
    output_tokens: int
    error: str | None = Field(description='null: it succeeded; else its kind ("timeout", "HTTP 503", ...)')
    trace_id: str = Field(description="the W3C trace id it sent (api.traceparent), 32 hex digits")


class Slowest(_Model):
    """api.traceparent: a step's slowest requests, slowest first, with their trace ids."""

    ttft: list[SlowRequest] = Field(description="the successful requests with the longest TTFT")
    e2e: list[SlowRequest] = Field(description="the requests (failed ones too) with the longest E2E")


class Step(_Model):
    """One load step, measured over its window (after the step's warm-up)."""

    index: int
    concurrency: float | None = Field(None, description="users (closed loop); absent in open loop")
    request_rate: float | None = Field(None, description="requests/s (open loop); absent in closed loop")
    users: int
    start_s: float
    end_s: float
    duration_s: float = Field(description="the measured window")
    complete: bool = Field(description="false: the run stopped before the step's end")
    requests_ok: int
    requests_failed: int
    retries: int
    errors: dict[str, int] = Field(description="failed requests by kind")
    output_tps: float | None
    total_tps: float | None
    rps: float
    ttft_ms: Latency | None
    tpot_ms: Latency | None
    itl_ms: Latency | None
    e2e_ms: Latency
    gpu_util: GpuUtil | None
    gpu_util_reason: str | None
    goodput_rps: float = Field(description="requests/s that met both SLOs")
    valid: bool
    invalid_reason: str | None
    token_count_source: Literal["usage", "chunks"]
    input_tokens_mean: float | None
    output_tokens_mean: float | None
    loadgen_cpu_percent: float | None
    loadgen_loop_lag_ms: Latency | None = Field(
        None, description="how late the load generator's event loop woke (its busiest process): chunks read this late"
    )
    client_inflight_mean: float | None = Field(
        None, description="requests the load generator had sent and not yet wholly received (mean over the window)"
    )
    send_lag_ms: Latency | None
    token_interval_ms: float | None = Field(description="the GPU's idle gap between forwards")
    cpu_interval_ms: float | None = Field(description="the CPU work per engine step")
    backend: Backend
    prefix_cache_hit_rate: float | None
    not_collected: dict[str, str] = Field(description="figure -> why it is null (settings.json turned it off)")
    tpot_ms_reason: str | None = None
    itl_ms_reason: str | None = None
    ttfa_ms: Latency | None = Field(
        None, description="send -> the first answer token (a reasoning model's, after its reasoning; else = TTFT)"
    )
    reasoning_ms: Latency | None = Field(None, description="per request, TTFA - TTFT: the time spent reasoning")
    reasoning_tokens_mean: float | None = Field(
        None, description="usage.completion_tokens_details.reasoning_tokens, or the reasoning chunks counted"
    )
    cached_tokens_mean: float | None = Field(
        None, description="usage.prompt_tokens_details.cached_tokens per request (null: the server reports none)"
    )
    cached_prompt_share: float | None = Field(None, description="cached prompt tokens / prompt tokens")
    slowest_requests: Slowest | None = Field(
        None, description="api.traceparent: the requests that ended in the window slowest, with their trace ids"
    )

    @property
    def load(self) -> float | None:
        """The step's load: users (closed loop) or requests/s (open loop)."""
        return self.concurrency if self.concurrency is not None else self.request_rate


class Knee(_Model):
    step: int
    load: float
    tps_growth_to_next: float
    text: str


class Diagnosis(_Model):
    step: int
    concurrency: float | None
    request_rate: float | None = None
    limit: Limit
    evidence: str
    advice: str


class Source(_Model):
    """workload.dataset or load_test.trace: the file the requests came from."""

    kind: Literal["dataset", "trace"]
    path: str
    format: Literal["openai_jsonl", "sharegpt", "mooncake", "burstgpt"]
    items: int = Field(description="usable items (dataset) or requests (trace) in the file")
    used: int = Field(description="items the run sends round and round (dataset_limit), or the trace's requests")
    skipped: int = Field(description="left out: ShareGPT conversations with no reply, BurstGPT failed rows")
    tokens_from: str = Field(description="how max_tokens (ShareGPT) or the trace's prompts were counted")
    trace_speed: float | None = None
    span_s: float | None = Field(None, description="trace: its first to its last planned send, after trace_speed")


class Run(_Model):
    name: str
    started_utc: str
    started_unix_s: float
    ended_utc: str
    duration_s: float
    base_url: str
    model: str | None
    stopped_early: str | None
    endpoint: str
    mode: Literal["closed_loop", "open_loop"]
    prompt_tokens_from: str | None
    num_worker_processes: int
    interrupted_requests: int
    source: Source | None = Field(None, description="where the prompts came from: a dataset or a trace file")


class Slo(_Model):
    ttft_ms: float
    tpot_ms: float


class Totals(_Model):
    """The whole run (warm-up and every process included), for checking that it adds up."""

    requests_ok: int
    requests_failed: int
    requests_interrupted: int
    output_tokens_ok: int


class RunReport(_Model):
    """A run folder's report.json."""

    zerogap_report: Literal[1]
    run: Run
    slo: Slo
    steps: list[Step]
    knee: Knee | None
    diagnosis: list[Diagnosis]
    errors: dict[str, int]
    totals: Totals


def json_schema() -> str:
    """The text of loadtest/report.schema.json."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **RunReport.model_json_schema()}
    return json.dumps(schema, indent=2) + "\n"
