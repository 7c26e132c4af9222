"""The sim built to hit each limit, run in virtual time with its own scheduler and cost
model (as `zerogap tune --virtual` runs it), then diagnosed as a real run's report is."""

from __future__ import annotations

from typing import Any

from common.config.loader import parse_config
from loadtest import diagnose
from zerogap.tune.grid import Candidate
from zerogap.tune.trial import Trial
from zerogap.tune.virtual import virtual_step


def diagnosis(config_toml: str, users: int, prompt_tokens: int = 128) -> dict[str, Any]:
    trial = Trial("sim", (users,), 8.0, 5.0, 2.0, prompt_tokens, 64, 2000.0, 100.0, virtual=True)
    step = virtual_step(0, users, trial, Candidate({}, parse_config(config_toml)))
    (entry,) = diagnose([step])
    return entry


def test_max_num_seqs_16_under_64_users_is_batch_cap() -> None:
    entry = diagnosis("[scheduler]\nmax_num_seqs = 16\n", 64)
    assert entry["limit"] == "batch_cap", entry
    assert "running 16.0 of a cap of 16" in entry["evidence"] and "waiting 48.0" in entry["evidence"]
    assert "max_num_seqs" in entry["advice"]


def test_sync_without_slot_reuse_at_256_is_token_interval() -> None:
    entry = diagnosis("[token_interval]\nasync_scheduling = false\nslot_reuse = false\n", 256)
    assert entry["limit"] == "token_interval", entry
    assert "async_scheduling" in entry["advice"]


def test_a_small_kv_cache_with_512_token_prompts_is_kv_cache() -> None:
    entry = diagnosis("[sim]\nkv_cache_blocks = 300\n", 64, prompt_tokens=512)
    assert entry["limit"] == "kv_cache", entry


def test_async_at_256_is_compute() -> None:
    entry = diagnosis("[token_interval]\nasync_scheduling = true\n", 256)
    assert entry["limit"] in ("compute", "none"), entry
    assert entry["limit"] == "compute"
