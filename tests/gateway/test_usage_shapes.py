"""Every request shape is charged what it used (issue 35): a non-streamed request the client
abandons midway, a list of prompts against tpm, and the answer a non-streamed client gets now
that the gateway asks the backend for a stream (gateway/relay/assemble.py). Real gateway over HTTP,
the fixture upstream in vLLM's shape; charges read from /admin/usage."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, make_config, post, wait_until
from tests.gateway.test_usage_charged import ADMIN, charged, new_key

VLLM_TOP = {  # vLLM 0.32's non-streamed answers (ChatCompletionResponse, CompletionResponse), id and created aside
    "/v1/chat/completions": ["object", "model", "choices", "service_tier", "system_fingerprint", "usage",
                             "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
                             "ec_transfer_params", "metrics"],
    "/v1/completions": ["object", "model", "choices", "service_tier", "system_fingerprint", "usage",
                        "kv_transfer_params", "ec_transfer_params", "metrics"],
}  # fmt: skip


def holds(got: object, want: object) -> bool:
    """got has every field of want, equal (lists item by item, dicts key by key; more keys allowed)."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and holds(got[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(holds, got, want))
    return got == want


def raw_request(port: int, key: str, path: str, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


async def test_a_non_streamed_request_abandoned_midway_is_charged_what_the_engine_made(tmp_path) -> None:
    """Before, the engine made ~582 tokens for 3 such requests and 0 were charged. Now the backend
    is asked for a stream, the client's leaving closes it (the engine stops), and the key pays
    for every token that reached the gateway."""
    behavior = Behavior(num_output_tokens=3000, interval_s=0.005)
    with UpstreamServer(behavior, model="m") as up:
        config = make_config(tmp_path, [("b0", up.url, "m")], admin_key=ADMIN)
        with GatewayServer(config) as gs:
            key = new_key(gs, "gone")
            sock = raw_request(config.server.port, key, "/v1/chat/completions", chat_body(stream=False))
            try:
                assert await wait_until(lambda: bool(up.requests) and up.requests[0].num_tokens_sent >= 100, 20)
            finally:
                sock.close()
            assert await wait_until(lambda: up.requests[0].disconnected, 10)  # the engine was told to stop
            row = await charged(gs, "gone")
    made = up.requests[0].num_tokens_sent
    assert up.requests[0].body["stream"] is True and made < 3000
    assert 0.9 * made <= row["completion_tokens"] <= made
    assert row["prompt_tokens"] > 0


async def test_the_non_streamed_answer_is_the_backends_own_shape(tmp_path) -> None:
    """What the client gets equals what the backend answers to the same request not streamed
    (id and created aside), usage included; chat and completions."""
    with UpstreamServer(Behavior(num_output_tokens=12), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
            for path, body in [
                ("/v1/chat/completions", chat_body(stream=False, max_tokens=12)),
                ("/v1/completions", {"model": "m", "prompt": "one two three", "max_tokens": 12}),
            ]:
                status, _, via = await post(gs.url + path, body, auth())
                assert status == 200, via
                status, _, direct = await post(up.url + path, body)
                assert status == 200
                got, want = json.loads(via), json.loads(direct)
                for answer in (got, want):
                    answer.pop("id"), answer.pop("created")
                assert holds(got, want)  # vLLM's fields beside (None where the stream had none)
                assert list(got) == VLLM_TOP[path]
    assert all(seen.body["stream"] is True for seen in up.requests[::2])


async def test_tpm_counts_every_prompt_of_a_list(tmp_path) -> None:
    """100 prompts x max_tokens 200 may make 20,000 tokens: beyond a 3,000 tpm key at once."""
    with UpstreamServer(Behavior(num_output_tokens=4), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], admin_key=ADMIN)) as gs:
            key = new_key(gs, "lists", tpm=3000)
            body = {"model": "m", "prompt": ["a b c"] * 100, "max_tokens": 200}
            status, _, raw = await post(gs.url + "/v1/completions", body, auth(key))
            assert status == 400, raw
            error = json.loads(raw)["error"]
            assert error["code"] == "request_exceeds_tpm" and "20000" in error["message"].replace(",", "")
            small = {"model": "m", "prompt": ["a b c"] * 10, "max_tokens": 20}
            status, _, raw = await post(gs.url + "/v1/completions", small, auth(key))
            assert status == 200, raw
    assert len(up.requests) == 1
    await asyncio.sleep(0)


def content_chunks(raw: bytes) -> int:
    """Content chunks the client got, over every choice (chat deltas or completion texts)."""
    num = 0
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices") or []:
                num += bool((choice.get("delta") or {}).get("content") or choice.get("text"))
    return num


async def cut_stream_charge(tmp_path, path: str, body: dict, cut: int, shown: dict | None) -> tuple[int, int, int]:
    """(chunks the client got, completion tokens charged, tokens the upstream sent) for a stream
    the upstream cuts after `cut` content chunks (no [DONE], no final usage)."""
    with UpstreamServer(Behavior(num_output_tokens=90, cut_after_chunks=cut), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], admin_key=ADMIN)) as gs:
            key = new_key(gs, "multi")
            stream_body = {**body, "stream": True, **({"stream_options": shown} if shown else {})}
            status, _, raw = await post(gs.url + path, stream_body, auth(key))
            assert status == 200
            row = await charged(gs, "multi")
    return content_chunks(raw), row["completion_tokens"], up.requests[0].num_tokens_sent


@pytest.mark.parametrize("shown", [None, {"include_usage": True, "continuous_usage_stats": True}])
async def test_a_cut_n8_chat_stream_is_charged_every_choice(tmp_path, shown) -> None:
    """Before: 720 chunks relayed, 90 charged (the last chunk's usage is its own choice's)."""
    body = chat_body(n=8, max_tokens=90)
    got, completion, sent = await cut_stream_charge(tmp_path, "/v1/chat/completions", body, 700, shown)
    assert got == 700 and sent == 700
    assert 0.95 * got <= completion <= sent


async def test_a_cut_stream_of_10_prompts_is_charged_every_prompt(tmp_path) -> None:
    """Before: 900 relayed, 90 charged; now each choice's last usage, summed, each prompt once."""
    body = {"model": "m", "prompt": [f"prompt number {i}" for i in range(10)], "max_tokens": 90}
    got, completion, sent = await cut_stream_charge(tmp_path, "/v1/completions", body, 880, None)
    assert got == 880 == sent
    assert 0.95 * got <= completion <= sent
