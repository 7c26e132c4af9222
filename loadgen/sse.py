"""Server-sent events of an OpenAI-compatible stream, read by `data:` lines up to [DONE].

A chunk may carry several tokens or none (the role-only first chunk, keep-alive
comments, the usage-only last chunk): only chunks with text are content chunks, and the
token count comes from `usage` when the server sends it.

A reasoning model's chunks carry `reasoning_content` (vLLM's older name) or `reasoning`
(vLLM 0.32) before the answer's `content`: both are content chunks (TTFT is the first of
either), and the first answer chunk's time and the reasoning chunks are kept apart.
"""

from __future__ import annotations

import json
from typing import Any

_REASONING_FIELDS = ("reasoning_content", "reasoning")
NONE, ANSWER, REASONING = 0, 1, 2


class SseParser:
    """Feed it the stream's lines (bytes, with or without line endings) and the time
    each was read; it keeps the content-chunk times and the usage."""

    __slots__ = (
        "_data",
        "answer_time",
        "cached_tokens",
        "chat",
        "completion_tokens",
        "content_times",
        "done",
        "error",
        "prompt_tokens",
        "reasoning_chunks",
        "reasoning_tokens",
    )

    def __init__(self, chat: bool = True) -> None:
        self.chat = chat
        self.content_times: list[float] = []
        self.answer_time: float | None = None  # the first chunk of the answer itself (not reasoning)
        self.reasoning_chunks = 0
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens
        self.cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
        self.done = False
        self.error: str | None = None
        self._data: list[bytes] = []

    def feed_line(self, line: bytes, now: float) -> None:
        line = line.rstrip(b"\r\n")
        if not line:
            self._dispatch(now)
        elif line.startswith(b"data:"):
            self._data.append(line[6:] if line[5:6] == b" " else line[5:])
        # comments (": keep-alive"), event:, id:, retry: carry no tokens

    def finish(self, now: float) -> None:
        """End of the body: an event without its blank line still counts."""
        self._dispatch(now)

    def _dispatch(self, now: float) -> None:
        if not self._data:
            return
        payload = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        self._data = []
        if payload.strip() == b"[DONE]":
            self.done = True
            return
        self.on_json(json.loads(payload), now)

    def on_json(self, obj: Any, now: float) -> None:
        if not isinstance(obj, dict):
            return
        if "error" in obj:
            err = obj["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)
            return
        usage = obj.get("usage")
        if usage:
            self.completion_tokens = usage.get("completion_tokens")
            self.prompt_tokens = usage.get("prompt_tokens")
            if usage.get("completion_tokens_details") or usage.get("prompt_tokens_details"):
                self._details(usage)
        for choice in obj.get("choices") or ():
            kind = self._text_kind(choice)
            if kind:
                self.content_times.append(now)
                if kind == ANSWER:
                    if self.answer_time is None:
                        self.answer_time = now
                else:
                    self.reasoning_chunks += 1
                return

    def _details(self, usage: dict[str, Any]) -> None:
        completion, prompt = usage.get("completion_tokens_details"), usage.get("prompt_tokens_details")
        if isinstance(completion, dict) and isinstance(completion.get("reasoning_tokens"), int):
            self.reasoning_tokens = completion["reasoning_tokens"]
        if isinstance(prompt, dict) and isinstance(prompt.get("cached_tokens"), int):
            self.cached_tokens = prompt["cached_tokens"]

    def _text_kind(self, choice: dict[str, Any]) -> int:
        """ANSWER, REASONING, or NONE (no text in this choice)."""
        if not self.chat:
            return ANSWER if choice.get("text") else NONE
        delta = choice.get("delta") or choice.get("message") or {}  # a stream's delta, a whole answer's message
        if delta.get("content"):
            return ANSWER
        return REASONING if any(delta.get(name) for name in _REASONING_FIELDS) else NONE

    @property
    def num_content_chunks(self) -> int:
        return len(self.content_times)
