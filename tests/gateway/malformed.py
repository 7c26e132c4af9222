"""A corpus of malformed completion bodies, each as (path, name, bytes): the gateway must answer
every one with a 4xx (or serve it, where it is valid after all), never a 5xx or a traceback."""

from __future__ import annotations

import copy
import itertools
import json
import random
from typing import Any

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
GOOD_CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3}
GOOD_COMPLETION: dict[str, Any] = {"model": "m", "prompt": "hi there", "max_tokens": 3}

# every field the gateway reads, as a path into the body (a number: a list index)
READ_FIELDS: list[tuple[str, tuple[str | int, ...]]] = [
    (CHAT, ("model",)),
    (CHAT, ("stream",)),
    (CHAT, ("stream_options",)),
    (CHAT, ("stream_options", "include_usage")),
    (CHAT, ("stream_options", "continuous_usage_stats")),
    (CHAT, ("messages",)),
    (CHAT, ("messages", 0)),
    (CHAT, ("messages", 0, "role")),
    (CHAT, ("messages", 0, "content")),
    (CHAT, ("max_tokens",)),
    (CHAT, ("max_completion_tokens",)),
    (CHAT, ("n",)),
    (CHAT, ("tools",)),
    (CHAT, ("priority",)),
    (COMPLETIONS, ("prompt",)),
    (COMPLETIONS, ("prompt", 0)),
    (COMPLETIONS, ("max_tokens",)),
    (COMPLETIONS, ("best_of",)),
    (COMPLETIONS, ("seed",)),
]
HUGE_INT = "9" * 5000  # past CPython's 4300-digit limit
WRONG_VALUES = [
    "null", "true", "false", "0", "-1", "1.5", "2.0", '""', '"x"', "[]", "[1]", "[[]]", "{}", '{"a": 1}',
    "1" + "0" * 400, HUGE_INT, "-" + HUGE_INT, "1e400", "-1e400", "NaN", "Infinity", "-Infinity",
    "9223372036854775808", '"\\ud800"', '"\\udc00x"', '"\\u0000"', '"' + "x" * 100_000 + '"',
    "[" * 100 + "]" * 100,
]  # fmt: skip
BAD_BYTES = [b"\xff", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\x00"]


def with_value(body: dict[str, Any], path: tuple[str | int, ...], literal: str) -> bytes:
    """`body` with the value at `path` replaced by a JSON literal written as is (NaN, 10**400 ...)."""
    marker = "@@VALUE@@"
    body = copy.deepcopy(body)
    target: Any = body
    for step, following in itertools.pairwise(path):
        kind = list if isinstance(following, int) else dict
        if isinstance(step, str) and not isinstance(target.get(step), kind):
            target[step] = [None] if kind is list else {}
        target = target[step]
    target[path[-1]] = marker
    return json.dumps(body).replace(f'"{marker}"', literal).encode()


def _nesting() -> list[tuple[str, str, bytes]]:
    good = json.dumps(GOOD_CHAT).encode()
    return [
        (CHAT, "200k [", b"[" * 200_000),
        (CHAT, "200k {", b'{"a":' * 200_000),
        (CHAT, "200k [ closed", b"[" * 200_000 + b"]" * 200_000),
        (CHAT, "deep objects closed", b'{"a":' * 5000 + b"1" + b"}" * 5000),
        (CHAT, "deep in a field", good[:-1] + b', "tools": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        (CHAT, "deep content", good.replace(b'"hi there"', b"[" * 50_000 + b"]" * 50_000)),
        (CHAT, "65 levels", good[:-1] + b', "tools": ' + b"[" * 64 + b"]" * 64 + b"}"),
        (CHAT, "deep unclosed in a field", good[:-1] + b', "x": ' + b"[{" * 100_000),
    ]


def _numbers_and_types() -> list[tuple[str, str, bytes]]:
    cases = []
    for path, field in READ_FIELDS:
        good = GOOD_CHAT if path == CHAT else GOOD_COMPLETION
        for literal in WRONG_VALUES:
            cases.append((path, f"{'.'.join(map(str, field))}={literal[:20]}", with_value(good, field, literal)))
    return cases


def _text() -> list[tuple[str, str, bytes]]:
    good = json.dumps(GOOD_CHAT).encode()
    cases = [(CHAT, f"bytes {bad!r} in content", good.replace(b"hi there", b"hi" + bad)) for bad in BAD_BYTES]
    cases += [(CHAT, f"bytes {bad!r} in a key", good.replace(b'"role"', b'"r' + bad + b'"')) for bad in BAD_BYTES]
    cases += [
        (CHAT, "utf-8 bom", b"\xef\xbb\xbf" + good),
        (CHAT, "utf-16", json.dumps(GOOD_CHAT).encode("utf-16")),
        (CHAT, "utf-32", json.dumps(GOOD_CHAT).encode("utf-32")),
        (CHAT, "lone surrogate key", good.replace(b'"role"', b'"\\ud800"')),
        (CHAT, "huge string", good.replace(b"hi there", b"x " * 1_500_000)),
        (CHAT, "huge model", with_value(GOOD_CHAT, ("model",), '"' + "m" * 1_000_000 + '"')),
        (CHAT, "huge key", good[:-1] + b', "' + b"k" * 1_000_000 + b'": 1}'),
        (CHAT, "many keys", good[:-1] + b"".join(b', "k%d": %d' % (i, i) for i in range(50_000)) + b"}"),
        (CHAT, "duplicate keys", good[:-1] + b', "model": "m", "max_tokens": 1' + b"0" * 30 + b"}"),
        (CHAT, "control characters", good.replace(b"hi there", b"hi\x01\x1f")),
        (CHAT, "empty", b""),
        (CHAT, "whitespace", b" \n\t "),
        (CHAT, "two objects", good + good),
        (CHAT, "trailing comma", good[:-1] + b",}"),
        (CHAT, "single quotes", good.replace(b'"', b"'")),
        (CHAT, "comment", b"/* x */" + good),
    ]
    return cases


def _truncated_and_random(seed: int = 20) -> list[tuple[str, str, bytes]]:
    rng = random.Random(seed)
    good = json.dumps({**GOOD_CHAT, "stream": True, "stream_options": {"include_usage": True}}).encode()
    cases = [(CHAT, f"cut at {i}", good[:i]) for i in range(0, len(good), 5)]
    for i in range(40):
        mutated = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        cases.append((CHAT, f"mutation {i}", bytes(mutated)))
    cases += [(CHAT, f"random {i}", rng.randbytes(rng.choice([1, 10, 1000, 100_000]))) for i in range(20)]
    return cases


def corpus() -> list[tuple[str, str, bytes]]:
    return _nesting() + _numbers_and_types() + _text() + _truncated_and_random()
