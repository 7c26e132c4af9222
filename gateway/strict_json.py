"""Decode a request body as strict JSON: what the gateway checks is what the engine will read,
and no body, however built, ends in a 500.

- UTF-8 only (RFC 8259 section 8.1): bytes that are not UTF-8, encoded surrogates included, are refused.
- No NaN, Infinity or -Infinity (Python's json reads them; they are not JSON), and no number
  so large that it overflows a float (1e400 would be read as inf and re-encoded as Infinity).
- CPython refuses integers of more than 4300 digits (a ValueError); that becomes a 400 too.
- At most MAX_DEPTH levels of arrays and objects. The C decoder recurses, and 200,000 `[` raise
  RecursionError (caught); a body that parses is measured (in bytes operations) only when it has
  more than MAX_DEPTH brackets at all, which a typical chat body has not (two bytes.count calls).
- No lone surrogate (a `\\ud800` escape without its pair): a tokenizer cannot encode one, and
  an engine that answers it with a 500 would count against a healthy backend.
- Duplicate keys: the last one counts, as in Python's json, FastAPI (vLLM), Go and JavaScript,
  so the gateway reads the value the engine reads; fields the gateway drops go in every copy.

Every refusal is an ApiError 400 whose `param` names the top-level field when it can be told.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from gateway.errors import ApiError

MAX_DEPTH = 64  # levels of arrays/objects, the body's own object included
NAME_DEEP_FIELD_BYTES = 256 * 1024  # a larger body nested too deep is refused without the field's name
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # any \uD800-\uDFFF escape: a pair or a lone half
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'"[]{}'))


def invalid(message: str, param: str | None = None, status: int = 400) -> ApiError:
    return ApiError(status, message, "invalid_request_error", param=param, code="invalid_value")


class _Refused(ValueError):
    """A literal the decoder met that is not a finite JSON number; `text` as written."""

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


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def decode_object(raw: bytes) -> dict[str, Any]:
    """The body as a dict, or ApiError 400 saying what is wrong with it."""
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise invalid(f"The body is not valid UTF-8 (byte {exc.start}). Send JSON encoded as UTF-8.") from None
    try:
        body = _DECODER.decode(text)
    except RecursionError:
        raise _too_deep(None) from None
    except _Refused as exc:
        raise _bad_number(raw, exc.text) from None
    except json.JSONDecodeError as exc:
        raise invalid(f"The body is not valid JSON ({exc}). Send a JSON object.") from None
    except ValueError:  # CPython's limit on the digits of an int
        param = _field_before(raw, rb"-?[0-9]{4301}")
        raise invalid(
            f"{_where(param)}holds an integer of more than 4300 digits. Send numbers that fit their fields.", param
        ) from None
    if not isinstance(body, dict):
        raise invalid("The body must be a JSON object.")
    if raw.count(b"{") + raw.count(b"[") > MAX_DEPTH and not _depth_of_json_within(raw, MAX_DEPTH):
        raise _too_deep(_deep_field(body) if len(raw) <= NAME_DEEP_FIELD_BYTES else None)
    if _SURROGATE_ESCAPE.search(raw) is not None:
        _check_surrogates(body)
    return body


def _where(param: str | None) -> str:
    return f"'{param}' " if param else "The body "


def _too_deep(param: str | None) -> ApiError:
    return invalid(
        f"{_where(param)}nests arrays and objects more than {MAX_DEPTH} levels deep. Send a flatter body.", param
    )


def _bad_number(raw: bytes, text: str) -> ApiError:
    param = _field_before(raw, re.escape(text.encode()))
    what = "is not a JSON number" if text in ("NaN", "Infinity", "-Infinity") else "is too large for a number"
    return invalid(f"{_where(param)}holds {text[:40]}, which {what}. Send a finite number.", param)


def _field_before(raw: bytes, value_pattern: bytes) -> str | None:
    """The key written right before a value matching value_pattern (an error's field); None if
    the value is not a key's own value or the key is escaped. Runs only on the error path."""
    found = re.search(rb'"([A-Za-z0-9_.-]{1,64})"\s*:\s*' + value_pattern, raw)
    return found.group(1).decode() if found else None


def _depth_of_json_within(raw: bytes, max_depth: int) -> bool:
    """Whether valid JSON `raw` nests at most max_depth levels, in bytes operations only (no Python
    loop per value; a third of the decoder's time on a body of tool schemas). Escaped backslashes
    and quotes go first (outside strings there are none), then everything but quotes and brackets;
    strings with no bracket then are `""` pairs, and removing a pair leaves every other byte inside
    or outside a string as it was; the rest of the strings go by splitting at quotes. What is left
    is the structure's brackets, balanced: each pass of removing `[]` takes off one level."""
    text = raw
    if b"\\" in text:  # one byte: a memchr
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = text.translate(_ONE_KIND, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in brackets:
        brackets = b"".join(brackets.split(b'"')[::2])
    for _ in range(max_depth):
        if not brackets:
            return True
        brackets = brackets.replace(b"[]", b"")
    return not brackets


def _deep_field(body: dict[str, Any]) -> str | None:
    """The first top-level field nested too deep (a walk of the values: only on the error path, and
    only for bodies small enough that the walk costs little)."""
    deep = (key for key, value in body.items() if not _depth_within(value, MAX_DEPTH - 1))
    return field_name(next(deep, ""))


def _depth_within(node: Any, max_depth: int) -> bool:
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


def field_name(key: str) -> str | None:
    """`key` if it is safe to repeat in a message and a log line (a plain name), else None."""
    return key if _NAME.fullmatch(key) else None


def _check_surrogates(body: dict[str, Any]) -> None:
    """Refuse a lone surrogate anywhere in the body; runs only when the bytes have a surrogate escape
    (emoji written as \\ud83d\\ude00 pairs pass)."""
    for key, value in body.items():
        try:
            json.dumps([key, value], ensure_ascii=False).encode()
        except UnicodeEncodeError:
            param = field_name(key)
            raise invalid(
                f"{_where(param)}holds a lone surrogate (a \\ud800-\\udfff escape without its pair), "
                "which is not text. Send valid Unicode.",
                param,
            ) from None
