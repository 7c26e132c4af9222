"""Validate a completion request and prepare the body sent upstream."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ApiError


def invalid(message: str, param: str | None = None, status: int = 422) -> ApiError:
    return ApiError(status, message, "invalid_request_error", param=param, code="invalid_value")


@dataclass
class Call:
    """One validated completion request."""

    path: str  # "/v1/chat/completions" or "/v1/completions"
    model: str
    body: dict[str, Any]
    raw: bytes  # the client's bytes; sent as they are when nothing had to change
    stream: bool
    client_wants_usage: bool
    max_tokens: int | None
    client_wants_continuous_usage: bool = False  # usage on every chunk (stream_options.continuous_usage_stats)
    budget_tokens: int = 0  # completion tokens reserved against tpm: (max_tokens or the default) x n
    _encoded: bytes | None = None
    _by_model: dict[str, bytes] = field(default_factory=dict)

    def body_for(self, upstream_model: str | None) -> bytes:
        """The body to send to a backend that serves this model as `upstream_model` (None: as asked)."""
        if upstream_model and upstream_model != self.model:
            cached = self._by_model.get(upstream_model)
            if cached is None:
                cached = json.dumps({**self.body, "model": upstream_model}).encode()
                self._by_model[upstream_model] = cached
            return cached
        if self._encoded is None:
            self._encoded = json.dumps(self.body).encode()
        return self._encoded


def _int_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(f"'{name}' must be a positive integer (got {value!r}).", name)
    return value


def _check_kind(body: dict[str, Any], chat: bool) -> None:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise invalid('\'messages\' is required: a non-empty list of {"role", "content"} objects.', "messages")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise invalid("each item of 'messages' must be an object with a string 'role'.", "messages")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
            raise invalid("'prompt' is required: a string or a non-empty list.", "prompt")


def _append_usage_option(raw: bytes) -> bytes | None:
    """The client's bytes with stream_options added at the end of the object (no re-encoding),
    when they are plain UTF-8 JSON; None to encode the parsed body instead."""
    text = raw.strip()
    if not (text.startswith(b"{") and text.endswith(b"}")):
        return None
    return text[:-1] + b',"stream_options":{"include_usage":true}}'


def parse_call(raw: bytes, path: str, chat: bool) -> Call:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"The body is not valid JSON ({exc}). Send a JSON object.", status=400) from None
    if not isinstance(body, dict):
        raise invalid("The body must be a JSON object.", status=400)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required: the name of a model from GET /v1/models.", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid(f"'stream' must be true or false (got {stream!r}).", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("'stream_options' must be an object.", "stream_options")
    _check_kind(body, chat)
    max_tokens = _int_field(body, "max_completion_tokens") or _int_field(body, "max_tokens")
    wants_usage = bool(options and options.get("include_usage") is True)
    call = Call(path, model, body, raw, stream, wants_usage, max_tokens)
    if stream and not wants_usage:
        body["stream_options"] = {**(options or {}), "include_usage": True}
        if options is None:
            call._encoded = _append_usage_option(raw)
    elif not stream and options is not None:
        del body["stream_options"]  # vLLM refuses stream_options without stream
    else:
        call._encoded = raw
    return call
