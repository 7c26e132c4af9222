"""calibrate's client gap (backends/sim/calibrate/fit_terms.client_gap): the share of a user's cycle (users /
requests per second) that the engine's own gauges put outside the engine."""

from __future__ import annotations

import pytest

from backends.sim.calibrate.fit_terms import client_gap
from backends.sim.calibrate.runs import Observation
from backends.sim.settings import SimSettings


def observation(users: int, output_tps: float, running: float, e2e_p50_ms: float) -> Observation:
    return Observation(
        run="fit", index=0, users=users, prompt_tokens=77, output_tokens=32, output_tps=output_tps,
        tpot_p50_ms=None, ttft_p50_ms=100.0, e2e_p50_ms=e2e_p50_ms, tpot_mean_ms=None, ttft_mean_ms=None,
        gpu_busy=None, cpu_interval_ms=None, running_mean=running, waiting_mean=0.0, kv_usage_mean=None,
        max_num_seqs=None, measure_s=6.0, step_s=8.0, warmup_s=2.0,
    )  # fmt: skip


def test_the_gap_is_the_share_of_the_cycle_outside_the_engine() -> None:
    """Real vLLM beside two busy loops (2026-12-03): 16 users, 1418.67 tok/s of 32-token answers
    (a 0.361-s cycle), the engine's gauge 0.286: the gap is 0.361 s x 15.714/16 = 354.5 ms. Taking
    the client's E2E (236.8 ms) for the time in the engine made it 13,000 ms: the model then
    finished nothing in any window."""
    gap_ms, note = client_gap(SimSettings(), [observation(16, 1418.67, 0.286, 236.8)])
    assert gap_ms == pytest.approx(1000 * 16 * 32 / 1418.67 * (16 - 0.286) / 16, rel=1e-9)
    assert gap_ms == pytest.approx(354.5, abs=0.1) and "client_gap_ms 354.5" in note
    # half the users outside: half the cycle (4 users, 1000 tok/s: a 0.128-s cycle)
    assert client_gap(SimSettings(), [observation(4, 1000.0, 2.0, 100.0)])[0] == pytest.approx(64.0)
    # under 10% outside: the gauges cannot tell; the load generator's usual turnaround is assumed
    assert "assumed" in client_gap(SimSettings(), [observation(16, 1000.0, 14.5, 100.0)])[1]


def test_a_gauge_that_read_0_puts_the_whole_cycle_outside() -> None:
    """Real vLLM beside two busy loops (2026-12-03): 1 user at 517.33 tok/s of 32-token answers (a
    61.9-ms cycle) and the engine's running gauge 0 at both scrapes. Left out, the gap was assumed
    (1 ms) and calibrate's model made 2977 tok/s of this step (+475%)."""
    gap_ms, note = client_gap(SimSettings(), [observation(1, 517.33, 0.0, 47.0)])
    assert gap_ms == pytest.approx(1000 * 32 / 517.33, rel=1e-9)
    assert "the engine held fewer requests than there were users" in note
    # the median over the steps: 1, 4 and 16 users with the gauge at 0 (cycles 62, 218 and 830 ms)
    steps = [observation(1, 517.33, 0.0, 47.0), observation(4, 586.67, 0.0, 135.2), observation(16, 616.61, 0.0, 417.6)]
    assert client_gap(SimSettings(), steps)[0] == pytest.approx(1000 * 4 * 32 / 586.67, rel=1e-9)
