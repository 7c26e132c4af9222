"""A reasoning model's stream: `reasoning_content` (older vLLM) or `reasoning` (vLLM 0.32) deltas before
the answer's `content`, timed apart; reasoning and cached tokens from the usage's details, or counted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadgen.client import _to_record
from loadgen.sse import SseParser


def line(delta: dict[str, Any] | None = None, usage: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {"choices": [] if delta is None else [{"index": 0, "delta": delta}]}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def read(lines: list[bytes]) -> SseParser:
    parser = SseParser(chat=True)
    for at, raw in enumerate([*lines, b"data: [DONE]\n\n"], start=1):
        for part in raw.split(b"\n"):
            parser.feed_line(part, float(at))
    return parser


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_then_the_answer(field: str) -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 5, "completion_tokens_details": {"reasoning_tokens": 3},
             "prompt_tokens_details": {"cached_tokens": 4}}  # fmt: skip
    parser = read(
        [
            line({"role": "assistant", "content": ""}),
            line({field: " a"}),
            line({field: " b"}),
            line({field: " c"}),
            line({"content": " x"}),
            line({"content": " y"}),
            line(usage=usage),
        ]
    )
    assert parser.content_times == [2.0, 3.0, 4.0, 5.0, 6.0]  # TTFT: the first token of either
    assert parser.answer_time == 5.0 and parser.reasoning_chunks == 3
    record, _ = _to_record(parser, 100.0, 1.0, "", None, end=6.5)
    assert record.ttft_s == 1.0 and record.ttfa_s == 4.0
    assert record.reasoning_tokens == 3 and record.cached_tokens == 4 and record.output_tokens == 5


def test_reasoning_counted_when_the_usage_does_not_say() -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 8}  # two tokens a chunk
    parser = read([line({"reasoning": " a b"}), line({"reasoning": " c d"}), line({"content": " x y"}),
                   line({"content": " z w"}), line(usage=usage)])  # fmt: skip
    record, _ = _to_record(parser, 100.0, 0.0, "", None, end=5.0)
    assert record.reasoning_tokens == 4 and record.cached_tokens is None
    assert record.ttfa_s == 3.0 and record.ttft_s == 1.0


def test_no_reasoning_no_figures() -> None:
    parser = read([line({"content": " x"}), line(usage={"prompt_tokens": 1, "completion_tokens": 1})])
    record, _ = _to_record(parser, 100.0, 0.0, "", None, end=3.0)
    assert record.reasoning_tokens is None and record.ttfa_s == record.ttft_s == 1.0
