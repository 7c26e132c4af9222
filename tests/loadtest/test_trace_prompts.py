"""A trace row's prompt: its hash_ids blocks (equal ids, equal text) then its own words, to its length;
the words checked against the engine's tokenizer."""

from __future__ import annotations

from loadgen.trace_prompts import TracePrompts, fit_vocabulary
from loadgen.traces import TraceRow


def row(index: int, num_tokens: int, ids: tuple[int, ...]) -> TraceRow:
    return TraceRow(index, index + 1, 0.0, num_tokens, 1, ids)


def test_equal_ids_are_equal_leading_text_and_nothing_unique_comes_first() -> None:
    prompts = TracePrompts(block_tokens=8)
    a = prompts.prompt(row(0, 20, (1, 2, 3))).split()  # blocks 1, 2 and 4 words of 3
    b = prompts.prompt(row(1, 24, (1, 2, 5))).split()
    c = prompts.prompt(row(2, 30, (1, 2))).split()  # 2 blocks, then 14 words of its own
    d = prompts.prompt(row(3, 30, (1, 2))).split()
    assert [len(a), len(b), len(c)] == [20, 24, 30]
    assert a[:16] == b[:16] == c[:16] == d[:16]
    assert a[16:] != b[16:20] and c[16:] != d[16:]  # their own words differ from the first one on
    assert a[16:20] == prompts.block(3).split()[:4]  # a short last block is the start of that block
    other = TracePrompts(block_tokens=8)  # another process builds the same text
    assert other.prompt(row(0, 20, (1, 2, 3))).split() == a


def test_a_row_without_blocks_is_all_its_own() -> None:
    prompts = TracePrompts(block_tokens=8)
    first, second = prompts.prompt(row(0, 12, ())).split(), prompts.prompt(row(1, 12, ())).split()
    assert len(first) == len(second) == 12 and first[:8] != second[:8]


def test_the_words_are_checked_against_the_tokenizer() -> None:
    words = lambda text: len(text.split())  # noqa: E731 - one word a token: the list is kept
    assert fit_vocabulary(words, 16)[1] == "tokenize"
    assert fit_vocabulary(None, 16)[1] == "approx"

    def two_for_long_words(text: str) -> int:  # words of 4 letters or more are two tokens; plus a BOS
        return 1 + sum(2 if len(word) >= 4 else 1 for word in text.split())

    vocabulary, how = fit_vocabulary(two_for_long_words, 16)
    assert how == "tokenize" and vocabulary and all(len(word) < 4 for word in vocabulary)
    prompts = TracePrompts(16, vocabulary)
    assert two_for_long_words(prompts.prompt(row(0, 40, (7, 8)))) == 41
    assert fit_vocabulary(lambda text: 2 * len(text.split()), 16)[1] == "approx"  # no word is one token
