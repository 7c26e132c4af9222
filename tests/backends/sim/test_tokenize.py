"""POST /tokenize and POST /detokenize of the sim, over real HTTP: vLLM's shapes, the ids the
sim counts a prompt with (count = usage.prompt_tokens), and ids that read back as the text."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from backends.sim.engine import words
from backends.sim.server.tokenize_api import LearnedWords
from backends.sim.testing import SimProcess, run_sim_process
from tests.backends.sim._client import stream

MODEL = "sim-tok"
PROMPT = "the  quick brown fox\njumps over Zyzzyva's 42 lazy-dogs"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with run_sim_process("--time-scale", "1", "--max-model-len", "512", model=MODEL) as process:
        yield process


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
        yield client


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json()


async def test_tokenize_answers_vllms_shape_with_the_sims_ids(sim, session):
    status, body = await post(session, f"{sim.url}/tokenize", {"model": MODEL, "prompt": PROMPT})
    assert status == 200
    assert set(body) == {"count", "max_model_len", "tokens", "token_strs"}
    assert body["tokens"] == [words.token_id(w) for w in PROMPT.split()]
    assert body["tokens"][:2] == [words.WORDS.index("the"), words.WORDS.index("quick")]
    assert all(type(t) is int and 0 <= t < words.VOCAB_SIZE for t in body["tokens"])
    assert body["count"] == 9 and body["max_model_len"] == 512 and body["token_strs"] is None
    _, strs = await post(session, f"{sim.url}/tokenize", {"prompt": PROMPT, "return_token_strs": True})
    assert strs["token_strs"] == PROMPT.split() and strs["tokens"] == body["tokens"]
    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}],
            "add_generation_prompt": True, "add_special_tokens": False}  # fmt: skip
    _, counted = await post(session, f"{sim.url}/tokenize", chat)
    assert counted["count"] == 11 and counted["tokens"][2:] == body["tokens"]


async def test_count_is_the_prompt_tokens_the_sim_reports(sim, session):
    messages = [{"role": "user", "content": [{"type": "text", "text": PROMPT}, {"type": "text", "text": "and more"}]}]
    _, chat = await post(session, f"{sim.url}/tokenize", {"model": MODEL, "messages": messages})
    _, done = await post(session, f"{sim.url}/v1/chat/completions", {"messages": messages, "max_tokens": 2})
    assert chat["count"] == done["usage"]["prompt_tokens"] == 11
    streamed = await stream(
        session,
        f"{sim.url}/v1/chat/completions",
        {"messages": messages, "max_tokens": 2, "stream_options": {"include_usage": True}},
    )
    assert streamed.events[-1]["usage"]["prompt_tokens"] == chat["count"]
    _, text = await post(session, f"{sim.url}/tokenize", {"prompt": PROMPT})
    _, completion = await post(session, f"{sim.url}/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
    assert text["count"] == completion["usage"]["prompt_tokens"] == 9
    _, by_ids = await post(session, f"{sim.url}/v1/completions", {"prompt": text["tokens"], "max_tokens": 1})
    assert by_ids["usage"]["prompt_tokens"] == text["count"]


async def test_detokenize_reads_the_ids_back(sim, session):
    _, tokenized = await post(session, f"{sim.url}/tokenize", {"prompt": PROMPT})
    status, back = await post(session, f"{sim.url}/detokenize", {"model": MODEL, "tokens": tokenized["tokens"]})
    assert status == 200 and back == {"prompt": " ".join(PROMPT.split())}
    _, again = await post(session, f"{sim.url}/tokenize", {"prompt": back["prompt"]})
    assert again["tokens"] == tokenized["tokens"]
    _, completion = await post(session, f"{sim.url}/v1/completions", {"prompt": "hi", "max_tokens": 6})
    output = completion["choices"][0]["text"]
    _, ids = await post(session, f"{sim.url}/tokenize", {"prompt": output})
    _, text = await post(session, f"{sim.url}/detokenize", {"tokens": ids["tokens"]})
    assert text["prompt"] == output.strip() and ids["count"] == completion["usage"]["completion_tokens"] == 6
    unseen = words.token_id("never-tokenized-here")
    _, shown = await post(session, f"{sim.url}/detokenize", {"tokens": [0, unseen]})
    assert shown["prompt"] == f"the <id {unseen}>"


USER_X = [{"role": "user", "content": "x"}]
BAD = [
    ("/tokenize", {"prompt": 12}, "prompt"),
    ("/tokenize", {"prompt": ["a", "b"]}, "prompt"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"prompt": "x", "return_token_strs": 1}, "return_token_strs"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": [{"content": "x"}]}, "messages"),
    (
        "/tokenize",
        {"messages": USER_X, "continue_final_message": True, "add_generation_prompt": True},
        "continue_final_message",
    ),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/detokenize", {"tokens": [1, True]}, "tokens"),
    ("/detokenize", {"tokens": [1, 2.0]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [words.VOCAB_SIZE]}, "tokens"),
    ("/detokenize", [1, 2], None),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD)
async def test_bad_input_is_a_400_in_the_openai_error_shape(sim, session, path, body, param):
    status, data = await post(session, f"{sim.url}{path}", body)
    assert status == 400, data
    assert set(data) == {"error"} and set(data["error"]) == {"message", "type", "param", "code"}
    assert data["error"]["type"] == "BadRequestError" and data["error"]["code"] == 400
    assert data["error"]["param"] == param and len(data["error"]["message"]) > 15


async def test_not_json_and_another_model(sim, session):
    for path in ("/tokenize", "/detokenize"):
        async with session.post(f"{sim.url}{path}", data=b"{nope") as response:
            assert response.status == 400 and "not valid JSON" in (await response.json())["error"]["message"]
        status, data = await post(session, f"{sim.url}{path}", {"model": "other", "prompt": "x", "tokens": [1]})
        assert status == 404 and data["error"]["param"] == "model" and MODEL in data["error"]["message"]


def test_learned_words_forget_the_oldest_beyond_the_limit() -> None:
    learned = LearnedWords(limit=2)
    ids = learned.tokenize("alpha-x the beta-x gamma-x")
    assert ids[1] == 0 and [learned.text(t) for t in ids[2:]] == ["beta-x", "gamma-x"]
    assert learned.text(ids[0]) == f"<id {ids[0]}>"
    learned.tokenize("beta-x delta-x")  # beta-x is used again: gamma-x is now the oldest
    assert learned.text(ids[2]) == "beta-x" and learned.text(ids[3]) == f"<id {ids[3]}>"
