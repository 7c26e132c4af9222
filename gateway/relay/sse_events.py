"""A stream's SSE events decoded, for the paths that must read them (a stream of several choices,
a non-streamed answer put together, a continuation); the per-token path (sse.SseFilter) decodes
nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def json_events(events: bytes, strict: bool = False) -> Iterator[dict[str, Any]]:
    """The JSON objects of complete SSE events' data lines (not [DONE] or comments), for the
    paths that decode a stream's events (several choices, a put-together answer, a
    continuation); one that is not JSON is skipped, or raises ValueError when strict."""
    for line in events.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if not payload.startswith(b"{"):
            continue
        try:
            event = json.loads(payload)
        except ValueError:
            if strict:
                raise
            continue
        if isinstance(event, dict):
            yield event
