"""backends/sim/server/protocol.py: the simulated engine's own rules on top of common/openai_request.py
(the shared rules' messages are tested there, and through both servers in
tests/gateway/test_request_same_as_sim.py). Bounds are tested at the last value that passes and the first
that does not."""

from __future__ import annotations

from typing import Any

import pytest

from backends.sim.engine import words
from backends.sim.server.protocol import RequestError, check_model, parse_generation
from backends.sim.settings import SimSettings

SETTINGS = SimSettings(model="sim-m", max_model_len=100)
MSG = [{"role": "user", "content": "one two three"}]


def parse(body: dict[str, Any], chat: bool = True):
    return parse_generation(body, SETTINGS, chat)


def refused(body: Any, chat: bool = True) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_generation(body, SETTINGS, chat)
    return info.value


def test_a_shared_rule_is_this_engines_400_with_the_shared_message() -> None:
    err = refused({"messages": MSG, "max_tokens": 0})
    assert (err.status, err.param, err.error_type) == (400, "max_tokens", "BadRequestError")
    assert err.message == "'max_tokens' must be a positive integer (got 0)."
    err = refused({"messages": MSG, "ignore_eos": "yes"})
    assert (err.param, err.message) == ("ignore_eos", "'ignore_eos' must be true or false (got a string).")


def test_model_absent_or_served_passes_another_is_404_and_a_wrong_one_400() -> None:
    assert parse({"messages": MSG}).prompt_token_ids == words.tokenize("one two three")
    assert parse({"messages": MSG, "model": "sim-m"}).chat
    err = refused({"messages": MSG, "model": "other"})
    assert (err.status, err.param) == (404, "model") and "sim-m" in err.message
    err = refused({"messages": MSG, "model": "x" * 300})  # not echoed in a 404
    assert (err.status, err.param) == (400, "model") and "longer than 256" in err.message
    with pytest.raises(RequestError) as info:
        check_model({"model": 5}, SETTINGS)  # /tokenize's check: the same rule
    assert (info.value.status, info.value.param) == (400, "model")


def test_the_context_length_bounds_prompt_plus_completion() -> None:
    prompt = " ".join(["w"] * 10)
    assert parse({"prompt": prompt, "max_tokens": 90}, chat=False).max_tokens == 90  # 100 in all: fits
    err = refused({"prompt": prompt, "max_tokens": 91}, chat=False)
    assert err.param == "max_tokens" and "maximum context length is 100" in err.message
    assert parse({"prompt": prompt}, chat=False).max_tokens == 90  # not said: the rest of the context
    err = refused({"prompt": " ".join(["w"] * 100)}, chat=False)
    assert err.param == "messages" and "100 input tokens" in err.message
    assert parse({"prompt": " ".join(["w"] * 99)}, chat=False).max_tokens == 1


def test_chat_reads_max_completion_tokens_first_and_completions_only_max_tokens() -> None:
    assert parse({"messages": MSG, "max_tokens": 50, "max_completion_tokens": 5}).max_tokens == 5
    err = refused({"messages": MSG, "max_tokens": 5, "max_completion_tokens": 98})
    assert err.param == "max_completion_tokens"  # the field the length came from
    body = {"prompt": "a b", "max_tokens": 4, "max_completion_tokens": 50}
    assert parse(body, chat=False).max_tokens == 4


def test_token_ids_in_the_vocabulary() -> None:
    last = words.VOCAB_SIZE - 1
    assert parse({"prompt": [0, last]}, chat=False).prompt_token_ids == [0, last]
    assert parse({"prompt": [[5, 6]]}, chat=False).prompt_token_ids == [5, 6]
    assert parse({"prompt": ["a b"]}, chat=False).prompt_token_ids == words.tokenize("a b")
    err = refused({"prompt": [1, words.VOCAB_SIZE]}, chat=False)
    assert err.param == "prompt" and f"0 to {last}" in err.message
    err = refused({"prompt": [[1], [2, words.VOCAB_SIZE]]}, chat=False)  # in any prompt of a list
    assert err.param == "prompt" and f"0 to {last}" in err.message
    assert refused({"prompt": ""}, chat=False).message == "The prompt is empty: send at least one word."


