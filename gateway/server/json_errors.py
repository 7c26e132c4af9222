"""Why a body that msgspec refused is not strict JSON, as a 400 that names the field.

gateway/server/strict_json.py decodes with msgspec, which refuses what the gateway refuses (bytes that are
not UTF-8, NaN and Infinity, numbers that overflow, integers of more than 4300 digits, lone
surrogates, nesting past the interpreter's recursion limit) but says little about where. So a
refused body is decoded again, to say why, by the decoder the gateway had before (Python's json with
hooks for the literals, then the depth and surrogate checks): the same messages as ever. It costs up
to ten times msgspec's time, so it runs only on bodies small enough (EXPLAIN_BYTES, EXPLAIN_VALUES)
that it stays within a few milliseconds; a larger body gets the message from msgspec's own error
and the bytes around the position it names.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec

from gateway.server.body_scan import MAX_DEPTH, BodyScan
from gateway.server.errors import ApiError

EXPLAIN_BYTES = 256 * 1024  # a refused body this small (and with few values) is explained by Python's json
EXPLAIN_VALUES = 8192
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_KEY_BEFORE = re.compile(rb'"([A-Za-z0-9_.-]{1,64})"[ \t\n\r]*:[ \t\n\r]*\Z')
_AT_BYTE = re.compile(r"\(byte (\d+)\)")
_LITERALS = (b"-Infinity", b"NaN", b"Infinity")  # msgspec points at the I of -Infinity
_NUMBER_BYTES = bytes(
    b"0"[0] if byte in b"0123456789" else b"e"[0] if byte in b"eE" else byte if byte in b".+-" else b" "[0]
    for byte in range(256)
)  # digits as 0, E as e, the rest of a number as it is, every other byte a space
_CANDIDATES = 64  # literals tried per pattern before the message goes without the literal
_PADDED = msgspec.json.Decoder()


def invalid(message: str, param: str | None = None, status: int = 400) -> ApiError:
    return ApiError(status, message, "invalid_request_error", param=param, code="invalid_value")


def field_name(key: str) -> str | None:
    """`key` if it is safe to repeat in a message and a log line (a plain name), else None."""
    return key if _NAME.fullmatch(key) else None


def where(param: str | None) -> str:
    return f"'{param}' " if param else "The body "


def too_deep(param: str | None) -> ApiError:
    return invalid(
        f"{where(param)}nests arrays and objects more than {MAX_DEPTH} levels deep. Send a flatter body.", param
    )


def bad_number(param: str | None, text: str) -> ApiError:
    what = "is not a JSON number" if text in ("NaN", "Infinity", "-Infinity") else "is too large for a number"
    return invalid(f"{where(param)}holds {text[:40]}, which {what}. Send a finite number.", param)


def huge_int(param: str | None) -> ApiError:
    return invalid(
        f"{where(param)}holds an integer of more than 4300 digits. Send numbers that fit their fields.", param
    )


def lone_surrogate(param: str | None) -> ApiError:
    return invalid(
        f"{where(param)}holds a lone surrogate (a \\ud800-\\udfff escape without its pair), which is not text. "
        "Send valid Unicode.",
        param,
    )


def not_utf8(exc: UnicodeDecodeError) -> ApiError:
    return invalid(f"The body is not valid UTF-8 (byte {exc.start}). Send JSON encoded as UTF-8.")


def explain(raw: bytes, scan: BodyScan, exc: Exception) -> ApiError:
    """The 400 for `raw`, which msgspec refused with `exc`."""
    if isinstance(exc, RecursionError):
        return too_deep(None)
    if len(raw) <= EXPLAIN_BYTES and scan.values <= EXPLAIN_VALUES:
        try:
            _decode_with_json(raw)
        except ApiError as err:
            return err
    return _from_msgspec(raw, str(exc))


class _Refused(ValueError):
    """A literal Python's json met that is not a finite JSON number; `text` as written."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _no_constant(text: str) -> float:
    raise _Refused(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused(text)
    return value


_JSON = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def _decode_with_json(raw: bytes) -> None:
    """The gateway's checks before msgspec, in their order (the first fault found is the one
    named): UTF-8, JSON with finite numbers, an object, depth, surrogates."""
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise not_utf8(exc) from None
    try:
        body = _JSON.decode(text)
    except RecursionError:
        raise too_deep(None) from None
    except _Refused as exc:
        raise bad_number(_field_before(raw, re.escape(exc.text.encode())), exc.text) from None
    except json.JSONDecodeError as exc:
        raise invalid(f"The body is not valid JSON ({exc}). Send a JSON object.") from None
    except ValueError:  # CPython's limit on the digits of an int
        raise huge_int(_field_before(raw, rb"-?[0-9]{4301}")) from None
    if not isinstance(body, dict):
        raise invalid("The body must be a JSON object.")
    deep = next((key for key, value in body.items() if not depth_within(value, MAX_DEPTH - 1)), None)
    if deep is not None:
        raise too_deep(field_name(deep))
    check_surrogates(body)


def _field_before(raw: bytes, value_pattern: bytes) -> str | None:
    """The key written right before a value matching value_pattern (an error's field); None if
    the value is not a key's own value or the key is escaped."""
    found = re.search(rb'"([A-Za-z0-9_.-]{1,64})"\s*:\s*' + value_pattern, raw)
    return found.group(1).decode() if found else None


def depth_within(node: Any, max_depth: int) -> bool:
    """Whether `node` nests at most max_depth levels of arrays/objects (a scalar: 0), level by level."""
    level = [node] if type(node) is dict or type(node) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            return False
        below: list[Any] = []
        for item in level:
            values = item.values() if type(item) is dict else item
            below += [v for v in values if type(v) is dict or type(v) is list]
        level = below
    return True


def _from_msgspec(raw: bytes, message: str) -> ApiError:
    """The 400 from msgspec's message and the bytes it points at (bounded work on any body)."""
    try:
        raw.decode()
    except UnicodeDecodeError as exc:
        return not_utf8(exc)
    if message == "Input data was truncated" and b"\\u" in raw:
        try:  # or a lone high surrogate near the end: msgspec wants 6 more bytes for its pair
            _PADDED.decode(raw + b" " * 6)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            message = str(exc)
    at = _AT_BYTE.search(message)
    position = int(at.group(1)) if at else -1
    if "surrogate" in message or "hex escape" in message:
        return lone_surrogate(None)
    for literal in _LITERALS:
        start = position - (literal == b"-Infinity")
        if position >= 0 and raw.startswith(literal, start):
            return bad_number(_key_before(raw, start), literal.decode())
    if message.startswith("Number out of range"):
        start, text = _overflowing(raw)
        return bad_number(_key_before(raw, start) if text else None, text or "a number")
    if message.startswith("Integer value out of range"):
        return huge_int(None)
    detail = message.removeprefix("JSON is malformed: ")
    return invalid(f"The body is not valid JSON ({detail}). Send a JSON object.")


def _overflowing(raw: bytes) -> tuple[int, str | None]:
    """Where the first literal that overflows a float stands, and its text (None: not found among
    the first candidates). A candidate has an exponent of 3 digits or more, or 309 digits before
    its point; numbers are found in a copy of the body with every other byte a space (a regex
    over megabytes of numbers backtracks for seconds)."""
    numbers = raw.translate(_NUMBER_BYTES)
    for needle in (b"0e000", b"0e+000", b"0" * 309):
        at = numbers.find(needle)
        for _ in range(_CANDIDATES):
            if at < 0:
                break
            start, end = numbers.rfind(b" ", 0, at) + 1, numbers.find(b" ", at)
            text = raw[start : end if end >= 0 else len(raw)].decode()
            try:
                if math.isinf(float(text)):
                    return start, text
            except ValueError:
                pass
            at = numbers.find(needle, end) if end >= 0 else -1
    return -1, None


def _key_before(raw: bytes, position: int) -> str | None:
    """The key written right before the value at `position`, if it is a plain name."""
    found = _KEY_BEFORE.search(raw, max(0, position - 80), position)
    return found.group(1).decode() if found else None


def check_surrogates(body: dict[str, Any]) -> None:
    """Refuse a lone surrogate anywhere in the body (emoji written as \\ud83d\\ude00 pairs pass)."""
    for key, value in body.items():
        try:
            json.dumps([key, value], ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise lone_surrogate(field_name(key)) from None
