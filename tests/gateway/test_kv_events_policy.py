"""routing = "kv_events" (gateway/pool/routing/kv_events.py, kv_index.py), the pure parts: the index
follows BlockStored / BlockRemoved / AllBlocksCleared as the engines send them, the longest match
wins over the hash within cache_aware's load rules, every process decides alike given the same
events and loads, and an engine that leaves or joins moves only its share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

from common.config.routing import CacheAwareSection
from common.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, decode_batch, encode_batch
from common.sim_words import tokenize
from gateway.pool.model_pool import Backend
from gateway.pool.routing.kv_events import KvEvents
from gateway.pool.routing.kv_index import KvIndex, chain
from gateway.pool.routing.policy import AFFINITY, BALANCE
from gateway.pool.routing.prefix import Prompt

SETTINGS = CacheAwareSection(block_chars=8, key_blocks=4, load_factor=1.25, load_slack=0)
BS = 4  # tokens per block in these events
NUM_PROMPTS = 1200


def engines(*names: str) -> list[Backend]:
    return [Backend(name, f"http://{name}:8000", "m") for name in names]


def text(i: int, tail: str = "") -> str:
    return " ".join(f"p{i}w{k}" for k in range(12)) + tail  # 12 words: 3 blocks of 4


def prompt(i: int, tail: str = "") -> Prompt:
    body = {"model": "m", "prompt": text(i, tail)}
    return Prompt.of(body, False, SETTINGS.block_chars, SETTINGS.max_prompt_blocks)


def stored(token_ids: list[int], theirs: list[int | bytes], parent: int | None = None) -> BlockStored:
    """As an engine sends it: its own hashes (any numbers), the token ids of those blocks."""
    return BlockStored(theirs, parent, token_ids, BS, None, "GPU", None)


def cached(index: KvIndex, url: str, i: int, num_blocks: int = 3, salt: int = 0) -> None:
    """The engine at url caches the first num_blocks blocks of prompt i (its hashes: salt + position)."""
    ids = tokenize(text(i))[: num_blocks * BS]
    index.apply(url, [stored(ids, [salt + i * 100 + k for k in range(num_blocks)])])


def test_the_index_follows_stored_removed_and_cleared() -> None:
    index, url = KvIndex(), "http://a:8000"
    ids = tokenize(text(1))
    mine = chain(ids, BS, 10)
    assert len(mine) == 3 and index.match(url, mine) == 0
    index.apply(url, [stored(ids[:8], [11, 12])])  # two blocks, then the third as a child of the second
    index.apply(url, [stored(ids[8:12], [13], parent=12)])
    assert index.match(url, mine) == 3 and index.block_size() == BS
    index.apply(url, [BlockRemoved([12], "GPU")])  # the middle block goes: the chain ends at the first
    assert index.match(url, mine) == 1
    index.apply(url, [stored(ids[4:8], [99], parent=11)])  # cached again under another hash of the engine's
    assert index.match(url, mine) == 3
    index.apply(url, [stored(ids[:4], [7], parent=12345)])  # a parent it never saw: not placed, counted
    assert index.engines[url].num_unplaced == 1
    index.apply(url, [BlockStored([55], None, ids[:4], BS, None, "CPU", None)])  # offloaded copies: not the GPU's
    index.apply(url, [AllBlocksCleared()])
    assert index.match(url, mine) == 0 and len(index.engines[url]) == 0
    index.apply(url, [BlockStored([1], None, ids[:4], BS, None, "GPU", None, extra_keys=[("salt",)])])
    assert index.match(url, mine) == 0  # a salted block is not the plain prompt's


def test_the_longest_match_wins_over_the_hash() -> None:
    policy, pool = KvEvents(SETTINGS), engines("a", "b", "c")
    for i in range(60):
        home = policy.ranking(pool, prompt(i).key(4) or 0)[0]
        holder = next(e for e in pool if e is not home)
        assert (route := policy.route(pool, prompt(i))) is not None and route.backend is home  # nothing known
        cached(policy.index, holder.url, i, num_blocks=2)
        cached(policy.index, home.url, i, num_blocks=1, salt=50)  # the home holds less of it
        route = policy.route(pool, prompt(i, " and a question"))
        assert route is not None and route.backend is holder, i
        assert (route.reason, route.num_matched, route.num_blocks) == (AFFINITY, 2, 3)


def test_the_load_bound_and_shedding_still_rule() -> None:
    policy, (a, b, c) = KvEvents(SETTINGS), engines("a", "b", "c")
    cached(policy.index, a.url, 1)
    a.num_reported = 9  # past 1.25 x the mean: the holder is skipped
    route = policy.route([a, b, c], prompt(1))
    assert route is not None and route.backend is not a and route.reason == BALANCE and route.num_matched == 0
    a.num_reported = 0
    for i in range(2, 202):
        cached(policy.index, a.url, i)
    policy.shed[a.url] = 0.9  # a sheds 90 % of its prompts, whole: their next engine takes them
    kept = [i for i in range(2, 202) if (r := policy.route([a, b, c], prompt(i))) and r.backend is a]
    assert 0.03 < len(kept) / 200 < 0.2, len(kept)
    again = [policy.route([a, b, c], prompt(i, " again")) for i in kept]
    assert all(r is not None and r.backend is a for r in again)


DECIDE = """
import json, sys
from common.config.routing import CacheAwareSection
from common.kv_events import decode_batch
from gateway.pool.model_pool import Backend
from gateway.pool.routing.kv_events import KvEvents
from gateway.pool.routing.prefix import Prompt
settings, batches, observed, loads, bodies = json.loads(sys.stdin.read())
policy = KvEvents(CacheAwareSection(**settings))
for url, payload in batches:
    policy.index.apply(url, decode_batch(bytes.fromhex(payload)).events)
