"""Parse and validate OpenAI-style request bodies into what the engine needs.

Errors are vLLM-shaped: {"error": {"message", "type": "BadRequestError", "param", "code": 400}}.
Prompt tokens are counted as whitespace-separated words (see words.py); a chat prompt
is the words of every message's text content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.sim import words
from backends.sim.settings import SimSettings


class RequestError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status

    @property
    def error_type(self) -> str:
        return {404: "NotFoundError", 413: "RequestEntityTooLarge"}.get(self.status, "BadRequestError")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.status}}


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    chat: bool
    prompt_token_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    ignore_eos: bool
    stop_ids: frozenset[int]


def parse_generation(body: Any, settings: SimSettings, chat: bool) -> GenerationRequest:
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.")
    check_model(body, settings)
    prompt = words.tokenize(chat_text(body)) if chat else _completion_prompt(body)
    if not prompt:
        raise RequestError("The prompt is empty: send at least one word.", "messages" if chat else "prompt")
    _check_n(body)
    stream = _optional(body, "stream", bool, False)
    stream_options = body.get("stream_options")
    if stream_options is not None and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.", "stream_options")
    options = stream_options if isinstance(stream_options, dict) else {}
    if stream_options is not None and not isinstance(stream_options, dict):
        raise RequestError("`stream_options` must be an object.", "stream_options")
    max_tokens = _max_tokens(body, len(prompt), settings.max_model_len)
    return GenerationRequest(
        chat=chat,
        prompt_token_ids=prompt,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(_optional(options, "include_usage", bool, False)),
        continuous_usage=bool(_optional(options, "continuous_usage_stats", bool, False)),
        ignore_eos=_optional(body, "ignore_eos", bool, False),
        stop_ids=_stop_ids(body.get("stop")),
    )


def _optional(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RequestError(f"`{key}` must be of type {kind.__name__}; got {type(value).__name__}.", key)
    return value


def check_model(body: dict[str, Any], settings: SimSettings) -> None:
    model = body.get("model")
    if model is not None and model != settings.model:
        raise RequestError(f"The model `{model}` does not exist. This engine serves `{settings.model}`.", "model", 404)


def _check_n(body: dict[str, Any]) -> None:
    n = _optional(body, "n", int, 1)
    if n != 1:
        raise RequestError(f"`n` must be 1: the simulated engine returns one choice (got {n}).", "n")
    temperature = body.get("temperature")
    if temperature is not None and (not isinstance(temperature, int | float) or isinstance(temperature, bool)):
        raise RequestError("`temperature` must be a number.", "temperature")


def chat_text(body: dict[str, Any]) -> str:
    """The text a chat prompt's tokens are counted from: every message's text content, in order
    (no chat template: the sim's prompt is the messages' words)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list of {role, content} objects.", "messages")
    texts: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string `role`.", "messages")
        texts.append(_message_text(message.get("content"), i))
    return " ".join(texts)


def _message_text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(
                    f"messages[{i}].content: only text parts ({{'type': 'text', 'text': ...}}) are supported.",
                    "messages",
                )
            parts.append(part["text"])
        return " ".join(parts)
    raise RequestError(f"messages[{i}].content must be a string or a list of text parts.", "messages")


def _completion_prompt(body: dict[str, Any]) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return words.tokenize(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(t < 0 or t >= words.VOCAB_SIZE for t in prompt):
            raise RequestError(f"Token ids in `prompt` must be in [0, {words.VOCAB_SIZE}).", "prompt")
        return list(prompt)
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        raise RequestError("The simulated engine takes one prompt per request; send them separately.", "prompt")
    raise RequestError("`prompt` must be a string or a list of token ids.", "prompt")


def _max_tokens(body: dict[str, Any], num_prompt: int, max_model_len: int) -> int:
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if num_prompt >= max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{num_prompt} input tokens. Please reduce the length of the input messages.",
            "messages",
        )
    max_tokens = _optional(body, key, int, None)
    if max_tokens is None:
        return max_model_len - num_prompt
    if max_tokens < 1:
        raise RequestError(f"`{key}` must be at least 1, got {max_tokens}.", key)
    if num_prompt + max_tokens > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt + max_tokens} tokens ({num_prompt} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.",
            key,
        )
    return int(max_tokens)


def _stop_ids(stop: Any) -> frozenset[int]:
    """Stop strings that are one output word stop the request when that word is generated."""
    if stop is None:
        return frozenset()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("`stop` must be a string or a list of strings.", "stop")
    return frozenset(words.token_id(s.strip()) for s in stop if s.strip() and len(s.split()) == 1)
