"""Validate a completion request and prepare the body sent upstream.

Every field the gateway reads is checked here, and a bad one is a 400 naming it (`param`):
model, stream, stream_options (include_usage, continuous_usage_stats), messages or prompt,
max_tokens, max_completion_tokens, n, best_of; and any top-level integer must fit in 64 bits.
gateway/strict_json.py refuses bodies that are not strict JSON (depth, NaN, overflow, surrogates).

What goes upstream differs from what the client sent in four ways, and only then is the body
re-encoded (else the client's bytes go as they are, or with fields appended before the final `}`):
- a streamed request always asks for usage on every chunk (`stream_options: {"include_usage":
  true, "continuous_usage_stats": true}`), so that a stream that ends early is charged what was
  relayed; the relay strips usage the client did not ask for (client_wants_*);
- a request that is not streamed loses stream_options (vLLM refuses it without stream);
- [gateway].drop_body_fields (default: priority, vLLM's queue order) are removed;
- with [gateway].max_tokens_limit set, a request that names no max_tokens is sent
  max_tokens = min(default_max_tokens, max_tokens_limit), so the limit cannot be dodged by
  leaving the field out (the engine's own default is the whole context).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ApiError
from gateway.keys.fields import MAX_MODEL_CHARS  # a longer name can be in no allow-list
from gateway.strict_json import decode_object, field_name, invalid
from zerogap.config.gateway import GatewaySection

MAX_TOKENS_BOUND = 2**31 - 1  # the most completion tokens anyone may ask for (no engine has a longer context)
MAX_CHOICES = 128  # n and best_of: completions generated per request
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # any top-level integer (seed, top_k, ...) must fit an engine's int64
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}
_STREAM_OPTIONS_OBJECT = b'{"include_usage":true,"continuous_usage_stats":true}'
_STREAM_OPTIONS_BYTES = b'"stream_options":' + _STREAM_OPTIONS_OBJECT
_STREAM_OPTIONS_VALUE = re.compile(rb'"stream_options"[ \t\n\r]*:[ \t\n\r]*(\{[^{}]*\})')
_USAGE_FLAGS = frozenset(STREAM_OPTIONS)
_UNICODE_ESCAPE = re.compile(rb"\\u")  # a regex search: half the time of `in` for a two-byte needle


@dataclass
class Call:
    """One validated completion request."""

    path: str  # "/v1/chat/completions" or "/v1/completions"
    model: str
    body: dict[str, Any]
    raw: bytes  # the client's bytes; sent as they are when nothing had to change
    stream: bool
    client_wants_usage: bool  # stream_options.include_usage: the final usage chunk
    max_tokens: int | None  # the completion tokens the client asked for (per choice); None: not said
    client_wants_continuous_usage: bool = False  # usage on every chunk (and include_usage, as vLLM has it)
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


def _count(body: dict[str, Any], name: str, most: int, setting: str | None = None) -> int | None:
    """A positive integer field at most `most` (None when absent or null); `setting` names the
    config key that sets `most`, for the message."""
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise invalid(f"'{name}' must be a positive integer (got {_shown(value)}).", name)
    if value > most:
        if setting is None:
            raise invalid(f"'{name}' must be at most {most} (got {_shown(value)}).", name)
        raise ApiError(
            400,
            f"'{name}' asks for {_shown(value)} tokens; this gateway allows at most {most} ({setting}). "
            f"Ask for {most} or fewer.",
            param=name,
            code="max_tokens_above_limit",
        )
    return value


def _shown(value: Any) -> str:
    """A client's value, short, for a message: numbers as written (at most 24 characters), else the type."""
    if type(value) in (int, float, bool):
        text = repr(value)
        return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} characters)"
    return type(value).__name__


