"""[gateway.cache_aware]: the settings of routing = "cache_aware" (gateway/routing/)."""

from __future__ import annotations

from pydantic import Field

from zerogap.config.base import Section


class CacheAwareSection(Section):
    block_chars: int = Field(
        64, ge=8, le=65536, description="characters per hashed prompt block (64 chars ~ one 16-token KV block)"
    )
    max_prompt_blocks: int = Field(
        512, ge=1, le=1_000_000, description="leading blocks hashed per request; the rest of the prompt is ignored"
    )
    max_blocks_per_backend: int = Field(
        65536, ge=1, le=10_000_000, description="block hashes remembered per backend (LRU); bounds the memory"
    )
    balance_abs: float = Field(
        32, ge=0, description="affinity is dropped when the match's load exceeds the least load by more than this"
    )
    balance_rel: float = Field(1.3, ge=1, description="... and is more than this many times the least load")
