"""Pass SSE bytes through whole events at a time, reading the usage the backend reports and
showing the client only the usage it asked for. Events are never re-encoded.

The gateway asks a streaming backend for usage on every chunk (vLLM's `stream_options:
{"include_usage": true, "continuous_usage_stats": true}`), so that a stream that ends early
(client gone, backend broke, idle timeout, ejection, drain) is charged exactly what was relayed.
Reading it must stay cheap: this runs once per read from the backend, on the per-token hot path.
So no event is decoded as JSON and, on the usual path, no regex scans a read: usage is
cumulative, so only the last usage object relayed matters: its bytes are kept (a slice of at
most USAGE_BYTES, so that a stream never holds on to a large read), and its two counts are read
once, when the stream ends. For a client
that did not ask for it, the `usage` field is cut out of each chunk with `find` and slicing, its
end found by matching braces (a usage object holds no strings). JSON that is not compact (vLLM's,
the sim's and OpenAI's are) takes a slower path through regular expressions, to the same end.

When the backend reports no usage at all, completion tokens are counted instead: one per event
that carries a choice, less the chat stream's role-only opener. One token per chunk is vLLM's
streaming granularity (its default `--stream-interval 1`); a backend that packs several tokens
into a chunk is under-counted by that factor, and a bare finish chunk counts one too many.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from gateway.relay.choice_usage import ChoiceUsage
    from gateway.relay.continuation import Rewriter, Transcript

MAX_PENDING_BYTES = 1 << 20  # an "event" this long without a blank line is passed on as it is

# What the client sees of the backend's usage (from its stream_options).
SHOW_NONE: Final = 0  # asked for nothing: no usage field in any chunk, no usage-only chunk
SHOW_FINAL: Final = 1  # include_usage: the final usage-only chunk (choices: []) and nothing else
SHOW_ALL: Final = 2  # include_usage and continuous_usage_stats: as the backend sends it

FIELD = b',"usage":'  # the usage field in compact JSON, after another field (vLLM: after "choices")
USAGE_ONLY = b'"choices":[]'  # what comes right before it in the final usage-only chunk
ERROR_EVENT = b'data: {"error"'  # vLLM's error event inside a stream
USAGE_BYTES = 1024  # what is kept of the last usage field (vLLM's, with its *_details, is under 300)

_OBJECT = rb"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}"  # a JSON object holding objects one level deep (*_details)
_USAGE_AT = re.compile(rb'"usage"\s*:\s*(' + _OBJECT + rb")")
# The field inside a chunk. It never matches inside a JSON string: there a quote is escaped (\").
_USAGE_FIELD = re.compile(rb',\s*"usage"\s*:\s*(?:' + _OBJECT + rb"|null)")
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_USAGE_ONLY_EVENT = re.compile(rb'data:[^\n]*"choices"\s*:\s*\[\s*\][^\n]*\n\r?\n')
_TOKENS = re.compile(rb'"(prompt|completion)_tokens"\s*:\s*(\d+)')


def shown_usage(wants_usage: bool, wants_continuous: bool) -> int:
    """SHOW_* for a client's stream_options (vLLM honours continuous_usage_stats only with include_usage)."""
    if not wants_usage:
        return SHOW_NONE
    return SHOW_ALL if wants_continuous else SHOW_FINAL


