"""The article's three points, reproduced by the defaults in virtual time."""

import pytest

from backends.sim.plan.sweep import StepSummary, run_sweep, summarise
from backends.sim.plan.virtual import Arrival, VirtualEngine, closed_loop
from backends.sim.settings import SimSettings


def _at_256(async_scheduling: bool, slot_reuse: bool) -> StepSummary:
    settings = SimSettings().with_flags(async_scheduling=async_scheduling, slot_reuse=slot_reuse)
    [row] = run_sweep(settings, [256], prompt_tokens=512, output_tokens=256, step_duration_s=40, measure_last_s=20)
    return row


@pytest.fixture(scope="module")
def article() -> dict[str, StepSummary]:
    return {
        "baseline": _at_256(False, False),
        "slot_reuse": _at_256(False, True),
        "async": _at_256(True, True),
    }


def test_baseline_interval_about_equals_forward_and_gpu_half_busy(article):
    row = article["baseline"]
    assert row.batch_mean == pytest.approx(256, abs=1)
    assert row.token_interval_ms == pytest.approx(35, rel=0.1)  # the GPU waits the whole CPU interval
    assert row.cpu_interval_ms == pytest.approx(row.token_interval_ms, rel=0.01)
    assert row.forward_ms == pytest.approx(35, rel=0.2)
    assert 0.45 <= row.gpu_busy <= 0.60


def test_slot_reuse_cuts_interval_to_14ms_and_gpu_three_quarters_busy(article):
    row = article["slot_reuse"]
    assert row.token_interval_ms == pytest.approx(14, rel=0.1)
    assert row.cpu_interval_ms == pytest.approx(row.token_interval_ms, rel=0.01)
    assert 0.68 <= row.gpu_busy <= 0.80


def test_async_hides_the_interval(article):
    row = article["async"]
    assert row.gpu_busy >= 0.95
    # the GPU's gap between forwards all but vanishes (the bar: <= 5% of the
    # baseline's); the CPU still does the slot-reuse interval's work, behind the forward
    assert row.token_interval_ms <= 0.05 * article["baseline"].token_interval_ms
    assert row.cpu_interval_ms == pytest.approx(14, rel=0.1)


def test_async_gap_is_what_the_forward_cannot_hide():
    """At a batch whose CPU interval outgrows the forward, async scheduling leaves the
    GPU the difference (plus the part it never hides) between two forwards."""
    settings = SimSettings().with_flags(async_scheduling=True, slot_reuse=False, max_num_seqs=512)
    [row] = run_sweep(settings, [512], prompt_tokens=8, output_tokens=400, step_duration_s=30, measure_last_s=10)
    c = settings.cost
    forward = c.forward_fixed_ms + 512 * c.forward_per_seq_ms
    interval = c.interval_fixed_ms + 512 * (c.interval_per_seq_ms + c.interval_schedule_per_seq_ms)
    assert interval > forward
    assert row.token_interval_ms == pytest.approx(interval - forward + c.async_overhead_ms, rel=0.05)


def test_no_gap_is_counted_across_an_idle_engine():
    settings = SimSettings().with_flags(async_scheduling=False, slot_reuse=False)
    arrivals = [Arrival(0.0, list(range(100, 104)), 2), Arrival(5.0, list(range(200, 204)), 2)]
    run = VirtualEngine(settings).run(arrivals, until_s=10)
    gaps = [s.gap_s for s in run.steps]
    assert len(gaps) == 4 and gaps[0] is None and gaps[2] is None
    assert gaps[1] == pytest.approx(run.steps[1].cpu_s) and gaps[3] == pytest.approx(run.steps[3].cpu_s)


def test_async_tps_is_at_least_1_6_times_baseline_at_256(article):
    assert article["async"].output_tps / article["baseline"].output_tps >= 1.6
    assert article["slot_reuse"].output_tps > article["baseline"].output_tps


def test_tps_grows_with_concurrency_and_tpot_with_it():
    rows = run_sweep(SimSettings(), [32, 128], 128, 64, step_duration_s=20, measure_last_s=10)
    assert rows[0].output_tps < rows[1].output_tps
    tpots = [row.tpot_mean_s for row in rows]
    assert tpots[0] is not None and tpots[1] is not None and tpots[0] < tpots[1]
    for row in rows:
        # closed loop: Little's law ties TPS, concurrency and per-request latency together
        assert row.ttft_p50_s is not None and row.tpot_mean_s is not None
        latency = row.ttft_p50_s + 63 * row.tpot_mean_s
        assert row.rps * latency == pytest.approx(row.concurrency, rel=0.1)


def test_single_request_timing_is_exactly_the_model():
    settings = SimSettings().with_flags(async_scheduling=False, slot_reuse=False)
    run = VirtualEngine(settings).run([Arrival(0.0, list(range(100, 110)), 5)], until_s=10)
    [record] = run.requests
    prefill = settings.cost.forward_fixed_ms + 10 * settings.cost.forward_per_prefill_token_ms
    decode = settings.cost.forward_fixed_ms + settings.cost.forward_per_seq_ms
    interval = settings.cost.interval_fixed_ms + settings.cost.interval_per_seq_ms
    interval += settings.cost.interval_schedule_per_seq_ms
    assert record.ttft_s == pytest.approx((prefill + interval) / 1000)
    assert record.tpot_s == pytest.approx((decode + interval) / 1000)
    assert record.num_output_tokens == 5


def test_virtual_time_does_not_sleep():
    import time

    started = time.monotonic()
    run = closed_loop(SimSettings().with_flags(time_scale=100.0), 8, 16, 16, duration_s=600)
    assert run.end_s >= 600
    assert time.monotonic() - started < 10


def test_a_window_without_finished_requests_reports_none():
    [row] = run_sweep(SimSettings(), [16], 32, 4000, step_duration_s=10, measure_last_s=5)
    assert row.tpot_mean_s is None and row.output_tps > 0
    from backends.sim.plan.sweep import format_table

    assert "hold the step longer" in format_table([row])


def test_summarise_measures_only_the_window():
    run = closed_loop(SimSettings(), 16, 32, 32, duration_s=10)
    early = summarise(run, "m", 16, 0, 5)
    late = summarise(run, "m", 16, 5, 10)
    total = sum(s.num_new_tokens for s in run.steps if s.end_s <= 10)
    assert early.output_tps * 5 + late.output_tps * 5 == pytest.approx(total)
