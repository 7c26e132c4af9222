"""gateway/endpoints/request.py: what a request may hold, the body sent upstream, the token budget."""

from __future__ import annotations

import json

import pytest

from common.config.gateway import GatewaySection
from gateway.endpoints.request import parse_call
from gateway.server.errors import ApiError

DEFAULTS = GatewaySection()
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USAGE_ALWAYS = {"include_usage": True, "continuous_usage_stats": True}


def parse(raw: bytes, chat: bool = False, **settings):
    return parse_call(raw, CHAT if chat else COMPLETIONS, chat, GatewaySection(**settings) if settings else DEFAULTS)


def sent(raw: bytes, chat: bool = False, **settings) -> dict:
    return json.loads(parse(raw, chat, **settings).body_for(None))


def test_usage_on_every_chunk_asked_without_reencoding_the_client_body() -> None:
    raw = b'  {"model": "m", "prompt": "x \\u00e9", "stream": true}\n'
    call = parse(raw)
    upstream = call.body_for(None)
    assert upstream.startswith(b'{"model": "m", "prompt": "x \\u00e9"')  # the client's bytes, as sent
    assert json.loads(upstream) == {**json.loads(raw), "stream_options": USAGE_ALWAYS}
    assert (call.client_wants_usage, call.client_wants_continuous_usage) == (False, False)
    renamed = json.loads(parse(raw).body_for("real"))
    assert renamed["model"] == "real" and renamed["stream_options"] == USAGE_ALWAYS


def test_what_the_client_asked_of_usage_is_kept_apart_from_what_goes_upstream() -> None:
    both = b'{"model": "m", "prompt": "x", "stream": true,'
    both += b' "stream_options": {"include_usage": true, "continuous_usage_stats": true}}'
    call = parse(both)
    assert call.body_for(None) == both  # already what the gateway asks for: the client's bytes
    assert (call.client_wants_usage, call.client_wants_continuous_usage) == (True, True)

    final_only = b'{"model": "m", "prompt": "x", "stream": true, "stream_options": {"include_usage": true, "x": 1}}'
    call = parse(final_only)
    assert (call.client_wants_usage, call.client_wants_continuous_usage) == (True, False)
    assert json.loads(call.body_for(None))["stream_options"] == {**USAGE_ALWAYS, "x": 1}

    # as vLLM has it, per-chunk usage comes only with include_usage
    alone = b'{"model": "m", "prompt": "x", "stream": true, "stream_options": {"continuous_usage_stats": true}}'
    call = parse(alone)
    assert (call.client_wants_usage, call.client_wants_continuous_usage) == (False, False)
    assert json.loads(call.body_for(None))["stream_options"] == USAGE_ALWAYS

    null = b'{"model": "m", "prompt": "x", "stream": true, "stream_options": null}'
    assert sent(null)["stream_options"] == USAGE_ALWAYS  # re-encoded: no second "stream_options" key


@pytest.mark.parametrize(
    ("raw", "kept"),
    [
        (b'{"model":"m",  "prompt":"x", "stream":true, "stream_options": {"include_usage": true}}', True),
        (b'{"model":"m",  "prompt":"x", "stream":true, "stream_options" :\n{ } , "n": 1}', True),
        (
            b'{"model":"m",  "stream_options":{"include_usage":false,"continuous_usage_stats":null}, "stream":true,'
            b' "prompt":"x"}',
            True,
        ),
        # not safely found in the bytes: encoded anew, and still right
        (b'{"model":"m",  "prompt":"x", "stream":true, "stream\\u005foptions": {"include_usage": true}}', False),
        (b'{"model":"m",  "prompt":"\\u00e9", "stream":true, "stream_options": {"include_usage": true}}', False),
        (
            b'{"model":"m",  "prompt":"x", "stream":true, "stream_options": {"include_usage": true},'
            b' "tools": [{"stream_options": {}}]}',
            False,
        ),
        (
            b'{"model":"m",  "prompt":"x", "stream":true, "stream\\u005foptions": {"include_usage": true},'
            b' "tools": [{"stream_options": {}}]}',
            False,
        ),
        (b'{"model":"m",  "prompt":"stream_options", "stream":true, "stream_options": {"include_usage": true}}', False),
        (b'{"model":"m",  "prompt":"x", "stream":true, "stream_options": {"include_usage": true, "y": "}"}}', False),
    ],
)
def test_the_clients_stream_options_replaced_in_its_bytes_when_that_is_safe(raw, kept) -> None:
    upstream = parse(raw).body_for(None)
    expected = json.loads(raw)
    expected["stream_options"] = {**expected["stream_options"], **USAGE_ALWAYS}
    assert json.loads(upstream) == expected
    assert upstream.startswith(b'{"model":"m",  ') == kept  # the client's bytes (json.dumps writes no double space)


