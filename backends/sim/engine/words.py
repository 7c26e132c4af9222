"""The synthetic tokenizer: one whitespace-separated word = one token.

Prompt words map to stable ids (a word of WORDS to its index, any other word to a
CRC32-derived id); output tokens are drawn from WORDS and each is sent as " word",
so the output text split on whitespace has exactly as many words as tokens.
"""

from __future__ import annotations

from common.sim_words import VOCAB_SIZE, WORDS, token_id, tokenize

__all__ = ["TOKEN_TEXT", "VOCAB_SIZE", "WORDS", "output_token", "token_id", "tokenize"]

TOKEN_TEXT: tuple[str, ...] = tuple(" " + word for word in WORDS)


def output_token(seq_id: int, position: int) -> int:
    """The id of a request's output token at a position: deterministic, from WORDS."""
    return (seq_id * 7 + position) % len(WORDS)
