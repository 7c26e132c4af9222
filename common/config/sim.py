"""[sim]: the simulated engine's cost model (only the forward and the token interval
are modelled). Owned by backends/sim; see backends/sim/README.md for the model.

Defaults are calibrated to the source article: at 256 concurrent decodes the baseline
(synchronous, global reschedule) has forward ~= interval ~= 35 ms; slot reuse cuts
the interval to ~14 ms; async scheduling hides it behind the forward.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from common.config.base import Section
from common.config.zmq_endpoint import check_zmq_endpoint


class SimSection(Section):
    time_scale: float = Field(1.0, gt=0, description="multiplies every modelled time (10 = ten times slower)")
    # forward = fixed + per decoding sequence + per prefill token
    forward_fixed_ms: float = Field(5.0, ge=0)
    forward_per_seq_ms: float = Field(0.117, ge=0, description="per decoding sequence")
    forward_per_prefill_token_ms: float = Field(0.01, ge=0)
    # interval = fixed + per sequence (outputs) + per rescheduled sequence + per sequence detokenized in-process
    interval_fixed_ms: float = Field(3.0, ge=0)
    interval_per_seq_ms: float = Field(0.043, ge=0, description="append token, stop checks, stream: every seq")
    interval_schedule_per_seq_ms: float = Field(
        0.082, ge=0, description="schedule + prepare inputs, per seq rescheduled (all with no slot reuse)"
    )
    interval_detokenize_per_seq_ms: float = Field(
        0.0152, ge=0, description="detokenize in the engine process (only when detokenizer_async is off)"
    )
    async_overhead_ms: float = Field(0.5, ge=0, description="the part of a step async scheduling cannot hide")
    client_gap_ms: float = Field(
        0.0,
        ge=0,
        description="virtual closed loops (sim plan, tune --virtual): the mean time from a response's end to the "
        "user's next request reaching the engine (load generator and HTTP); `zerogap sim calibrate` measures it",
    )
    frontend_per_request_ms: float = Field(
        0.0,
        ge=0,
        description="the engine's API server, one first-come-first-served server: its work per request before the "
        "engine sees it (parse, chat template, tokenize); 0 with frontend_per_token_ms 0: no API server modelled",
    )
    frontend_per_token_ms: float = Field(
        0.0, ge=0, description="the API server's work per token the engine makes (detokenize, one SSE event)"
    )
    kv_cache_blocks: int = Field(16384, ge=1)
    block_size: int = Field(16, ge=1)
    enable_prefix_caching: bool = True
    max_model_len: int | None = Field(None, ge=16, description="default: [engine].max_model_len, else 8192")
    eos_probability: float = Field(
        0.0, ge=0, lt=1, description="chance per token of an early EOS (requests without ignore_eos)"
    )
    metrics_window_s: float = Field(5.0, gt=0, description="window of zerogap_sim_gpu_busy_ratio (wall time)")
    reasoning_tokens: float = Field(
        0.0,
        ge=0,
        description="a reasoning model: each chat answer starts with this many reasoning tokens (>= 1), or this "
        "share of max_tokens (< 1), streamed as `reasoning` deltas before the answer's `content` (vLLM 0.32's shape)",
    )
    seed: int = 0
    kv_events_endpoint: str | None = Field(
        None,
        description="publish the KV cache's changes as vLLM does (--kv-events-config endpoint): a ZeroMQ PUB "
        "socket bound here, e.g. tcp://*:5557 (tcp://HOST:PORT or ipc://PATH); unset: no events",
    )
    kv_events_replay_endpoint: str | None = Field(
        None, description="a ZeroMQ ROUTER socket bound here replays buffered batches from a sequence number"
    )
    kv_events_topic: str = Field("", description="the topic frame of every published batch")
    kv_events_buffer_steps: int = Field(10_000, ge=1, le=10_000_000, description="batches kept for replay")

    @field_validator("kv_events_endpoint", "kv_events_replay_endpoint")
    @classmethod
    def _zmq_endpoint(cls, value: str | None) -> str | None:
        return None if value is None else check_zmq_endpoint(value, bind=True)
