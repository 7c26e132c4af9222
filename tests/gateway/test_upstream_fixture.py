"""The test upstream itself: timing, lengths, usage, failure modes, recording."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import aiohttp
import pytest

from common.net import free_port, wait_for_port
from common.process_group import stop_process
from tests.fixtures.upstream import Behavior, UpstreamServer


def sse_events(raw: bytes) -> list[str]:
    return [e[len("data: ") :] for e in raw.decode().split("\n\n") if e.startswith("data: ")]


async def post(url: str, body: dict) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.read()


async def test_streams_with_role_chunk_usage_and_done() -> None:
    with UpstreamServer(Behavior(num_output_tokens=5, tokens_per_chunk=2), model="m") as up:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "a b c"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        status, raw = await post(up.url + "/v1/chat/completions", body)
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    texts = [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]]
    assert texts == [" t0 t1", " t2 t3", " t4"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert up.requests[0].finished and not up.requests[0].disconnected


async def test_max_tokens_ignore_eos_and_whole_body() -> None:
    with UpstreamServer(Behavior(num_output_tokens=4)) as up:
        _, raw = await post(up.url + "/v1/completions", {"model": "x", "prompt": "hi", "max_tokens": 9})
        capped = json.loads(raw)
        _, raw = await post(
            up.url + "/v1/completions", {"model": "x", "prompt": "hi", "max_tokens": 9, "ignore_eos": True}
        )
        forced = json.loads(raw)
        _, raw = await post(up.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True})
    assert capped["usage"]["completion_tokens"] == 4 and capped["choices"][0]["finish_reason"] == "stop"
    assert forced["usage"]["completion_tokens"] == 9 and forced["choices"][0]["finish_reason"] == "length"
    events = sse_events(raw)
    assert all("usage" not in json.loads(e) for e in events[:-1])  # not asked for
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


async def test_timing_is_honoured() -> None:
    with UpstreamServer(Behavior(ttft_s=0.2, interval_s=0.05, num_output_tokens=5)) as up:
        start = time.monotonic()
        async with (
            aiohttp.ClientSession() as s,
            s.post(up.url + "/v1/completions", json={"prompt": "x", "stream": True}) as resp,
        ):
            first = None
            async for _ in resp.content.iter_any():
                first = first or time.monotonic() - start
        total = time.monotonic() - start
    assert first is not None and 0.18 <= first < 1.0
    assert 0.38 <= total < 2.0


async def test_failure_modes_and_metrics() -> None:
    with UpstreamServer(Behavior(fail_status=503, num_failures=1, extra_waiting=3)) as up:
        status, _ = await post(up.url + "/v1/completions", {"prompt": "x"})
        assert status == 503
        status, _ = await post(up.url + "/v1/completions", {"prompt": "x"})
        assert status == 200
        async with aiohttp.ClientSession() as s, s.get(up.url + "/metrics") as resp:
            text = await resp.text()
        assert 'vllm:num_requests_waiting{model_name="test-model"} 3.0' in text
        up.behavior.close_after_tokens = 2
        with pytest.raises(aiohttp.ClientPayloadError):
            await post(up.url + "/v1/completions", {"prompt": "x", "stream": True})
        up.behavior.healthy = False
        async with aiohttp.ClientSession() as s, s.get(up.url + "/health") as resp:
            assert resp.status == 503


async def test_client_disconnect_is_recorded_and_restart_on_same_port() -> None:
    with UpstreamServer(Behavior(ttft_s=5)) as up:
        async with aiohttp.ClientSession() as s:
            async with s.post(up.url + "/v1/completions", json={"prompt": "x", "stream": True}) as resp:
                assert resp.status == 200
        assert up.wait_for(lambda u: bool(u.requests) and u.requests[0].disconnected, 3)
        port = up.port
        up.stop()
        with pytest.raises(aiohttp.ClientConnectionError):
            await post(up.url + "/v1/completions", {"prompt": "x"})
        up.start()
        up.behavior.ttft_s = 0
        assert up.port == port
        status, _ = await post(up.url + "/v1/completions", {"prompt": "x"})
        assert status == 200


async def test_keep_requests_bounds_the_record() -> None:
    """A long soak's record is bounded: between keep_requests and twice that, the newest last."""
    with UpstreamServer(model="m", keep_requests=3) as up:
        for i in range(10):
            status, _ = await post(up.url + "/v1/completions", {"model": "m", "prompt": f"p{i}", "max_tokens": 1})
            assert status == 200
            assert len(up.requests) <= 5
    assert len(up.requests) >= 3 and up.requests[-1].body["prompt"] == "p9"