class SseFilter:
    __slots__ = ("_pending", "_usage", "choices", "errored", "num_chunks", "rewriter", "show", "transcript")

    def __init__(self, show: int, choices: ChoiceUsage | None = None) -> None:
        self.show = show
        self.choices = choices  # a stream of several choices is charged per choice (choice_usage.py)
        self.transcript: Transcript | None = None  # the text so far, for a continuation (continuation.py)
        self.rewriter: Rewriter | None = None  # set while a continuation is relayed
        self.errored = False  # a continuable stream's backend sent an error event: held back, the stream is over
        self.num_chunks = 0  # events with a choice relayed, less role-only openers (counted while no usage came)
        self._usage: bytes | None = None  # the last usage field the backend reported, from its "usage" key on
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward now: the complete events of pending + data."""
        if self.rewriter is not None:
            data = self.rewriter.feed(data)
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
        if self.transcript is not None:
            data = self._held_error(data)
            if not data:
                return b""
            self.transcript.feed(data)
        if self.choices is not None:
            self.choices.feed(data)
        at = data.find(FIELD)
        if at >= 0:
            out = self._usage_in(data, at)
        else:
            out = self._usage_in_any_json(data) if b'"usage"' in data else data
        if self._usage is None:  # no usage yet (none at all, or OpenAI's "usage": null): count
            num = data.count(b"data: {")
            if self.num_chunks == 0:  # the chat stream's role-only opener comes first (vLLM: with the first token)
                num -= data.count(b'"delta":{"role"')
            self.num_chunks += num
        return out

    def _held_error(self, data: bytes) -> bytes:
        """A stream that may be continued: an error event from the backend (an engine failure
        inside a 200 stream) is not relayed, nor anything after it; the relay continues the stream
        elsewhere, or ends it with its own error event."""
        if self.errored:
            return b""
        at = data.find(ERROR_EVENT)
        if at < 0:
            return data
        self.errored = True
        return data[:at]

    def drop_pending(self) -> None:
        """Forget the partial event of a stream that broke (a continuation starts afresh)."""
        self._pending = b""
        self.errored = False

    def rest(self) -> bytes:
        """What is left at the end of the stream (an event without its blank line)."""
        if self.rewriter is not None:
            self._pending += self.rewriter.rest()
        rest, self._pending = self._pending, b""
        if self.transcript is not None:
            rest = self._held_error(rest)
        if rest and self.choices is not None:
            self.choices.feed(rest)
        if rest and self.transcript is not None:
            self.transcript.feed(rest)
        return rest

    def reported(self) -> tuple[int | None, int | None]:
        """(prompt, completion) tokens of the last usage the backend reported; None where it said nothing."""
        found = _USAGE_AT.match(self._usage) if self._usage is not None else None
        counts = dict(_TOKENS.findall(found.group(1))) if found is not None else {}
        prompt, completion = counts.get(b"prompt"), counts.get(b"completion")
        return (int(prompt) if prompt else None, int(completion) if completion else None)

    def _usage_in(self, data: bytes, at: int) -> bytes:
        """data without the usage fields the client did not ask for; `at`: where the first one is."""
        if self.show == SHOW_ALL:  # the last usage that is an object, not null (as _usage_in_any_json)
            at = data.rfind(FIELD)
            while at >= 0 and data.startswith(b"null", at + len(FIELD)):
                at = data.rfind(FIELD, 0, at)
            if at >= 0:
                self._usage = data[at + 1 : at + 1 + USAGE_BYTES]
            return data
        value = at + len(FIELD)
        close = data.find(b"}", value)
        if (  # the usual read: one event, its usage object flat (no *_details object) and last
            data.startswith(b"{", value)
            and data.find(b"{", value + 1, close) < 0 <= close
            and data.find(FIELD, close) < 0
            and not data.endswith(USAGE_ONLY, 0, at)
        ):
            self._usage = data[at + 1 : close + 1]
            return data[:at] + data[close + 1 :]
        parts: list[bytes] = []
        start = 0
        while at >= 0:
            value = at + len(FIELD)
            if data.startswith(b"null", value):
                end = value + 4
            else:
                end = _object_end(data, value)
                if end < 0:  # not a usage object as vLLM writes one: leave the rest as it came
                    break
                self._usage = data[at + 1 : end]
                if data.endswith(USAGE_ONLY, 0, at):  # the final usage-only chunk: kept or dropped whole
                    if self.show == SHOW_FINAL:
                        at = data.find(FIELD, end)
                        continue
                    at, end = data.rfind(b"\n", 0, at) + 1, _event_end(data, end)
            parts.append(data[start:at])
            start = end
            at = data.find(FIELD, end)
        parts.append(data[start:])
        return b"".join(parts)

    def _usage_in_any_json(self, data: bytes) -> bytes:
        """_usage_in for JSON with spaces (or a usage field first): the same, with regular expressions."""
        end = len(data)
        while (at := data.rfind(b'"usage"', 0, end)) >= 0:  # the last one that is an object, not null
            found = _USAGE_AT.match(data, at)
            if found is not None:
                self._usage = found.group()
                break
            end = at
        if self.show == SHOW_ALL:
            return data
        final = _USAGE_ONLY_EVENT.search(data) if _NO_CHOICES.search(data) is not None else None
        if final is None:
            return _USAGE_FIELD.sub(b"", data)
        start, stop = final.span()
        kept = data[start:stop] if self.show == SHOW_FINAL else b""
        return _USAGE_FIELD.sub(b"", data[:start]) + kept + _USAGE_FIELD.sub(b"", data[stop:])


def _object_end(data: bytes, start: int) -> int:
    """Just past the JSON object at `start` (-1 if none): braces matched, as no string is inside."""
    if not data.startswith(b"{", start):
        return -1
    close = data.find(b"}", start)
    inner = data.find(b"{", start + 1, close)
    while inner >= 0 and close >= 0:  # each object inside moves the end one closing brace on
        close = data.find(b"}", close + 1)
        inner = data.find(b"{", inner + 1, close)
    return close + 1 if close >= 0 else -1


def _event_end(data: bytes, pos: int) -> int:
    """Just past the blank line that ends the event going on at `pos`."""
    line_end = data.find(b"\n", pos)
    if line_end < 0:
        return len(data)
    for blank in (b"\n", b"\r\n"):
        if data.startswith(blank, line_end + 1):
            return line_end + 1 + len(blank)
    return line_end + 1


def _crlf_end(data: bytes) -> int:
    end = data.rfind(b"\n\r\n")
    return end + 3 if end >= 0 else -1
