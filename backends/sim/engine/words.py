"""The synthetic tokenizer: one whitespace-separated word = one token.

Prompt words map to stable ids (a word of WORDS to its index, any other word to a
CRC32-derived id); output tokens are drawn from WORDS and each is sent as " word",
so the output text split on whitespace has exactly as many words as tokens.
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
TOKEN_TEXT: tuple[str, ...] = tuple(" " + word for word in WORDS)


def token_id(word: str) -> int:
    known = _INDEX.get(word)
    if known is not None:
        return known
    return len(WORDS) + zlib.crc32(word.encode("utf-8")) % (VOCAB_SIZE - len(WORDS))


def tokenize(text: str) -> list[int]:
    return [token_id(word) for word in text.split()]


def output_token(seq_id: int, position: int) -> int:
    """The id of a request's output token at a position: deterministic, from WORDS."""
    return (seq_id * 7 + position) % len(WORDS)
