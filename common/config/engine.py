"""[engine], [scheduler], [token_interval]: the engines `zerogap backends up` starts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.config.base import Section


class EngineSection(Section):
    model: str = Field("", description="model path or name the engine loads")
    served_model_name: str | None = Field(None, description="the name clients ask for; default: model")
    replicas: int = Field(1, ge=1, le=64)
    base_port: int = Field(8100, ge=1, le=65535)
    host: str = "127.0.0.1"
    python: str | None = Field(
        None, description="interpreter that has vLLM; default ZEROGAP_VLLM_PYTHON, then this one"
    )
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    dtype: Literal["auto", "float16", "bfloat16", "float32", "half", "float"] = "auto"
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_model_len: int | None = Field(None, ge=16)
    extra_args: list[str] = Field(default_factory=list, description="passed to vLLM as they are")
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment for each replica (e.g. VLLM_CPU_KVCACHE_SPACE)"
    )
    startup_timeout_s: float = Field(900.0, gt=0, description="longest wait for a replica's /health to answer 200")
    restart_backoff_max_s: float = Field(60.0, gt=0, description="longest pause before restarting a dead replica")
    stop_timeout_s: float = Field(30.0, gt=0, description="grace after SIGTERM before a replica is killed")

    def client_model_name(self) -> str:
        return self.served_model_name or self.model


class SchedulerSection(Section):
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=16)
    enable_chunked_prefill: bool = True
    scheduler_policy: Literal["fcfs", "priority"] = "fcfs"


class TokenIntervalSection(Section):
    """The three fixes of the source article for the CPU time between GPU steps."""

    async_scheduling: bool = True
    overlap_token_interval: bool | None = Field(
        None, description="the source article's name for async_scheduling (hide the interval behind the forward)"
    )
    detokenizer_async: bool = True
    slot_reuse: bool = True
    api_server_count: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _overlap_is_async_scheduling(self) -> TokenIntervalSection:
        """overlap_token_interval and async_scheduling are one setting under two names: they must agree,
        and the one the file sets decides."""
        overlap = self.overlap_token_interval
        if overlap is None or "overlap_token_interval" not in self.model_fields_set:
            self.__dict__["overlap_token_interval"] = self.async_scheduling
            return self
        if "async_scheduling" in self.model_fields_set and overlap != self.async_scheduling:
            raise ValueError(
                f"overlap_token_interval = {str(overlap).lower()} and async_scheduling = "
                f"{str(self.async_scheduling).lower()} disagree; they are one setting (async scheduling hides the "
                "token interval behind the forward). Keep one of them, or set both to the same value"
            )
        self.__dict__["async_scheduling"] = overlap
        self.model_fields_set.add("async_scheduling")
        return self
