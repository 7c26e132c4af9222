"""Bound what a request body can cost the event loop before it is decoded.

A JSON decoder's time grows with the values it builds (arrays and objects most), not with the bytes:
4 MiB of `[]` is 1.4 million lists, hundreds of milliseconds in any decoder, in one call that holds
the GIL (a thread would not free the loop; bench/body_parse.py measures it). So the body is
counted first, outside its strings, and a body with more than MAX_VALUES values or MAX_CONTAINERS
arrays and objects is refused before it is decoded; one within both decodes in a few milliseconds.

The count is made as the body arrives: gateway/server/asgi.py's read_body feeds each chunk to a BodyScan
(bytes operations only, a few passes over the chunk, no Python loop per byte or value) and returns
a ScannedBody, the body's bytes with its scan. Strings are cut out by their quotes (escaped
backslashes and quotes go first; a backslash or a string open at a chunk's end carries over), and
what is left is structure and numbers: `[`/`{` count containers, `,` the values after a
container's first. Along the way the scan measures the depth (running sums over the brackets,
while within MAX_CONTAINERS), notes 65 opening brackets in a row (too deep, whatever else), and
reads the digits of any number of 19 digits or more (the first LONG_INTS_READ of them): only a
body with an integer beyond 64 bits has its decoded values walked for the integer's path. A body
that is not valid JSON may be miscounted; it is refused either way.
"""

from __future__ import annotations

import itertools
import operator

from gateway.server.errors import ApiError

MAX_VALUES = 150_000  # values of any kind (a 128k-token prompt as token ids is 131,072 of them)
MAX_CONTAINERS = 1 << 15  # arrays and objects (a chat of 10,000 messages has about 20,000)
MAX_DEPTH = 64  # levels of arrays/objects, the body's own object included
LONG_INT_DIGITS = 19  # the digits of 2**63: a shorter integer always fits in 64 bits

