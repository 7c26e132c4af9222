"""routing = "kv_events" against real vLLM's KV-event publisher: the tier's shared replica runs with
--kv-events-config (a ZeroMQ PUB socket and its replay socket, tests/backends/vllm/pool.py).

The gateway's own pieces, in this process: its tokenizer of the tiny model (tokenizer.json and the chat
template) gives the ids vLLM's /tokenize gives; its listener (gateway/pool/kv_listener.py) decodes
vLLM's batches; and after a completion the index says the engine holds every full block of the prompt,
keyed by the gateway's own chain of those ids, both from the live socket and from a replay."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import zmq.asyncio

from gateway.pool.kv_listener import EngineFeed
from gateway.pool.model_pool import Backend
from gateway.pool.routing.kv_index import KvIndex, chain
from gateway.pool.routing.tokens import HfTokens
from tests.backends.vllm.pool import KV_TOPIC, MODEL, Pool, kv_events_ports, post

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
WAIT_S = 60.0


def backend(pool: Pool) -> Backend:
    pub, replay = kv_events_ports(pool.config)
    return Backend("vllm0", pool.engine_url, MODEL, kv_events_endpoint=f"tcp://127.0.0.1:{pub}",
                   kv_events_replay_endpoint=f"tcp://127.0.0.1:{replay}", kv_events_topic=KV_TOPIC)  # fmt: skip


def test_the_gateway_tokenizes_as_vllm_does(vllm_pool: Pool) -> None:
    tokens = HfTokens(vllm_pool.folder / "models" / "tiny")
    prompt = "The engine steps forward; 42 tokens, then an interval. " * 6
    given = post(vllm_pool.engine_url + "/tokenize", {"model": MODEL, "prompt": prompt})["tokens"]
    assert tokens({"prompt": prompt}, False, 10_000) == given
    messages = [{"role": "system", "content": "You answer briefly. " * 5}, {"role": "user", "content": "Why?"}]
    body: dict[str, Any] = {"model": MODEL, "messages": messages}
    given = post(vllm_pool.engine_url + "/tokenize", {**body, "add_generation_prompt": True})["tokens"]
    assert tokens(body, True, 10_000) == given


async def _follow_and_complete(pool: Pool, prompt: str) -> tuple[KvIndex, list[int], int]:
    context = zmq.asyncio.Context()
    b, index = backend(pool), KvIndex()
    feed = EngineFeed(context, b, [index])
    task = asyncio.create_task(feed.follow())
    try:
        await asyncio.sleep(1.0)  # the SUB socket joins (what came before it, the replay gave)
        await asyncio.to_thread(post, pool.engine_url + "/v1/completions",
                                {"model": MODEL, "prompt": prompt, "max_tokens": 1})  # fmt: skip
        ids = HfTokens(pool.folder / "models" / "tiny")({"prompt": prompt}, False, 100_000)
        assert ids is not None
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while asyncio.get_running_loop().time() < deadline:
            size = index.block_size()
            if size and index.match(b.url, chain(ids, size, 10_000)) == len(ids) // size:
                break
            await asyncio.sleep(0.1)
        size = index.block_size()
        assert size, f"no BlockStored from vLLM within {WAIT_S} s ({feed.num_batches} batches)"
        held = index.match(b.url, chain(ids, size, 10_000))
        assert held == len(ids) // size, (held, len(ids), size, feed.num_undecodable)

        replayed = KvIndex()  # a gateway process that starts now learns the same from the replay socket
        late = EngineFeed(context, b, [replayed])
        await late.replay(0)
        assert replayed.match(b.url, chain(ids, size, 10_000)) == held
        return index, ids, size
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        context.destroy(linger=0)


def test_vllms_events_tell_the_gateway_what_it_holds(vllm_pool: Pool) -> None:
    prompt = " ".join(f"block{i} of the shared system prompt," for i in range(60))
    index, ids, size = asyncio.run(_follow_and_complete(vllm_pool, prompt))
    assert len(ids) // size >= 2, (len(ids), size)  # several full blocks, chained
    other = chain([*ids[:size], *[(t + 1) % 1000 for t in ids[size:]]], size, 10_000)
    assert index.match(vllm_pool.engine_url, other) == 1  # the first block alike, then nothing