for reported, now_s in observed:
    policy.observe(reported, now_s)
pool = [Backend(name, f"http://{name}:8000", "m", num_reported=load) for name, load in loads]
print(json.dumps([policy.route(pool, Prompt.of(b, False, 8, 512)).backend.name for b in bodies]))
"""


def test_every_process_decides_alike_given_the_same_events_and_loads() -> None:
    loads = [("e0", 7), ("e1", 3), ("e2", 5), ("e3", 4)]  # e0 past the hard bound
    urls = [f"http://{name}:8000" for name, _ in loads]
    batches: list[tuple[str, str]] = []
    for i in range(0, 40, 2):  # half the prefixes held somewhere, some by two engines
        for url in {urls[i % 4], urls[(i * 7) % 4]}:
            ids = tokenize(text(i))[: (1 + i % 3) * BS]
            event = stored(ids, [hash((url, i, k)) & 0xFFFF_FFFF for k in range(len(ids) // BS)])
            batches.append((url, encode_batch(KVEventBatch(0.0, [event])).hex()))
    observed = [({u: 9 if u == urls[2] else 4 for u in urls}, 0.1 * t) for t in range(8)]  # e2 sheds
    bodies: list[dict[str, Any]] = [{"prompt": text(i % 40, f" question {i}")} for i in range(300)]
    policy = KvEvents(SETTINGS)
    for url, payload in batches:
        policy.index.apply(url, decode_batch(bytes.fromhex(payload)).events)
    for reported, now_s in observed:
        policy.observe(reported, now_s)
    pool = [Backend(name, f"http://{name}:8000", "m", num_reported=load) for name, load in loads]
    routes = [policy.route(pool, Prompt.of(b, False, 8, 512)) for b in bodies]
    here = [r.backend.name for r in routes if r is not None]
    assert {r.num_matched > 0 for r in routes if r is not None} == {True, False}  # held and unheld prompts
    assert set(here) == {"e1", "e2", "e3"}
    given = json.dumps([SETTINGS.model_dump(), batches, observed, loads, bodies])
    for seed in ("1", "2"):  # fresh interpreters, each with its own string-hash seed
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", DECIDE], input=given, env=env, capture_output=True, text=True,
                             timeout=60, check=True)  # fmt: skip
        assert json.loads(out.stdout) == here


def homes(policy: KvEvents, pool: list[Backend]) -> list[str]:
    found = []
    for i in range(NUM_PROMPTS):
        route = policy.route(pool, prompt(i))
        assert route is not None
        found.append(route.backend.name)
    return found


def test_an_engine_that_leaves_or_joins_moves_about_one_in_n() -> None:
    policy, four = KvEvents(SETTINGS), engines("a", "b", "c", "d")
    before = homes(policy, four)
    for i, name in enumerate(before):  # each engine holds what was sent to it
        cached(policy.index, f"http://{name}:8000", i)
    assert homes(policy, four) == before
    after = homes(policy, four[:3])  # d leaves
    moved = [i for i in range(NUM_PROMPTS) if before[i] != after[i]]
    assert all(before[i] == "d" for i in moved) and len(moved) == before.count("d")
    assert 0.2 < len(moved) / NUM_PROMPTS < 0.3, len(moved)
    assert min(Counter(after[i] for i in moved).values()) > 0.2 * len(moved)  # spread over a, b, c
    joined = homes(policy, [*four, *engines("new")])  # one joins: it holds nothing, takes no held prompt
    assert joined == before
    fresh = KvEvents(SETTINGS)  # with nothing known, the ranking alone: the joiner takes about 1/5
    base = homes(fresh, four)
    grown = homes(fresh, [*four, *engines("new")])
    moved = [i for i in range(NUM_PROMPTS) if base[i] != grown[i]]
    assert all(grown[i] == "new" for i in moved) and 0.15 < len(moved) / NUM_PROMPTS < 0.25, len(moved)


def test_a_prefix_every_engine_holds_goes_to_the_least_loaded_of_them() -> None:
    policy, pool = KvEvents(CacheAwareSection(block_chars=8, key_blocks=2, load_slack=8)), engines("a", "b", "c")
    for e in pool:
        cached(policy.index, e.url, 5, salt=ord(e.name[0]) * 1000)
    for loads, least in (((5, 2, 3), "b"), ((1, 4, 3), "a"), ((6, 6, 2), "c")):
        for e, load in zip(pool, loads, strict=True):
            e.num_reported = load
        route = policy.route(pool, prompt(5, " q"))
        assert route is not None and route.backend.name == least and route.reason == AFFINITY, loads
    # held by two only: the third (less loaded, holding nothing) is not taken while they are within the bound
    fresh, (a, b, c) = KvEvents(CacheAwareSection(block_chars=8, key_blocks=2, load_slack=8)), engines("a", "b", "c")
    cached(fresh.index, a.url, 6)
    cached(fresh.index, b.url, 6, salt=77)
    a.num_reported, b.num_reported, c.num_reported = 4, 3, 0
    route = fresh.route([a, b, c], prompt(6, " q"))
    assert route is not None and route.backend is b
