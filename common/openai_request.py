"""The rules of an OpenAI completion request that the gateway and the simulated engine both read.

gateway/endpoints/request.py (the gateway's check before it routes and charges a request) and
backends/sim/server/protocol.py (the simulated engine's parse) call `check_fields` on the decoded body:
one copy of the rules, and one message for each mistake, however the request arrives. Each side
then checks only what is its own (the gateway: its limits and the body it sends upstream; the sim:
its tokens and context length) and turns InvalidRequest into its own 400 (the gateway's ApiError,
the sim's vLLM-shaped RequestError) with the same message and `param`.

The fields, as vLLM reads them:
- model: a non-empty string of at most MAX_MODEL_CHARS (it is echoed in a 404); the gateway
  requires it (it routes by it), an engine serves its one model when it is absent;
- stream: true or false; stream_options: an object whose include_usage and
  continuous_usage_stats are true or false (as the client asked: per-chunk usage is sent only
  with include_usage, and stream_options only with stream, which each side handles its way);
- messages (chat): a non-empty list of objects with a string role;
- prompt (completions): a string, a non-empty list of strings, a non-empty list of token ids,
  or a non-empty list of such lists;
- max_tokens and max_completion_tokens: positive integers up to MAX_TOKENS_BOUND; the chat API
  reads max_completion_tokens, then max_tokens, and the completions API only max_tokens;
- n: a positive integer up to MAX_CHOICES.
Absent and null mean the same. Messages quote fields as OpenAI does ('max_tokens') and say
what to send instead; a client's value is shown short (`shown`), never echoed at length.
"""

from __future__ import annotations

from typing import Any, NamedTuple

MAX_MODEL_CHARS = 256  # a model's name; a longer one can be in no allow-list
MAX_TOKENS_BOUND = 2**31 - 1  # the most completion tokens anyone may ask for, and the largest token id
MAX_CHOICES = 128  # n (and the gateway's best_of): completions generated per request


class InvalidRequest(ValueError):
    """A body that breaks a rule: a 400 with `message` (what to fix) naming the field `param`."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class Fields(NamedTuple):
    """What a valid body asks, as the engine will read it."""

    model: str | None  # None: absent (allowed only when not required)
    stream: bool
    include_usage: bool  # stream_options.include_usage as asked (whether or not streamed)
    continuous_usage_stats: bool  # stream_options.continuous_usage_stats as asked
    max_tokens: int | None  # completion tokens per choice, from the field the API reads; None: not said
    n: int | None  # None: not said (one choice)


def check_fields(body: dict[str, Any], chat: bool, model_required: bool = True) -> Fields:
    """The shared fields of a /v1/chat/completions (chat) or /v1/completions body, or InvalidRequest."""
    model = model_of(body, model_required)
    stream = flag(body.get("stream"), "stream")
    include_usage, continuous = _stream_options(body.get("stream_options"))
    if chat:
        check_messages(body.get("messages"))
        max_completion_tokens = positive_int(body, "max_completion_tokens", MAX_TOKENS_BOUND)
        max_tokens = positive_int(body, "max_tokens", MAX_TOKENS_BOUND)
        asked = max_completion_tokens or max_tokens
    else:
        _check_prompt(body.get("prompt"))
        positive_int(body, "max_completion_tokens", MAX_TOKENS_BOUND)  # not read here, but not wrong either
        asked = positive_int(body, "max_tokens", MAX_TOKENS_BOUND)
    n = positive_int(body, "n", MAX_CHOICES)
    return Fields(model, stream, include_usage, continuous, asked, n)


def model_of(body: dict[str, Any], required: bool = True) -> str | None:
    """The body's `model` (None when absent and not required)."""
    model = body.get("model")
    if model is None and not required:
        return None
    if type(model) is not str or not model:
        got = "" if model is None else f" (got {shown(model)})"
        raise InvalidRequest(f"'model' is required: the name of a model from GET /v1/models{got}.", "model")
    if len(model) > MAX_MODEL_CHARS:
        raise InvalidRequest(f"'model' is longer than {MAX_MODEL_CHARS} characters: see GET /v1/models.", "model")
    return model


def flag(value: Any, name: str) -> bool:
    """A true/false field (None: false)."""
    if value is None:
        return False
    if type(value) is not bool:
        raise InvalidRequest(f"'{name}' must be true or false (got {shown(value)}).", name)
    return value


def positive_int(body: dict[str, Any], name: str, most: int) -> int | None:
    """A positive integer field at most `most` (None when absent or null)."""
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise InvalidRequest(f"'{name}' must be a positive integer (got {shown(value)}).", name)
    if value > most:
        raise InvalidRequest(f"'{name}' must be at most {most} (got {shown(value)}).", name)
    return value


def shown(value: Any) -> str:
    """A client's value, short, for a message: numbers as written (at most 24 characters), an empty
    string as '', anything else by its JSON type."""
    kind = type(value)
    if kind in (int, float, bool):
        text = "true" if value is True else "false" if value is False else repr(value)
        return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} characters)"
    if kind is str:
        return "''" if not value else "a string"
    if kind is list:
        return "a list"
    return "an object" if kind is dict else "null"


def _stream_options(options: Any) -> tuple[bool, bool]:
    if options is None:
        return False, False
    if type(options) is not dict:
        message = f"'stream_options' must be an object, such as {{\"include_usage\": true}} (got {shown(options)})."
        raise InvalidRequest(message, "stream_options")
    usage = flag(options.get("include_usage"), "stream_options.include_usage")
    return usage, flag(options.get("continuous_usage_stats"), "stream_options.continuous_usage_stats")


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """The chat body's messages: a non-empty list of objects, each with a string role."""
    if type(messages) is not list or not messages:
        raise InvalidRequest(
            '\'messages\' is required: a non-empty list of {"role", "content"} objects.', "messages"
        )  # fmt: skip
    for i, message in enumerate(messages):
        if type(message) is not dict or type(message.get("role")) is not str:
            raise InvalidRequest(
                f"'messages[{i}]' must be an object with a string 'role', such as "
                '{"role": "user", "content": "Hello"}.',
                "messages",
            )
    return messages


def _is_tokens(items: list[Any]) -> bool:
    if not items or not all(type(t) is int for t in items):
        return False
    return min(items) >= 0 and max(items) <= MAX_TOKENS_BOUND


def _check_prompt(prompt: Any) -> None:
    """A string, a list of strings, a list of token ids or a list of lists of token ids (OpenAI's forms)."""
    if type(prompt) is str:
        return
    if type(prompt) is list and prompt:
        first = type(prompt[0])
        if first is str and all(type(p) is str for p in prompt):
            return
        if first is int and _is_tokens(prompt):
            return
        if first is list and all(type(p) is list and _is_tokens(p) for p in prompt):
            return
    raise InvalidRequest(
        "'prompt' is required: a string, a non-empty list of strings, or a non-empty list of token ids "
        f"(integers 0 to {MAX_TOKENS_BOUND}), or a list of such lists.",
        "prompt",
    )
