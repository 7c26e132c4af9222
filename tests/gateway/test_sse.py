"""gateway/sse.py: SSE events split across reads, usage kept or stripped."""

from __future__ import annotations

from gateway.sse import SseFilter

CHUNK = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}\n\n'
DONE = b"data: [DONE]\n\n"


def test_events_split_across_reads_are_forwarded_whole_and_unchanged() -> None:
    f = SseFilter(strip_usage=True)
    stream = CHUNK * 2 + USAGE + DONE
    out = b"".join(f.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + f.rest()
    assert out == CHUNK * 2 + DONE
    assert f.usage == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}


def test_usage_kept_when_asked_and_openai_style_null_usage_ignored() -> None:
    f = SseFilter(strip_usage=False)
    with_null = b'data: {"choices":[{"delta":{}}],"usage":null}\n\n'
    assert f.feed(with_null + USAGE + DONE) == with_null + USAGE + DONE
    assert f.usage is not None and f.usage["completion_tokens"] == 7


def test_crlf_events_are_not_held_back() -> None:
    f = SseFilter(strip_usage=True)
    assert f.feed(b"data: 1\r\n\r\ndata: 2") == b"data: 1\r\n\r\n"
    assert f.rest() == b"data: 2"
