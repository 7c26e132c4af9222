"""The pure parts: SSE event splitting and usage stripping, backend choice, token buckets."""

from __future__ import annotations

import json

import pytest

from gateway.auth import Principal
from gateway.errors import ApiError
from gateway.health import parse_queue
from gateway.limits import RateLimiter
from gateway.pool import Backend, ModelPool
from gateway.request import parse_call
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


def test_least_load_and_round_robin_choices() -> None:
    a, b, c = Backend("a", "u", "m"), Backend("b", "u", "m"), Backend("c", "u", "m")
    pool = ModelPool("m", [a, b, c], "least_load")
    a.num_reported, b.num_inflight, c.num_reported = 5, 1, 2
    assert pool.choose() is b
    assert pool.choose([b]) is c
    b.healthy = False
    assert pool.choose() is c
    rr = ModelPool("m", [a, b, c], "round_robin")
    assert [rr.choose() for _ in range(4)] == [a, c, c, a]  # b is down; rotation goes on
    a.healthy = c.healthy = False
    assert rr.choose() is None


async def test_token_buckets() -> None:
    limiter = RateLimiter()
    who = Principal("k", rpm=1, tpm=100)
    await limiter.admit(who, 30)
    with pytest.raises(ApiError) as exc:
        await limiter.admit(who, 30)
    assert exc.value.status == 429 and exc.value.headers["Retry-After"] in ("60", "59")
    other = Principal("t", tpm=100)
    await limiter.admit(other, 30)
    limiter.settle(other, 30, 130)  # used more than reserved: overdrawn by 30
    with pytest.raises(ApiError) as exc:
        await limiter.admit(other, 1)
    assert exc.value.code == "rate_limit_tokens" and 17 <= int(exc.value.headers["Retry-After"]) <= 19


def test_parse_queue() -> None:
    text = (
        b"# TYPE vllm:num_requests_running gauge\n"
        b'vllm:num_requests_running{model_name="a"} 3.0\n'
        b'vllm:num_requests_waiting{model_name="a"} 4.0\n'
        b"vllm:num_requests_waiting_by_reason 9\n"
    )
    assert parse_queue(text) == 7
    assert parse_queue(b"garbage\nvllm:num_requests_running x") == 0


def test_usage_option_added_without_reencoding_the_client_body() -> None:
    raw = b'  {"model": "m", "prompt": "x \\u00e9", "stream": true}\n'
    call = parse_call(raw, "/v1/completions", chat=False)
    sent = call.body_for(None)
    assert sent.startswith(b'{"model": "m", "prompt": "x \\u00e9"')  # the client's bytes, as sent
    assert json.loads(sent) == {**json.loads(raw), "stream_options": {"include_usage": True}}
    renamed = parse_call(raw, "/v1/completions", chat=False).body_for("real")
    assert json.loads(renamed)["model"] == "real" and json.loads(renamed)["stream_options"]["include_usage"]
    asked = b'{"model": "m", "prompt": "x", "stream": true, "stream_options": {"include_usage": true}}'
    assert parse_call(asked, "/v1/completions", chat=False).body_for(None) == asked
