"""SSE parsing: tokens are content chunks; role-only, empty, usage-only and comment lines are not."""

from __future__ import annotations

import json

import pytest

from loadgen.sse import SseParser


def chat_chunk(content: str | None = None, role: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    delta: dict[str, str] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    body: dict[str, object] = {"choices": [{"index": 0, "delta": delta}] if delta or usage is None else []}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n"


def feed(parser: SseParser, lines: list[bytes]) -> None:
    for number, line in enumerate(lines):
        parser.feed_line(line, float(number))
        if line.strip():
            parser.feed_line(b"\n", float(number))
    parser.finish(99.0)


def test_role_only_empty_and_multi_token_chunks() -> None:
    parser = SseParser(chat=True)
    feed(
        parser,
        [
            chat_chunk(role="assistant", content=""),  # role-only first chunk: not a token
            b": keep-alive\n",
            chat_chunk(content=" two tokens"),  # several tokens in one chunk
            chat_chunk(content=""),  # empty content: not a token
            chat_chunk(content=" three"),
            chat_chunk(usage={"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}),
            b"data: [DONE]\n",
        ],
    )
    assert parser.done
    assert parser.num_content_chunks == 2
    assert parser.content_times == [2.0, 4.0]
    assert (parser.completion_tokens, parser.prompt_tokens) == (3, 7)


def test_no_usage_leaves_counting_to_chunks() -> None:
    parser = SseParser(chat=True)
    feed(parser, [chat_chunk(content="a"), chat_chunk(content="b"), b"data: [DONE]\n"])
    assert parser.completion_tokens is None
    assert parser.num_content_chunks == 2


def test_completions_text_crlf_and_no_space_after_colon() -> None:
    parser = SseParser(chat=False)
    lines = [b'data:{"choices":[{"text":"hi"}]}\r\n', b"\r\n", b'data: {"choices":[{"text":""}]}\r\n', b"\r\n"]
    for line in [*lines, b"data: [DONE]\r\n", b"\r\n"]:
        parser.feed_line(line, 1.0)
    assert parser.done and parser.num_content_chunks == 1


def test_event_split_over_two_data_lines_is_one_event() -> None:
    parser = SseParser(chat=True)
    for line in [b'data: {"choices": [{"delta":\n', b'data: {"content": "x"}}]}\n', b"\n"]:
        parser.feed_line(line, 5.0)
    assert parser.content_times == [5.0]


def test_stream_error_event_is_reported() -> None:
    parser = SseParser(chat=True)
    feed(parser, [b'data: {"error": {"message": "engine died", "type": "server_error"}}\n'])
    assert parser.error == "engine died"
    assert not parser.done


def test_bad_json_raises_value_error() -> None:
    parser = SseParser(chat=True)
    parser.feed_line(b"data: {not json\n", 0.0)
    with pytest.raises(ValueError):
        parser.feed_line(b"\n", 0.0)


def test_reasoning_content_counts_as_content() -> None:
    parser = SseParser(chat=True)
    feed(parser, [b'data: {"choices": [{"delta": {"reasoning_content": "hmm"}}]}\n', b"data: [DONE]\n"])
    assert parser.num_content_chunks == 1