def test_runs_as_its_own_process() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fixtures.upstream",
            "--port",
            str(port),
            "--model",
            "sub",
            "--num-output-tokens",
            "3",
        ]
    )
    try:
        wait_for_port(port, 120, proc)
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as resp:
            assert json.loads(resp.read())["data"][0]["id"] == "sub"
    finally:
        stop_process(proc)


# n > 1 and prompt lists, in vLLM 0.32's shapes (serving_chat.py / serving_completion.py)

CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def by_choice(chunks: list[dict]) -> dict[int, list[dict]]:
    """The chunks that carry a choice, by index; each carries exactly one."""
    out: dict[int, list[dict]] = {}
    for chunk in chunks:
        if chunk["choices"]:
            [choice] = chunk["choices"]
            out.setdefault(choice["index"], []).append(chunk)
    return out


def check_choice(chunks: list[dict], prompt_tokens: int, num_tokens: int, chat: bool) -> None:
    """(chat: its role chunk, then) a chunk per token counting this choice's tokens so far, the last
    one carrying the finish_reason."""
    if chat:
        role, chunks = chunks[0], chunks[1:]
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert role["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}
    usages = [c["usage"] for c in chunks]
    assert [u["completion_tokens"] for u in usages] == list(range(1, num_tokens + 1))
    assert all(u["prompt_tokens"] == prompt_tokens for u in usages)
    assert all(u["total_tokens"] == prompt_tokens + u["completion_tokens"] for u in usages)
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons == [None] * (num_tokens - 1) + ["length"]


async def test_chat_n3_streams_one_choice_per_chunk_with_its_own_usage_and_the_sums_last() -> None:
    with UpstreamServer(Behavior(num_output_tokens=10), model="m") as up:
        body = {
            "messages": [{"role": "user", "content": "a b c d"}],
            "n": 3,
            "max_tokens": 4,
            "stream": True,
            "stream_options": CONTINUOUS,
        }
        status, raw = await post(up.url + "/v1/chat/completions", body)
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["index"] for c in chunks[:3]] == [0, 1, 2]  # the role chunks, together, first
    choices = by_choice(chunks)
    assert sorted(choices) == [0, 1, 2]
    for chunk_list in choices.values():
        check_choice(chunk_list, 4, 4, chat=True)
    # interleaved: a step's chunk for each choice, in index order
    assert [c["choices"][0]["index"] for c in chunks[3:-1]] == [0, 1, 2] * 4
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert up.requests[0].num_tokens_sent == 12 and up.requests[0].tokens_by_choice == [4, 4, 4]


async def test_completions_prompt_list_n2_index_per_prompt_usage_and_sums() -> None:
    prompts = ["a b", "c d e f g", "h"]
    with UpstreamServer(Behavior(num_output_tokens=3, tokens_per_chunk=2)) as up:
        body = {"prompt": prompts, "n": 2, "stream": True, "stream_options": CONTINUOUS}
        _, raw = await post(up.url + "/v1/completions", body)
        up.behavior.tokens_per_chunk = 1
        ids_body = {"prompt": [[1, 2, 3], [4]], "max_tokens": 2, "stream": True, "stream_options": CONTINUOUS}
        _, ids_raw = await post(up.url + "/v1/completions", ids_body)
    chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
    choices = by_choice(chunks)
    assert sorted(choices) == [0, 1, 2, 3, 4, 5]
    for index, chunk_list in choices.items():
        lengths = [len(p.split()) for p in prompts]
        usages = [c["usage"] for c in chunk_list]
        assert [u["completion_tokens"] for u in usages] == [2, 3]  # two tokens, then the last one
        assert {u["prompt_tokens"] for u in usages} == {lengths[index // 2]}  # index = prompt_index * n + i
        assert [c["choices"][0]["finish_reason"] for c in chunk_list] == [None, "stop"]
        assert "".join(c["choices"][0]["text"] for c in chunk_list) == " t0 t1 t2"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 8, "completion_tokens": 18, "total_tokens": 26}
    chunks = [json.loads(e) for e in sse_events(ids_raw)[:-1]]
    choices = by_choice(chunks)
    check_choice(choices[0], 3, 2, chat=False)
    check_choice(choices[1], 1, 2, chat=False)
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}


