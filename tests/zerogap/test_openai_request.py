"""common/openai_request.py: the request rules the gateway and the simulated engine share.
Each bound is tested at the last value that passes and the first that does not."""

from __future__ import annotations

from typing import Any

import pytest

from common.openai_request import (
    MAX_CHOICES,
    MAX_MODEL_CHARS,
    MAX_TOKENS_BOUND,
    Fields,
    InvalidRequest,
    check_fields,
    shown,
)

MSG = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSG, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hi", **fields}


BAD = [
    # (body, chat, param, the message)
    ({"messages": MSG}, True, "model", "'model' is required: the name of a model from GET /v1/models."),
    (chat(model=""), True, "model", "'model' is required: the name of a model from GET /v1/models (got '')."),
    (chat(model=5), True, "model", "'model' is required: the name of a model from GET /v1/models (got 5)."),
    (chat(model=["m"]), True, "model", "'model' is required: the name of a model from GET /v1/models (got a list)."),
    (chat(model="m" * (MAX_MODEL_CHARS + 1)), True, "model", "'model' is longer than 256 characters"),
    (chat(stream="yes"), True, "stream", "'stream' must be true or false (got a string)."),
    (chat(stream=1), True, "stream", "'stream' must be true or false (got 1)."),
    (chat(stream_options=[]), True, "stream_options", "'stream_options' must be an object"),
    (chat(stream=True, stream_options={"include_usage": 1}), True, "stream_options.include_usage", "true or false"),
    (
        chat(stream=True, stream_options={"continuous_usage_stats": "y"}),
        True,
        "stream_options.continuous_usage_stats",
        "true or false",
    ),
    ({"model": "m"}, True, "messages", "'messages' is required: a non-empty list"),
    (chat(messages=[]), True, "messages", "'messages' is required: a non-empty list"),
    (chat(messages={"role": "user"}), True, "messages", "'messages' is required: a non-empty list"),
    (chat(messages=["hi"]), True, "messages", "'messages[0]' must be an object with a string 'role'"),
    (chat(messages=[*MSG, {"role": 1}]), True, "messages", "'messages[1]' must be an object with a string 'role'"),
    ({"model": "m"}, False, "prompt", "'prompt' is required: a string"),
    (completion(prompt=[]), False, "prompt", "'prompt' is required"),
    (completion(prompt=["x", 1]), False, "prompt", "token ids"),
    (completion(prompt=[1, -1]), False, "prompt", "integers 0 to 2147483647"),
    (completion(prompt=[MAX_TOKENS_BOUND + 1]), False, "prompt", "integers 0 to 2147483647"),
    (completion(prompt=[1, True]), False, "prompt", "token ids"),
    (completion(prompt=[[1], []]), False, "prompt", "a list of such lists"),
    (completion(max_tokens=0), False, "max_tokens", "'max_tokens' must be a positive integer (got 0)."),
    (completion(max_tokens=True), False, "max_tokens", "'max_tokens' must be a positive integer (got true)."),
    (completion(max_tokens="9"), False, "max_tokens", "'max_tokens' must be a positive integer (got a string)."),
    (completion(max_tokens=2.0), False, "max_tokens", "'max_tokens' must be a positive integer (got 2.0)."),
    (
        completion(max_tokens=MAX_TOKENS_BOUND + 1),
        False,
        "max_tokens",
        "'max_tokens' must be at most 2147483647 (got 2147483648).",
    ),
    (chat(max_completion_tokens=0), True, "max_completion_tokens", "must be a positive integer (got 0)"),
    (completion(max_completion_tokens=[5]), False, "max_completion_tokens", "positive integer (got a list)"),
    (chat(n=0), True, "n", "'n' must be a positive integer (got 0)."),
    (chat(n=MAX_CHOICES + 1), True, "n", "'n' must be at most 128 (got 129)."),
    (completion(n={}), False, "n", "'n' must be a positive integer (got an object)."),
]


@pytest.mark.parametrize(("body", "is_chat", "param", "message"), BAD)
def test_each_broken_rule_is_named_with_what_to_send(body, is_chat, param, message) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_fields(body, is_chat)
    assert info.value.param == param
    assert message in info.value.message, info.value.message


@pytest.mark.parametrize(
    ("body", "is_chat"),
    [
        (chat(model="m" * MAX_MODEL_CHARS), True),
        (completion(prompt=[0, MAX_TOKENS_BOUND]), False),
        (completion(prompt=[[1, 2], [3]]), False),
        (completion(prompt=["a", "b"]), False),
        (completion(max_tokens=1), False),
        (completion(max_tokens=MAX_TOKENS_BOUND), False),
        (chat(n=MAX_CHOICES), True),
        (chat(n=1, stream=False, stream_options=None, max_tokens=None), True),
        (chat(messages=[{"role": "user"}]), True),  # content is the engine's business
    ],
)
def test_bodies_at_the_bounds_pass(body, is_chat) -> None:
    check_fields(body, is_chat)


def test_the_fields_as_the_engine_reads_them() -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = chat(stream=True, stream_options=options, max_tokens=100, max_completion_tokens=7, n=3)
    assert check_fields(body, True) == Fields("m", True, True, True, 7, 3)  # chat: max_completion_tokens first
    assert check_fields(chat(max_tokens=100), True).max_tokens == 100
    body = completion(max_tokens=100, max_completion_tokens=7)
    assert check_fields(body, False).max_tokens == 100  # the completions API has only max_tokens
    assert check_fields(completion(max_completion_tokens=7), False).max_tokens is None
    # stream_options as the client asked: what to do without stream or include_usage is each side's
    unstreamed = completion(stream_options={"continuous_usage_stats": True})
    assert check_fields(unstreamed, False) == Fields("m", False, False, True, None, None)


def test_model_may_be_left_out_where_it_is_not_required() -> None:
    assert check_fields({"prompt": "x"}, False, model_required=False).model is None
    assert check_fields({"prompt": "x", "model": None}, False, model_required=False).model is None
    with pytest.raises(InvalidRequest, match="got 5"):
        check_fields({"prompt": "x", "model": 5}, False, model_required=False)
    with pytest.raises(InvalidRequest, match="longer than 256"):
        check_fields({"prompt": "x", "model": "m" * 257}, False, model_required=False)


def test_a_clients_value_is_shown_short() -> None:
    assert shown(10**40) == "100000000000... (41 characters)"
    assert shown(10**23) == str(10**23)  # 24 characters: as written
    assert (shown(None), shown(False), shown(1.5), shown("x" * 10_000)) == ("null", "false", "1.5", "a string")
