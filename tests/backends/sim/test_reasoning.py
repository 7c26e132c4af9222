"""The sim as a reasoning model ([sim] reasoning_tokens), over real HTTP, in vLLM 0.32's shapes: the
first tokens as `reasoning` deltas, then `content`; completion_tokens_details.reasoning_tokens in the
usage; a non-streamed message with `reasoning` beside `content`; completions answer without reasoning."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from backends.sim.server.reasoning import num_reasoning
from backends.sim.testing import SimProcess, run_sim_process
from tests.sse import DONE, data_of

MODEL = "sim-reasoning"
REASONING = 3


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    config = Path(tmp_path_factory.mktemp("reasoning")) / "config.toml"
    config.write_text(f"[sim]\nreasoning_tokens = {REASONING}\n")
    with run_sim_process(model=MODEL, config=config) as process:
        yield process


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
        yield client


async def events(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    async with session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        async for raw in response.content:
            payload = data_of(raw)
            if payload is not None and payload != DONE:
                out.append(json.loads(payload))
    return out


def body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "think about it"}], "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, **extra}  # fmt: skip


def delta_kinds(chunks: list[dict[str, Any]]) -> list[str]:
    kinds = []
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            kinds += [name for name in ("reasoning", "content") if delta.get(name)]
    return kinds


async def test_reasoning_streams_first_then_the_answer(sim: SimProcess, session: aiohttp.ClientSession) -> None:
    # 70 tokens: the sim's 64 output words come round again, so a reasoning token's event kept for
    # its word would be sent again as an answer token
    chunks = await events(session, f"{sim.url}/v1/chat/completions", body(70))
    assert delta_kinds(chunks) == ["reasoning"] * REASONING + ["content"] * 67
    assert chunks[-1]["usage"]["completion_tokens"] == 70
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": REASONING}


async def test_continuous_usage_counts_the_reasoning_so_far(sim: SimProcess, session: aiohttp.ClientSession) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = await events(session, f"{sim.url}/v1/chat/completions", body(5, stream_options=options))
    counted = [c["usage"]["completion_tokens_details"]["reasoning_tokens"] for c in chunks if c["choices"]]
    assert counted == [0, 1, 2, 3, 3, 3]  # the role chunk, 3 reasoning tokens, 2 answer tokens


async def test_a_short_answer_is_all_reasoning(sim: SimProcess, session: aiohttp.ClientSession) -> None:
    chunks = await events(session, f"{sim.url}/v1/chat/completions", body(2))
    assert delta_kinds(chunks) == ["reasoning", "reasoning"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


async def test_the_whole_answer_has_reasoning_beside_content(sim: SimProcess, session: aiohttp.ClientSession) -> None:
    plain = {**body(6), "stream": False}
    del plain["stream_options"]
    async with session.post(f"{sim.url}/v1/chat/completions", json=plain) as response:
        answer = await response.json()
    message = answer["choices"][0]["message"]
    assert len(message["reasoning"].split()) == REASONING and len(message["content"].split()) == 3
    assert answer["usage"]["completion_tokens_details"] == {"reasoning_tokens": REASONING}


async def test_completions_answer_without_reasoning(sim: SimProcess, session: aiohttp.ClientSession) -> None:
    request = {k: v for k, v in body(4).items() if k != "messages"} | {"prompt": "think about it"}
    chunks = await events(session, f"{sim.url}/v1/completions", request)
    assert sum(1 for c in chunks for choice in c["choices"] if choice.get("text")) == 4
    assert "completion_tokens_details" not in chunks[-1]["usage"] or not chunks[-1]["usage"].get(
        "completion_tokens_details"
    )


def test_a_share_is_of_max_tokens_and_a_count_is_capped() -> None:
    assert num_reasoning(0.25, 100) == 25
    assert num_reasoning(40, 100) == 40
    assert num_reasoning(400, 100) == 100
    assert num_reasoning(0.0, 100) == 0
