"""The sim's synthetic tokenizer: one whitespace-separated word = one token (the ids the sim
computes, its KV-cache events carry and the gateway's kv_events policy computes again).

A word of WORDS maps to its index, any other word to a CRC32-derived id.
"""

from __future__ import annotations

import zlib

VOCAB_SIZE = 32000

WORDS: tuple[str, ...] = (
    "the", "engine", "steps", "forward", "token", "interval", "batch", "slot",
    "reuse", "async", "schedule", "prefill", "decode", "cache", "block", "prefix",
    "stream", "queue", "gpu", "busy", "idle", "kernel", "memory", "latency",
    "throughput", "request", "model", "layer", "head", "tensor", "vector", "matrix",
    "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "river",
    "mountain", "cloud", "signal", "pattern", "window", "garden", "harbor", "lantern",
    "amber", "cobalt", "silver", "copper", "marble", "velvet", "cedar", "maple",
    "north", "south", "east", "west", "early", "late", "bright", "calm",
)  # fmt: skip

_INDEX = {word: i for i, word in enumerate(WORDS)}


def token_id(word: str) -> int:
    known = _INDEX.get(word)
    if known is not None:
        return known
    return len(WORDS) + zlib.crc32(word.encode("utf-8")) % (VOCAB_SIZE - len(WORDS))


def tokenize(text: str) -> list[int]:
    return [token_id(word) for word in text.split()]
