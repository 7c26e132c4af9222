"""The engine's API server in the sim (backends/sim/engine/frontend.py, outbox.py): one first-come-
first-served server that every request passes on its way in and every token on its way out,
in virtual time and in the served sim."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from backends.sim.engine.frontend import Frontend
from backends.sim.plan.stepped import Schedule, Step, measure_steps, simulate
from backends.sim.plan.virtual import closed_loop
from backends.sim.settings import SimSettings
from backends.sim.testing import SimProcess, run_sim_process
from tests.backends.sim._client import metrics, stream

OUTPUT_TOKENS = 32
FAST_ENGINE = {"forward_fixed_ms": 1.0, "forward_per_seq_ms": 0.01, "interval_fixed_ms": 0.5}


def test_the_server_takes_one_thing_at_a_time_in_the_order_it_came() -> None:
    server = Frontend(per_request_s=0.002, per_token_s=0.0005)
    assert server.admit(0.0) == pytest.approx(0.002)
    assert server.deliver(0.001) == pytest.approx(0.0025)  # made while the server parsed: it waits
    assert server.deliver(0.001) == pytest.approx(0.003)  # behind the one before
    assert server.admit(1.0) == pytest.approx(1.002)  # idle meanwhile: no wait
    assert server.busy_s == pytest.approx(0.005)


def test_no_costs_no_server_and_time_scale_applies() -> None:
    assert Frontend.of(SimSettings()) is None
    server = Frontend.of(SimSettings().with_flags(frontend_per_token_ms=0.5, time_scale=10.0))
    assert server is not None and (server.per_request_s, server.per_token_s) == pytest.approx((0.0, 0.005))


def test_a_slow_server_caps_the_tokens_per_second_and_holds_requests_outside_the_engine() -> None:
    """1 ms per token: at most 1,000 tokens/s however many users and however fast the engine. The
    engine, done with its tokens long before the server is, holds few of the 64 users' requests."""
    engine = SimSettings(async_scheduling=False).with_flags(**FAST_ENGINE)
    served = engine.with_flags(frontend_per_token_ms=1.0)
    schedule = Schedule((Step(64, 6.0, 4.0),), 64, OUTPUT_TOKENS, warmup_s=1.0)
    alone, behind = (measure_steps(simulate(s, schedule), schedule)[0] for s in (engine, served))
    assert 0.97 * 1000.0 <= behind.output_tps <= 1000.0 * 1.01
    assert alone.output_tps > 5 * behind.output_tps
    assert behind.running_mean < 0.5 * 64 < alone.running_mean
    assert behind.engine_ttft_mean_ms is not None and behind.ttft_mean_ms is not None
    assert behind.engine_ttft_mean_ms < 0.1 * behind.ttft_mean_ms  # the wait is the server's, not the engine's
    assert alone.engine_ttft_mean_ms == pytest.approx(alone.ttft_mean_ms)


def test_the_per_request_cost_is_paid_before_the_engine_sees_it() -> None:
    """One user, 20 ms per request: every request reaches the engine 20 ms after it was sent."""
    settings = SimSettings(async_scheduling=False).with_flags(**FAST_ENGINE, frontend_per_request_ms=20.0)
    run = closed_loop(settings, 1, 16, 4, duration_s=1.0, gap_s=0.0)
    done = [r for r in run.requests if r.finish_s is not None]
    assert len(done) >= 10
    for r in done:
        assert r.engine_arrival_s == pytest.approx(r.arrival_s + 0.020)
        assert r.ttft_s is not None and r.engine_ttft_s is not None
        assert r.ttft_s == pytest.approx(r.engine_ttft_s + 0.020)


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    config = tmp_path_factory.mktemp("frontend") / "config.toml"
    config.write_text(
        "[token_interval]\nasync_scheduling = false\n\n[sim]\nforward_fixed_ms = 1.0\ninterval_fixed_ms = 0.5\n"
        "frontend_per_request_ms = 150.0\nfrontend_per_token_ms = 40.0\n"
    )
    with run_sim_process(model="sim-test", config=Path(config)) as process:
        yield process


async def test_the_served_sim_delivers_at_the_servers_pace(slow_server: SimProcess) -> None:
    """Served over real HTTP: token k (from 0) no sooner than the request's 150 ms plus k + 1 tokens'
    40 ms (the engine makes one every 1.5 ms). Lower bounds only: the server never hands a token out
    before it is due, however busy the machine (a late one makes the gap to the next one shorter)."""
    body = {"model": "sim-test", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "ignore_eos": True}  # fmt: skip
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        result = await stream(session, f"{slow_server.url}/v1/chat/completions", body)
        scraped = await metrics(session, slow_server.url)
    assert result.done and len(result.token_times_s) == 6
    for k, t in enumerate(result.token_times_s):
        assert t - result.sent_s >= 0.150 + 0.040 * (k + 1), (k, t - result.sent_s)
    # the engine's own first token came after the server's 150 ms on the request, not at once
    assert scraped["vllm:time_to_first_token_seconds_count"] == 1
    assert scraped["vllm:time_to_first_token_seconds_sum"] >= 0.150


@pytest.fixture(scope="module")
def parsing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    config = tmp_path_factory.mktemp("parsing") / "config.toml"
    config.write_text("[sim]\nforward_fixed_ms = 1.0\nfrontend_per_request_ms = 1000.0\n")
    with run_sim_process(model="sim-test", config=Path(config)) as process:
        yield process


async def test_a_client_that_leaves_while_its_request_is_parsed_never_reaches_the_engine(
    parsing_server: SimProcess,
) -> None:
    """The first request leaves during its 1,000 ms at the API server: it is counted as aborted and
    the engine never prefills it. A second request, parsed after it (so after the first's 1,000 ms
    would have run out), is all the engine ever computed."""
    url = parsing_server.url
    label = '{model_name="sim-test"}'
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        body = {"model": "sim-test", "prompt": "one two three", "max_tokens": 4, "stream": True}
        async with session.post(f"{url}/v1/completions", json=body) as response:
            assert response.status == 200  # the headers; no token can come for 1,000 ms
            response.close()
        aborted = 'vllm:request_success_total{finished_reason="abort",model_name="sim-test"}'
        for _ in range(200):  # the server notices the hang-up (its handler is cancelled)
            if (await metrics(session, url)).get(aborted) == 1:
                break
            await asyncio.sleep(0.05)
        second = {"model": "sim-test", "prompt": "four five", "max_tokens": 1}
        async with session.post(f"{url}/v1/completions", json=second) as response:
            usage = (await response.json())["usage"]
        scraped = await metrics(session, url)
    assert scraped[aborted] == 1
    # every token the engine computed is the second request's: its prompt (whose step samples the first
    # token) and a decode step per token after the first
    computed = usage["prompt_tokens"] + usage["completion_tokens"] - 1
    assert scraped[f"vllm:iteration_tokens_total_sum{label}"] == computed
    assert scraped[f"vllm:generation_tokens_total{label}"] == usage["completion_tokens"] == 1
