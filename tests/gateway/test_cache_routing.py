"""Cache-aware routing end to end: three real sims with small KV caches behind a real gateway,
the shared-prefix workload of the load-test harness, a few seconds per policy.

Side by side on the same sims (each phase with prefixes of its own): least_load, then
cache_aware, on the uniform workload; the engines' own prefix-cache counters must show a
higher hit rate for cache_aware. Then a hot prefix (60 % of the requests): every routing
decision, seen at the moment it was made, keeps the chosen backend within the load bound.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from backends.sim.testing import SimProcess, run_sim_process
from gateway.pool import ModelPool
from loadtest import Workload, parse_settings
from tests.gateway.helpers import GatewayServer, auth, make_config
from zerogap.promtext import sums_by_name

HITS, QUERIES, FINISHED = (
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:request_success_total",
)
NUM_STREAMS = 12
PHASE_S = 3.0


@contextmanager
def three_sims(tmp_path: Path) -> Iterator[list[SimProcess]]:
    config = tmp_path / "sim.toml"
    # 20-block prefixes: 8 of them fit next to the streams' own blocks, 24 do not
    config.write_text("[sim]\nkv_cache_blocks = 320\nmax_model_len = 1024\n")
    with ExitStack() as stack:
        yield [stack.enter_context(run_sim_process("--time-scale", "4", model="m", config=config)) for _ in range(3)]


def workload(tag: str, hot_share: float = 0.0) -> Workload:
    settings = parse_settings(
        json.dumps({"workload": {"prefix_groups": 24, "prefix_tokens": 320, "prefix_hot_share": hot_share,
                                 "prompt_tokens": 4, "max_output_tokens": 6}})
    )  # fmt: skip
    w = Workload(settings, "what comes next", seed=3)
    w.prefixes = [f"{tag} {p}" for p in w.prefixes]  # each phase its own prefixes: no hits from the last one
    return w


def counters(sims: list[SimProcess]) -> list[dict[str, float]]:
    pages = []
    for sim in sims:
        with urllib.request.urlopen(sim.url + "/metrics", timeout=5) as page:
            pages.append(sums_by_name(page.read(), {HITS, QUERIES, FINISHED}))
    return pages


async def drive(url: str, w: Workload, seconds: float) -> int:
    """NUM_STREAMS users, each one request after another, for `seconds`; the number of failures."""
    failures = 0
    end = time.monotonic() + seconds

    async def user(session: aiohttp.ClientSession) -> None:
        nonlocal failures
        me = w.session()
        while time.monotonic() < end:
            async with session.post(url, data=me.body("m"), headers=auth()) as resp:
                await resp.read()
                failures += resp.status != 200

    timeout = aiohttp.ClientTimeout(total=seconds + 20)
    async with aiohttp.ClientSession(timeout=timeout, headers={"Content-Type": "application/json"}) as s:
        await asyncio.wait_for(asyncio.gather(*(user(s) for _ in range(NUM_STREAMS))), seconds + 20)
    return failures


async def run_phase(gs: GatewayServer, sims: list[SimProcess], w: Workload) -> tuple[float, list[float]]:
    """The engines' hit rate over the phase and the requests each one finished."""
    before = counters(sims)
    assert await drive(gs.url + "/v1/chat/completions", w, PHASE_S) == 0
    after = counters(sims)
    delta = [
        {k: a.get(k, 0.0) - b.get(k, 0.0) for k in (HITS, QUERIES, FINISHED)}
        for a, b in zip(after, before, strict=True)
    ]
    return sum(d[HITS] for d in delta) / sum(d[QUERIES] for d in delta), [d[FINISHED] for d in delta]


def watch_decisions(pool: ModelPool) -> list[tuple[str, float, float]]:
    """(reason, chosen backend's load, least candidate load) of each decision, as it was made."""
    assert pool.affinity is not None
    seen: list[tuple[str, float, float]] = []
    route = pool.affinity.route

    def watched(candidates: Any, hashes: Any) -> Any:
        loads = [c.load() for c in candidates]
        chosen = route(candidates, hashes)
        if chosen is not None:
            seen.append((chosen.reason, chosen.backend.load(), min(loads)))
        return chosen

    pool.affinity.route = watched  # type: ignore[method-assign]
    return seen


async def test_cache_aware_beats_least_load_and_keeps_the_bound(tmp_path: Path) -> None:
    with three_sims(tmp_path) as sims:
        backends = [(f"sim{i}", s.url, "m") for i, s in enumerate(sims)]
        with GatewayServer(make_config(tmp_path, backends, {"routing": "least_load"})) as gs:
            hit_least, _ = await run_phase(gs, sims, workload("A"))
        with GatewayServer(make_config(tmp_path, backends, {"routing": "cache_aware"})) as gs:
            hit_aware, _ = await run_phase(gs, sims, workload("B"))
        tight = "[gateway.cache_aware]\nbalance_abs = 4\n"  # 12 streams: a bound that the hot prefix reaches
        with GatewayServer(make_config(tmp_path, backends, {"routing": "cache_aware"}, extra=tight)) as gs:
            pool = gs.gw.router.pools["m"]
            seen = watch_decisions(pool)
            _, finished = await run_phase(gs, sims, workload("C", hot_share=0.6))
            assert pool.affinity is not None
            overloaded = pool.affinity.overloaded
    assert hit_aware > hit_least + 0.15, (hit_aware, hit_least)
    assert {reason for reason, _, _ in seen} >= {"affinity", "balance"}  # the hot prefix pushed past the bound
    beyond = [(reason, load, least) for reason, load, least in seen if overloaded(load, least)]
    assert not beyond and len(seen) > 50, beyond
    assert min(finished) > 0.75 * max(finished), finished  # the hot prefix did not make a hot spot
