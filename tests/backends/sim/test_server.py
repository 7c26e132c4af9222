"""The served API over real HTTP: a `zerogap sim` subprocess on a free port."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from backends.sim.plan.virtual import Arrival, VirtualEngine
from backends.sim.settings import SimSettings
from backends.sim.testing import SimProcess, run_sim_process
from tests.backends.sim._client import metrics, stream

MODEL = "sim-test"
MSG = [{"role": "user", "content": "one two"}]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with run_sim_process("--time-scale", "1", "--max-model-len", "4096", model=MODEL) as process:
        yield process


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
        yield client


def _words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def test_health_and_models(sim, session):
    async with session.get(f"{sim.url}/health") as response:
        assert response.status == 200
    async with session.get(f"{sim.url}/v1/models") as response:
        body = await response.json()
    assert [card["id"] for card in body["data"]] == [MODEL]
    assert body["data"][0]["max_model_len"] == 4096


async def test_chat_stream_tokens_and_usage(sim, session):
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": _words(10)}],
        "max_tokens": 7,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    result = await stream(session, f"{sim.url}/v1/chat/completions", body)
    assert result.done
    assert result.events[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in result.events if e["choices"])
    assert len(content.split()) == 7 == len(result.token_times_s)
    finals = [e["choices"][0]["finish_reason"] for e in result.events if e["choices"]]
    assert finals[-1] == "length" and set(finals[:-1]) == {None}
    usage = result.events[-1]["usage"]
    assert result.events[-1]["choices"] == []
    assert usage["prompt_tokens"] == 12 and usage["completion_tokens"] == 7 and usage["total_tokens"] == 19
    assert all(e["object"] == "chat.completion.chunk" and e["model"] == MODEL for e in result.events)


async def test_no_chunk_leaves_before_the_first_token(sim, session):
    """The role chunk goes out with the first token, as vLLM sends it: a client that times
    TTFT by the first event (vllm bench serve does) must not read less than the prefill."""
    num_prompt = 3000
    settings = SimSettings().with_flags(time_scale=1.0)
    [modelled] = VirtualEngine(settings).run([Arrival(0.0, list(range(600, 600 + num_prompt)), 2)], 10).requests
    assert modelled.ttft_s is not None and modelled.ttft_s > 0.03  # a prefill long enough to see
    body = {"model": MODEL, "messages": [{"role": "user", "content": _words(num_prompt, "ttft")}], "max_tokens": 2}
    result = await stream(session, f"{sim.url}/v1/chat/completions", body)
    assert result.events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert result.first_event_s is not None
    assert result.first_event_s - result.sent_s >= modelled.ttft_s
    assert result.token_times_s[0] - result.first_event_s < 0.005  # the first token came with it


async def test_continuous_usage_stats_on_every_chunk(sim, session):
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"prompt": _words(5), "max_tokens": 4, "ignore_eos": True, "stream_options": options}
    result = await stream(session, f"{sim.url}/v1/completions", body)
    counts = [e["usage"]["completion_tokens"] for e in result.events if e["choices"]]
    assert counts == [1, 2, 3, 4]
    assert result.events[-1]["choices"] == [] and result.events[-1]["usage"]["completion_tokens"] == 4
    assert all(e["object"] == "text_completion" for e in result.events)


async def test_continuous_usage_stats_without_include_usage_sends_no_usage(sim, session):
    """vLLM (should_include_usage) sends per-chunk usage only when include_usage is asked too."""
    for path, prompt in (("/v1/completions", {"prompt": _words(5)}), ("/v1/chat/completions", {"messages": MSG})):
        body = {**prompt, "max_tokens": 4, "ignore_eos": True, "stream_options": {"continuous_usage_stats": True}}
        result = await stream(session, sim.url + path, body)
        assert result.done and len(result.token_times_s) == 4, path
        assert [e for e in result.events if "usage" in e] == [], path


async def test_completion_not_streamed(sim, session):
    body = {"model": MODEL, "prompt": _words(6), "max_tokens": 5}
    async with session.post(f"{sim.url}/v1/completions", json=body) as response:
        assert response.status == 200
        data = await response.json()
    assert data["object"] == "text_completion"
    assert len(data["choices"][0]["text"].split()) == 5
    assert data["choices"][0]["finish_reason"] == "length"
    usage = {"prompt_tokens": 6, "total_tokens": 11, "completion_tokens": 5, "prompt_tokens_details": None}
    assert data["usage"] == usage


async def test_chat_not_streamed_and_stop_word(sim, session):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stop": ["steps"]}
    async with session.post(f"{sim.url}/v1/chat/completions", json=body) as response:
        data = await response.json()
    message = data["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"].split()[-1] == "steps"
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"]["completion_tokens"] == len(message["content"].split())


async def test_tokenize_agrees_with_usage(sim, session):
    prompt = "The quick  brown fox\njumps"
    async with session.post(f"{sim.url}/tokenize", json={"model": MODEL, "prompt": prompt}) as response:
        tokens = await response.json()
    assert tokens["count"] == 5 == len(tokens["tokens"])
    messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
    async with session.post(f"{sim.url}/tokenize", json={"messages": messages}) as response:
        assert (await response.json())["count"] == 5
    body = {"messages": messages, "max_tokens": 1}
    async with session.post(f"{sim.url}/v1/chat/completions", json=body) as response:
        assert (await response.json())["usage"]["prompt_tokens"] == 5


BAD = [
    ("/v1/chat/completions", b"{not json", None),
    ("/v1/chat/completions", b"[1, 2]", None),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 129}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream_options": {}}, "stream_options"),
    ("/v1/completions", {"prompt": ["a", ""]}, "prompt"),
    ("/v1/completions", {"prompt": ["a", _words(4096)]}, "messages"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": 12}, "prompt"),
    ("/v1/completions", {"prompt": "x", "stop": 3}, "stop"),
    ("/tokenize", {"nothing": 1}, "prompt"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD)
async def test_bad_requests_get_vllm_shaped_400(sim, session, path, body, param):
    kwargs = {"data": body} if isinstance(body, bytes) else {"json": body}
    async with session.post(f"{sim.url}{path}", **kwargs) as response:
        assert response.status == 400
        data = await response.json()
    error = data["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["param"] == param
    assert len(error["message"]) > 10


async def test_too_long_prompt_names_the_context_length(sim, session):
    body = {"prompt": _words(4096)}
    async with session.post(f"{sim.url}/v1/completions", json=body) as response:
        assert response.status == 400
        message = (await response.json())["error"]["message"]
    assert "maximum context length is 4096" in message


async def test_unknown_model_is_404(sim, session):
    body = {"model": "nope", "prompt": "x"}
    async with session.post(f"{sim.url}/v1/completions", json=body) as response:
        assert response.status == 404
        error = (await response.json())["error"]
    assert error["type"] == "NotFoundError" and MODEL in error["message"]


async def test_unknown_route_and_wrong_method_are_json_errors(sim, session):
    async with session.get(f"{sim.url}/v1/nothing") as response:
        assert response.status == 404
        assert "POST /v1/chat/completions" in (await response.json())["error"]["message"]
    async with session.get(f"{sim.url}/v1/completions") as response:
        assert response.status == 405
        assert (await response.json())["error"]["code"] == 405


async def test_metrics_have_vllm_names_and_model_label(sim, session):
    await stream(session, f"{sim.url}/v1/completions", {"prompt": "a b", "max_tokens": 3})
    samples = await metrics(session, sim.url)
    label = f'{{model_name="{MODEL}"}}'
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:iteration_tokens_total_count",
        "zerogap_sim_gpu_busy_ratio",
        "zerogap_sim_token_interval_seconds",
        "zerogap_sim_cpu_interval_seconds",
    ):
        assert f"{name}{label}" in samples, name
    assert samples[f"vllm:generation_tokens_total{label}"] >= 3
    assert samples[f"vllm:time_to_first_token_seconds_count{label}"] >= 1
    assert 0 < samples[f"zerogap_sim_gpu_busy_ratio{label}"] <= 1
    assert samples[f"zerogap_sim_cpu_interval_seconds{label}"] > 0
    assert samples[f"zerogap_sim_token_interval_seconds{label}"] > 0


async def test_disconnect_aborts_and_frees_the_slot(sim, session):
    label = f'{{model_name="{MODEL}"}}'
    body = {"prompt": _words(64, "d"), "max_tokens": 3000, "ignore_eos": True, "stream": True}
    async with session.post(f"{sim.url}/v1/completions", json=body) as response:
        seen = 0
        async for raw in response.content:
            seen += raw.startswith(b"data: ")
            if seen >= 3:
                break
        busy = await metrics(session, sim.url)
        assert busy[f"vllm:num_requests_running{label}"] == 1
        assert busy[f"vllm:kv_cache_usage_perc{label}"] > 0
        response.close()  # drop the connection mid-stream
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        after = await metrics(session, sim.url)
        if after[f"vllm:num_requests_running{label}"] == 0:
            break
        await asyncio.sleep(0.05)
    assert after[f"vllm:num_requests_running{label}"] == 0
    assert after[f"vllm:kv_cache_usage_perc{label}"] == 0
    assert after[f'vllm:request_success_total{{finished_reason="abort",model_name="{MODEL}"}}'] >= 1


async def test_repeated_prefix_is_served_from_the_cache(sim, session):
    prompt = _words(200, "p")
    body = {"prompt": prompt, "max_tokens": 2}
    usages = []
    for _ in range(2):
        async with session.post(f"{sim.url}/v1/completions", json=body) as response:
            usages.append((await response.json())["usage"])
    assert usages[0]["prompt_tokens_details"] is None
    assert usages[1]["prompt_tokens_details"]["cached_tokens"] >= 192
    samples = await metrics(session, sim.url)
    assert samples[f'vllm:prefix_cache_hits_total{{model_name="{MODEL}"}}'] >= 192


async def test_small_kv_cache_preempts_and_still_completes(session):
    args = ("--time-scale", "0.2", "--kv-cache-blocks", "8", "--max-model-len", "128")
    with run_sim_process(*args, model=MODEL) as small:
        body = {"prompt": _words(20, "k"), "max_tokens": 40, "ignore_eos": True}
        results = await asyncio.gather(*(stream(session, f"{small.url}/v1/completions", body) for _ in range(4)))
        samples = await metrics(session, small.url)
    assert all(len(r.token_times_s) == 40 and r.done for r in results)
    assert samples[f'vllm:num_preemptions_total{{model_name="{MODEL}"}}'] >= 1
