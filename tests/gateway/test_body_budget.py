"""gateway/server/body_scan.py and the decode it bounds: a body past the budget is refused before it is
decoded, one within it decodes in a small share of what Python's json took on the worst bodies,
large refused bodies are still explained, and read_body hands on its scan."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bench.body_parse import CHUNK, counted, filled, shapes
from common.config.gateway import GatewaySection
from gateway.endpoints.request import parse_call
from gateway.server.asgi import read_body
from gateway.server.body_scan import MAX_CONTAINERS, MAX_VALUES, BodyScan, ScannedBody
from gateway.server.errors import ApiError
from gateway.server.json_errors import EXPLAIN_BYTES
from gateway.server.strict_json import decode_object

HEAD = b'{"model": "m", "prompt": "x", '
PAD = b'"pad": "' + b"p" * EXPLAIN_BYTES + b'", '  # past EXPLAIN_BYTES: explained from msgspec's error


def refusal(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_call(raw, "/v1/completions", False, GatewaySection())
    assert info.value.status == 400 and len(info.value.message) < 300
    return info.value


def test_values_up_to_the_budget_pass_and_one_more_is_refused_before_decoding() -> None:
    # the body's object, "prompt"'s list, the ints: MAX_VALUES values in all
    ints = MAX_VALUES - 3
    raw = b'{"model": "m", "prompt": [' + b",".join([b"7"] * ints) + b"]}"
    assert len(parse_call(raw, "/v1/completions", False, GatewaySection()).body["prompt"]) == ints
    err = refusal(raw.replace(b"[7,", b"[7,7,", 1))
    assert err.param is None and f"at most {MAX_VALUES} values" in err.message


def test_arrays_and_objects_past_the_budget_are_refused() -> None:
    raw = HEAD + b'"x": [' + b",".join([b"{}"] * MAX_CONTAINERS) + b"]}"
    assert f"{MAX_CONTAINERS} arrays and objects" in refusal(raw).message
    within = HEAD + b'"x": [' + b",".join([b"{}"] * (MAX_CONTAINERS - 2)) + b"]}"
    assert parse_call(within, "/v1/completions", False, GatewaySection()).body["x"][-1] == {}


def test_a_body_past_the_budget_that_is_also_too_deep_says_too_deep() -> None:
    assert "levels deep" in refusal(HEAD + b'"x": ' + b"[" * 100_000).message


@pytest.mark.parametrize(
    ("fault", "param", "words"),
    [
        (b'"temperature": NaN', "temperature", "holds NaN, which is not a JSON number"),
        (b'"top_p": -Infinity', "top_p", "holds -Infinity"),
        (b'"temperature": 1.5e400', "temperature", "holds 1.5e400, which is too large"),
        (b'"stop": [1e999]', None, "holds 1e999"),
        (b'"seed": ' + b"9" * 5000, None, "4300 digits"),
        (b'"user": "\\ud800"', None, "lone surrogate"),
        (b'"user": "\\udc00 x"', None, "lone surrogate"),
        (b'"user": "\xff"', None, "not valid UTF-8"),
        (b'"user": tru', None, "not valid JSON"),
    ],
)
def test_a_large_refused_body_is_explained_from_msgspecs_error(fault: bytes, param: str | None, words: str) -> None:
    err = refusal(HEAD + PAD + fault + b"}")
    assert err.param == param and words in err.message, err.message


@pytest.mark.parametrize(
    ("value", "param"),
    [
        (b'{"a": {"b": [1, 9223372036854775808]}}', "x.a.b[1]"),
        (b"[[0, -9223372036854775809]]", "x[0][1]"),
        (b'{"odd key": {"b": 18446744073709551616}}', "x"),  # the path stops before a key it cannot name
        (b"[" + b"1" * 30 + b"]", "x[0]"),
    ],
)
def test_an_integer_beyond_64_bits_at_any_depth_is_named_by_its_path(value: bytes, param: str) -> None:
    err = refusal(HEAD + b'"x": ' + value + b"}")
    assert err.param == param and f"'{param}' is out of range" in err.message


@pytest.mark.parametrize(
    "value",
    [
        b'{"a": [9223372036854775807, -9223372036854775808]}',
        b'"12345678901234567890123"',
        b"[1.2345678901234567890123]",
    ],
)
def test_integers_within_64_bits_digits_in_strings_and_long_fractions_pass(value: bytes) -> None:
    assert parse_call(HEAD + b'"x": ' + value + b"}", "/v1/completions", False, GatewaySection()).model == "m"


@pytest.mark.parametrize("size", [777, 1 << 20], ids=["small chunks", "one chunk scanned in slices"])
async def test_read_body_hands_on_the_scan_of_its_chunks(size: int) -> None:
    raw = HEAD + b'"x": [' + b", ".join([b'{"a": "[\\\\\\"{"}'] * 5000) + b"]}"
    chunks = [raw[i : i + size] for i in range(0, len(raw), size)]
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1} for i, chunk in enumerate(chunks)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    body = await read_body(receive, {"headers": []}, 1 << 22)
    assert type(body) is ScannedBody and body == raw
    assert (body.scan.containers, body.scan.commas, body.scan.max_depth) == (5002, 4999 + 2, 3)
    assert decode_object(body)["x"][0] == {"a": '[\\"{'}


def test_no_step_on_any_worst_case_body_costs_a_twentieth_of_what_json_took() -> None:
    """The longest step of the new path (a chunk's scan as it arrives, or the decode with its
    checks) on each 4 MiB worst case and each largest body within the budget, against Python's
    json on the deep body, measured in this thread's CPU time now (a ratio: whatever the machine's
    speed and load). Before issue 35 the deep body alone took longer than that json.loads."""
    import json

    deep = filled(b"[" * 61 + b"]" * 61)
    started = time.thread_time()
    json.loads(deep)
    reference = time.thread_time() - started
    worst = {}
    for name, raw in [*shapes().items(), ("max strings", counted(b'"ab"', MAX_VALUES - 16))]:
        scan, longest = BodyScan(), 0.0
        for start in range(0, len(raw), CHUNK):
            chunk = raw[start : start + CHUNK]
            began = time.thread_time()
            scan.feed(chunk)
            longest = max(longest, time.thread_time() - began)
        body = ScannedBody(raw, scan)
        began = time.thread_time()
        try:
            decode_object(body)
        except ApiError:
            pass
        worst[name] = max(longest, time.thread_time() - began)
    assert max(worst.values()) < reference / 20, (reference, worst)
