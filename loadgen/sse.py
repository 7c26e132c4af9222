"""Server-sent events of an OpenAI-compatible stream, read by `data:` lines up to [DONE].

A chunk may carry several tokens or none (the role-only first chunk, keep-alive
comments, the usage-only last chunk): only chunks with content text are content
chunks, and the token count comes from `usage` when the server sends it.
"""

from __future__ import annotations

import json
from typing import Any

_CHAT_TEXT_FIELDS = ("content", "reasoning_content", "reasoning")


class SseParser:
    """Feed it the stream's lines (bytes, with or without line endings) and the time
    each was read; it keeps the content-chunk times and the usage."""

    __slots__ = ("_data", "chat", "completion_tokens", "content_times", "done", "error", "prompt_tokens")

    def __init__(self, chat: bool = True) -> None:
        self.chat = chat
        self.content_times: list[float] = []
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
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
        for choice in obj.get("choices") or ():
            if self._has_text(choice):
                self.content_times.append(now)
                return

    def _has_text(self, choice: dict[str, Any]) -> bool:
        if not self.chat:
            return bool(choice.get("text"))
        delta = choice.get("delta") or choice.get("message") or {}  # a stream's delta, a whole answer's message
        return any(delta.get(name) for name in _CHAT_TEXT_FIELDS)

    @property
    def num_content_chunks(self) -> int:
        return len(self.content_times)
