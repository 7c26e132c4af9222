"""settings.json: the article's sections (api, load_test, workload, metrics) plus the
brief's additions (steps, slo, output), typed and validated.

Every failure becomes one SettingsError whose text names the file, the field and
what to do; the harness prints it and exits non-zero, never with a traceback.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

from common.config.explain import read_text, validate

SETTINGS_ENV = "ZEROGAP_SETTINGS"
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_SETTINGS = "settings.json"


class SettingsError(Exception):
    """Settings that cannot be used; str() is the message for the user."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def _check_url(value: str) -> str:
    HttpUrl(value)
    return value.rstrip("/")


class ApiSection(_Section):
    base_url: str = "http://127.0.0.1:8000/api"
    api_key_env: str = Field("TAOTOKEN_API_KEY", description='env var holding the key; "" sends no key')
    endpoint: Literal["chat", "completions"] = "chat"
    connect_timeout_seconds: float = Field(10.0, gt=0)
    timeout_seconds: float = Field(600.0, gt=0, description="longest wait for the next byte of a response")
    max_retries: int = Field(
        0, ge=0, le=20, description="retries of a request that failed before its first byte (connect, 429, 5xx)"
    )
    traceparent: bool = Field(
        False, description="each request sends a sampled W3C traceparent (its trace id starts with the send time)"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_key_in_file(cls, data: Any) -> Any:
        """A key written in the file is refused; "api_key": "${VAR}" names the variable, like api_key_env."""
        if isinstance(data, dict) and "api_key" in data:
            named = _ENV_REFERENCE.fullmatch(str(data["api_key"]))
            if named and data.get("api_key_env", named.group(1)) == named.group(1):
                return {**{k: v for k, v in data.items() if k != "api_key"}, "api_key_env": named.group(1)}
            raise ValueError(
                "api_key must not be written in settings.json; put the key in an environment variable "
                'and name it: "api_key_env": "TAOTOKEN_API_KEY" (or "api_key": "${TAOTOKEN_API_KEY}")'
            )
        return data

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value)

    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"


class LoadTestSection(_Section):
    concurrency: int = Field(128, ge=1, le=100_000)
    duration_seconds: float = Field(300.0, gt=0)
    request_rate: float = Field(0.0, ge=0, description="> 0: open-loop Poisson arrivals, requests/s")
    warmup_seconds: float = Field(30.0, ge=0)
    steps: list[float] = Field(
        default_factory=list, description="empty: one step at concurrency (or request_rate) for duration_seconds"
    )
    step_duration_seconds: float = Field(180.0, gt=0)
    measure_last_seconds: float = Field(120.0, gt=0)
    spawn_rate: float = Field(0.0, ge=0, description="users started per second, one by one; 0 = all at once")
    seed: int | None = Field(None, description="open loop: seed of the arrival times (None: a new one each run)")
    trace: str = Field(
        "", description='a Mooncake JSONL or BurstGPT CSV trace replayed open-loop at its times; "" = none'
    )
    trace_speed: float = Field(1.0, gt=0, description="trace: time runs this many times faster (2 = half the gaps)")
    trace_block_tokens: int = Field(512, ge=1, le=1_000_000, description="trace: tokens per hash_ids block")
    drain_seconds: float | None = Field(
        None,
        ge=0,
        le=3600,
        description="the most the run's end waits for the streams in flight; None: twice the longest request "
        "+ 5 s, at most 30 s (and the api timeout); 0: cut them at once (counted as interrupted)",
    )

    @field_validator("steps")
    @classmethod
    def _positive(cls, value: list[float]) -> list[float]:
        for index, step in enumerate(value):
            if step <= 0:
                raise ValueError(f"steps[{index}] is {step}; every step must be > 0")
        return value

    @model_validator(mode="after")
    def _whole_users(self) -> LoadTestSection:
        if self.request_rate == 0:
            for index, step in enumerate(self.steps):
                if step != int(step):
                    raise ValueError(f"steps[{index}] is {step}; with request_rate 0 a step is a user count")
        if self.steps and self.measure_last_seconds > self.step_duration_seconds:
            raise ValueError(
                f"measure_last_seconds ({self.measure_last_seconds}) is longer than step_duration_seconds "
                f"({self.step_duration_seconds}); make it at most the step's length"
            )
        return self


