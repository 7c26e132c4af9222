"""Property tests of parse_call over random JSON (hypothesis): any body is either a Call whose
upstream body keeps the gateway's promises, or an ApiError 400; never another exception."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.config.gateway import GatewaySection
from gateway.endpoints.request import parse_call
from gateway.server import strict_json
from gateway.server.body_scan import BodyScan, ScannedBody
from gateway.server.errors import ApiError
from gateway.server.json_errors import depth_within

SETTINGS = GatewaySection(max_tokens_limit=1000, default_max_tokens=300)
FIELDS = ["model", "stream", "stream_options", "messages", "prompt", "max_tokens", "max_completion_tokens", "n"]
FIELDS += ["best_of", "priority", "seed", "temperature", "tools"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
good_messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=20)}),
    min_size=1,
    max_size=3,
)
field_values = {
    "model": st.just("m") | values,
    "stream": st.booleans() | values,
    "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans() | values, "continuous_usage_stats": st.booleans() | values}
    )
    | values,
    "messages": good_messages | values,
    "prompt": st.text(min_size=1, max_size=20) | st.lists(st.integers(0, 50_000), min_size=1, max_size=5) | values,
    "max_tokens": st.integers(-5, 2000) | values,
    "max_completion_tokens": st.integers(-5, 2000) | values,
    "n": st.integers(-1, 200) | values,
}
bodies = st.fixed_dictionaries(
    {"model": field_values["model"]},
    optional={name: field_values.get(name, values) for name in FIELDS if name != "model"},
)


def check(raw: bytes, chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    try:
        call = parse_call(raw, path, chat, SETTINGS)
    except ApiError as exc:
        assert exc.status == 400 and exc.message and exc.type == "invalid_request_error"
        return
    sent: dict[str, Any] = json.loads(call.body_for(None))
    assert sent == json.loads(call.body_for(call.model)) and sent["model"] == call.model
    assert "priority" not in sent
    if call.stream or call.assembled:  # assembled: streamed upstream, put together for the client
        assert sent["stream_options"] == {
            **sent["stream_options"],
            "include_usage": True,
            "continuous_usage_stats": True,
        }
        assert call.stream or (sent["stream"] is True and not call.client_wants_usage)
    else:
        assert "stream_options" not in sent and not call.client_wants_usage
    asked = [sent.get("max_tokens"), sent.get("max_completion_tokens")]
    assert any(isinstance(a, int) for a in asked) and all(a is None or 1 <= a <= 1000 for a in asked)
    assert 1 <= call.budget_tokens <= 1000 * 128
    assert call.client_wants_usage or not call.client_wants_continuous_usage


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, chat=st.booleans())
def test_any_body_is_a_call_that_keeps_the_promises_or_a_400(body: dict[str, Any], chat: bool) -> None:
    check(json.dumps(body).encode(), chat)


@settings(max_examples=150, deadline=None, database=None)
@given(value=values, chat=st.booleans())
def test_any_json_value_is_a_400_or_a_call(value: Any, chat: bool) -> None:
    check(json.dumps(value).encode(), chat)


@settings(max_examples=150, deadline=None, database=None)
@given(raw=st.binary(max_size=200), chat=st.booleans())
def test_any_bytes_are_a_400_or_a_call(raw: bytes, chat: bool) -> None:
    check(raw, chat)


@settings(max_examples=150, deadline=None, database=None)
@given(body=bodies, cut=st.integers(0, 10_000), byte=st.integers(0, 255))
def test_mutated_bodies_are_a_400_or_a_call(body: dict[str, Any], cut: int, byte: int) -> None:
    raw = bytearray(json.dumps(body).encode())
    raw[cut % len(raw)] = byte
    check(bytes(raw), True)


valid_bodies = st.fixed_dictionaries(
    {"model": st.text(min_size=1, max_size=10), "messages": good_messages},
    optional={
        "stream": st.booleans() | st.none(),
        "stream_options": st.fixed_dictionaries(
            {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
        ),
        "max_tokens": st.integers(1, 1000),
        "max_completion_tokens": st.integers(1, 1000),
        "n": st.integers(1, 128),
        "priority": st.integers(-(2**63), 2**63 - 1),
        "temperature": st.floats(0, 2),
        "seed": st.integers(-(2**63), 2**63 - 1),
    },
)


@settings(max_examples=150, deadline=None, database=None)
@given(body=valid_bodies)
def test_valid_bodies_are_always_accepted_and_keep_the_promises(body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    call = parse_call(raw, "/v1/chat/completions", True, SETTINGS)  # no ApiError
    check(raw, True)
    options = body.get("stream_options", {})
    assert call.client_wants_usage == (bool(body.get("stream")) and options.get("include_usage") is True)
    per_choice = body.get("max_completion_tokens") or body.get("max_tokens") or 300
    assert call.budget_tokens == per_choice * body.get("n", 1)


tricky_text = st.text(alphabet='[]{}"\\ab/u', max_size=12)
nested_values = st.recursive(
    st.none() | st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
    max_leaves=30,
)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def containers_and_commas(value: Any) -> tuple[int, int]:
    if not isinstance(value, (dict, list)):
        return 0, 0
    items = list(value.values()) if isinstance(value, dict) else value
    counts = [containers_and_commas(item) for item in items]
    return 1 + sum(c for c, _ in counts), max(len(items) - 1, 0) + sum(k for _, k in counts)


def scanned(raw: bytes, cuts: list[int]) -> BodyScan:
    """`raw` fed to a BodyScan in the pieces `cuts` makes (as chunks arrive)."""
    scan = BodyScan()
    bounds = [0, *sorted(c % (len(raw) + 1) for c in cuts), len(raw)]
    for start, end in itertools.pairwise(bounds):
        scan.feed(raw[start:end])
    return scan


@settings(max_examples=300, deadline=None, database=None)
@given(
    value=nested_values,
    indent=st.sampled_from([None, 1]),
    ascii_only=st.booleans(),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
)
def test_the_structure_read_from_the_bytes_is_the_structure_of_the_value(
    value: Any, indent: int | None, ascii_only: bool, cuts: list[int]
):
    """Strings full of brackets, quotes and backslashes, cut anywhere into chunks, do not fool the
    bytes-only scan: its counts and depth are the value's."""
    raw = json.dumps(value, indent=indent, ensure_ascii=ascii_only).encode()
    scan = scanned(raw, cuts)
    assert (scan.containers, scan.commas) == containers_and_commas(value)
    assert not scan.in_string and not scan.escaped
    actual = depth(value)
    assert (scan.max_depth, scan.depth) == (actual, 0), raw
    for max_depth in {max(actual - 1, 0), actual, actual + 1}:
        assert depth_within(value, max_depth) == (actual <= max_depth)


big_ints = st.integers(min_value=-(2**70), max_value=2**70)
int_values = st.recursive(
    st.none() | big_ints | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b c", "d"]), inner, max_size=3),
    max_leaves=20,
)


def outside_int64(value: Any) -> bool:
    if isinstance(value, dict):
        return any(outside_int64(v) for v in value.values())
    if isinstance(value, list):
        return any(outside_int64(v) for v in value)
    return type(value) is int and not -(2**63) <= value < 2**63


@settings(max_examples=300, deadline=None, database=None)
@given(value=int_values, cuts=st.lists(st.integers(0, 10_000), max_size=4))
def test_an_integer_beyond_64_bits_is_found_at_any_depth(value: Any, cuts: list[int]):
    body = {"x": value}
    raw = json.dumps(body).encode()
    scan = scanned(raw, cuts)
    assert scan.long_ints >= outside_int64(value)  # the scan never misses one
    if not cuts:  # and, with no chunk's edge to cut a number, is exact
        assert scan.long_ints == outside_int64(value)
    found, path = strict_json.int64_outside(body, ScannedBody(raw, scan))
    assert found == outside_int64(value)
    if found:
        assert path is not None and path.startswith("x")