def test_a_request_that_is_not_streamed_goes_upstream_as_a_stream_with_usage_on_every_chunk() -> None:
    """So that a client that leaves is charged what the engine made (gateway/relay/assemble.py puts the
    answer together); the client's own stream_options are replaced, since it gets no stream."""
    raw = b'{"model": "m", "prompt": "x", "stream_options": {"include_usage": true}}'
    call = parse(raw)
    assert json.loads(call.body_for(None)) == {
        "model": "m",
        "prompt": "x",
        "stream": True,
        "stream_options": USAGE_ALWAYS,
    }
    assert (call.stream, call.client_wants_usage, call.client_wants_continuous_usage) == (False, False, False)
    plain = b'{"model": "m", "prompt": "x"}'
    assert parse(plain).body_for(None).startswith(plain[:-1])  # appended to the client's bytes, not re-encoded
    false = b'{"model": "m", "prompt": "x", "stream": false}'
    assert json.loads(parse(false).body_for(None))["stream"] is True


def test_prompt_logprobs_not_streamed_upstream_since_vllm_refuses_them_in_a_stream() -> None:
    raw = b'{"model": "m", "prompt": "x", "prompt_logprobs": 2, "stream_options": {"include_usage": true}}'
    call = parse(raw)
    assert not call.assembled
    assert json.loads(call.body_for(None)) == {"model": "m", "prompt": "x", "prompt_logprobs": 2}
    assert parse(b'{"model": "m", "prompt": "x", "prompt_logprobs": 0}').assembled
    assert not parse(b'{"model": "m", "prompt": "x", "echo": true, "logprobs": 2}').assembled  # vLLM's prompt logprobs
    assert parse(b'{"model": "m", "prompt": "x", "echo": true}').assembled


def test_limits_and_stream_flags_read_from_the_body() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 7, "stream": true}'
    call = parse(raw, chat=True)
    assert (call.model, call.stream, call.max_tokens, call.client_wants_usage) == ("m", True, 7, False)
    assert call.body_for(None).startswith(raw[:-1])  # the client's bytes, the usage options appended


@pytest.mark.parametrize(
    ("fields", "chat", "budget"),
    [
        ({}, True, 4096),  # [gateway].default_max_tokens
        ({"max_tokens": 100}, True, 100),
        ({"max_tokens": 100, "n": 3}, True, 300),
        ({"max_completion_tokens": 50, "max_tokens": 100}, True, 50),  # chat reads max_completion_tokens first
        ({"max_completion_tokens": 50, "max_tokens": 100}, False, 100),  # the completions API has only max_tokens
        ({"max_completion_tokens": 50}, False, 4096),
        ({"n": 2}, True, 8192),
        ({"n": 2, "best_of": 5, "max_tokens": 10}, False, 50),  # best_of sequences are generated
        ({"n": None, "max_tokens": None}, True, 4096),
        ({"prompt": ["a", "b", "c"], "max_tokens": 10}, False, 30),  # every prompt of a list
        ({"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 10}, False, 60),
        ({"prompt": [[1, 2], [3]], "max_tokens": 10}, False, 20),
        ({"prompt": [1, 2, 3], "max_tokens": 10}, False, 10),  # one prompt of token ids
    ],
)
def test_budget_is_max_tokens_or_the_default_times_the_choices(fields, chat, budget) -> None:
    body = {"model": "m", **({"messages": [{"role": "user"}]} if chat else {"prompt": "x"}), **fields}
    assert parse(json.dumps(body).encode(), chat).budget_tokens == budget
    uses_default = budget % 4096 == 0
    scaled = budget // 4096 * 10 if uses_default else budget
    assert parse(json.dumps(body).encode(), chat, default_max_tokens=10).budget_tokens == scaled


def test_max_tokens_limit_refuses_more_and_is_sent_when_the_request_names_none() -> None:
    over = b'{"model": "m", "prompt": "x", "max_tokens": 1001}'
    with pytest.raises(ApiError) as info:
        parse(over, max_tokens_limit=1000)
    err = info.value
    assert (err.status, err.param, err.code) == (400, "max_tokens", "max_tokens_above_limit")
    assert "1000" in err.message and "[gateway].max_tokens_limit" in err.message
    chat_over = b'{"model": "m", "messages": [{"role": "user"}], "max_completion_tokens": 1001, "max_tokens": 5}'
    with pytest.raises(ApiError) as info:
        parse(chat_over, chat=True, max_tokens_limit=1000)
    assert info.value.param == "max_completion_tokens"

    at = b'{"model": "m", "prompt": "x", "max_tokens": 1000, "stream": true}'
    assert parse(at, max_tokens_limit=1000).body_for(None).startswith(at[:-1])

    # no max_tokens: the engine would allow the whole context, so the gateway names one
    none = b'{"model": "m", "prompt": "x", "stream": true}'
    call = parse(none, max_tokens_limit=1000)
    assert call.body_for(None).startswith(none[:-1])  # appended to the client's bytes
    assert json.loads(call.body_for(None))["max_tokens"] == 1000 and call.budget_tokens == 1000
    call = parse(none, max_tokens_limit=1000, default_max_tokens=300)
    assert json.loads(call.body_for(None))["max_tokens"] == 300 and call.budget_tokens == 300
    null = b'{"model": "m", "prompt": "x", "max_tokens": null}'
    assert sent(null, max_tokens_limit=1000) == {
        "model": "m", "prompt": "x", "max_tokens": 1000, "stream": True, "stream_options": USAGE_ALWAYS
    }  # fmt: skip
    chat_alt = b'{"model": "m", "messages": [{"role": "user"}], "max_completion_tokens": 20}'
    assert "max_tokens" not in sent(chat_alt, chat=True, max_tokens_limit=1000)
    # without a limit the request goes as asked
    assert "max_tokens" not in sent(none)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"priority": -100, "model": "m", "prompt": "x"}',
        b'{"model": "m", "priority": -100, "prompt": "x"}',
        b'{"model": "m", "prompt": "x", "priority": -100}',
        b'{"model": "m", "priority": 5, "prompt": "x", "priority": -100}',
        b'{"model": "m", "prompt": "x", "pr\\u0069ority": -100}',
        b'{"model": "m", "prompt": "x", "stream": true, "priority": -100}',
        b'{"model": "m", "prompt": "x", "stream": true, "stream_options": {"include_usage": true,'
        b' "continuous_usage_stats": true}, "priority": -100}',
    ],
)
def test_dropped_fields_never_reach_the_backend(raw) -> None:
    call = parse(raw)
    upstream = call.body_for(None)
    assert b"priority" not in upstream and b"\\u0069" not in upstream
    assert "priority" not in json.loads(call.body_for("other"))
    assert json.loads(upstream)["prompt"] == "x"