def test_a_list_of_prompts_each_with_its_own_context_limit() -> None:
    """As vLLM: each prompt of a list is a request of its own; with no max_tokens each gets the rest of
    the context after its own prompt, and any prompt that leaves no room for max_tokens is refused."""
    gen = parse({"prompt": ["a b", "c d e f", "g"], "max_tokens": 3}, chat=False)
    assert gen.prompts == [(words.tokenize("a b"), 3), (words.tokenize("c d e f"), 3), (words.tokenize("g"), 3)]
    assert not gen.single and gen.n == 1
    gen = parse({"prompt": [[1, 2], [3, 4, 5, 6]]}, chat=False)
    assert gen.prompts == [([1, 2], 98), ([3, 4, 5, 6], 96)]  # each prompt its own rest of the 100
    err = refused({"prompt": ["a", " ".join(["w"] * 10)], "max_tokens": 91}, chat=False)
    assert err.param == "max_tokens" and "maximum context length is 100" in err.message
    assert parse({"prompt": ["a", " ".join(["w"] * 10)], "max_tokens": 90}, chat=False).max_tokens == 90
    err = refused({"prompt": ["a", ""]}, chat=False)
    assert (err.param, err.message) == ("prompt", "The prompt is empty: send at least one word.")


def test_only_text_content_is_counted() -> None:
    parts = [{"type": "text", "text": "a b"}, {"type": "text", "text": "c"}]
    messages = [{"role": "system", "content": None}, {"role": "user", "content": parts}]
    assert parse({"messages": messages}).prompt_token_ids == words.tokenize("a b c")
    image = [{"type": "image_url", "image_url": {"url": "http://x"}}]
    err = refused({"messages": [*MSG, {"role": "user", "content": image}]})
    assert err.param == "messages" and "'messages[1].content'" in err.message and "text parts" in err.message
    assert "'messages[0].content' must be a string" in refused({"messages": [{"role": "user", "content": 3}]}).message


def test_n_choices_a_numeric_temperature_and_stream_options_only_when_streamed() -> None:
    gen = parse({"messages": MSG, "n": 1, "temperature": 0})
    assert (gen.max_tokens, gen.n, gen.single) == (97, 1, True)
    gen = parse({"messages": MSG, "n": 128})  # the shared rule's bound (MAX_CHOICES)
    assert (gen.n, gen.single, len(gen.prompts)) == (128, False, 1)
    assert refused({"messages": MSG, "n": 129}).param == "n"
    assert refused({"messages": MSG, "n": 0}).param == "n"
    assert parse({"prompt": ["a", "b"], "n": 3}, chat=False).n == 3
    assert refused({"messages": MSG, "temperature": True}).param == "temperature"
    err = refused({"messages": MSG, "stream_options": {"include_usage": True}})
    assert err.param == "stream_options" and '"stream": true' in err.message
    gen = parse({"messages": MSG, "stream": True, "stream_options": {"include_usage": True}})
    assert (gen.stream, gen.include_usage, gen.continuous_usage) == (True, True, False)
    assert refused({"messages": MSG, "stop": 3}).message == "'stop' must be a string or a list of strings (got 3)."
    assert refused([MSG]).message == "The body must be a JSON object."


def test_a_chat_answer_is_continued_as_vllm_continues_one() -> None:
    """continue_final_message with add_generation_prompt false: the answer so far (the last message)
    is part of the prompt, as the gateway's stream continuation sends it; both true is vLLM's 400."""
    so_far = [*MSG, {"role": "assistant", "content": "four five"}]
    body = {"messages": so_far, "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 5}
    assert len(parse(body).prompt_token_ids) == 5
    err = refused({**body, "add_generation_prompt": True})
    assert err.param == "continue_final_message" and "Cannot set both" in err.message
    assert len(parse({"prompt": "one two three four five", "max_tokens": 5}, chat=False).prompt_token_ids) == 5
