"""n > 1 and lists of prompts on the served sim, over real HTTP, in vLLM 0.32's shapes: a sequence
per choice in the engine, one choice per chunk with its own continuous usage, index =
prompt_index * n + i, the request's sums in the final usage (each prompt's tokens once)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from backends.sim.testing import SimProcess, run_sim_process
from tests.backends.sim._client import metrics, stream

MODEL = "sim-choices"
LABEL = f'{{model_name="{MODEL}"}}'
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with run_sim_process("--time-scale", "1", "--max-model-len", "4096", model=MODEL) as process:
        yield process


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
        yield client


def _words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def _text(choice: dict[str, Any]) -> str:
    return str(choice["delta"].get("content", "")) if "delta" in choice else str(choice["text"])


def _per_choice(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The chunks that carry a choice, by choice index (each chunk must carry exactly one)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        if event["choices"]:
            [choice] = event["choices"]
            out.setdefault(choice["index"], []).append(event)
    return out


def _check_choice(chunks: list[dict[str, Any]], num_prompt: int, num_tokens: int, chat: bool) -> None:
    """One choice's chunks: (chat) its role chunk, then one chunk per token whose usage counts this
    choice's tokens so far, the last one carrying finish_reason, and no other finish."""
    if chat:
        role, chunks = chunks[0], chunks[1:]
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert role["usage"]["prompt_tokens"] == num_prompt and role["usage"]["completion_tokens"] == 0
    assert [c["usage"]["completion_tokens"] for c in chunks] == list(range(1, num_tokens + 1))
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {num_prompt}
    assert all(c["usage"]["total_tokens"] == num_prompt + c["usage"]["completion_tokens"] for c in chunks)
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons == [None] * (num_tokens - 1) + ["length"]
    assert len("".join(_text(c["choices"][0]) for c in chunks).split()) == num_tokens


async def test_chat_n3_streams_each_choice_with_its_own_usage_and_the_sums_last(sim, session) -> None:
    num_prompt, num_tokens = 7, 5
    body = {
        "messages": [{"role": "user", "content": _words(num_prompt, "c")}],
        "n": 3,
        "max_tokens": num_tokens,
        "ignore_eos": True,
        "stream_options": CONTINUOUS,
    }
    result = await stream(session, f"{sim.url}/v1/chat/completions", body)
    assert result.done
    # the three role chunks come first, together (vLLM: on the request's first output)
    assert [e["choices"][0]["index"] for e in result.events[:3]] == [0, 1, 2]
    assert all(e["choices"][0]["delta"].get("role") == "assistant" for e in result.events[:3])
    by_choice = _per_choice(result.events)
    assert sorted(by_choice) == [0, 1, 2]
    for chunks in by_choice.values():
        _check_choice(chunks, num_prompt, num_tokens, chat=True)
    # interleaved as the steps make them: choice 2's first token comes before choice 0's last
    order = [(e["choices"][0]["index"], e["choices"][0]["finish_reason"]) for e in result.events if e["choices"]]
    assert order.index((2, None), 3) < order.index((0, "length"))
    texts = {"".join(_text(c["choices"][0]) for c in chunks) for chunks in by_choice.values()}
    assert len(texts) == 3  # three sequences, three outputs
    final = result.events[-1]
    assert final["choices"] == []
    assert final["usage"]["prompt_tokens"] == num_prompt  # once, not n times
    assert final["usage"]["completion_tokens"] == 3 * num_tokens
    assert final["usage"]["total_tokens"] == num_prompt + 3 * num_tokens


