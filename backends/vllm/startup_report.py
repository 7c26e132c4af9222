"""What a replica's vLLM reports at start-up, and the table built from it: each
setting in force, left to vLLM's default, or not honoured by this vLLM or platform.

Sources, all printed by vLLM itself while it starts:
- entry.py's ZEROGAP_VLLM_CONFIG line: the configuration after vLLM's defaults and
  the platform's overrides (the CPU backend sets async_scheduling off here, silently);
- "Initializing a V1 LLM engine (vX.Y.Z)": the version, and the V1 persistent batch;
- "KV cache size: N tokens" and "Maximum concurrency ...": what the memory allows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from backends.vllm.entry import MARK

_ENGINE = re.compile(r"Initializing a (V\d) LLM engine \(v([^)]+)\)")
_KV = re.compile(r"KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.,]+)x")


@dataclass
class StartupReport:
    reported: dict[str, Any] = field(default_factory=dict)
    engine_version: str | None = None  # "V1"
    vllm_version: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: str | None = None
    hook_error: str | None = None

    def feed(self, line: str) -> None:
        """One line of the replica's output (vLLM's prefixes included)."""
        if MARK in line:
            self._config_line(line.split(MARK, 1)[1])
        elif match := _ENGINE.search(line):
            self.engine_version, self.vllm_version = match.group(1), match.group(2)
        if match := _KV.search(line):
            self.kv_cache_tokens = int(match.group(1).replace(",", ""))
        if match := _CONCURRENCY.search(line):
            self.max_concurrency = f"{match.group(2)}x at {match.group(1)} tokens per request"

    def _config_line(self, text: str) -> None:
        if self.reported:
            return  # the first resolution is the one the engine runs with
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            self.hook_error = f"unreadable config line: {text[:200]}"
            return
        self.hook_error = data.pop("error", None)
        self.reported = data
        self.vllm_version = self.vllm_version or data.get("vllm_version")

    def value(self, setting: str) -> Any:
        """What vLLM runs with, for a config.toml setting name (None: not reported)."""
        if setting == "detokenizer_async":
            return self.reported.get("engine_core_process")
        if setting == "slot_reuse":
            return True if self.engine_version == "V1" else None
        if setting == "overlap_token_interval":  # the article's name for async scheduling
            return self.reported.get("async_scheduling")
        return self.reported.get(setting)
