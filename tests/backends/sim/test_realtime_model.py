"""Served in real time, under load, the engine keeps to its model: TTFT and TPOT that a
real HTTP client measures match the same requests replayed in virtual time (10%)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import aiohttp
import pytest

from backends.sim.engine import words
from backends.sim.plan.virtual import Arrival, VirtualEngine, VirtualRequest
from backends.sim.settings import SimSettings
from backends.sim.testing import run_sim_process
from tests.backends.sim._client import StreamResult, stream

# Steps of ~0.2 s: on a shared 2-core machine, scheduling noise of tens of ms stays
# well under 10% of a modelled TTFT or TPOT.
TIME_SCALE = 20.0
CONCURRENCY = 32
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 12
DURATION_S = 6.0
# The users' first requests spread over this long (about three steps): started together, 32
# identical users stay in lockstep, and whether their burst lands just before or just after a
# step boundary (a few ms on a busy machine) moves every TTFT by a step at once, in the served
# sim and in the replay alike but not always on the same side.
STAGGER_S = 0.6


Served = list[list[tuple[list[int], StreamResult]]]  # per user, in order: (prompt ids, result)


async def _user(session, url, rng, deadline, out, start_s):
    await asyncio.sleep(start_s)
    while time.monotonic() < deadline:
        prompt = " ".join(rng.choice(words.WORDS) + str(rng.randrange(10**6)) for _ in range(PROMPT_TOKENS))
        body = {"prompt": prompt, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True}
        result = await stream(session, f"{url}/v1/completions", body)
        out.append((words.tokenize(prompt), result))


PROBE_S = 0.005  # the client's lag probe: how late a sleep this long wakes up


async def _probe(deadline: float, lags: list[float]) -> None:
    """How late the client's own event loop wakes (a starved machine delays its clock readings)."""
    while time.monotonic() < deadline:
        t = time.monotonic()
        await asyncio.sleep(PROBE_S)
        lags.append(time.monotonic() - t - PROBE_S)


async def _load(url: str) -> tuple[Served, float]:
    """The users' requests and results, and how late the machine let the client and the sim run:
    the client's wake-up lag p90 plus the sim.s own step-loop lag p90 (its /sim/stats), in seconds."""
    served: Served = [[] for _ in range(CONCURRENCY)]
    rng = random.Random(7)
    deadline = time.monotonic() + DURATION_S
    connector = aiohttp.TCPConnector(limit=0)
    lags: list[float] = []
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        users = [_user(session, url, rng, deadline, served[u], u * STAGGER_S / CONCURRENCY) for u in range(CONCURRENCY)]
        await asyncio.gather(_probe(deadline, lags), *users)
        async with session.get(f"{url}/sim/stats") as response:
            sim_lag_s = (await response.json())["step_lag_ms"]["p90"] / 1000.0
    client_lag_s = statistics.quantiles(lags, n=10)[-1] if len(lags) >= 10 else 0.0
    return served, client_lag_s + sim_lag_s


def _replay(settings: SimSettings, served: Served) -> dict[tuple[int, int], VirtualRequest]:
    """The same users in virtual time: each user's first request at its real send time
    (relative to the first), each next one after the model's finish plus the real gap
    the client took between its last token and its next request."""
    t0 = min(requests[0][1].sent_s for requests in served)
    starts = [Arrival(reqs[0][1].sent_s - t0, reqs[0][0], OUTPUT_TOKENS, user=u) for u, reqs in enumerate(served)]
    sent = [0] * len(served)
    records: dict[tuple[int, int], VirtualRequest] = {}

    def on_finish(record: VirtualRequest, t_s: float) -> list[Arrival]:
        user, i = record.user, sent[record.user]
        records[(user, i)] = record
        sent[user] = i + 1
        if i + 1 >= len(served[user]):
            return []
        gap = served[user][i + 1][1].sent_s - served[user][i][1].token_times_s[-1]
        return [Arrival(t_s + gap, served[user][i + 1][0], OUTPUT_TOKENS, user=user)]

    VirtualEngine(settings).run(starts, until_s=3600, on_finish=on_finish)
    return records


TRIM = 0.1  # of each end


def trimmed_mean(values: list[float]) -> float:
    """The mean without the lowest and highest TRIM. Not the median: a request's TTFT is a whole
    number of steps plus a part, so a lag of a few ms moves the requests sent just before a step
    boundary a whole step later; the share that moves grows with the lag, and so does the mean
    (by about the lag), while the median stays put until half have moved and then jumps a whole
    step (0.60 vs 0.48 s once, lag 30 ms). The trim keeps a process stalled now and then (a
    machine shared with other test runs) out of it."""
    values = sorted(values)
    k = int(len(values) * TRIM)
    return statistics.fmean(values[k : len(values) - k])


@pytest.mark.slow
@pytest.mark.parametrize("scheduling", [("sync", "--no-slot-reuse"), ("async", "--slot-reuse")])
async def test_client_measured_ttft_and_tpot_match_the_model(scheduling):
    mode, reuse = scheduling
    args = ("--time-scale", str(TIME_SCALE), "--scheduling", mode, reuse)
    with run_sim_process(*args) as sim:
        served, lag_s = await _load(sim.url)
    settings = SimSettings().with_flags(
        async_scheduling=mode == "async", slot_reuse=reuse == "--slot-reuse", time_scale=TIME_SCALE
    )
    modelled = _replay(settings, served)
    real = {(u, i): result for u, reqs in enumerate(served) for i, (_, result) in enumerate(reqs)}
    assert len(real) >= CONCURRENCY * 2
    assert all(len(r.token_times_s) == OUTPUT_TOKENS for r in real.values())
    assert modelled.keys() == real.keys()
    real_ttft = trimmed_mean([r.ttft_s for r in real.values()])
    real_tpot = trimmed_mean([r.tpot_s for r in real.values()])
    model_ttft = trimmed_mean([m.ttft_s or 0.0 for m in modelled.values()])
    model_tpot = trimmed_mean([m.tpot_s or 0.0 for m in modelled.values()])
    detail = (
        f"ttft real {real_ttft:.4f} model {model_ttft:.4f}; tpot real {real_tpot:.4f} model {model_tpot:.4f}; "
        f"lag {lag_s:.4f}"
    )
    print(detail)
    # Both to 10%, plus the lag the machine put on the clocks (the client's wake-ups and the sim's
    # steps, p90): staggered users read within 2% here on a quiet machine; beside two busy loops and
    # three other test workers TTFT once read +16% (67 ms on 0.42 s). The error this test is for, a
    # served sim off its model (async vs sync hides or shows the token interval: 3/8 of a step, 75 ms),
    # is larger than the bound wherever the lag is under a step's quarter.
    assert abs(real_ttft - model_ttft) <= 0.10 * model_ttft + lag_s, detail
    assert abs(real_tpot - model_tpot) <= 0.10 * model_tpot + lag_s, detail