async def test_completions_three_prompts_n2_index_per_prompt_usage_and_sums(sim, session) -> None:
    lengths, n, num_tokens = [2, 5, 9], 2, 4
    before = await metrics(session, sim.url)
    body = {
        "prompt": [_words(k, f"p{k}x") for k in lengths],
        "n": n,
        "max_tokens": num_tokens,
        "ignore_eos": True,
        "stream_options": CONTINUOUS,
    }
    result = await stream(session, f"{sim.url}/v1/completions", body)
    assert result.done
    by_choice = _per_choice(result.events)
    assert sorted(by_choice) == list(range(len(lengths) * n))
    for index, chunks in by_choice.items():
        _check_choice(chunks, lengths[index // n], num_tokens, chat=False)  # index = prompt_index * n + i
    final = result.events[-1]
    assert final["choices"] == []
    assert final["usage"]["prompt_tokens"] == sum(lengths)
    assert final["usage"]["completion_tokens"] == len(lengths) * n * num_tokens
    assert final["usage"]["total_tokens"] == sum(lengths) + len(lengths) * n * num_tokens
    # six sequences in the engine: each finished, each counted its prompt and its tokens
    after = await metrics(session, sim.url)
    finished = f'vllm:request_success_total{{finished_reason="length",model_name="{MODEL}"}}'
    assert after[finished] - before.get(finished, 0) == len(lengths) * n
    prompt_total = f"vllm:prompt_tokens_total{LABEL}"
    assert after[prompt_total] - before[prompt_total] == n * sum(lengths)


async def test_token_id_prompts_without_usage_have_their_indices_and_no_usage(sim, session) -> None:
    body = {"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 3, "ignore_eos": True, "stream_options": {}}
    result = await stream(session, f"{sim.url}/v1/completions", body)
    assert result.done and sorted(_per_choice(result.events)) == [0, 1]
    assert [e for e in result.events if "usage" in e] == []
    assert len(result.token_times_s) == 6


async def test_not_streamed_bodies_hold_every_choice_and_the_sums(sim, session) -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": _words(4, "m")}], "n": 3, "max_tokens": 6}
    body["ignore_eos"] = True
    async with session.post(f"{sim.url}/v1/chat/completions", json=body) as response:
        assert response.status == 200
        chat = await response.json()
    assert chat["object"] == "chat.completion"
    assert [c["index"] for c in chat["choices"]] == [0, 1, 2]
    for choice in chat["choices"]:
        assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
        assert len(choice["message"]["content"].split()) == 6
    assert len({c["message"]["content"] for c in chat["choices"]}) == 3
    usage = {"prompt_tokens": 4, "total_tokens": 22, "completion_tokens": 18, "prompt_tokens_details": None}
    assert chat["usage"] == usage

    lengths = [3, 1, 6]
    body = {"prompt": [_words(k, f"q{k}x") for k in lengths], "n": 2, "max_tokens": 2, "ignore_eos": True}
    async with session.post(f"{sim.url}/v1/completions", json=body) as response:
        assert response.status == 200
        completion = await response.json()
    assert completion["object"] == "text_completion"
    assert [c["index"] for c in completion["choices"]] == list(range(6))
    assert all(len(c["text"].split()) == 2 and c["finish_reason"] == "length" for c in completion["choices"])
    usage = completion["usage"]  # each prompt once: 3 + 1 + 6; every choice's tokens: 6 x 2
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (10, 12, 22)


@pytest.mark.parametrize(
    ("path", "body", "num_seqs"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": _words(40, "ab")}], "n": 3}, 3),
        ("/v1/completions", {"prompt": [_words(40, "ac"), _words(20, "ad")], "n": 2}, 4),
    ],
)
async def test_a_client_that_leaves_aborts_every_choice(sim, session, path, body, num_seqs) -> None:
    request = {**body, "max_tokens": 3000, "ignore_eos": True, "stream": True}
    aborted = f'vllm:request_success_total{{finished_reason="abort",model_name="{MODEL}"}}'
    before = (await metrics(session, sim.url)).get(aborted, 0)
    async with session.post(f"{sim.url}{path}", json=request) as response:
        seen = set()
        async for raw in response.content:
            if raw.startswith(b"data: {"):
                seen.add(raw[raw.index(b'"index":') :][:10])
            if len(seen) >= num_seqs:
                break  # every choice has streamed
        busy = await metrics(session, sim.url)
        assert busy[f"vllm:num_requests_running{LABEL}"] == num_seqs
        assert busy[f"vllm:kv_cache_usage_perc{LABEL}"] > 0
        response.close()  # drop the connection mid-stream
    deadline = time.monotonic() + 10
    after = await metrics(session, sim.url)
    while after[f"vllm:num_requests_running{LABEL}"] != 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        after = await metrics(session, sim.url)
    assert after[f"vllm:num_requests_running{LABEL}"] == 0
    assert after[f"vllm:num_requests_waiting{LABEL}"] == 0
    assert after[f"vllm:kv_cache_usage_perc{LABEL}"] == 0
    assert after[aborted] - before == num_seqs


async def test_a_client_that_leaves_before_the_first_token_aborts_every_choice_unmade(session) -> None:
    """Gone during the prefill (a step of seconds at time-scale 200): every choice is aborted by the
    handler at once, none of them ever makes a token (no write fails to tell the engine)."""
    n = 3
    with run_sim_process("--time-scale", "200", model=MODEL) as slow:
        before = await metrics(session, slow.url)
        body = {"prompt": _words(200, "slow"), "n": n, "max_tokens": 50, "ignore_eos": True, "stream": True}
        async with session.post(f"{slow.url}/v1/completions", json=body) as response:
            assert response.status == 200  # the headers: every choice is in the engine
            busy = await metrics(session, slow.url)
            assert busy[f"vllm:num_requests_running{LABEL}"] + busy[f"vllm:num_requests_waiting{LABEL}"] == n
            response.close()
        deadline = time.monotonic() + 30
        after = busy
        while time.monotonic() < deadline and (
            after[f"vllm:num_requests_running{LABEL}"] or after[f"vllm:num_requests_waiting{LABEL}"]
        ):
            await asyncio.sleep(0.05)
            after = await metrics(session, slow.url)
    assert after[f"vllm:num_requests_running{LABEL}"] == after[f"vllm:num_requests_waiting{LABEL}"] == 0
    first_tokens = f"vllm:time_to_first_token_seconds_count{LABEL}"
    assert after[first_tokens] == before[first_tokens]  # aborted before any was made
    aborted = f'vllm:request_success_total{{finished_reason="abort",model_name="{MODEL}"}}'
    assert after[aborted] - before.get(aborted, 0) == n
