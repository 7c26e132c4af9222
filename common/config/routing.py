"""[gateway].routing's names and [gateway.cache_aware]: the settings of the prefix policies
(gateway/pool/routing/). A new policy adds its name to RoutingName (and its settings here, if any)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from common.config.base import Section

RoutingName = Literal["least_load", "round_robin", "cache_aware", "cache_aware_local", "kv_events"]


class CacheAwareSection(Section):
    block_chars: int = Field(
        64, ge=8, le=65536, description="characters per hashed prompt block (64 chars ~ one 16-token KV block)"
    )
    max_prompt_blocks: int = Field(
        512, ge=1, le=1_000_000, description="leading blocks hashed per request; the rest of the prompt is ignored"
    )
    key_blocks: int = Field(
        16,
        ge=1,
        le=1_000_000,
        description="cache_aware: the leading blocks that name a prompt's home engine (a shorter prompt: all its "
        "full blocks); prompts alike in these go to the same engine",
    )
    load_factor: float = Field(
        1.15,
        ge=1,
        description="cache_aware: no engine takes a request past this times the mean load (this request included, "
        "rounded up); the prompt goes to its next engine",
    )
    load_slack: int = Field(
        4,
        ge=0,
        le=1_000_000,
        description="cache_aware: the hard bound is at least this many requests above the mean",
    )
    shed_rate: float = Field(
        0.5,
        ge=0,
        description="cache_aware: how fast (per second, per unit of relative excess over the mean) an engine's "
        "share of prompts handed to their next engine follows its reported load",
    )
    load_scrape_interval_s: float = Field(
        0.1,
        gt=0,
        description="cache_aware: the backends' load is scraped at least this often ([gateway] "
        "load_scrape_interval_s, if lower, wins): every process bounds the load by what it last read",
    )
    max_blocks_per_backend: int = Field(
        65536, ge=1, le=10_000_000, description="cache_aware_local: block hashes remembered per backend (LRU)"
    )
    balance_abs: float = Field(
        32,
        ge=0,
        description="cache_aware_local: affinity is dropped when the match's load exceeds the least load by more "
        "than this",
    )
    balance_rel: float = Field(1.3, ge=1, description="... and is more than this many times the least load")
    tokenizer: str = Field(
        "words",
        min_length=1,
        description="kv_events: how the gateway computes a prompt's token ids as the engines do: 'words' (the "
        "sim's tokenizer) or the model's folder (its tokenizer.json and tokenizer_config.json's chat template)",
    )

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str) -> str:
        if value != "words" and not (Path(value).expanduser() / "tokenizer.json").is_file():
            raise ValueError(f"{value!r} has no tokenizer.json: give the model's folder, or 'words' for the sim")
        return value
