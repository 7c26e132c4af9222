"""routing = "kv_events" over real sockets: real sims publishing their KV-cache events (ZeroMQ,
vLLM's wire format), the gateway's listener subscribed to them.

The sim's publisher as a consumer sees it (the batches, their token ids and chained hashes, the
replay socket, evictions); the gateway sending a prompt to the engine that holds it, where the hash
alone would send it elsewhere; and the engines' hit rate with `--workers 2` against one process."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from backends.sim.testing import SimProcess, run_sim_process
from common.kv_events import END_SEQ, BlockRemoved, BlockStored, KVEventBatch, decode_batch, seq_bytes, seq_of
from common.net import free_port
from common.promtext import sums_by_name
from common.sim_words import tokenize
from gateway.pool.routing.kv_events import KvEvents
from gateway.pool.routing.kv_index import chain
from tests.gateway.helpers import GatewayServer, auth, make_config
from tests.gateway.processes import UNIFIED, GatewayProcess
from tests.gateway.test_cache_routing import GROUPS, HITS, QUERIES, REQUESTS, counters, send_each, workload

JSON = {"Content-Type": "application/json"}
RECV_TIMEOUT_MS = 10_000


@dataclass
class EventSim:
    sim: SimProcess
    pub_port: int
    replay_port: int

    @property
    def url(self) -> str:
        return self.sim.url

    def backend_toml(self, name: str) -> str:
        return (
            f'[[backends]]\nname = "{name}"\nurl = "{self.url}"\nmodel = "m"\nkv_events_topic = "kv"\n'
            f'kv_events_endpoint = "tcp://127.0.0.1:{self.pub_port}"\n'
            f'kv_events_replay_endpoint = "tcp://127.0.0.1:{self.replay_port}"\n'
        )


@contextmanager
def event_sims(tmp_path: Path, n: int, kv_blocks: int, ports: list[int] | None = None) -> Iterator[list[EventSim]]:
    with ExitStack() as stack:
        found = []
        for i in range(n):
            pub, replay = free_port(), free_port()
            config = tmp_path / f"sim{i}-{pub}.toml"
            config.write_text(
                f"[sim]\nkv_cache_blocks = {kv_blocks}\nmax_model_len = {min(1024, kv_blocks * 16)}\n"
                f'kv_events_topic = "kv"\nkv_events_endpoint = "tcp://*:{pub}"\n'
                f'kv_events_replay_endpoint = "tcp://*:{replay}"\n'
            )
            port = ports[i] if ports else None
            sim = stack.enter_context(run_sim_process("--time-scale", "4", model="m", config=config, port=port))
            found.append(EventSim(sim, pub, replay))
        yield found


def complete(url: str, prompt: str, max_tokens: int = 2) -> None:
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens}).encode()
    with urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", body, JSON), timeout=30) as resp:
        assert resp.status == 200


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{k}" for k in range(n))


def test_the_sim_publishes_vllms_events_and_replays_them(tmp_path: Path) -> None:
    with event_sims(tmp_path, 1, kv_blocks=24) as (es,):
        context = zmq.Context()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
        sub.connect(f"tcp://127.0.0.1:{es.pub_port}")
        try:
            received: list[tuple[int, bytes]] = []
            stored: list[BlockStored] = []
            for attempt in range(50):  # a SUB socket misses what was sent before it joined: until one arrives
                complete(es.url, words(f"a{attempt}x", 100))
                if sub.poll(500):
                    break
            while sub.poll(1000):
                topic, seq, payload = sub.recv_multipart()
                assert topic == b"kv"
                received.append((seq_of(seq), payload))
            assert [s for s, _ in received] == list(range(received[0][0], received[0][0] + len(received)))
            batches = [decode_batch(p) for _, p in received]
            stored = [e for b in batches for e in b.events if isinstance(e, BlockStored)]
            prompt_ids = tokenize(words(f"a{attempt}x", 100))
            mine = [e for e in stored if e.token_ids[:16] == prompt_ids[:16]]
            assert mine and mine[0].parent_block_hash is None and mine[0].block_size == 16
            assert sum(len(e.block_hashes) for e in mine) == 6  # 100 + 2 tokens: 6 full blocks
            assert mine[0].token_ids == prompt_ids[: 16 * len(mine[0].block_hashes)]

            for i in range(3):  # more than 24 blocks of new prompts: the first ones are evicted
                complete(es.url, words(f"b{i}x", 120))
            removed = []
            while sub.poll(1000):
                _, _, payload = sub.recv_multipart()
                removed += [
                    h for e in decode_batch(payload).events if isinstance(e, BlockRemoved) for h in e.block_hashes
                ]
            assert set(mine[0].block_hashes) & set(removed)  # its blocks went, and the events said so

            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
            dealer.connect(f"tcp://127.0.0.1:{es.replay_port}")
            dealer.send_multipart((b"", seq_bytes(received[0][0])))
            replayed = []
            while (frames := dealer.recv_multipart())[2] != END_SEQ:
                assert frames[0] == b"" and frames[1] == b"kv"
                replayed.append((seq_of(frames[2]), frames[3]))
            assert replayed[: len(received)] == received  # the same bytes, from the sequence number asked
            dealer.close(linger=0)
        finally:
            sub.close(linger=0)
            context.term()


def test_the_gateway_sends_a_prompt_to_the_engine_that_holds_it(tmp_path: Path) -> None:
    with event_sims(tmp_path, 3, kv_blocks=2048) as sims:
        extra = "".join(s.backend_toml(f"sim{i}") for i, s in enumerate(sims))
        with GatewayServer(make_config(tmp_path, [], {"routing": "kv_events"}, extra=extra)) as gs:
            policy = gs.gw.router.pools["m"].policy
            assert isinstance(policy, KvEvents)
            by_url = {s.url: s for s in sims}
            chosen: list[str] = []
            for i in range(6):
                text = words(f"p{i}q", 200)
                body: dict[str, Any] = {"model": "m", "prompt": text + " question", "max_tokens": 2}
                home = policy.ranking(gs.gw.router.pools["m"].backends, _key(text))[0]
                holder = next(s for s in sims if s.url != home.url)
                complete(holder.url, text)  # warmed directly: only the events can tell the gateway
                blocks = chain(tokenize(text), 16, 512)
                _until(lambda h=holder, b=blocks: policy.index.match(h.url, b) == len(b))
                before = counters([s.sim for s in sims])
                req = urllib.request.Request(gs.url + "/v1/completions", json.dumps(body).encode(), {**JSON, **auth()})
                with urllib.request.urlopen(req, timeout=30) as resp:
                    assert resp.status == 200
                after = counters([s.sim for s in sims])
                hits = [a.get(HITS, 0.0) - b.get(HITS, 0.0) for a, b in zip(after, before, strict=True)]
                chosen.append(list(by_url)[hits.index(max(hits))])
                assert chosen[-1] == holder.url and max(hits) >= 12 * 16, (i, hits)  # its 12 blocks hit there
            with urllib.request.urlopen(urllib.request.Request(gs.url + "/metrics"), timeout=10) as page:
                ratio = sums_by_name(page.read(), {"zerogap_route_prefix_match_ratio_sum"})
            assert ratio.get("zerogap_route_prefix_match_ratio_sum", 0) > 6 * 0.9  # each matched (12 of 13 blocks)


def _key(text: str) -> int:
    from gateway.pool.routing.prefix import Prompt

    key = Prompt(text, 64, 512).key(16)
    assert key is not None
    return key


def _until(done: Any, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if done():
            return
        time.sleep(0.02)
    raise AssertionError("the events did not arrive")


def process_config(path: Path, sims: list[EventSim], routing: str) -> Path:
    head = f'[server]\napi_key = "{UNIFIED}"\n[gateway]\nrouting = "{routing}"\nkey_store = "keys.db"\n'
    head += "health_interval_s = 0.2\nload_scrape_interval_s = 0.1\n"
    path.write_text(head + "".join(s.backend_toml(f"sim{i}") for i, s in enumerate(sims)))
    return path


async def served_hit_rate(tmp_path: Path, workers: int, ports: list[int]) -> float:
    """As test_cache_routing's: three fresh engines with room for every prefix, SERVED_STREAMS x REQUESTS requests."""
    with event_sims(tmp_path, 3, 2048, ports) as sims:
        config = process_config(tmp_path / f"kv-{workers}.toml", sims, "kv_events")
        with GatewayProcess(config, free_port(), workers) as gw:
            assert await send_each(gw.url + "/v1/chat/completions", workload("P", groups=GROUPS), REQUESTS) == 0
            after = counters([s.sim for s in sims])
    return sum(a.get(HITS, 0.0) for a in after) / sum(a.get(QUERIES, 0.0) for a in after)


async def test_kv_events_keeps_its_hit_rate_with_two_workers(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    one = await served_hit_rate(tmp_path, 1, ports)
    two = await served_hit_rate(tmp_path, 2, ports)
    print({"one process": one, "two workers": two})
    assert two >= 0.97 * one, (one, two)
    assert one > 0.5, one  # the prefixes did meet in the caches


_ = KVEventBatch  # the batch type the decoder returns