def test_drop_body_fields_is_configurable() -> None:
    raw = b'{"model": "m", "prompt": "x", "priority": 1, "kv_transfer_params": {"a": 1}, "seed": 3}'
    upstream = {"stream": True, "stream_options": USAGE_ALWAYS}  # not streamed: asked as a stream (assemble.py)
    kept = {"model": "m", "prompt": "x", "priority": 1, "seed": 3, **upstream}
    assert sent(raw, drop_body_fields=["kv_transfer_params"]) == kept
    assert sent(raw, drop_body_fields=[]) == {**json.loads(raw), **upstream}
    assert parse(raw, drop_body_fields=[]).body_for(None).startswith(raw[:-1])


def test_duplicate_keys_read_as_the_engine_reads_them_the_last_one() -> None:
    call = parse(b'{"model": "m", "prompt": "x", "max_tokens": 5, "max_tokens": 900}')
    assert call.max_tokens == 900 and call.budget_tokens == 900
    with pytest.raises(ApiError) as info:
        parse(b'{"model": "m", "prompt": "x", "max_tokens": 5, "max_tokens": 900}', max_tokens_limit=100)
    assert info.value.param == "max_tokens"


def test_emoji_as_surrogate_pairs_and_non_ascii_text_pass() -> None:
    raw = '{"model": "m", "prompt": "\\ud83d\\ude00 \\uD83D\\uDE00 x \\\\ud800 é 😀 한국어 \\ud55c"}'.encode()
    assert parse(raw).body_for(None).startswith(raw[:-1])


def test_large_strings_and_many_containers_within_the_limits_pass() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "[{" * 50}]} for _ in range(500)]
    body = {"model": "m", "messages": messages, "tools": [{"a": [[[{"b": [1]}]]]}] * 100}
    assert parse(json.dumps(body).encode(), chat=True).body["messages"] == messages
    big = {"model": "m", "prompt": "x" * 3_000_000}
    assert len(parse(json.dumps(big).encode()).body["prompt"]) == 3_000_000


def test_fields_the_gateway_reads_cannot_be_dropped() -> None:
    with pytest.raises(ValueError, match="reads max_tokens, stream itself"):
        GatewaySection(drop_body_fields=["priority", "stream", "max_tokens"])


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ["a"] * 129}, "prompt"),
        ({"prompt": ["a"] * 65, "n": 2}, "prompt"),
        ({"prompt": [[1]] * 43, "best_of": 3}, "prompt"),
        ({"prompt": "a", "n": 128, "best_of": 128}, None),  # 128 x 1: at the bound
    ],
)
def test_choices_times_prompts_bounded_by_max_choices(fields, param) -> None:
    body = json.dumps({"model": "m", **fields}).encode()
    if param is None:
        assert parse(body).budget_tokens == 128 * 4096
        return
    with pytest.raises(ApiError) as info:
        parse(body)
    err = info.value
    assert (err.status, err.param, err.code) == (400, param, "too_many_choices")
    assert "[gateway].max_choices" in err.message and "128" in err.message
    assert parse(body, max_choices=1000).budget_tokens > 0  # a gateway may allow more


def test_prompt_estimates_per_prompt() -> None:
    call = parse(json.dumps({"model": "m", "prompt": ["abcdefgh", "abcd", "abcde"], "n": 2}).encode())
    assert call.prompt_estimates == [2, 1, 2] and call.choices_per_prompt == 2
    assert parse(b'{"model": "m", "prompt": [[1, 2, 3, 4, 5], [6]]}').prompt_estimates == [5, 1]
    assert parse(b'{"model": "m", "prompt": [7, 8, 9]}').prompt_estimates == [3]