async def test_not_streamed_bodies_hold_every_choice_and_report_usage_false_has_none() -> None:
    with UpstreamServer(Behavior(num_output_tokens=3)) as up:
        chat_body = {"messages": [{"role": "user", "content": "a b"}], "n": 3}
        _, raw = await post(up.url + "/v1/chat/completions", chat_body)
        chat = json.loads(raw)
        _, raw = await post(up.url + "/v1/completions", {"prompt": ["a", "b c", "d e f"], "n": 2, "max_tokens": 2})
        completion = json.loads(raw)
        up.behavior.report_usage = False
        _, raw = await post(up.url + "/v1/completions", {"prompt": ["a", "b c"], "n": 2})
        bare = json.loads(raw)
        stream_body = {**chat_body, "stream": True, "stream_options": CONTINUOUS}
        _, raw = await post(up.url + "/v1/chat/completions", stream_body)
        bare_events = sse_events(raw)
    assert [c["index"] for c in chat["choices"]] == [0, 1, 2]
    for choice in chat["choices"]:
        assert choice["message"] == {"role": "assistant", "content": " t0 t1 t2"}
        assert choice["finish_reason"] == "stop"
    assert chat["usage"] == {"prompt_tokens": 2, "completion_tokens": 9, "total_tokens": 11}
    assert [c["index"] for c in completion["choices"]] == [0, 1, 2, 3, 4, 5]
    assert all(c["text"] == " t0 t1" and c["finish_reason"] == "length" for c in completion["choices"])
    assert completion["usage"] == {"prompt_tokens": 6, "completion_tokens": 12, "total_tokens": 18}
    assert len(bare["choices"]) == 4 and "usage" not in bare
    assert bare_events[-1] == "[DONE]"
    assert [json.loads(e) for e in bare_events[:-1] if "usage" in json.loads(e)] == []
    assert len(by_choice([json.loads(e) for e in bare_events[:-1]])) == 3


async def raw_stream(port: int, path: str, body: dict) -> tuple[list[str], bool]:
    """POST over a bare socket and read to the end, however it ends: the SSE data events that came
    and whether the chunked body was ended properly (aiohttp may drop what it buffered when the
    connection breaks)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    writer.write(head.encode() + b"Connection: close\r\n\r\n" + data)
    raw = b""
    try:
        while chunk := await reader.read(65536):
            raw += chunk
    except ConnectionResetError:
        pass
    writer.close()
    _, body_bytes = raw.split(b"\r\n\r\n", 1)
    payload, ended = b"", False
    while body_bytes:
        size_line, _, rest = body_bytes.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            ended = True
            break
        if len(rest) < size + 2:
            break  # cut inside a chunk
        payload, body_bytes = payload + rest[:size], rest[size + 2 :]
    return sse_events(payload), ended


@pytest.mark.parametrize(("cut", "num_finished"), [(30, 6), (32, 8)])
async def test_cut_after_chunks_drops_the_connection_without_done_or_usage(cut: int, num_finished: int) -> None:
    """n = 8, 4 tokens each: 32 content chunks. Cut after 30: choices 0-5 ended, 6 and 7 did not; cut
    after 32: every token went out, but still no final usage and no [DONE]."""
    with UpstreamServer(Behavior(num_output_tokens=4, cut_after_chunks=cut)) as up:
        body = {
            "messages": [{"role": "user", "content": "a b"}],
            "n": 8,
            "stream": True,
            "stream_options": CONTINUOUS,
        }
        events, ended = await raw_stream(up.port, "/v1/chat/completions", body)
        assert up.wait_for(lambda u: u.requests[0].disconnected, 5)
    assert not ended and "[DONE]" not in events
    chunks = [json.loads(e) for e in events]
    assert all(c["choices"] for c in chunks)  # no usage-only chunk
    content = [c for c in chunks if "role" not in c["choices"][0]["delta"]]
    assert len(content) == cut and len(chunks) == cut + 8
    finishes = [c["choices"][0]["index"] for c in content if c["choices"][0]["finish_reason"]]
    assert finishes == list(range(num_finished))
    seen = up.requests[0]
    assert not seen.finished and seen.num_tokens_sent == cut
    assert seen.tokens_by_choice == [4] * num_finished + [3] * (8 - num_finished)
