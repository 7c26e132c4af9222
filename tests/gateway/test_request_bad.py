"""gateway/endpoints/request.py and gateway/server/strict_json.py: each bad body is a 400 that names the field
and the fix."""

from __future__ import annotations

import pytest

from common.config.gateway import GatewaySection
from gateway.endpoints.request import parse_call
from gateway.server.errors import ApiError
from gateway.server.strict_json import MAX_DEPTH

MSG = b'"messages": [{"role": "user", "content": "x"}]'
PAD = b', "pad": [' + b", ".join([b"{}"] * MAX_DEPTH) + b"]"


def nested(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * depth + close * depth


def object_chain(depth: int) -> bytes:
    return b'{"a": ' * depth + b"1" + b"}" * depth


CASES = [
    # (raw, chat, param, words in the message)
    (b"{not json", True, None, "not valid JSON"),
    (b"", True, None, "not valid JSON"),
    (b"[1, 2]", True, None, "JSON object"),
    (b'"text"', True, None, "JSON object"),
    (b"\xef\xbb\xbf{" + MSG + b', "model": "m"}', True, None, "not valid JSON"),  # a byte-order mark
    (b'{"model": "m", "prompt": "\xff"}', False, None, "not valid UTF-8"),
    (b'{"model": "m", "prompt": "\xed\xa0\x80"}', False, None, "not valid UTF-8"),  # an encoded surrogate
    # nesting
    (b"[" * 200_000, True, None, f"more than {MAX_DEPTH} levels"),
    (b"{" + b'"a":{' * 200_000, True, None, f"more than {MAX_DEPTH} levels"),
    (b'{"model": "m", "prompt": "x", "tools": ' + nested(MAX_DEPTH) + b"}", False, "tools", "levels deep"),
    (b'{"model": "m", "prompt": "x", "x": ' + object_chain(MAX_DEPTH) + b"}", False, "x", "levels deep"),
    (b'{"model": "m", "prompt": ' + nested(MAX_DEPTH + 5) + b"}", False, "prompt", "levels deep"),
    (b'{"model": "m", "prompt": "' + b"x" * 300_000 + b'", "t": ' + nested(MAX_DEPTH) + b"}", False, None, "deep"),
    (b'{"model": "' + b"m" * 257 + b'", "prompt": "x"}', False, "model", "longer than 256"),
    # numbers
    (b'{"model": "m", "prompt": "x", "temperature": NaN}', False, "temperature", "not a JSON number"),
    (b'{"model": "m", "prompt": "x", "top_p": Infinity}', False, "top_p", "not a JSON number"),
    (b'{"model": "m", "prompt": "x", "top_p": -Infinity}', False, "top_p", "not a JSON number"),
    (b'{"model": "m", "prompt": "x", "temperature": 1e400}', False, "temperature", "too large"),
    (b'{"model": "m", "prompt": "x", "logit_bias": {"5": -1.5e309}}', False, "5", "too large"),
    (b'{"model": "m", "prompt": "x", "stop": [1e999]}', False, None, "too large"),
    (b'{"model": "m", "prompt": "x", "max_tokens": 1e400}', False, "max_tokens", "too large"),
    (b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", False, "max_tokens", "4300 digits"),
    (b'{"model": "m", "prompt": [' + b"1" * 4400 + b"]}", False, None, "4300 digits"),
    (b'{"model": "m", "prompt": "x", "max_tokens": 1' + b"0" * 400 + b"}", False, "max_tokens", "at most 2147483647"),
    (b'{"model": "m", "prompt": "x", "max_tokens": 2147483648}', False, "max_tokens", "at most 2147483647"),
    (b'{"model": "m", "prompt": "x", "max_tokens": 10.0}', False, "max_tokens", "positive integer"),
    (b'{"model": "m", "prompt": "x", "max_tokens": 0}', False, "max_tokens", "positive integer"),
    (b'{"model": "m", "prompt": "x", "max_tokens": -1}', False, "max_tokens", "positive integer"),
    (b'{"model": "m", "prompt": "x", "max_tokens": true}', False, "max_tokens", "positive integer"),
    (b'{"model": "m", "prompt": "x", "max_tokens": "100"}', False, "max_tokens", "positive integer"),
    (b'{"model": "m", ' + MSG + b', "max_completion_tokens": [5]}', True, "max_completion_tokens", "positive"),
    (b'{"model": "m", "prompt": "x", "max_completion_tokens": 1.5}', False, "max_completion_tokens", "positive"),
    (b'{"model": "m", "prompt": "x", "n": 0}', False, "n", "positive integer"),
    (b'{"model": "m", "prompt": "x", "n": 129}', False, "n", "at most 128"),
    (b'{"model": "m", "prompt": "x", "n": 2.0}', False, "n", "positive integer"),
    (b'{"model": "m", "prompt": "x", "n": "2"}', False, "n", "positive integer"),
    (b'{"model": "m", "prompt": "x", "best_of": 1000}', False, "best_of", "at most 128"),
    (b'{"model": "m", "prompt": "x", "seed": 9223372036854775808}', False, "seed", "64 bits"),
    (b'{"model": "m", "prompt": "x", "top_k": -9223372036854775809}', False, "top_k", "64 bits"),
    # strings
    (b'{"model": "m", "prompt": "\\ud800"}', False, "prompt", "lone surrogate"),
    (b'{"model": "m", "prompt": "\\udc00 x"}', False, "prompt", "lone surrogate"),
    (b'{"model": "m", "prompt": "\\\\\\ud800"}', False, "prompt", "lone surrogate"),
    (b'{"model": "m", "prompt": "x", "\\ud800": 1}', False, None, "lone surrogate"),
    (b'{"model": "m\\udfff", "prompt": "x"}', False, "model", "lone surrogate"),
    # the fields the gateway reads, with the wrong type
    (b'{"messages": [{"role": "user", "content": "hi"}]}', True, "model", "'model' is required"),
    (b'{"model": "", ' + MSG + b"}", True, "model", "'model' is required"),
    (b'{"model": 5, ' + MSG + b"}", True, "model", "'model' is required"),
    (b'{"model": ["m"], ' + MSG + b"}", True, "model", "'model' is required"),
    (b'{"model": null, ' + MSG + b"}", True, "model", "'model' is required"),
    (b'{"model": "m", ' + MSG + b', "stream": "yes"}', True, "stream", "true or false"),
    (b'{"model": "m", ' + MSG + b', "stream": 1}', True, "stream", "true or false"),
    (b'{"model": "m", ' + MSG + b', "stream": {}}', True, "stream", "true or false"),
    (b'{"model": "m", ' + MSG + b', "stream_options": 1}', True, "stream_options", "an object"),
    (b'{"model": "m", ' + MSG + b', "stream_options": []}', True, "stream_options", "an object"),
    (
        b'{"model": "m", ' + MSG + b', "stream": true, "stream_options": {"include_usage": "yes"}}',
        True,
        "stream_options.include_usage",
        "true or false",
    ),
    (
        b'{"model": "m", ' + MSG + b', "stream": true, "stream_options": {"continuous_usage_stats": 1}}',
        True,
        "stream_options.continuous_usage_stats",
        "true or false",
    ),
    (b'{"model": "m"}', True, "messages", "'messages' is required"),
    (b'{"model": "m", "messages": []}', True, "messages", "non-empty list"),
    (b'{"model": "m", "messages": {"role": "user"}}', True, "messages", "non-empty list"),
    (b'{"model": "m", "messages": "hi"}', True, "messages", "non-empty list"),
    (b'{"model": "m", "messages": ["hi"]}', True, "messages", "string 'role'"),
    (b'{"model": "m", "messages": [{"content": "hi"}]}', True, "messages", "string 'role'"),
    (b'{"model": "m", "messages": [{"role": 1}]}', True, "messages", "string 'role'"),
    (b'{"model": "m", "messages": [{"role": "user"}, null]}', True, "messages", "string 'role'"),
    (b'{"model": "m"}', False, "prompt", "'prompt' is required"),
    (b'{"model": "m", "prompt": []}', False, "prompt", "non-empty list"),
    (b'{"model": "m", "prompt": 5}', False, "prompt", "'prompt' is required"),
    (b'{"model": "m", "prompt": {"text": "x"}}', False, "prompt", "'prompt' is required"),
    (b'{"model": "m", "prompt": ["x", 1]}', False, "prompt", "token ids"),
    (b'{"model": "m", "prompt": [1, "x"]}', False, "prompt", "token ids"),
    (b'{"model": "m", "prompt": [1, -1]}', False, "prompt", "token ids"),
    (b'{"model": "m", "prompt": [1, 2147483648]}', False, "prompt", "token ids"),
    (b'{"model": "m", "prompt": [1, true]}', False, "prompt", "token ids"),
    (b'{"model": "m", "prompt": [1.5]}', False, "prompt", "token ids"),
    (b'{"model": "m", "prompt": [[1, 2], []]}', False, "prompt", "token ids"),
    (b'{"model": "m", "prompt": [[1, 2], [3, "x"]]}', False, "prompt", "token ids"),
    (b'{"model": "m", "prompt": [null]}', False, "prompt", "token ids"),
]


@pytest.mark.parametrize(("raw", "chat", "param", "words"), CASES)
def test_bad_bodies_are_a_400_naming_the_field_and_the_fix(raw, chat, param, words) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    with pytest.raises(ApiError) as info:
        parse_call(raw, path, chat, GatewaySection())
    err = info.value
    assert (err.status, err.param, err.type) == (400, param, "invalid_request_error")
    assert words in err.message, err.message
    assert len(err.message) < 300  # a client's huge value is not echoed back


@pytest.mark.parametrize(
    "raw",
    [
        # the body's object is level 1; PAD has brackets enough that the depth is measured
        b'{"model": "m", "prompt": "x", "tools": ' + nested(MAX_DEPTH - 1) + PAD + b"}",
        b'{"model": "m", "prompt": "x", "x": ' + object_chain(MAX_DEPTH - 1) + PAD + b"}",
        b'{"model": "m", "prompt": "' + b"[" * 1000 + b'"}',  # brackets in a string are text
        b'{"model": "m", "prompt": [[1], [2, 3]], "seed": 9223372036854775807, "temperature": 1e308}',
        b'{"model": "m", "prompt": "x", "max_tokens": 2147483647, "n": 128, "stream": false}',
        b'{"model": "m", "prompt": ["a", "b"], "top_k": -9223372036854775808, "logit_bias": {"1": -100}}',
        b'{"model": "m", "prompt": "x", "stream_options": null, "max_tokens": null, "n": null}',
    ],
)
def test_bodies_at_the_limits_pass(raw) -> None:
    assert parse_call(raw, "/v1/completions", False, GatewaySection()).model == "m"


def test_a_model_name_at_the_limit_passes() -> None:
    name = "m" * 256
    assert parse_call(b'{"model": "%s", "prompt": "x"}' % name.encode(), "/v1/completions", False,
                      GatewaySection()).model == name  # fmt: skip
