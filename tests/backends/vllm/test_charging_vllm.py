"""What the gateway charges for the request shapes vLLM streams per choice (issue 35), checked
against vLLM itself: a cut `n = 2` stream is charged every choice's tokens (vLLM's continuous
usage on each chunk is that chunk's choice's only), and a non-streamed request, which the gateway
asks for as a stream and puts together (gateway/relay/assemble.py), gets vLLM's own non-streamed answer.
The tier's shared replica behind the real gateway (tests/conftest.py's vllm_pool)."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any

import pytest

from tests.backends.vllm.pool import MODEL, UNIFIED, Pool, metric, post

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = [{"role": "user", "content": "Say something about tokens."}]


@pytest.fixture
def pool(vllm_pool: Pool) -> Pool:
    return vllm_pool


def charged_completion(pool: Pool) -> float:
    return metric(pool.gateway_url, "zerogap_tokens_total", {"kind": "completion"}, absent=0.0)


def read_then_cut(pool: Pool, body: dict[str, Any], num_tokens: int) -> dict[int, int]:
    """Content chunks read per choice index until num_tokens came in all, then the connection dropped."""
    conn = http.client.HTTPConnection("127.0.0.1", pool.gateway_port, timeout=120)
    headers = {"Authorization": f"Bearer {UNIFIED}", "Content-Type": "application/json"}
    per_choice: dict[int, int] = {}
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        response = conn.getresponse()
        assert response.status == 200
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                if choice.get("delta", {}).get("content"):
                    per_choice[choice["index"]] = per_choice.get(choice["index"], 0) + 1
            if sum(per_choice.values()) >= num_tokens:
                break
    finally:
        conn.close()
    return per_choice


def test_a_cut_n2_stream_is_charged_both_choices(pool: Pool) -> None:
    before = charged_completion(pool)
    engine_before = metric(pool.engine_url, "vllm:generation_tokens_total")
    body = {"model": MODEL, "messages": PROMPT, "n": 2, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    per_choice = read_then_cut(pool, body, 60)
    assert set(per_choice) == {0, 1}, per_choice  # vLLM interleaves the two choices
    deadline = time.monotonic() + 60
    while charged_completion(pool) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    charged = charged_completion(pool) - before
    made = metric(pool.engine_url, "vllm:generation_tokens_total") - engine_before
    # every token the client read was charged (before: about half, the last chunk's choice's count),
    # and no more than the engine made for the request
    assert sum(per_choice.values()) <= charged <= made, (per_choice, charged, made)


def differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Where two JSON values differ: (path, a's value, b's value)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in {*a, *b} for d in differences(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [(path, a, b)]


def without_ids(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k not in ("id", "created")}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": PROMPT, "max_tokens": 12}),
        (
            "/v1/chat/completions",
            {"messages": PROMPT, "max_tokens": 8, "n": 2, "logprobs": True, "top_logprobs": 2, "temperature": 1.0},
        ),  # n > 1 is not greedy: the seed makes it repeatable
        ("/v1/completions", {"prompt": ["one two three", "four five"], "max_tokens": 8, "n": 2, "temperature": 1.0}),
        ("/v1/completions", {"prompt": "one two three", "max_tokens": 8, "echo": True}),
        ("/v1/completions", {"prompt": "one two three", "max_tokens": 8, "return_token_ids": True}),
        # echo with logprobs: vLLM adds the prompt's logprobs, which it never streams: sent unstreamed
        ("/v1/completions", {"prompt": "one two three", "max_tokens": 8, "logprobs": 2, "echo": True}),
    ],
)
def test_a_non_streamed_answer_is_vllms_own(pool: Pool, path: str, body: dict[str, Any]) -> None:
    """Greedy (temperature 0) or seeded, so the engine answers the same twice: the gateway's answer, put
    together from a stream, equals vLLM's own non-streamed one field for field, usage included."""
    body = {"model": MODEL, "temperature": 0, "seed": 7, **body}
    direct = post(pool.engine_url + path, body)
    via = post(pool.gateway_url + path, body)
    assert without_ids(via) == without_ids(direct), differences(without_ids(via), without_ids(direct))
    assert list(via) == list(direct)  # the same fields in the same order