class WorkloadSection(_Section):
    model: str = Field("", description='the model to ask for; "" = the only model GET {base_url}/v1/models lists')
    prompt_tokens: int = Field(
        512, ge=1, le=1_000_000, validation_alias=AliasChoices("prompt_tokens", "input_tokens"),
        description="the prompt's length in tokens (input_tokens: the same, older name)",
    )  # fmt: skip
    max_output_tokens: int = Field(256, ge=1, le=1_000_000)
    stream: bool = Field(True, description="false: non-streamed requests (TTFT = E2E, no TPOT or ITL)")
    ignore_eos: bool = True
    temperature: float = Field(0.0, ge=0)
    prompt_tokens_from: Literal["tokenize", "approx"] = "tokenize"
    tokenize_url: str = Field("", description='POST endpoint counting tokens; "" tries {base_url}/tokenize, /tokenize')
    unique_prompts: bool = True
    prefix_groups: int = Field(0, ge=0, le=100_000, description="> 0: requests share one of G prefixes")
    prefix_tokens: int = Field(0, ge=0, le=1_000_000, description="length of each shared prefix (before input)")
    prefix_hot_share: float = Field(0.0, ge=0, le=1, description="> 0: prefix 0 takes this share of requests")
    multi_turn: bool = Field(False, description="each user sends its conversation's growing history")
    max_turns: int = Field(8, ge=1, le=1000, description="multi_turn: a conversation starts over after this")
    dataset: str = Field("", description='a JSONL of OpenAI request bodies or a ShareGPT JSON file; "" = none')
    dataset_limit: int | None = Field(None, ge=1, description="use the first N items (after sampling); None = all")
    dataset_order: Literal["random", "in_order"] = Field("random", description="random: shuffled with dataset_seed")
    dataset_seed: int = 0
    dataset_turns: Literal["first", "all"] = Field(
        "first", description="ShareGPT: the first human turn, or every turn of the conversation in order"
    )

    @field_validator("tokenize_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value) if value else value

    @model_validator(mode="after")
    def _prefixes(self) -> WorkloadSection:
        if self.prefix_groups and not self.prefix_tokens:
            raise ValueError("prefix_groups is set but prefix_tokens is 0; give each shared prefix a length")
        if self.prefix_hot_share and self.prefix_groups < 2:
            raise ValueError("prefix_hot_share needs prefix_groups >= 2 (one hot prefix and the others)")
        return self


class GpuUtilSection(_Section):
    source: Literal["backend_metrics", "nvml", "prometheus", "none"] = "backend_metrics"
    backend_metric: str = "zerogap_sim_gpu_busy_ratio"
    backend_metric_unit: Literal["ratio", "percent"] = "ratio"
    prometheus_url: str = "http://127.0.0.1:9090"
    prometheus_query: str = "avg(DCGM_FI_DEV_GPU_UTIL)"
    prometheus_unit: Literal["ratio", "percent"] = "percent"
    nvml_devices: list[int] = Field(default_factory=list, description="GPU indexes; empty = all")


class MetricsSection(_Section):
    collect_tps: bool = Field(True, description="false: no output/total tokens per second anywhere")
    collect_ttft: bool = Field(True, description="false: no time to first token anywhere")
    collect_tpot: bool = Field(True, description="false: no time per output token (nor inter-token latency)")
    collect_gpu_util: bool = Field(True, description="false: GPU utilization is neither scraped nor shown")
    sample_interval_ms: int = Field(1000, ge=50, le=60_000)
    gpu_util: GpuUtilSection = Field(default_factory=GpuUtilSection)
    backend_metrics_urls: list[str] | None = Field(
        None,
        description="each backend's /metrics URL; absent: the zerogap gateway at api.base_url lists them"
        " (GET /metrics/backends); [] = none",
    )
    gateway_metrics_key_env: str = Field(
        "ZEROGAP_METRICS_KEY",
        description="env var holding the gateway's [server].metrics_key, sent to its GET /metrics/backends"
        " and GET /metrics; unset: no key",
    )
    scrape_timeout_seconds: float = Field(2.0, gt=0)
    exporter_port: int = Field(9646, ge=0, le=65535, description="the load generator's own /metrics; 0 = off")
    exporter_host: str = "127.0.0.1"
    saturation_cpu_percent: float = Field(90.0, gt=0, le=100, description="load-generator CPU that invalidates")
    max_send_lag_ms: float = Field(100.0, gt=0, description="open loop: p90 send lag that invalidates a step")
    max_loop_lag_ms: float = Field(
        50.0, gt=0, description="p90 of the load generator's event-loop lag (chunks read late) that invalidates a step"
    )

    @field_validator("backend_metrics_urls")
    @classmethod
    def _urls(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [_check_url(url) for url in value]


class SloSection(_Section):
    ttft_ms: float = Field(2000.0, gt=0)
    tpot_ms: float = Field(100.0, gt=0)


class OutputSection(_Section):
    dir: str = "runs"
    run_name: str = Field("", description='the run folder\'s name; "" = UTC timestamp')
    plots: bool = Field(True, description="draw the PNGs of report.html (zerogap report RUN_DIR draws them later)")


class Settings(_Section):
    api: ApiSection = Field(default_factory=ApiSection)
    load_test: LoadTestSection = Field(default_factory=LoadTestSection)
    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    slo: SloSection = Field(default_factory=SloSection)
    output: OutputSection = Field(default_factory=OutputSection)

    @model_validator(mode="after")
    def _one_traffic_source(self) -> Settings:
        if self.load_test.trace and self.workload.dataset:
            raise ValueError(
                "load_test.trace and workload.dataset are both set; a trace builds its prompts from its own "
                "lengths: drop one of them"
            )
        return self

    def api_key(self, env: Mapping[str, str] | None = None) -> str:
        """The key from the environment variable api.api_key_env names ("" when none is named)."""
        name = self.api.api_key_env
        if not name:
            return ""
        value = (os.environ if env is None else env).get(name, "")
        if not value:
            raise SettingsError(
                f"api.api_key_env: environment variable {name} is not set. Export it (export {name}=...), "
                'or set api.api_key_env to "" for a backend that needs no key.'
            )
        return value


def _field(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_settings(text: str, source: str = DEFAULT_SETTINGS) -> Settings:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{source}: not valid JSON: {exc}. Fix the syntax.") from None
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: the top level must be a JSON object {{...}}.")
    return validate(Settings, raw, source, _field, SettingsError, unknown="field")


def settings_path(cli_value: str | None, env: Mapping[str, str] | None = None) -> Path:
    """--settings PATH, else $ZEROGAP_SETTINGS, else ./settings.json."""
    environ = os.environ if env is None else env
    return Path(cli_value or environ.get(SETTINGS_ENV) or DEFAULT_SETTINGS)


def load_settings(path: str | Path) -> Settings:
    file = Path(path)
    hint = f"Pass --settings PATH, set {SETTINGS_ENV}, or run from the folder that has settings.json."
    text = read_text(file, hint, SettingsError)
    return parse_settings(text, str(file))
