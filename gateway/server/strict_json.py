"""Decode a request body as strict JSON: what the gateway checks is what the engine will read,
no body, however built, ends in a 500, and none costs the event loop more than a few milliseconds.

- UTF-8 only (RFC 8259 section 8.1): bytes that are not UTF-8, encoded surrogates included, are refused.
- No NaN, Infinity or -Infinity (Python's json reads them; they are not JSON), and no number
  so large that it overflows a float (1e400 would be read as inf and re-encoded as Infinity).
- No integer of more than 4300 digits (CPython's limit); gateway/endpoints/request.py bounds every integer,
  at any depth, to 64 bits.
- At most MAX_DEPTH levels of arrays and objects.
- No lone surrogate (a `\\ud800` escape without its pair): a tokenizer cannot encode one, and
  an engine that answers it with a 500 would count against a healthy backend.
- Duplicate keys: the last one counts, as in Python's json, FastAPI (vLLM), Go and JavaScript,
  so the gateway reads the value the engine reads; fields the gateway drops go in every copy.
- At most MAX_VALUES values and MAX_CONTAINERS arrays and objects (gateway/server/body_scan.py counts them
  as the body arrives, before any is decoded).

The decoder is msgspec's (C, no Python call per value, garbage collection paused while it builds):
4 to 10 times Python's json on numbers, with the hooks that refused NaN and overflow. Every refusal
is an ApiError 400 whose `param` names the field when it can be told (gateway/server/json_errors.py).
"""

from __future__ import annotations

import gc
from typing import Any

import msgspec

from gateway.server.body_scan import INT64_MAX, INT64_MIN, MAX_DEPTH, scan_of
from gateway.server.json_errors import depth_within, explain, field_name, invalid, too_deep

__all__ = ["MAX_DEPTH", "NAME_DEEP_FIELD_BYTES", "decode_object", "field_name", "int64_outside", "invalid"]

NAME_DEEP_FIELD_BYTES = 256 * 1024  # a larger body nested too deep is refused without the field's name
_NUMBERS = (int, float, bool)
MAX_PATH = 200  # characters of a field path named in a message
_DECODER = msgspec.json.Decoder()


def decode_object(raw: bytes) -> dict[str, Any]:
    """The body as a dict, or ApiError 400 saying what is wrong with it."""
    scan = scan_of(raw)
    refused = scan.over_budget()
    if refused is not None:
        raise refused
    collecting = gc.isenabled()
    gc.disable()  # the decoder allocates only what it returns: nothing for the collector to find
    try:
        body = _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise explain(raw, scan, exc) from None
    finally:
        if collecting:
            gc.enable()
    if type(body) is not dict:
        raise invalid("The body must be a JSON object.")
    if scan.max_depth > MAX_DEPTH:
        raise too_deep(_deep_field(body) if len(raw) <= NAME_DEEP_FIELD_BYTES else None)
    return body


def _deep_field(body: dict[str, Any]) -> str | None:
    """The first top-level field nested too deep (only on the error path, for bodies small enough
    that the walk costs little)."""
    deep = (key for key, value in body.items() if not depth_within(value, MAX_DEPTH - 1))
    return field_name(next(deep, ""))


def int64_outside(body: dict[str, Any], raw: bytes) -> tuple[bool, str | None]:
    """Whether an integer beyond 64 bits stands anywhere in `body`, and its path
    (`tools[0].parameters.maximum`; it stops before a key that is not a plain name, and at
    MAX_PATH characters). The values are walked only when the body's scan read such an integer
    outside its strings, or past the first LONG_INTS_READ long numbers, or a run of 19 digits or
    more cut by a chunk's edge. A list of numbers (token ids) is passed by its min and max (C)."""
    if not scan_of(raw).long_ints:
        return False, None
    stack: list[tuple[Any, str, bool]] = [(body, "", False)]
    while stack:
        node, path, stopped = stack.pop()
        if type(node) is list and _numbers_within_int64(node):
            continue
        for key, value in node.items() if type(node) is dict else enumerate(node):
            kind = type(value)
            if kind is int:
                if INT64_MIN <= value <= INT64_MAX:
                    continue
            elif kind is not dict and kind is not list:
                continue
            below, stop = path, stopped
            if not stopped:
                named = type(key) is int or field_name(str(key)) is not None
                step = f"{path}[{key}]" if type(key) is int else f"{path}.{key}" if path else str(key)
                stop = not named or len(step) > MAX_PATH
                below = path if stop else step
            if kind is int:
                return True, below or None
            stack.append((value, below, stop))
    return False, None


def _numbers_within_int64(items: list[Any]) -> bool:
    """Whether `items` are numbers all within 64 bits (False: not only numbers, or one beyond)."""
    if not items or type(items[0]) not in _NUMBERS:
        return False
    try:
        low, high = min(items), max(items)
    except TypeError:  # numbers and other values
        return False
    return type(low) in _NUMBERS and type(high) in _NUMBERS and INT64_MIN <= low and high <= INT64_MAX
