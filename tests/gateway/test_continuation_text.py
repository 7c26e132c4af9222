"""continuation.Transcript.text: the answer so far sliced from the relayed bytes exactly, escapes
and look-alike text inside the answer included; JSON it cannot slice exactly gives None."""

from __future__ import annotations

import json

from gateway.relay.continuation import Transcript


def event(content: str) -> bytes:
    payload = {"id": "c", "choices": [{"index": 0, "delta": {"content": content}}]}
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def test_the_text_is_sliced_exactly_escapes_and_look_alikes_included() -> None:
    pieces = ["", ' say "content":"x"', " back\\slash\\", " é \u2028 \n", ' \\"']
    t = Transcript(chat=True)
    t.feed(event(pieces[0]) + event(pieces[1]))  # two events in one read
    for piece in pieces[2:]:
        t.feed(event(piece))
    assert t.text() == "".join(pieces)


def test_json_written_otherwise_is_not_continued() -> None:
    t = Transcript(chat=True)
    t.feed(b'data: {"choices":[{"index":0,"delta":{"content": " spaced"}}]}\n\n')
    assert t.text() is None
