"""gateway/request.py: the body sent upstream."""

from __future__ import annotations

import json

import pytest

from gateway.errors import ApiError
from gateway.request import parse_call


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


@pytest.mark.parametrize(
    ("raw", "chat", "status", "param", "words"),
    [
        (b"{not json", True, 400, None, "not valid JSON"),
        (b"[1, 2]", True, 400, None, "JSON object"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', True, 422, "model", "'model' is required"),
        (b'{"model": "m", "stream": "yes", "messages": [{"role": "user"}]}', True, 422, "stream", "true or false"),
        (b'{"model": "m", "messages": []}', True, 422, "messages", "non-empty list"),
        (b'{"model": "m", "messages": ["hi"]}', True, 422, "messages", "string 'role'"),
        (b'{"model": "m", "prompt": []}', False, 422, "prompt", "non-empty list"),
        (b'{"model": "m", "prompt": "x", "max_tokens": 0}', False, 422, "max_tokens", "positive integer"),
        (b'{"model": "m", "prompt": "x", "max_tokens": true}', False, 422, "max_tokens", "positive integer"),
        (b'{"model": "m", "prompt": "x", "stream_options": 1}', False, 422, "stream_options", "an object"),
    ],
)
def test_bad_bodies_are_refused_with_the_field_and_the_fix(raw, chat, status, param, words) -> None:
    with pytest.raises(ApiError) as info:
        parse_call(raw, "/v1/chat/completions" if chat else "/v1/completions", chat=chat)
    assert info.value.status == status and info.value.param == param
    assert words in str(info.value)


def test_limits_and_stream_flags_read_from_the_body() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 7}'
    call = parse_call(raw, "/v1/chat/completions", chat=True)
    assert (call.model, call.stream, call.max_tokens, call.client_wants_usage) == ("m", False, 7, False)
    assert call.body_for(None) == raw  # nothing had to change: the client's bytes as they are


def test_stream_options_dropped_from_a_non_streamed_request() -> None:
    raw = b'{"model": "m", "prompt": "x", "stream_options": {"include_usage": true}}'
    sent = json.loads(parse_call(raw, "/v1/completions", chat=False).body_for(None))
    assert "stream_options" not in sent  # vLLM refuses stream_options without stream
