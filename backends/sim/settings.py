"""The sim's resolved settings: flags > config.toml [scheduler]/[token_interval]/[sim] > defaults."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from common.config.model import Config
from common.config.sim import SimSection

DEFAULT_MAX_MODEL_LEN = 8192


@dataclass(frozen=True, slots=True)
class SimSettings:
    """Everything the engine core needs; times in ms before time_scale is applied."""

    model: str = "sim-model"
    async_scheduling: bool = True
    slot_reuse: bool = True
    detokenizer_async: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    cost: SimSection = field(default_factory=SimSection)

    @property
    def time_scale(self) -> float:
        return self.cost.time_scale

    @property
    def mode(self) -> str:
        """A short name: baseline (sync, no slot reuse), slot_reuse, async, async+slot_reuse."""
        if self.async_scheduling:
            return "async+slot_reuse" if self.slot_reuse else "async"
        return "slot_reuse" if self.slot_reuse else "baseline"

    def with_flags(self, **flags: Any) -> SimSettings:
        """Override with the flags that were given (None = not given)."""
        given = {k: v for k, v in flags.items() if v is not None}
        own = {f.name for f in fields(self)}
        cost_fields = {k: given.pop(k) for k in list(given) if k not in own and k in SimSection.model_fields}
        cost = self.cost.model_copy(update=cost_fields) if cost_fields else self.cost
        return replace(self, cost=cost, **given)


def settings_from_config(config: Config | None) -> SimSettings:
    if config is None:
        return SimSettings()
    sim = config.sim
    max_len = sim.max_model_len or config.engine.max_model_len or DEFAULT_MAX_MODEL_LEN
    return SimSettings(
        model=config.engine.client_model_name() or "sim-model",
        async_scheduling=config.token_interval.async_scheduling,
        slot_reuse=config.token_interval.slot_reuse,
        detokenizer_async=config.token_interval.detokenizer_async,
        max_num_seqs=config.scheduler.max_num_seqs,
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        enable_chunked_prefill=config.scheduler.enable_chunked_prefill,
        max_model_len=max_len,
        cost=sim,
    )
