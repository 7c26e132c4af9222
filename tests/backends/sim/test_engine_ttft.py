"""calibrate fits the engine's part of TTFT (backends/sim/calibrate/runs.engine_ttft_ms): the client's
TTFT less each request's time in flight outside the engine (Little's law on the load generator's
in-flight figure and the engine's gauges), which the model has no place for.

The starved run below is real vLLM beside two busy loops (2026-12-03, the calibrate test's fit run):
its API server held nearly every request, so the client's TTFT (109-274 ms) was the API server's.
Fitted as the engine's, it made the prefill cost 11 ms per prompt token; 16 users' prefills then
overloaded the modelled engine and the fit's own steps read -93%, -100%, -100%."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from backends.sim.calibrate.fit import calibrate
from backends.sim.calibrate.runs import (
    ENGINE_TTFT_MIN_SHARE,
    Observation,
    engine_ttft_ms,
    gauges_read,
    read_runs,
)
from backends.sim.settings import SimSettings


def observation(
    users: int, output_tps: float, rps: float, ttft_ms: float, running: float | None, in_flight: float | None
) -> Observation:
    return Observation(
        run="fit", index=users, users=users, prompt_tokens=77, output_tokens=32, output_tps=output_tps,
        tpot_p50_ms=None, ttft_p50_ms=ttft_ms, e2e_p50_ms=ttft_ms, tpot_mean_ms=None, ttft_mean_ms=ttft_ms,
        gpu_busy=None, cpu_interval_ms=None, running_mean=running, waiting_mean=None if running is None else 0.0,
        kv_usage_mean=None, max_num_seqs=None, measure_s=6.0, step_s=8.0, warmup_s=2.0, rps=rps,
        client_inflight_mean=in_flight,
    )  # fmt: skip


STARVED_RUN = Path(__file__).parents[2] / "fixtures" / "vllm_starved_run"
STARVED = [  # users, output TPS, rps, TTFT mean (ms), vLLM's running gauge, the load generator's in-flight
    observation(1, 245.33, 7.667, 123.72, 0.0, 0.99),
    observation(4, 272.0, 8.5, 285.58, None, 2.5),  # every scrape of vLLM's /metrics timed out
    observation(16, 1418.67, 44.333, 340.53, 0.286, 14.79),
]


def test_the_time_outside_the_engine_comes_off_the_ttft() -> None:
    # 4 users: 3.9 in flight at the client, 1.9 in the engine, 10 requests/s: 200 ms each outside it
    o = observation(4, 320.0, 10.0, 250.0, 1.9, 3.9)
    assert o.outside_engine_ms == pytest.approx(200.0)
    assert engine_ttft_ms(o, 250.0, gauges_read=True) == pytest.approx(50.0)
    # without the load generator's figure (an older report) every user counts as in flight
    assert observation(4, 320.0, 10.0, 250.0, 1.9, None).outside_engine_ms == pytest.approx(210.0)


def test_a_ttft_the_engine_has_too_small_a_part_of_is_left_out() -> None:
    # the boundary pair: the engine's part just under ENGINE_TTFT_MIN_SHARE of the TTFT, and at it
    o = observation(4, 320.0, 10.0, 250.0, 1.9, 3.9)  # 200 ms outside
    at = 200.0 / (1 - ENGINE_TTFT_MIN_SHARE)
    assert engine_ttft_ms(o, at, gauges_read=True) == pytest.approx(ENGINE_TTFT_MIN_SHARE * at)
    assert engine_ttft_ms(o, at - 0.01, gauges_read=True) is None


def test_a_step_without_gauges_keeps_its_ttft_only_where_no_step_had_them() -> None:
    blind = STARVED[1]
    assert blind.outside_engine_ms is None
    assert engine_ttft_ms(blind, 285.58, gauges_read=gauges_read(STARVED)) is None
    assert engine_ttft_ms(blind, 285.58, gauges_read=gauges_read([blind])) == 285.58


def test_the_starved_vllm_run_fits_its_own_busiest_step() -> None:
    """The run itself (tests/fixtures/vllm_starved_run: its report.json, timeline.csv and settings.json),
    in virtual time (0.5 s). The 1-user step cannot fit (one client gap for every load: 354 ms against its
    130-ms cycle); the 16-user step must, and the prefill cost is not fitted to the API server's TTFT."""
    runs = read_runs([STARVED_RUN])
    assert [(o.users, o.running_mean, o.client_inflight_mean) for o in runs.observations] == [
        (1, 0.0, 0.99), (4, None, 2.5), (16, 0.286, 14.79)
    ]  # fmt: skip
    result = calibrate(SimSettings(async_scheduling=False), runs.observations)  # vLLM on a CPU: synchronous
    busiest = result.steps[-1]
    assert busiest.model.output_tps == pytest.approx(1418.67, rel=0.2), busiest.model
    assert "forward_per_prefill_token_ms" not in result.fitted
    notes = "\n".join(result.notes)
    assert "TTFT left out of the fit for vllm_starved_run#0, vllm_starved_run#1, vllm_starved_run#2" in notes
    assert all(math.isfinite(fit.model.output_tps) and fit.model.output_tps > 0 for fit in result.steps)


def test_a_fit_never_prefers_a_model_that_finishes_nothing() -> None:
    """Another starved run (tests/fixtures/vllm_starved_run2): 16 users made less TPS than 1 (the API
    server capped it), and vLLM's bursts made the client's TPOT 0.01-0.21 ms. With a missing figure
    cheaper than those errors, the fit took the engine to 128 ms per sequence, where no request ended
    in any window: -99%, -100%, -100%. Every step must be modelled (the fit cannot match them all: the
    model has no API server)."""
    runs = read_runs([STARVED_RUN.with_name("vllm_starved_run2")])
    result = calibrate(SimSettings(async_scheduling=False), runs.observations)
    for fit in result.steps:
        assert fit.model.output_tps > 0.1 * fit.observation.output_tps, (fit.observation.label, fit.model)
