"""A trace row's prompt, built to its token counts: its hash_ids blocks in order, then its own words.

Block `h` is the same text wherever it appears (words drawn with the seed BLOCK_SEED + h, one word a
token), so rows that share leading hash_ids share exactly that many leading tokens, and nothing unique
comes before the shared blocks: a row's own words (when input_length is longer than its blocks, or a
BurstGPT row that has no blocks) come after them. A last block shorter than the block size is the
first words of that block's text.

One word is one token for the engine's tokenizer only if it says so: `fit_vocabulary` asks its
/tokenize how many tokens one block and two blocks are, and keeps the words that are one token each
when the whole list is not ("approx" when no /tokenize answers or no list fits).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from loadgen.prompt import WORDS
from loadgen.traces import TraceRow

BLOCK_SEED = 1 << 40
UNIQUE_SEED = 1 << 41
PROBE_SEED = 1 << 42
MAX_CACHED_BLOCKS = 20_000
REPEATS = 32  # a word repeated this many times, and twice that: one token per word adds REPEATS tokens
MIN_WORDS = 16

Counter = Callable[[str], int | None]


def draw_words(num_words: int, seed: int, vocabulary: tuple[str, ...]) -> str:
    """num_words words drawn with seed; fewer words of the same seed are this text's first words."""
    return " ".join(random.Random(seed).choices(vocabulary, k=num_words))


class TracePrompts:
    def __init__(self, block_tokens: int, vocabulary: tuple[str, ...] = WORDS) -> None:
        self.block_tokens = block_tokens
        self.vocabulary = vocabulary
        self.blocks: dict[int, str] = {}

    def block(self, hash_id: int) -> str:
        text = self.blocks.get(hash_id)
        if text is None:
            if len(self.blocks) >= MAX_CACHED_BLOCKS:
                self.blocks.clear()
            text = self.blocks[hash_id] = draw_words(self.block_tokens, BLOCK_SEED + hash_id, self.vocabulary)
        return text

    def prompt(self, row: TraceRow) -> str:
        size, ids = self.block_tokens, row.hash_ids
        parts = [self.block(h) for h in ids[:-1]]
        if ids:
            last = min(size, row.input_tokens - size * (len(ids) - 1))
            full = self.block(ids[-1])
            parts.append(full if last == size else draw_words(last, BLOCK_SEED + ids[-1], self.vocabulary))
        own = row.input_tokens - size * len(ids)
        if own > 0:
            parts.append(draw_words(own, UNIQUE_SEED + row.index, self.vocabulary))
        return " ".join(parts)


def fit_vocabulary(counter: Counter | None, block_tokens: int) -> tuple[tuple[str, ...], str]:
    """(words, how): the words that are one token each for the engine, and "tokenize" when its
    /tokenize confirmed that a block is block_tokens tokens, else "approx"."""
    vocabulary = WORDS
    if counter is None:
        return vocabulary, "approx"
    if _block_fits(counter, block_tokens, vocabulary):
        return vocabulary, "tokenize"
    kept = []
    for word in vocabulary:
        once, twice = counter(" ".join([word] * REPEATS)), counter(" ".join([word] * 2 * REPEATS))
        if once is None or twice is None:
            return vocabulary, "approx"
        if twice - once == REPEATS:
            kept.append(word)
    if len(kept) >= MIN_WORDS and _block_fits(counter, block_tokens, tuple(kept)):
        return tuple(kept), "tokenize"
    return vocabulary, "approx"


def _block_fits(counter: Counter, block_tokens: int, vocabulary: tuple[str, ...]) -> bool:
    one = draw_words(block_tokens, PROBE_SEED, vocabulary)
    two = one + " " + draw_words(block_tokens, PROBE_SEED + 1, vocabulary)
    counted_one, counted_two = counter(one), counter(two)
    if counted_one is None or counted_two is None:
        return False
    return counted_two - counted_one == block_tokens and counted_one >= block_tokens
