"""calibrate's API server (backends/sim/calibrate/fit_terms.api_server): where the load generator had more
requests in flight than the engine held, a first-come-first-served server as slow as every step
allows; and, behind it, the client gap from the users the load generator did not have in flight."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from backends.sim import cli
from backends.sim.calibrate.fit_terms import api_server, client_gap
from backends.sim.calibrate.runs import Observation
from backends.sim.settings import SimSettings, settings_from_config
from common.config import load_config
from tests.backends.sim.harness_runs import Stepped, write_run


def observation(index: int, users: int, tps: float, running: float, in_flight: float, rps: float) -> Observation:
    return Observation(
        run="fit", index=index, users=users, prompt_tokens=77, output_tokens=32, output_tps=tps,
        tpot_p50_ms=None, ttft_p50_ms=40.0, e2e_p50_ms=None, tpot_mean_ms=None, ttft_mean_ms=None,
        gpu_busy=None, cpu_interval_ms=None, running_mean=running, waiting_mean=0.0, kv_usage_mean=None,
        max_num_seqs=None, measure_s=6.0, step_s=8.0, warmup_s=2.0, rps=rps, client_inflight_mean=in_flight,
    )  # fmt: skip


# Real vLLM on 2 cores (CI, 2026-12-03): the fit run's steps; the held-out run then made 683 and 688
# tok/s at 8 and 32 users, and the model without an API server predicted 17.9x that at 32.
VLLM_FIT = [
    observation(0, 1, 664.0, 0.111, 0.99, 20.667),
    observation(1, 4, 854.0, 0.8, 3.1, 26.667),
    observation(2, 16, 2936.0, 10.7, 13.35, 93.167),
]


def test_the_server_is_saturated_at_the_busiest_step() -> None:
    """The 16-user step made the most requests per second (93.167): the server takes 1 / 93.167 s
    per request, the slowest that still makes every step, and 32 tokens share it (nothing in
    CONFIG to split by)."""
    values, note = api_server(SimSettings(), VLLM_FIT)
    assert values["frontend_per_request_ms"] == 0.0
    assert values["frontend_per_token_ms"] == pytest.approx(1000.0 / 93.167 / 32, rel=1e-9)
    assert "10.73 ms per request of 32 tokens" in note and "fit#2's 93.17 requests per second" in note
    assert "all per token" in note and "0.9 of 1 at fit#0, 2.3 of 4 at fit#1, 2.7 of 16 at fit#2" in note
    # the busiest step bounds it whether or not it held requests outside itself
    quiet_and_busier = observation(3, 32, 6400.0, 31.0, 32.0, 200.0)
    assert 32 * api_server(SimSettings(), [*VLLM_FIT, quiet_and_busier])[0]["frontend_per_token_ms"] == 5.0
    assert api_server(SimSettings(), [quiet_and_busier]) == ({}, "")


def test_no_server_where_no_step_held_a_tenth_of_its_users_outside_the_engine() -> None:
    """The boundary pair: 1.99 of 20 held (under 10%): no server; 2 (at 10%): a server."""
    below = [observation(0, 20, 3000.0, 10.0, 11.99, 90.0)]
    at = [observation(0, 20, 3000.0, 10.0, 12.0, 90.0)]
    assert api_server(SimSettings(), below) == ({}, "")
    assert api_server(SimSettings(), at)[0]["frontend_per_token_ms"] > 0
    older = [replace(o, client_inflight_mean=None) for o in VLLM_FIT]  # reports without the client's count
    assert api_server(SimSettings(), older) == ({}, "")


def test_split_between_request_and_tokens_as_config_has_it() -> None:
    """CONFIG 2 ms per request and 0.25 per token: 2 of every 10 ms of a 32-token request."""
    config = SimSettings().with_flags(frontend_per_request_ms=2.0, frontend_per_token_ms=0.25)
    values, note = api_server(config, VLLM_FIT)
    total = 1000.0 / 93.167
    assert values["frontend_per_request_ms"] == pytest.approx(0.2 * total, rel=1e-9)
    assert values["frontend_per_token_ms"] == pytest.approx(0.8 * total / 32, rel=1e-9)
    assert "as in CONFIG" in note


def test_behind_a_server_the_gap_is_the_users_not_in_flight() -> None:
    """16 users at 2,936 tok/s of 32 tokens (a 174.4-ms cycle): 13.35 in flight, 10.7 in the engine.
    Behind the server the gap is the 2.65 users not in flight (28.9 ms); without it, the 5.3 not in
    the engine (57.8 ms)."""
    step = VLLM_FIT[2:]
    cycle_ms = 1000.0 * 16 * 32 / 2936.0
    gap_ms, note = client_gap(SimSettings(), step, past_api_server=True)
    assert gap_ms == pytest.approx(cycle_ms * (16 - 13.35) / 16, rel=1e-9)
    assert "the load generator had fewer requests in flight than there were users" in note
    assert client_gap(SimSettings(), step)[0] == pytest.approx(cycle_ms * (16 - 10.7) / 16, rel=1e-9)


def test_calibrate_finds_a_slow_api_server_and_predicts_its_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fast engine behind a server that takes 1 ms per token (1,000 tok/s at most): the runs at 4,
    16 and 64 users (the last two at the cap) give the server back within 10%, and `sim plan` with
    the fitted file predicts 32 and 128 users within 10% of the truth's output TPS."""
    truth = SimSettings(async_scheduling=False).with_flags(
        forward_fixed_ms=3.0, forward_per_seq_ms=0.05, interval_fixed_ms=1.0, frontend_per_token_ms=1.0
    )
    fit = write_run(tmp_path / "fit", truth, Stepped((4, 16, 64), 128, 32))
    held = write_run(tmp_path / "held", truth, Stepped((32, 128), 128, 32, seed=2))
    config, out = tmp_path / "config.toml", tmp_path / "fitted.toml"
    config.write_text("[token_interval]\nasync_scheduling = false\n")
    assert cli.main(["calibrate", str(fit), "--config", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "API server" in printed, printed
    fitted = settings_from_config(load_config(out, strict_env=False)).cost
    assert 32 * fitted.frontend_per_token_ms + fitted.frontend_per_request_ms == pytest.approx(32.0, rel=0.10)
    argv = ["plan", "--config", str(out), "--concurrency", "32,128", "--prompt-tokens", "128",
            "--output-tokens", "32", "--step-duration-s", "20", "--measure-last-s", "15", "--json"]  # fmt: skip
    assert cli.main(argv) == 0
    predicted = {row["concurrency"]: row for row in json.loads(capsys.readouterr().out)}
    for step in json.loads((held / "report.json").read_text())["steps"]:
        ratio = predicted[step["concurrency"]]["output_tps"] / step["output_tps"]
        assert ratio == pytest.approx(1.0, abs=0.10), (step["concurrency"], ratio)
