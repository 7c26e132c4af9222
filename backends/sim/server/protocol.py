"""Parse and validate OpenAI-style request bodies into what the engine needs.

The rules the gateway reads too (model, stream, stream_options, messages or prompt, max_tokens,
max_completion_tokens, n) are common/openai_request.py's, so a mistake gets the same message here
as through the gateway. What is the sim's own: the model it serves (a 404 for another), text
content only, token ids in its vocabulary, stream_options only with stream (as vLLM), the context
length (each prompt of a list on its own, as vLLM), stop and ignore_eos. A completions prompt may
be a list of prompts and n may be above 1: the engine runs n sequences per prompt (choices.py).

Errors are vLLM-shaped: {"error": {"message", "type": "BadRequestError", "param", "code": 400}}.
Prompt tokens are counted as whitespace-separated words (see words.py); a chat prompt
is the words of every message's text content.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from backends.sim.engine import words
from backends.sim.settings import SimSettings
from common.openai_request import InvalidRequest, check_fields, check_messages, flag, model_of, shown


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
    """common/openai_request.py's InvalidRequest as this engine's 400."""
    try:
        yield
    except InvalidRequest as exc:
        raise RequestError(exc.message, exc.param) from None


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    chat: bool
    prompt_token_ids: list[int]  # the first (usually the only) prompt
    max_tokens: int  # the first prompt's completion limit, per choice
    stream: bool
    include_usage: bool
    continuous_usage: bool
    ignore_eos: bool
    stop_ids: frozenset[int]
    n: int = 1  # choices per prompt
    more_prompts: tuple[tuple[list[int], int], ...] = ()  # a completions list's other prompts, with their limits

    @property
    def single(self) -> bool:
        """One prompt, one choice: the usual request (and the engine's fast path)."""
        return self.n == 1 and not self.more_prompts

    @property
    def prompts(self) -> list[tuple[list[int], int]]:
        """Every prompt with its completion limit, in the list's order."""
        return [(self.prompt_token_ids, self.max_tokens), *self.more_prompts]


def parse_generation(body: Any, settings: SimSettings, chat: bool) -> GenerationRequest:
    if not isinstance(body, dict):
        raise RequestError("The body must be a JSON object.")
    with _shared_rules():
        asked = check_fields(body, chat, model_required=False)
        ignore_eos = flag(body.get("ignore_eos"), "ignore_eos")
    _check_served(asked.model, settings)
    if chat and body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise RequestError(  # vLLM's own check; with continue_final_message the last message is continued
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", "continue_final_message"
        )
    prompts = [words.tokenize(_chat_text(body["messages"]))] if chat else _completion_prompts(body["prompt"])
    if not all(prompts):
        raise RequestError("The prompt is empty: send at least one word.", "messages" if chat else "prompt")
    named = _token_field(body, chat)
    limits = [_max_tokens(asked.max_tokens, named, len(p), settings.max_model_len) for p in prompts]
    temperature = body.get("temperature")
    if temperature is not None and type(temperature) not in (int, float):
        raise RequestError(f"'temperature' must be a number (got {shown(temperature)}).", "temperature")
    if body.get("stream_options") is not None and not asked.stream:
        raise RequestError(
            "'stream_options' is only for a streamed request: send \"stream\": true, or drop it.", "stream_options"
        )
    return GenerationRequest(
        chat=chat,
        prompt_token_ids=prompts[0],
        max_tokens=limits[0],
        stream=asked.stream,
        include_usage=asked.include_usage,
        continuous_usage=asked.include_usage and asked.continuous_usage_stats,  # as vLLM: should_include_usage
        ignore_eos=ignore_eos,
        stop_ids=_stop_ids(body.get("stop")),
        n=asked.n or 1,
        more_prompts=tuple(zip(prompts[1:], limits[1:], strict=True)),
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


def _completion_prompts(prompt: str | list[Any]) -> list[list[int]]:
    """Each prompt's token ids (a string, a list of ids, or a list of either: its shape is checked
    already, by openai_request), with ids in the sim's vocabulary."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    return [words.tokenize(p) if isinstance(p, str) else _known_ids(p) for p in prompt]


def _known_ids(ids: list[int]) -> list[int]:
    if max(ids) >= words.VOCAB_SIZE:
        raise RequestError(
            f"'prompt' holds token id {max(ids)}; the simulated engine's ids are 0 to {words.VOCAB_SIZE - 1}.",
            "prompt",
        )
    return list(ids)


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
