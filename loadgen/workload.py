"""Shared-prefix and multi-turn workloads (settings.json `workload`).

- `prefix_groups` G > 0: each request starts with one of G shared prefixes of
  `prefix_tokens` words (a system message in chat, the prompt's head in completions),
  then its own `input_tokens` words. `prefix_hot_share` h > 0: group 0 takes a share h
  of the requests and the others share the rest evenly; 0: all G evenly.
- `multi_turn`: each user keeps a conversation and sends the whole history each turn
  (its shared prefix, if any, first); the assistant's turns are filler words of the
  length it answered (the harness does not keep the text), and a conversation starts
  over after `max_turns` turns.

Engines see repeated leading tokens, so their prefix caches can hit; the report shows
the hit rate they export (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total).
"""

from __future__ import annotations

import random

from loadgen.prompt import request_body, words
from loadreport.settings import Settings

PREFIX_SEED = 10_000  # prefix g is words(prefix_tokens, PREFIX_SEED + g): the same in every process


class Session:
    """One user's requests: which prefix, and the conversation so far."""

    def __init__(self, settings: Settings, prompt: str, rng: random.Random, prefixes: list[str]) -> None:
        self.settings = settings
        self.prompt = prompt
        self.rng = rng
        self.prefixes = prefixes
        self.history: list[dict[str, str]] = []
        self.group: int | None = None
        self.num_turns = 0

    def pick_group(self) -> int | None:
        w = self.settings.workload
        if not self.prefixes:
            return None
        hot = w.prefix_hot_share
        if hot > 0 and len(self.prefixes) > 1:
            return 0 if self.rng.random() < hot else self.rng.randrange(1, len(self.prefixes))
        return self.rng.randrange(len(self.prefixes))

    def _question(self) -> str:
        w = self.settings.workload
        return f"{self.rng.randrange(10**6):06d} {self.prompt}" if w.unique_prompts else self.prompt

    def messages(self) -> list[dict[str, str]]:
        """The next request's messages (and the state they start from, for multi_turn)."""
        w = self.settings.workload
        if not w.multi_turn or self.num_turns == 0 or self.num_turns >= w.max_turns:
            self.history, self.num_turns = [], 0
            self.group = self.pick_group()
            if self.group is not None:
                self.history.append({"role": "system", "content": self.prefixes[self.group]})
        if self.history and self.history[-1]["role"] == "user":
            self.history.pop()  # the last turn failed: ask again instead
        self.history.append({"role": "user", "content": self._question()})
        self.num_turns += 1
        return list(self.history)

    def answered(self, num_output_tokens: int) -> None:
        """The last request's answer: kept in the history as filler of its length (multi_turn)."""
        if self.settings.workload.multi_turn and self.history and self.history[-1]["role"] == "user":
            filler = words(max(1, num_output_tokens), seed=self.rng.randrange(10**9))
            self.history.append({"role": "assistant", "content": filler})

    def body(self, model: str) -> bytes:
        """The next request's body: chat messages, or their texts joined for completions."""
        return request_body(self.settings, self.prompt, model, self.messages())


class Workload:
    """The shared prefixes of a run, and a session per user."""

    def __init__(self, settings: Settings, prompt: str, seed: int | None = None) -> None:
        w = settings.workload
        self.settings = settings
        self.prompt = prompt
        self.prefixes = [words(w.prefix_tokens, PREFIX_SEED + g) for g in range(w.prefix_groups)]
        self.rng = random.Random(seed)

    @property
    def shaped(self) -> bool:
        """True when requests differ from the plain workload (shared prefixes or conversations)."""
        w = self.settings.workload
        return bool(w.prefix_groups or w.multi_turn)

    def session(self) -> Session:
        return Session(self.settings, self.prompt, random.Random(self.rng.random()), self.prefixes)
