"""gateway/relay/choice_usage.py: a stream of several choices charged as the sum of each choice's own
usage (vLLM's continuous usage is per choice), each prompt once."""

from __future__ import annotations

import json

from gateway.relay.choice_usage import ChoiceUsage


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def chunk(index: int, text: str, usage: tuple[int, int] | None = None, role: bool = False) -> bytes:
    delta = {"role": "assistant", "content": ""} if role else {"content": text}
    payload: dict = {"id": "c", "choices": [{"index": index, "delta": delta}]}
    if usage is not None:
        payload["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return event(payload)


def test_cut_chat_stream_with_n_choices_is_charged_every_choice() -> None:
    acc = ChoiceUsage(chat=True, n=8, prompt_estimates=[50])
    stream = b"".join(chunk(i, "", (12, 0), role=True) for i in range(8))
    for step in range(1, 91):  # 90 tokens per choice, interleaved as vLLM sends them
        stream += b"".join(chunk(i, "w", (12, step)) for i in range(8))
    acc.feed(stream)
    assert acc.reported() == (12, 720, True)  # 8 x 90, the prompt once


def test_final_usage_chunk_is_the_answer() -> None:
    acc = ChoiceUsage(chat=True, n=2, prompt_estimates=[50])
    acc.feed(chunk(0, "a", (5, 1)) + chunk(1, "b", (5, 1)))
    acc.feed(event({"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}}))
    assert acc.reported() == (5, 7, True)


def test_completions_prompt_list_charges_each_prompt_once() -> None:
    """index = prompt_index * n + i; each chunk's prompt_tokens is its own prompt's."""
    acc = ChoiceUsage(chat=False, n=2, prompt_estimates=[3, 4, 100])
    parts = []
    for index, prompt_tokens in [(0, 3), (1, 3), (2, 4), (3, 4)]:  # prompt 2 (indices 4, 5) not started
        for step in (1, 2, 3):
            payload = {"choices": [{"index": index, "text": "x"}],
                       "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": step}}  # fmt: skip
            parts.append(event(payload))
    acc.feed(b"".join(parts))
    prompt, completion, exact = acc.reported()
    assert (prompt, completion) == (3 + 4 + 100, 12)  # the third prompt estimated: not exact
    assert not exact


def test_no_usage_counts_chunks_per_choice_without_role_openers() -> None:
    acc = ChoiceUsage(chat=True, n=3, prompt_estimates=[9])
    acc.feed(b"".join(chunk(i, "", role=True) for i in range(3)))
    acc.feed(b"".join(chunk(i, "t") for i in range(3) for _ in range(4)) + b"data: [DONE]\n\n")
    assert acc.reported() == (None, 12, False)


def test_a_choice_whose_usage_stopped_is_counted_by_its_chunks_after_it() -> None:
    """Usage from one choice does not stand for another: a choice with chunks but no usage is counted."""
    acc = ChoiceUsage(chat=False, n=2, prompt_estimates=[2])
    acc.feed(event({"choices": [{"index": 0, "text": "a"}], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}))
    acc.feed(event({"choices": [{"index": 1, "text": "b"}]}) * 3)
    assert acc.reported() == (2, 4, False)
