"""Which streams a break may be continued on another backend (gateway/relay/continuation.py
`continuable`): one choice of one string prompt, nothing whose answer depends on its start."""

from __future__ import annotations

import json
from typing import Any

import pytest

from common.config.gateway import GatewaySection
from gateway.endpoints.request import parse_call
from gateway.relay.continuation import continuable

CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "stream": True, "prompt": "once upon"}


def is_continuable(body: dict[str, Any]) -> bool:
    chat = "messages" in body
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return continuable(parse_call(json.dumps(body).encode(), path, chat, GatewaySection()))


@pytest.mark.parametrize("body", [CHAT, COMPLETION, {**COMPLETION, "prompt": ["once upon"]}, {**CHAT, "echo": False},
                                  {**CHAT, "response_format": None}, {**CHAT, "n": 1}])  # fmt: skip
def test_one_choice_of_one_prompt_is_continued(body: dict[str, Any]) -> None:
    assert is_continuable(body)


@pytest.mark.parametrize(
    "extra",
    [{"echo": True}, {"response_format": {"type": "json_object"}}, {"guided_json": {"type": "object"}},
     {"guided_regex": "a+"}, {"guided_choice": ["a", "b"]}, {"guided_grammar": "root ::= 'a'"},
     {"structured_outputs": {"choice": ["a"]}}, {"prompt_logprobs": 1}, {"n": 2}, {"stream": False}],
)  # fmt: skip
def test_an_answer_that_depends_on_its_start_or_several_choices_is_not(extra: dict[str, Any]) -> None:
    assert not is_continuable({**COMPLETION, **extra})


def test_several_prompts_or_token_ids_are_not() -> None:
    assert not is_continuable({**COMPLETION, "prompt": ["a", "b"]})
    assert not is_continuable({**COMPLETION, "prompt": [1, 2, 3]})