def _flag(value: Any, name: str) -> bool:
    if value is None:
        return False
    if type(value) is not bool:
        raise invalid(f"'{name}' must be true or false (got {_shown(value)}).", name)
    return value


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) as the client asked."""
    options = body.get("stream_options")
    if options is None:
        return False, False
    if type(options) is not dict:
        raise invalid("'stream_options' must be an object, such as {\"include_usage\": true}.", "stream_options")
    usage = _flag(options.get("include_usage"), "stream_options.include_usage")
    continuous = _flag(options.get("continuous_usage_stats"), "stream_options.continuous_usage_stats")
    return usage, usage and continuous  # vLLM sends per-chunk usage only with include_usage


def _check_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if type(messages) is not list or not messages:
        raise invalid('\'messages\' is required: a non-empty list of {"role", "content"} objects.', "messages")
    for message in messages:
        if type(message) is not dict or type(message.get("role")) is not str:
            raise invalid("each item of 'messages' must be an object with a string 'role'.", "messages")


def _is_tokens(items: list[Any]) -> bool:
    if not items or not all(type(t) is int for t in items):
        return False
    return min(items) >= 0 and max(items) <= MAX_TOKENS_BOUND


def _check_prompt(body: dict[str, Any]) -> None:
    """A string, a list of strings, a list of token ids or a list of lists of token ids (OpenAI's forms)."""
    prompt = body.get("prompt")
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
    raise invalid(
        "'prompt' is required: a string, a non-empty list of strings, or a non-empty list of token ids "
        f"(integers 0 to {MAX_TOKENS_BOUND}), or a list of such lists.",
        "prompt",
    )


def _check_int_range(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
            name = field_name(key)
            raise invalid(f"'{name or 'a field'}' is out of range (an integer must fit in 64 bits).", name)


def _completion_tokens(body: dict[str, Any], chat: bool, settings: GatewaySection) -> int | None:
    """The completion tokens per choice the engine will be allowed, as the client asked (None: not said)."""
    limit = settings.max_tokens_limit
    most, setting = (MAX_TOKENS_BOUND, None) if limit is None else (limit, "[gateway].max_tokens_limit")
    max_tokens = _count(body, "max_tokens", most, setting)
    max_completion_tokens = _count(body, "max_completion_tokens", most, setting)
    if chat:  # vLLM's chat API reads max_completion_tokens, then max_tokens
        return max_completion_tokens or max_tokens
    return max_tokens  # the completions API has only max_tokens


def model_of(body: dict[str, Any]) -> str:
    """The body's `model`, or a 400: required, a string, at most MAX_MODEL_CHARS (it is echoed in a 404)."""
    model = body.get("model")
    if type(model) is not str or not model:
        raise invalid("'model' is required: the name of a model from GET /v1/models.", "model")
    if len(model) > MAX_MODEL_CHARS:
        raise invalid(f"'model' is longer than {MAX_MODEL_CHARS} characters: see GET /v1/models.", "model")
    return model


def parse_call(raw: bytes, path: str, chat: bool, settings: GatewaySection) -> Call:
    body = decode_object(raw)
    model = model_of(body)
    stream = _flag(body.get("stream"), "stream")
    wants_usage, wants_continuous = _stream_options(body)
    if chat:
        _check_messages(body)
    else:
        _check_prompt(body)
    asked = _completion_tokens(body, chat, settings)
    choices = max(_count(body, "n", MAX_CHOICES) or 1, _count(body, "best_of", MAX_CHOICES) or 1)
    _check_int_range(body)
    call = Call(path, model, body, raw, stream, wants_usage and stream, asked, wants_continuous and stream)
    sent = asked
    if asked is None and settings.max_tokens_limit is not None:
        sent = min(settings.default_max_tokens, settings.max_tokens_limit)
    call.budget_tokens = (sent or settings.default_max_tokens) * choices
    call._encoded = _upstream_bytes(call, settings.drop_body_fields, None if sent == asked else sent)
    return call


def _upstream_bytes(call: Call, drop: list[str], max_tokens: int | None) -> bytes | None:
    """Change call.body into what goes upstream; the bytes to send, or None to encode call.body.
    Fields that were absent are appended to the client's bytes; any other change re-encodes."""
    body = call.body
    reencode = False
    appended: list[bytes] = []
    for name in drop:
        if name in body:
            del body[name]
            reencode = True
    raw = call.raw
    if call.stream:
        if not call.client_wants_continuous_usage:
            options, present = body.get("stream_options"), "stream_options" in body
            body["stream_options"] = {**(options or {}), **STREAM_OPTIONS}
            if not present:
                appended.append(_STREAM_OPTIONS_BYTES)
            elif not reencode:
                patched = _patched_stream_options(raw, options)
                reencode = patched is None
                raw = patched or raw
    elif "stream_options" in body:
        del body["stream_options"]  # vLLM refuses stream_options without stream
        reencode = True
    if max_tokens is not None:
        reencode = reencode or "max_tokens" in body  # there as null
        body["max_tokens"] = max_tokens
        appended.append(b'"max_tokens":%d' % max_tokens)
    if reencode:
        return None
    if not appended:
        return raw
    text = raw.strip()  # an object with at least "model" (checked): append before its `}`
    return text[:-1] + b"," + b",".join(appended) + b"}"


def _patched_stream_options(raw: bytes, options: Any) -> bytes | None:
    """The client's bytes with its stream_options object replaced by the gateway's, without
    re-encoding the body (many clients send {"include_usage": true}); None when that cannot be
    done safely. Safe when the client's object holds only the usage flags (so its text has no
    brace) and `"stream_options"` is written once, with no \\u escape anywhere in the body: then
    that one occurrence is the top-level key (a nested key or a string would be a second one,
    and the top-level key escaped would need a \\u)."""
    if type(options) is not dict or not _USAGE_FLAGS.issuperset(options):
        return None
    if raw.count(b'"stream_options"') != 1 or _UNICODE_ESCAPE.search(raw) is not None:
        return None
    found = _STREAM_OPTIONS_VALUE.search(raw)
    if found is None:
        return None
    return raw[: found.start(1)] + _STREAM_OPTIONS_OBJECT + raw[found.end(1) :]
