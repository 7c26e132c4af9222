"""Validate a completion request and prepare the body sent upstream.

Every field the gateway reads is checked, and a bad one is a 400 naming it (`param`). The rules an
engine reads too (model, stream, stream_options, messages or prompt, max_tokens,
max_completion_tokens, n) are common/openai_request.py's, shared with the simulated engine, so a
mistake gets the same message from both; the gateway's own are here: best_of (at most 128),
[gateway].max_tokens_limit, and every integer, at any depth, must fit in 64 bits.
gateway/server/strict_json.py refuses bodies that are not strict JSON (depth, NaN, overflow, surrogates).

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
import math
import re
from dataclasses import dataclass, field
from typing import Any

from common.config.gateway import GatewaySection
from common.openai_request import MAX_CHOICES, InvalidRequest, check_fields, positive_int, shown
from common.openai_request import model_of as _model_of
from gateway.server.errors import ApiError
from gateway.server.strict_json import decode_object, int64_outside, invalid

STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}
_STREAM_OPTIONS_OBJECT = b'{"include_usage":true,"continuous_usage_stats":true}'
_STREAM_OPTIONS_BYTES = b'"stream_options":' + _STREAM_OPTIONS_OBJECT
_STREAM_OPTIONS_VALUE = re.compile(rb'"stream_options"[ \t\n\r]*:[ \t\n\r]*(\{[^{}]*\})')
_USAGE_FLAGS = frozenset(STREAM_OPTIONS)
_UNICODE_ESCAPE = re.compile(rb"\\u")  # a regex search: half the time of `in` for a two-byte needle
_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")
BYTES_PER_TOKEN = 4  # a prompt's tokens estimated from its bytes (the engine's count settles it)


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
    budget_tokens: int = 0  # completion tokens reserved against tpm: (max_tokens or the default) x n x prompts
    assembled: bool = False  # not streamed for the client, yet asked upstream as a stream (assemble.py)
    choices_per_prompt: int = 1  # n (or best_of, if larger)
    prompt_estimates: list[int] = field(default_factory=list)  # per prompt of the request: its tokens, estimated
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


def _check_limit(body: dict[str, Any], limit: int) -> None:
    """[gateway].max_tokens_limit on both token fields (their types are checked already)."""
    for name in _TOKEN_FIELDS:
        value = body.get(name)
        if value is not None and value > limit:
            raise ApiError(
                400,
                f"'{name}' asks for {shown(value)} tokens; this gateway allows at most {limit} "
                f"([gateway].max_tokens_limit). Ask for {limit} or fewer.",
                param=name,
                code="max_tokens_above_limit",
            )


def _prompt_estimates(prompt: str | list[Any]) -> list[int]:
    """Each prompt of a completions request (its shape is checked): a string at 4 bytes a token,
    token ids counted."""
    if type(prompt) is str:
        return [math.ceil(len(prompt.encode(errors="replace")) / BYTES_PER_TOKEN)]
    if type(prompt[0]) is int:
        return [len(prompt)]
    return [len(p) if type(p) is list else math.ceil(len(p.encode(errors="replace")) / BYTES_PER_TOKEN) for p in prompt]


def _prompt_logprobs(body: dict[str, Any], chat: bool) -> bool:
    """Whether vLLM computes the prompt's logprobs, which it refuses in a stream and puts in a
    non-streamed answer only: prompt_logprobs, or (completions) echo with logprobs."""
    if body.get("prompt_logprobs") not in (None, 0):
        return True
    return not chat and bool(body.get("echo")) and body.get("logprobs") is not None


def _check_choices(choices: int, prompts: int, most: int) -> None:
    """[gateway].max_choices: the sequences one request makes an engine run (n x prompts)."""
    if choices * prompts > most:
        param = "prompt" if prompts > 1 else "n"
        raise ApiError(
            400,
            f"This request asks for {choices * prompts} completions ({prompts} prompt(s) x {choices} choice(s) "
            f"each, from n or best_of); this gateway allows at most {most} per request ([gateway].max_choices). "
            "Send fewer prompts or a smaller n, or split the request.",
            param=param,
            code="too_many_choices",
        )


def _check_int_range(body: dict[str, Any], raw: bytes) -> None:
    """Every integer, at any depth, must fit an engine's int64 (after check_fields, whose own
    bounds on max_tokens, n and token ids speak first); the 400 names its path."""
    found, path = int64_outside(body, raw)
    if found:
        raise invalid(f"'{path or 'a field'}' is out of range (an integer must fit in 64 bits).", path)


def model_of(body: dict[str, Any]) -> str:
    """The body's `model`, or a 400: required, a string, at most MAX_MODEL_CHARS (it is echoed in a 404)."""
    try:
        return _model_of(body) or ""  # never None: required
    except InvalidRequest as exc:
        raise invalid(exc.message, exc.param) from None


def parse_call(raw: bytes, path: str, chat: bool, settings: GatewaySection) -> Call:
    body = decode_object(raw)
    try:
        asked = check_fields(body, chat)
        best_of = positive_int(body, "best_of", MAX_CHOICES)
    except InvalidRequest as exc:
        raise invalid(exc.message, exc.param) from None
    if settings.max_tokens_limit is not None:
        _check_limit(body, settings.max_tokens_limit)
    choices = max(asked.n or 1, best_of or 1)
    prompt_estimates = [math.ceil(len(raw) / BYTES_PER_TOKEN)] if chat else _prompt_estimates(body["prompt"])
    _check_choices(choices, len(prompt_estimates), settings.max_choices)
    _check_int_range(body, raw)
    stream = asked.stream
    wants_usage = asked.include_usage and stream
    wants_continuous = wants_usage and asked.continuous_usage_stats  # vLLM sends per-chunk usage only with usage
    call = Call(path, asked.model or "", body, raw, stream, wants_usage, asked.max_tokens, wants_continuous)
    sent = asked.max_tokens
    if sent is None and settings.max_tokens_limit is not None:
        sent = min(settings.default_max_tokens, settings.max_tokens_limit)
    call.budget_tokens = (sent or settings.default_max_tokens) * choices * len(prompt_estimates)
    call.choices_per_prompt, call.prompt_estimates = choices, prompt_estimates
    call.assembled = not stream and not _prompt_logprobs(body, chat)
    call._encoded = _upstream_bytes(call, settings.drop_body_fields, None if sent == asked.max_tokens else sent)
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
    if not call.stream and not call.assembled:
        if "stream_options" in body:
            del body["stream_options"]  # vLLM refuses stream_options without stream
            reencode = True
    elif not call.stream:  # streamed upstream all the same, and put together for the client (assemble.py)
        reencode = reencode or "stream" in body or "stream_options" in body
        body["stream"] = True
        body["stream_options"] = dict(STREAM_OPTIONS)
        appended.append(b'"stream":true,' + _STREAM_OPTIONS_BYTES)
    elif not call.client_wants_continuous_usage:
        options, present = body.get("stream_options"), "stream_options" in body
        body["stream_options"] = {**(options or {}), **STREAM_OPTIONS}
        if not present:
            appended.append(_STREAM_OPTIONS_BYTES)
        elif not reencode:
            patched = _patched_stream_options(raw, options)
            reencode = patched is None
            raw = patched or raw
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
