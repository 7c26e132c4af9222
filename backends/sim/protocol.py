"""Parse and validate OpenAI-style request bodies into what the engine needs.

The rules the gateway reads too (model, stream, stream_options, messages or prompt, max_tokens,
max_completion_tokens, n) are zerogap/openai_request.py's, so a mistake gets the same message here
as through the gateway. What is the sim's own: the model it serves (a 404 for another), text
content only, one prompt per request with token ids in its vocabulary, n = 1, stream_options only
with stream (as vLLM), the context length, stop and ignore_eos.

Errors are vLLM-shaped: {"error": {"message", "type": "BadRequestError", "param", "code": 400}}.
Prompt tokens are counted as whitespace-separated words (see words.py); a chat prompt
is the words of every message's text content.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from backends.sim import words
from backends.sim.settings import SimSettings
from zerogap.openai_request import InvalidRequest, check_fields, check_messages, flag, model_of, shown


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


@contextmanager
def _shared_rules() -> Iterator[None]:
    """zerogap/openai_request.py's InvalidRequest as this engine's 400."""
    try:
        yield
    except InvalidRequest as exc:
        raise RequestError(exc.message, exc.param) from None


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
        raise RequestError("The body must be a JSON object.")
    with _shared_rules():
        asked = check_fields(body, chat, model_required=False)
        ignore_eos = flag(body.get("ignore_eos"), "ignore_eos")
    _check_served(asked.model, settings)
    prompt = words.tokenize(_chat_text(body["messages"])) if chat else _completion_prompt(body["prompt"])
    if not prompt:
        raise RequestError("The prompt is empty: send at least one word.", "messages" if chat else "prompt")
    if asked.n not in (None, 1):
        raise RequestError(f"'n' must be 1: the simulated engine returns one choice (got {asked.n}).", "n")
    temperature = body.get("temperature")
    if temperature is not None and type(temperature) not in (int, float):
        raise RequestError(f"'temperature' must be a number (got {shown(temperature)}).", "temperature")
    if body.get("stream_options") is not None and not asked.stream:
        raise RequestError(
            "'stream_options' is only for a streamed request: send \"stream\": true, or drop it.", "stream_options"
        )
    return GenerationRequest(
        chat=chat,
        prompt_token_ids=prompt,
        max_tokens=_max_tokens(asked.max_tokens, _token_field(body, chat), len(prompt), settings.max_model_len),
        stream=asked.stream,
        include_usage=asked.include_usage,
        continuous_usage=asked.include_usage and asked.continuous_usage_stats,  # as vLLM: should_include_usage
        ignore_eos=ignore_eos,
        stop_ids=_stop_ids(body.get("stop")),
    )


def check_model(body: dict[str, Any], settings: SimSettings) -> None:
    """The body's model, when it names one, is the one this engine serves (else a 400 or a 404)."""
    with _shared_rules():
        model = model_of(body, required=False)
    _check_served(model, settings)


def _check_served(model: str | None, settings: SimSettings) -> None:
    if model is not None and model != settings.model:
        raise RequestError(f"The model `{model}` does not exist. This engine serves `{settings.model}`.", "model", 404)


def chat_text(body: dict[str, Any]) -> str:
    """The text a chat prompt's tokens are counted from: every message's text content, in order
    (no chat template: the sim's prompt is the messages' words)."""
    with _shared_rules():
        messages = check_messages(body.get("messages"))
    return _chat_text(messages)


def _chat_text(messages: list[dict[str, Any]]) -> str:
    return " ".join(_message_text(message.get("content"), i) for i, message in enumerate(messages))


def _message_text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(
                    f"'messages[{i}].content': the simulated engine takes only text parts, such as "
                    '{"type": "text", "text": "Hello"}.',
                    "messages",
                )
            parts.append(part["text"])
        return " ".join(parts)
    raise RequestError(f"'messages[{i}].content' must be a string or a list of text parts.", "messages")


def _completion_prompt(prompt: str | list[Any]) -> list[int]:
    """The prompt's token ids; its shape is checked already (openai_request), but the sim takes one
    prompt per request, with ids in its vocabulary."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return words.tokenize(prompt)
    if prompt and isinstance(prompt[0], int):
        if max(prompt) >= words.VOCAB_SIZE:
            raise RequestError(
                f"'prompt' holds token id {max(prompt)}; the simulated engine's ids are 0 to {words.VOCAB_SIZE - 1}.",
                "prompt",
            )
        return list(prompt)
    raise RequestError("The simulated engine takes one prompt per request: send them separately.", "prompt")


def _token_field(body: dict[str, Any], chat: bool) -> str:
    """The field the completion's length was read from (chat: max_completion_tokens, then max_tokens)."""
    return "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"


def _max_tokens(asked: int | None, key: str, num_prompt: int, max_model_len: int) -> int:
    if num_prompt >= max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{num_prompt} input tokens. Please reduce the length of the input messages.",
            "messages",
        )
    if asked is None:
        return max_model_len - num_prompt
    if num_prompt + asked > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt + asked} tokens ({num_prompt} in the messages, {asked} in the completion). "
            "Please reduce the length of the messages or completion.",
            key,
        )
    return asked


def _stop_ids(stop: Any) -> frozenset[int]:
    """Stop strings that are one output word stop the request when that word is generated."""
    if stop is None:
        return frozenset()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError(f"'stop' must be a string or a list of strings (got {shown(stop)}).", "stop")
    return frozenset(words.token_id(s.strip()) for s in stop if s.strip() and len(s.split()) == 1)
