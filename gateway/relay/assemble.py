"""A non-streamed answer put together from the stream the gateway asked for instead.

The gateway sends every completion request upstream as a stream (gateway/endpoints/request.py), so that a
client that leaves before its non-streamed answer is done is charged the tokens made so far, and
the engine request is closed at once (it was charged nothing, while the engine ran to the end).
The client still gets one JSON body in vLLM's non-streamed shape: the chunks' choices joined per
`index` (text, reasoning, tool calls, logprobs), each with its finish_reason and stop_reason, and
the usage of the final usage chunk.

Events are decoded one by one here (a non-streamed request has no per-token hot path to keep).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.relay.sse_events import json_events

CHAT_OBJECT, TEXT_OBJECT = "chat.completion", "text_completion"
_TEXT_FIELDS = ("content", "reasoning_content", "reasoning", "refusal")  # joined across deltas when strings
_MESSAGE_DEFAULTS = {"refusal": None, "annotations": None, "audio": None, "function_call": None}
_COMMON_TOP = {"id": None, "object": None, "created": None, "model": None, "choices": None, "service_tier": None,
               "system_fingerprint": None, "usage": None}  # fmt: skip
_CHAT_TOP = {**_COMMON_TOP, "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
             "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}  # fmt: skip
_TEXT_TOP = {**_COMMON_TOP, "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
_USAGE = {"prompt_tokens": 0, "total_tokens": 0, "completion_tokens": 0, "prompt_tokens_details": None,
          "completion_tokens_details": None}  # fmt: skip  # vLLM's UsageInfo, every field
_CHAT_CHOICE = {"token_ids": None, "routed_experts": None}
_TEXT_CHOICE = {"token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
_CHOICE_LISTS = ("token_ids",)  # joined across chunks
_TOKEN_IDS = ("token_ids", "prompt_token_ids")  # in vLLM's non-streamed answer only with return_token_ids
_COMPLETION_TEXT = (*_TEXT_FIELDS, "text")
_CHOICE_OWN = ("index", "logprobs", "finish_reason", "stop_reason", "tool_calls")  # read by _add itself


class _Choice:
    __slots__ = ("extra", "fields", "finish_reason", "logprobs", "role", "stop_reason", "texts", "tool_calls")

    def __init__(self) -> None:
        self.role = "assistant"
        self.texts: dict[str, list[str]] = {}  # text field -> its pieces
        self.fields: dict[str, Any] = {}  # other fields of a chat delta, as last sent (into the message)
        self.extra: dict[str, Any] = {}  # other fields of the choice (token_ids joined; the rest as last sent)
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.logprobs: dict[str, list[Any]] | None = None  # list fields of the logprobs, joined
        self.finish_reason: Any = None
        self.stop_reason: Any = None


class Assembler:
    """Feed it the stream's events (complete ones, as sse.SseFilter hands them on); `body()` is the
    answer once the stream has ended."""

    __slots__ = ("_chat", "_choices", "_head", "_token_ids", "_usage", "num_events")

    def __init__(self, chat: bool, token_ids: bool = False) -> None:
        self._chat = chat
        self._token_ids = token_ids  # return_token_ids: vLLM's answer has them (a stream with echo has them anyway)
        self._head: dict[str, Any] = {}  # id, created, model, ... of the first chunk
        self._choices: dict[int, _Choice] = {}
        self._usage: Any = None
        self.num_events = 0

    def feed(self, events: bytes) -> None:
        for event in json_events(events):
            self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        self.num_events += 1
        for key, value in event.items():  # id, created, model; system_fingerprint on the last chunk
            if key not in ("choices", "usage", "object") and (value is not None or key not in self._head):
                self._head[key] = value
        if isinstance(event.get("usage"), dict):
            self._usage = {**_USAGE, **event["usage"]}
        choices = event.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            index = choice.get("index") if isinstance(choice, dict) else None
            if type(index) is int:
                self._add(self._choices.setdefault(index, _Choice()), choice)

    def _add(self, into: _Choice, choice: dict[str, Any]) -> None:
        part = choice.get("delta") if self._chat else choice
        if isinstance(part, dict):
            for key, value in part.items():
                if key == "role" and isinstance(value, str):
                    into.role = value
                elif key in _TEXT_FIELDS or (key == "text" and not self._chat):
                    if isinstance(value, str):
                        into.texts.setdefault(key, []).append(value)
                elif key == "tool_calls" and isinstance(value, list):
                    _add_tool_calls(into.tool_calls, value)
                elif self._chat:
                    into.fields[key] = value
        for key, value in choice.items():
            if key in _CHOICE_OWN or (key == "delta" and self._chat) or (key in _COMPLETION_TEXT and not self._chat):
                continue
            if key in _CHOICE_LISTS and isinstance(value, list):
                into.extra.setdefault(key, []).extend(value)
            elif value is not None or key not in into.extra:
                into.extra[key] = value
        if choice.get("finish_reason") is not None:
            into.finish_reason = choice["finish_reason"]
        if choice.get("stop_reason") is not None:
            into.stop_reason = choice["stop_reason"]
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            joined = into.logprobs if into.logprobs is not None else {}
            for key, value in logprobs.items():
                if isinstance(value, list):
                    joined.setdefault(key, []).extend(value)
            into.logprobs = joined

    def body(self) -> bytes:
        """vLLM 0.32's non-streamed answer (ChatCompletionResponse / CompletionResponse, every field
        in its order), filled from the stream; fields the stream had that vLLM's answer lacks follow."""
        answer: dict[str, Any] = dict(_CHAT_TOP if self._chat else _TEXT_TOP)
        answer["object"] = CHAT_OBJECT if self._chat else TEXT_OBJECT
        answer.update({k: v for k, v in self._head.items() if k not in answer or v is not None})
        answer["choices"] = [self._choice(i, c) for i, c in sorted(self._choices.items())]
        if self._usage is not None:  # a backend that reports no usage sends none here either
            answer["usage"] = self._usage
        else:
            del answer["usage"]
        return json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()

    def _choice(self, index: int, c: _Choice) -> dict[str, Any]:
        texts = {k: "".join(v) for k, v in c.texts.items()}
        out: dict[str, Any] = {"index": index}
        if self._chat:
            message: dict[str, Any] = {"role": c.role, "content": texts.pop("content", "")}
            message.update(_MESSAGE_DEFAULTS)
            if c.tool_calls:  # vLLM leaves an empty list out
                message["tool_calls"] = [c.tool_calls[i] for i in sorted(c.tool_calls)]
            message["reasoning"] = None
            message.update(texts)
            message.update({k: v for k, v in c.fields.items() if k not in message})
            out["message"] = message
        else:
            out["text"] = texts.get("text", "")
        out["logprobs"] = c.logprobs
        out["finish_reason"] = c.finish_reason
        out["stop_reason"] = c.stop_reason
        out.update(_CHAT_CHOICE if self._chat else _TEXT_CHOICE)
        out.update({k: v for k, v in c.extra.items() if v is not None and (self._token_ids or k not in _TOKEN_IDS)})
        return out


def _add_tool_calls(calls: dict[int, dict[str, Any]], deltas: list[Any]) -> None:
    """OpenAI's streamed tool calls: each delta names its call's index; the id, type and name come
    once, the arguments in pieces."""
    for delta in deltas:
        if not isinstance(delta, dict) or type(delta.get("index")) is not int:
            continue
        call = calls.setdefault(
            delta["index"], {"id": None, "type": "function", "function": {"name": None, "arguments": ""}}
        )
        if delta.get("id"):
            call["id"] = delta["id"]
        if delta.get("type"):
            call["type"] = delta["type"]
        function = delta.get("function")
        if isinstance(function, dict):
            if function.get("name"):
                call["function"]["name"] = function["name"]
            if isinstance(function.get("arguments"), str):
                call["function"]["arguments"] += function["arguments"]
