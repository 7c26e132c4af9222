"""routing = "cache_aware" (gateway/pool/routing/rendezvous.py), the pure parts: the same decision in
every process, engines that leave or join move only their share, the load bound spreads a hot
prefix, and the policies behind one interface. No I/O but a few `python -c` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from common.config.gateway import BackendEntry
from common.config.routing import CacheAwareSection
from gateway.pool.model_pool import Backend, ModelPool, Router
from gateway.pool.routing.metrics import RouteMetrics
from gateway.pool.routing.policy import AFFINITY, BALANCE, NO_MATCH, LeastLoad, RoundRobin
from gateway.pool.routing.prefix import Prompt
from gateway.pool.routing.registry import POLICIES, make_policy
from gateway.pool.routing.rendezvous import Rendezvous

SETTINGS = CacheAwareSection(block_chars=8, key_blocks=4, load_factor=1.25, load_slack=0)
NUM_PROMPTS = 2000
Observed = list[tuple[dict[str, int], float]]  # the reports a policy observed, and when


def engines(*names: str) -> list[Backend]:
    return [Backend(name, f"http://{name}:8000", "m") for name in names]


def prompt(i: int, tail: str = "") -> Prompt:
    return Prompt(f"prefix-{i:06d}-" * 3 + tail, SETTINGS.block_chars, SETTINGS.max_prompt_blocks)


def homes(policy: Rendezvous, pool: list[Backend]) -> list[str]:
    """Each prompt's engine at equal loads (no bound in the way)."""
    found = []
    for i in range(NUM_PROMPTS):
        route = policy.route(pool, prompt(i))
        assert route is not None and route.reason == AFFINITY
        found.append(route.backend.name)
    return found


DECIDE = """
import json, sys
from gateway.pool.model_pool import Backend
from gateway.pool.routing.prefix import Prompt
from gateway.pool.routing.rendezvous import Rendezvous
from common.config.gateway import BackendEntry
from common.config.routing import CacheAwareSection
settings, observed, loads, texts = json.loads(sys.stdin.read())
policy = Rendezvous(CacheAwareSection(**settings))
for reported, now_s in observed:
    policy.observe(reported, now_s)
pool = [Backend(name, f"http://{name}:8000", "m", num_reported=load) for name, load in loads]
print(json.dumps([policy.route(pool, Prompt(t, 8, 512)).backend.name for t in texts]))
"""


