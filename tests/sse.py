"""Server-sent events as the tests read them: the `data:` payloads of a stream."""

from __future__ import annotations

DONE = "[DONE]"


def data_of(line: bytes | str) -> str | None:
    """The payload of one `data: ...` line (line ending stripped); None for any other line."""
    text = (line.decode() if isinstance(line, bytes) else line).strip()
    return text[6:] if text.startswith("data: ") else None


def data_payloads(raw: bytes) -> list[str]:
    """Every `data:` payload of a whole SSE body, in order ([DONE] included)."""
    found = (data_of(line) for line in raw.decode().splitlines())
    return [payload for payload in found if payload is not None]
