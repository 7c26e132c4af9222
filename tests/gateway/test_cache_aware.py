"""cache_aware_local (per-process prefix tables), the pure parts: chained prompt-block hashes,
longest match, the load bound, LRU eviction, unhealthy backends, the metrics it feeds. No I/O."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from common.config import parse_config
from common.config.gateway import BackendEntry
from common.config.loader import ConfigError
from common.config.routing import CacheAwareSection
from gateway.pool.model_pool import Backend, ModelPool, Router
from gateway.pool.outlier import OutlierDetector
from gateway.pool.routing.affinity import AFFINITY, BALANCE, NO_MATCH, BlockLru, PrefixAffinity
from gateway.pool.routing.metrics import RouteMetrics
from gateway.pool.routing.prefix import Prompt, chain_hashes, prompt_blocks, prompt_text

SETTINGS = CacheAwareSection(block_chars=8, max_prompt_blocks=64, balance_abs=4, balance_rel=1.5)


def chat(*contents: str) -> dict[str, object]:
    return {"messages": [{"role": "system" if i == 0 else "user", "content": c} for i, c in enumerate(contents)]}


def backends(*names: str) -> list[Backend]:
    return [Backend(name, f"http://{name}", "m") for name in names]


def test_chained_hashes_cover_everything_before_them() -> None:
    base = chain_hashes("aaaaaaaabbbbbbbbcccccccc", 8, 10)
    assert len(base) == 3
    assert chain_hashes("aaaaaaaabbbbbbbbcccccccc" + "dddd", 8, 10) == base  # a partial block is left out
    changed_last = chain_hashes("aaaaaaaabbbbbbbbcccccccX", 8, 10)
    assert changed_last[:2] == base[:2] and changed_last[2] != base[2]
    changed_first = chain_hashes("Xaaaaaaabbbbbbbbcccccccc", 8, 10)
    assert all(x != y for x, y in zip(changed_first, base, strict=True))  # block 2 alike, its chain not
    assert chain_hashes("aaaaaaaabbbbbbbbcccccccc", 8, 2) == base[:2]


def test_messages_are_serialized_in_order_with_boundaries() -> None:
    assert prompt_text(chat("ab", "c"), chat=True) != prompt_text(chat("a", "bc"), chat=True)
    system = "s" * 40
    one = prompt_blocks(chat(system, "first question here"), True, 8, 64)
    two = prompt_blocks(chat(system, "another one entirely"), True, 8, 64)
    assert one[:5] == two[:5] and one[6:] != two[6:]  # the shared system prompt, then they part
    with_tools = prompt_blocks({**chat(system, "x"), "tools": [{"type": "function"}]}, True, 8, 64)
    assert with_tools[0] != one[0]  # tool definitions come first, as the chat template puts them
    assert prompt_blocks({"prompt": system}, False, 8, 64) == chain_hashes(system, 8, 64)


def test_longest_match_wins_and_no_match_goes_to_least_load() -> None:
    router = PrefixAffinity(SETTINGS)
    a, b, c = backends("a", "b", "c")
    short, long = chain_hashes("x" * 24, 8, 64), chain_hashes("x" * 48, 8, 64)
    c.num_inflight = 1
    route = router.decide([a, b, c], long)
    assert route is not None and (route.backend, route.reason, route.num_matched) == (a, NO_MATCH, 0)
    router.table("b").record(short)
    b.num_inflight = a.num_inflight = 1  # equal loads: the match decides
    route = router.decide([a, b, c], long)
    assert route is not None and (route.backend, route.reason, route.num_matched) == (a, AFFINITY, 6)
    assert route.num_blocks == 6
    route = router.decide([c, b, a], chain_hashes("x" * 32, 8, 64))
    assert route is not None and route.backend is a and route.num_matched == 4


def test_an_equal_match_goes_to_the_less_loaded_backend() -> None:
    router = PrefixAffinity(SETTINGS)
    a, b = backends("a", "b")
    hashes = chain_hashes("y" * 32, 8, 64)
    router.table("a").record(hashes)
    router.table("b").record(hashes)
    a.num_inflight = 2
    route = router.decide([a, b], hashes)
    assert route is not None and route.backend is b and route.reason == AFFINITY


@pytest.mark.parametrize(
    ("match_load", "least_load", "reason"),
    [
        (4, 0, AFFINITY),  # 4 more: not beyond balance_abs
        (5, 0, BALANCE),  # 5 more and more than 1.5x
        (14, 10, AFFINITY),  # 1.4x: not beyond balance_rel
        (16, 10, BALANCE),  # 6 more and 1.6x
        (15, 10, AFFINITY),  # 5 more but exactly 1.5x
        (104, 100, AFFINITY),  # 1.04x and 4 more
    ],
)
def test_the_load_bound_needs_both_thresholds(match_load: int, least_load: int, reason: str) -> None:
    router = PrefixAffinity(SETTINGS)
    hot, idle = backends("hot", "idle")
    hashes = chain_hashes("z" * 64, 8, 64)
    router.table("hot").record(hashes)
    hot.num_reported, idle.num_reported = match_load, least_load
    route = router.decide([hot, idle], hashes)
    assert route is not None and route.reason == reason
    assert route.backend is (hot if reason == AFFINITY else idle)
    if reason == BALANCE:
        assert route.num_matched == 0
        assert router.table("idle").match(hashes) == len(hashes)  # recorded there too: the prefix spreads


def test_a_hot_prefix_spreads_and_no_backend_goes_past_the_bound() -> None:
    router = PrefixAffinity(SETTINGS)
    pool = backends("a", "b", "c")
    hashes = chain_hashes("h" * 80, 8, 64)
    for _ in range(60):  # every request has the same prefix and none finishes
        route = router.decide(pool, hashes)
        assert route is not None
        route.backend.num_inflight += 1
        loads = sorted(b.load() for b in pool)
        assert not router.overloaded(loads[-1] - 1, loads[0])  # at most one request past the bound
    assert all(router.table(b.name).match(hashes) == len(hashes) for b in pool)  # each one caches it now
    assert max(b.load() for b in pool) <= 1.5 * min(b.load() for b in pool) + 1


def test_lru_evicts_the_least_recent_prefix_tail_first() -> None:
    table = BlockLru(capacity=6)
    first, second = chain_hashes("a" * 32, 8, 64), chain_hashes("b" * 32, 8, 64)
    table.record(first)
    table.record(second)
    assert len(table) == 6
    assert table.match(second) == 4
    assert table.match(first) == 2  # its last blocks went first; its leading blocks are still there
    table.record(first)  # used again: now the second prefix is the older one
    table.record(chain_hashes("c" * 32, 8, 64))
    assert table.match(first) == 2 and table.match(second) == 0
    assert table.memory_bytes() > 0
    bigger = BlockLru(capacity=1000)
    for i in range(100):
        bigger.record(chain_hashes(f"{i:08d}" * 4, 8, 64))
    assert len(bigger) == 400 and bigger.memory_bytes() > table.memory_bytes()


def test_unhealthy_backends_never_match_and_lose_their_table() -> None:
    a, b = backends("a", "b")
    pool = ModelPool("m", [a, b], "cache_aware_local", SETTINGS)
    assert isinstance(pool.policy, PrefixAffinity)
    text = "q" * 40
    hashes = chain_hashes(text, 8, 64)
    first = pool.route([], Prompt(text, 8, 64))
    assert first is not None and first.reason == NO_MATCH
    home = first.backend
    again = pool.route([], Prompt(text, 8, 64))
    assert again is not None and again.backend is home and again.reason == AFFINITY
    retry = pool.route([home], Prompt(text, 8, 64))  # a retry never goes back to a backend it tried
    assert retry is not None and retry.backend is not home
    home.healthy = False
    down = pool.route([], Prompt(text, 8, 64))
    assert down is not None and down.backend is not home
    assert pool.policy.table(home.name).match(hashes) == 0  # its engine's cache is gone
    assert pool.route([a, b], Prompt(text, 8, 64)) is None
    a.healthy = b.healthy = False  # panic routing: every backend is a candidate, none keeps a table
    for _ in range(2):  # a down backend's cache is unknown: no affinity to it
        panic = pool.route([], Prompt(text, 8, 64))
        assert panic is not None and panic.reason == NO_MATCH


def test_the_metrics_count_decisions_and_report_table_memory() -> None:
    text = '[gateway]\nrouting = "cache_aware_local"\n[gateway.cache_aware]\nblock_chars = 8\n'
    settings = parse_config(text, "c.toml", {}).gateway
    router = Router([BackendEntry(name="a", url="http://a", model="m")], settings.routing, settings.cache_aware)
    registry = CollectorRegistry()
    metrics = RouteMetrics(registry)
    metrics.start_at_zero(router)
    pool = router.pools["m"]
    text = "w" * 40
    for _ in range(3):
        route = pool.route([], Prompt(text, 8, 64))
        assert route is not None
        metrics.observe("m", route)
    metrics.render(router)
    value = registry.get_sample_value
    assert value("zerogap_route_decisions_total", {"model": "m", "reason": "no_match"}) == 1
    assert value("zerogap_route_decisions_total", {"model": "m", "reason": "affinity"}) == 2
    assert value("zerogap_route_decisions_total", {"model": "m", "reason": "balance"}) == 0
    assert value("zerogap_route_prefix_match_ratio_count", {"model": "m"}) == 3
    assert value("zerogap_route_prefix_match_ratio_sum", {"model": "m"}) == 2.0
    assert value("zerogap_route_prefix_table_blocks", {"backend": "a", "model": "m"}) == 5
    assert (value("zerogap_route_prefix_table_bytes", {"backend": "a", "model": "m"}) or 0) > 5 * 28


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"\[gateway\]\.cache_aware\.balance_rel: .* greater than or equal to 1"):
        parse_config("[gateway.cache_aware]\nbalance_rel = 0.5\n", "c.toml", {})


def test_an_ejected_backend_never_matches() -> None:
    config = parse_config('[gateway]\nrouting = "cache_aware_local"\noutlier_consecutive_errors = 2\n', "c.toml", {})
    entries = [BackendEntry(name=n, url=f"http://{n}", model="m") for n in ("a", "b")]
    router = Router(entries, "cache_aware_local", config.gateway.cache_aware)
    pool = router.pools["m"]
    text = "e" * 40
    home = pool.route([], Prompt(text, 8, 64))
    assert home is not None
    ejector = OutlierDetector(router, config.gateway, lambda b, why: setattr(b, "healthy", False))
    ejector.failure(home.backend, "503")
    ejector.failure(home.backend, "503")
    assert not home.backend.healthy  # ejected by the outlier rule
    route = pool.route([], Prompt(text, 8, 64))
    assert route is not None and route.backend is not home.backend and route.reason == NO_MATCH