def decide_elsewhere(observed: Observed, loads: list[tuple[str, int]], texts: list[str], hash_seed: str) -> list[str]:
    """The decisions of a fresh interpreter (its own string-hash seed), given the same reports and loads."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    given = json.dumps([SETTINGS.model_dump(), observed, loads, texts])
    out = subprocess.run([sys.executable, "-c", DECIDE], input=given, env=env, capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    return list(json.loads(out.stdout))


def test_every_process_decides_alike_given_the_same_loads() -> None:
    loads = [("e0", 7), ("e1", 3), ("e2", 5), ("e3", 4)]  # uneven: e0 is past the hard bound
    urls = [f"http://{name}:8000" for name, _ in loads]
    observed: Observed = [({u: 9 if u == urls[2] else 4 for u in urls}, 0.1 * t) for t in range(8)]  # e2 sheds
    texts = [f"shared system prompt number {i % 40} " * 3 + f"question {i}" for i in range(400)]
    pool = [Backend(name, f"http://{name}:8000", "m", num_reported=load) for name, load in loads]
    policy = Rendezvous(SETTINGS)
    for reported, now_s in observed:
        policy.observe(reported, now_s)
    assert 0.2 < policy.shed[urls[2]] < 0.95 and policy.shed[urls[0]] == 0.0
    here, reasons = [], set()
    for t in texts:
        route = policy.route(pool, Prompt(t, 8, 512))
        assert route is not None
        here.append(route.backend.name)
        reasons.add(route.reason)
    assert reasons == {AFFINITY, BALANCE} and set(here) == {"e1", "e2", "e3"}  # e0 past the bound, e2 shedding
    assert decide_elsewhere(observed, loads, texts, "1") == here
    assert decide_elsewhere(observed, loads, texts, "2") == here


def test_an_engine_that_leaves_moves_only_its_own_prompts() -> None:
    policy = Rendezvous(SETTINGS)
    four = engines("a", "b", "c", "d")
    before = homes(policy, four)
    after = homes(policy, four[:3])  # d is gone
    moved = [i for i in range(NUM_PROMPTS) if before[i] != after[i]]
    assert all(before[i] == "d" for i in moved)  # nothing else moved...
    assert len(moved) == before.count("d")  # ...and every prompt of d did
    assert 0.2 < len(moved) / NUM_PROMPTS < 0.3, len(moved)  # about 1/4
    assert 0.2 < min(Counter(after[i] for i in moved).values()) / len(moved)  # d's prompts spread over a, b, c


def test_an_engine_that_joins_takes_only_its_share() -> None:
    policy = Rendezvous(SETTINGS)
    three = engines("a", "b", "c")
    before = homes(policy, three)
    after = homes(policy, [*three, *engines("new")])
    moved = [i for i in range(NUM_PROMPTS) if before[i] != after[i]]
    assert all(after[i] == "new" for i in moved)  # prompts move only to the engine that joined
    assert 0.2 < len(moved) / NUM_PROMPTS < 0.3, len(moved)  # about 1/4 of them
    assert homes(policy, three) == before  # and back where they were once it leaves


def test_prompts_alike_in_their_key_blocks_share_a_home() -> None:
    policy = Rendezvous(SETTINGS)
    pool = engines("a", "b", "c")
    for i in range(50):
        first = policy.route(pool, prompt(i, "one question"))
        second = policy.route(pool, prompt(i, "a different and much longer question"))
        assert first is not None and second is not None and first.backend is second.backend
    short = Prompt("abc", 8, 512)  # not one full block: least load
    pool[0].num_inflight, pool[2].num_inflight = 2, 1
    route = policy.route(pool, short)
    assert route is not None and route.backend is pool[1] and route.reason == NO_MATCH
    route = policy.route(pool, None)
    assert route is not None and route.backend is pool[1] and route.reason == NO_MATCH


def test_a_hot_prefix_spreads_along_its_ranking_within_the_bound() -> None:
    policy = Rendezvous(SETTINGS)
    pool = engines("a", "b", "c")
    hot = prompt(7)
    key = hot.key(SETTINGS.key_blocks)
    assert key is not None
    ranking = policy.ranking(pool, key)
    reasons = []
    for _ in range(120):  # every request has the same prefix and none finishes
        cap = policy.hard_bound([b.load_now() for b in pool])
        route = policy.route(pool, hot)
        assert route is not None
        assert route.backend.load_now() + 1 <= cap  # never past the bound
        reasons.append(route.reason)
        route.backend.num_inflight += 1
    assert reasons[0] == AFFINITY and reasons.count(BALANCE) > 60
    loads = [b.load_now() for b in ranking]
    assert loads[0] >= loads[1] >= loads[2] > 0  # its home first, then its second engine, then the third
    assert max(loads) <= 1.25 * sum(loads) / 3 + 1


def test_a_loaded_engine_sheds_whole_prompts_and_takes_them_back() -> None:
    policy = Rendezvous(SETTINGS)
    a, b, c = pool = engines("a", "b", "c")
    mine = [i for i in range(1500) if (k := prompt(i).key(4)) is not None and policy.ranking(pool, k)[0] is a]

    def kept() -> set[int]:
        found = set()
        for i in mine:
            route, again = policy.route(pool, prompt(i)), policy.route(pool, prompt(i))
            assert route is not None and again is not None and route.backend is again.backend
            if route.backend is a:
                found.add(i)
        return found

    assert kept() == set(mine)  # nothing reported yet: every prompt at home
    loaded = {a.url: 30, b.url: 15, c.url: 15}  # a reports 1.5x the mean: its share grows each scrape
    history, t = [kept()], 0.0
    policy.observe(loaded, t)  # the first report only starts the clock
    assert kept() == set(mine)
    for _ in range(3):
        t += 0.5
        policy.observe(loaded, t)
        share = policy.shed.get(a.url, 0.0)
        history.append(kept())
        assert abs(len(history[-1]) / len(mine) - (1 - share)) < 0.08, (share, len(history[-1]) / len(mine))
        assert 0.0 < share and policy.shed[b.url] == policy.shed[c.url] == 0.0
    assert history[3] < history[2] < history[1] < history[0]  # whole prompts go, the same ones, more each time
    policy.observe({a.url: 20, b.url: 20, c.url: 20}, t + 0.5)  # even now: the share holds (no flapping)
    assert policy.shed[a.url] > share - 0.01
    t += 0.5
    for _ in range(10):  # a below the mean: its share falls and its prompts come home
        t += 0.5
        policy.observe({a.url: 10, b.url: 25, c.url: 25}, t)
    assert policy.shed[a.url] == 0.0 and kept() == set(mine)


def test_the_slack_keeps_a_prompt_home_at_low_load() -> None:
    slack = Rendezvous(CacheAwareSection(block_chars=8, key_blocks=4, load_factor=1.25, load_slack=3))
    pool = engines("a", "b", "c")
    key = prompt(5).key(4)
    assert key is not None
    home = slack.ranking(pool, key)[0]
    home.num_inflight = 4  # mean 5 / 3: hard max(ceil(2.08), 2 + 3) = 5
    assert slack.hard_bound([b.load_now() for b in pool]) == 5
    route = slack.route(pool, prompt(5))
    assert route is not None and route.backend is home and route.reason == AFFINITY
    home.num_inflight = 6  # mean 7 / 3: hard 3 + 3 = 6; a 7th request there is past it
    route = slack.route(pool, prompt(5))
    assert route is not None and route.backend is not home and route.reason == BALANCE
    tight = Rendezvous(SETTINGS)  # no slack: a 5th request there is past ceil(1.25 x 5 / 3) = 3 already
    home.num_inflight = 4
    assert tight.hard_bound([b.load_now() for b in pool]) == 3
    route = tight.route(pool, prompt(5))
    assert route is not None and route.backend is not home
    assert slack.hard_bound([40, 30, 20]) == 38  # mean 91 / 3: ceil(1.25 x 30.3); the slack does not count


def test_a_retry_never_returns_to_a_backend_it_tried() -> None:
    a, b, c = engines("a", "b", "c")
    pool = ModelPool("m", [a, b, c], "cache_aware", SETTINGS)
    first = pool.route([], prompt(3))
    assert first is not None
    retry = pool.route([first.backend], prompt(3))
    assert retry is not None and retry.backend is not first.backend
    first.backend.healthy = False
    assert (down := pool.route([], prompt(3))) is not None and down.backend is retry.backend
    assert pool.route([a, b, c], prompt(3)) is None


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_name_builds_its_policy(name: str) -> None:
    policy = make_policy(name)
    assert policy.name == name
    pool = engines("a", "b")
    pool[0].num_inflight = 1
    route = policy.route(pool, prompt(1))
    assert route is not None and route.backend in pool
    assert policy.reads_prompt == policy.by_prefix == (name in {"cache_aware", "cache_aware_local", "kv_events"})
    with pytest.raises(ValueError, match="unknown routing policy 'nope'"):
        make_policy("nope")


def test_least_load_and_round_robin_as_objects() -> None:
    a, b = engines("a", "b")
    a.num_reported = 3
    assert (route := LeastLoad().route([a, b], None)) is not None and route.backend is b
    assert (route := RoundRobin().route([a, b], None)) is not None and route.backend is a
    assert LeastLoad().route([], None) is None and RoundRobin().route([], None) is None


def test_its_decisions_are_counted_and_no_match_ratio_is_made_up() -> None:
    router = Router([BackendEntry(name=n, url=f"http://{n}", model="m") for n in "ab"], "cache_aware", SETTINGS)
    registry = CollectorRegistry()
    metrics = RouteMetrics(registry)
    metrics.start_at_zero(router)
    value = registry.get_sample_value
    assert value("zerogap_route_prefix_match_ratio_count", {"model": "m"}) == 0  # the series exists, at 0
    for i in range(5):
        route = router.pools["m"].route([], prompt(i))
        assert route is not None
        metrics.observe("m", route)
    metrics.render(router)
    assert value("zerogap_route_decisions_total", {"model": "m", "reason": "affinity"}) == 5
    assert value("zerogap_route_prefix_match_ratio_count", {"model": "m"}) == 0  # it knows no cache contents
    assert value("zerogap_route_prefix_table_blocks", {"backend": "a", "model": "m"}) is None  # nor tables
