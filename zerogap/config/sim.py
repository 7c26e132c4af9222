"""[sim]: the simulated engine's cost model (only the forward and the token interval
are modelled). Owned by backends/sim; see backends/sim/README.md for the model."""

from __future__ import annotations

from pydantic import Field

from zerogap.config.gateway import Section


class SimSection(Section):
    time_scale: float = Field(1.0, gt=0, description="multiplies every modelled time")
    forward_fixed_ms: float = Field(5.0, ge=0)
    forward_per_seq_ms: float = Field(0.117, ge=0)
    forward_per_prefill_token_ms: float = Field(0.01, ge=0)
    interval_fixed_ms: float = Field(3.0, ge=0)
    interval_per_seq_ms: float = Field(0.125, ge=0)
    kv_cache_blocks: int = Field(16384, ge=1)
    block_size: int = Field(16, ge=1)
    max_model_len: int = Field(8192, ge=16)
    seed: int = 0
