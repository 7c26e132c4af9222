"""Pass SSE bytes through whole events at a time, reading usage and dropping the
usage-only chunk when the client did not ask for it. Other events are not re-encoded."""

from __future__ import annotations

import json
from typing import Any

MAX_PENDING_BYTES = 1 << 20  # an "event" this long without a blank line is passed on as it is


class SseFilter:
    __slots__ = ("_pending", "num_events", "strip_usage", "usage")

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.usage: dict[str, Any] | None = None
        self._pending = b""
        self.num_events = 0

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward now: the complete events of pending + data."""
        if self._pending:
            data = self._pending + data
            self._pending = b""
        end = data.rfind(b"\n\n")
        end = end + 2 if end >= 0 else _crlf_end(data)
        if end < 0:
            if len(data) > MAX_PENDING_BYTES:
                return data
            self._pending = data
            return b""
        if end < len(data):
            self._pending = data[end:]
            data = data[:end]
        if b'"usage"' in data:
            return self._usage(data)
        return data

    def rest(self) -> bytes:
        """What is left at the end of the stream (an event without its blank line)."""
        rest, self._pending = self._pending, b""
        return rest

    def _usage(self, data: bytes) -> bytes:
        events = data.split(b"\n\n")
        kept = [e for e in events if not self._consume(e)]
        return b"\n\n".join(kept)

    def _consume(self, event: bytes) -> bool:
        """Read usage from an event; True if the event is to be dropped."""
        if b'"usage"' not in event or b'"usage":null' in event:
            return False
        payload = event.strip()
        if not payload.startswith(b"data:"):
            return False
        try:
            obj = json.loads(payload[5:])
        except ValueError:
            return False
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if not isinstance(usage, dict):
            return False
        self.usage = usage
        return self.strip_usage and obj.get("choices") == []


def _crlf_end(data: bytes) -> int:
    end = data.rfind(b"\n\r\n")
    return end + 3 if end >= 0 else -1


def usage_tokens(usage: dict[str, Any] | None) -> tuple[int, int]:
    """(prompt, completion) tokens of a usage object; zeros when absent or malformed."""
    if not usage:
        return 0, 0
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else 0, completion if isinstance(completion, int) else 0)