_STRUCTURE = bytes.maketrans(b"{}0123456789.eE+-", b"[]0000000000.....")
_NOT_STRUCTURE = bytes(set(range(256)) - set(b"[]{},0123456789.eE+-"))
_DEEP = b"[" * (MAX_DEPTH + 1)
_LONG_INT = b"0" * LONG_INT_DIGITS
_DIGIT_RUNS = bytes(b if b in b"0123456789-" else 32 for b in range(256)).translate(
    bytes.maketrans(b"123456789", b"000000000")
)  # digits as 0, a minus as it is, every other byte a space (positions kept)
_FLOAT_PARTS = (b".", b"e", b"E", b"+")
LONG_INTS_READ = 16  # long numbers read exactly per body; past them the decoded values are walked
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class BodyScan:
    """The structure of a body fed chunk by chunk: containers, commas, depth, long integers."""

    __slots__ = ("_digits_tail", "_long_read", "_opens_tail", "commas", "containers", "deep", "depth", "escaped",
                 "in_string", "long_ints", "max_depth")  # fmt: skip

    def __init__(self) -> None:
        self.containers = 0  # `[` and `{` outside strings
        self.commas = 0  # `,` outside strings
        self.deep = False  # more than MAX_DEPTH opening brackets in a row: too deep for sure
        self.long_ints = False  # maybe an integer beyond 64 bits (outside strings): walk the values
        self.in_string = False
        self.escaped = False  # the last chunk ended in a backslash that escapes the next byte
        self.depth = 0  # of arrays and objects open at the end of what was fed
        self.max_depth = 0  # the deepest nesting seen (measured while within MAX_CONTAINERS)
        self._opens_tail = b""
        self._digits_tail = b""
        self._long_read = 0

    @property
    def values(self) -> int:
        """The values in the body, its own object included (an empty container counts one more)."""
        return self.containers + self.commas + 1

    def feed(self, chunk: bytes) -> None:
        text = chunk
        if self.escaped and text:
            text, self.escaped = text[1:], False
        if b"\\" in text:  # a memchr; most chunks of a chat body have no escape at all
            text = text.replace(b"\\\\", b"")
            if text.endswith(b"\\"):
                text, self.escaped = text[:-1], True
            text = text.replace(b'\\"', b"")
        if b'"' in text:
            parts = text.split(b'"')
            text = b"".join(parts[1::2] if self.in_string else parts[::2])
            self.in_string ^= len(parts) % 2 == 0
        elif self.in_string:
            return
        structure = text.translate(_STRUCTURE, _NOT_STRUCTURE)
        if not structure:
            return
        self.containers += structure.count(b"[")
        self.commas += structure.count(b",")
        brackets = structure.translate(None, b",0.")
        if self.containers <= MAX_CONTAINERS:  # past it the body is refused: its depth does not matter
            self._measure_depth(brackets)
        if not self.deep:  # a run may begin in an earlier chunk: its tail goes in front
            self.deep = _DEEP in brackets or _DEEP in self._opens_tail + brackets[:MAX_DEPTH]
            self._opens_tail = _tail(self._opens_tail, brackets, MAX_DEPTH)
        if not self.long_ints:
            if _LONG_INT in self._digits_tail + structure[:LONG_INT_DIGITS]:
                self.long_ints = True  # cut by the chunk's start: the decoded values will tell
            elif _LONG_INT in structure:  # a long number: read its digits (most chunks have none)
                self.long_ints = self._beyond_int64(text)
            self._digits_tail = _tail(self._digits_tail, structure, LONG_INT_DIGITS)

    def _beyond_int64(self, text: bytes) -> bool:
        """Whether `text` (outside strings) holds an integer beyond 64 bits; True too past
        LONG_INTS_READ long numbers in the body (the decoded values are walked then)."""
        runs = text.translate(_DIGIT_RUNS)
        at = runs.find(_LONG_INT)
        while at >= 0:
            if self._long_read >= LONG_INTS_READ:
                return True
            self._long_read += 1
            start, end = runs.rfind(b" ", 0, at) + 1, runs.find(b" ", at)
            if start == 0 or end < 0:
                return True  # at the chunk's edge, the number may go on in the next or the last
            digits = text[start:end].lstrip(b"-")  # a float's part when a point or an exponent is next to it
            if text[start - 1 : start] not in _FLOAT_PARTS and text[end : end + 1] not in _FLOAT_PARTS:
                if digits.isdigit() and (
                    len(digits) > LONG_INT_DIGITS or not INT64_MIN <= int(text[start:end]) <= INT64_MAX
                ):
                    return True
            at = runs.find(_LONG_INT, end)
        return False

    def _measure_depth(self, brackets: bytes) -> None:
        """max_depth and depth past this chunk's brackets. Split at each `]`, a piece is a run of
        `[`: the depth at its end is the depth before it plus the run, less the `]` before it;
        running sums in C iteration (no Python step per bracket, about 60 ns a `]`)."""
        runs = brackets.split(b"]")
        first = self.depth + len(runs[0])
        if len(runs) > 1:
            rest = itertools.accumulate(map(operator.add, map(len, runs[1:]), itertools.repeat(-1)), initial=first)
            self.max_depth = max(self.max_depth, max(rest))
        else:
            self.max_depth = max(self.max_depth, first)
        self.depth += len(brackets) - 2 * (len(runs) - 1)

    def over_budget(self) -> ApiError | None:
        """The 400 for a body with more values or containers than the gateway decodes, else None."""
        if self.values <= MAX_VALUES and self.containers <= MAX_CONTAINERS:
            return None
        if self.deep or self.max_depth > MAX_DEPTH:  # the more useful of the two messages
            message = f"The body nests arrays and objects more than {MAX_DEPTH} levels deep. Send a flatter body."
        else:
            message = (
                f"The body holds {self.values} JSON values in {self.containers} arrays and objects; this gateway "
                f"decodes at most {MAX_VALUES} values and {MAX_CONTAINERS} arrays and objects. Send a smaller body."
            )
        return ApiError(400, message, "invalid_request_error", code="invalid_value")


class ScannedBody(bytes):
    """A request body's bytes with the BodyScan made while it arrived (read_body's answer)."""

    scan: BodyScan

    def __new__(cls, data: bytes, scan: BodyScan) -> ScannedBody:
        body = super().__new__(cls, data)
        body.scan = scan
        return body


def _tail(before: bytes, new: bytes, size: int) -> bytes:
    """The last `size` bytes of before + new (without copying a long `new`)."""
    return new[-size:] if len(new) >= size else (before + new)[-size:]


def scan_of(raw: bytes) -> BodyScan:
    """`raw`'s scan: the one made as it arrived, or one made now (a body that did not come through
    read_body; a large one costs milliseconds here)."""
    if type(raw) is ScannedBody:
        return raw.scan
    scan = BodyScan()
    scan.feed(raw)
    return scan
