"""`zerogap sim calibrate` on runs against sims whose cost model is known and not the
default: the fitted terms come back, and `zerogap sim plan --config FILE` predicts the
engine at loads the fit never saw (output TPS and TPOT p50 within 10%, TTFT p50 within 25%).

The runs are written by harness_runs.py: the engine in virtual time, measured and written
as the harness writes a stepped run (report.json valid against its schema, timeline.csv,
settings.json), with a load generator that answers 0-4 ms after each response.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.sim import cli
from backends.sim.settings import SimSettings, settings_from_config
from common.config import load_config
from tests.backends.sim.harness_runs import Stepped, write_run

TRUTH = {  # every term off its default
    "forward_fixed_ms": 8.0,
    "forward_per_seq_ms": 0.2,
    "forward_per_prefill_token_ms": 0.02,
    "interval_fixed_ms": 4.0,
    "interval_per_seq_ms": 0.06,
    "interval_schedule_per_seq_ms": 0.1,
    "async_overhead_ms": 0.8,
}
OUTPUT_TOKENS = 32
FIT = Stepped((4, 16, 64), 256, OUTPUT_TOKENS)
FIT_LONG_PROMPT = Stepped((4, 16), 1024, OUTPUT_TOKENS, seed=1)  # TTFT against prompt length: the prefill cost
HELD_OUT = Stepped((32, 128), 256, OUTPUT_TOKENS, seed=2)


def _mode_config(async_scheduling: bool, slot_reuse: bool) -> str:
    """The engine's config.toml as its user knows it: scheduling settings, no cost model."""
    return (
        "# the engine's settings\n[token_interval]\n"
        f"async_scheduling = {str(async_scheduling).lower()}\nslot_reuse = {str(slot_reuse).lower()}\n\n"
        "[sim]\ntime_scale = 1.0  # kept\n\n[logging]\nlog_tps = true\n"
    )


def _pinned(async_scheduling: bool, slot_reuse: bool) -> dict[str, tuple[str, ...]]:
    """The sums of fields the data pins down in this mode (see fit_terms.py)."""
    per_seq = ("interval_per_seq_ms",) if slot_reuse else ("interval_per_seq_ms", "interval_schedule_per_seq_ms")
    terms: list[tuple[str, ...]] = [("forward_fixed_ms",), ("forward_per_seq_ms",), ("interval_fixed_ms",)]
    terms.append(("forward_per_prefill_token_ms",))
    terms.append(per_seq)
    if async_scheduling:
        terms.append(("async_overhead_ms",))
    return {" + ".join(t): t for t in terms}


def _plan(config: Path, capsys: pytest.CaptureFixture[str]) -> dict[int, dict[str, float]]:
    argv = ["plan", "--config", str(config), "--concurrency", "32,128", "--prompt-tokens", "256",
            "--output-tokens", str(OUTPUT_TOKENS), "--step-duration-s", "16", "--measure-last-s", "10",
            "--json"]  # fmt: skip
    capsys.readouterr()
    assert cli.main(argv) == 0
    return {row["concurrency"]: row for row in json.loads(capsys.readouterr().out)}


@pytest.mark.parametrize(
    ("async_scheduling", "slot_reuse"),
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["baseline", "slot_reuse", "async", "async+slot_reuse"],
)
def test_calibrate_recovers_the_cost_model_and_predicts_held_out_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], async_scheduling: bool, slot_reuse: bool
) -> None:
    truth = SimSettings(async_scheduling=async_scheduling, slot_reuse=slot_reuse).with_flags(**TRUTH)
    fit_runs = [write_run(tmp_path / "fit", truth, FIT), write_run(tmp_path / "fit-long", truth, FIT_LONG_PROMPT)]
    held_out = json.loads((write_run(tmp_path / "held", truth, HELD_OUT) / "report.json").read_text())["steps"]
    config, out = tmp_path / "config.toml", tmp_path / "fitted.toml"
    config.write_text(_mode_config(async_scheduling, slot_reuse))

    assert cli.main(["calibrate", *map(str, fit_runs), "--config", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    print(printed)
    assert "measured -> modelled" in printed and "fit#2" in printed and "largest error" in printed

    # FILE: CONFIG's text and settings, with the fitted [sim]
    text = out.read_text()
    assert text.startswith("# the engine's settings") and "log_tps = true" in text and "time_scale = 1.0" in text
    fitted = settings_from_config(load_config(out, strict_env=False))
    assert (fitted.async_scheduling, fitted.slot_reuse) == (async_scheduling, slot_reuse)
    for name, fields in _pinned(async_scheduling, slot_reuse).items():
        got = sum(getattr(fitted.cost, f) for f in fields)
        want = sum(TRUTH[f] for f in fields)
        assert got == pytest.approx(want, rel=0.10), f"{name}: fitted {got:.4g}, truth {want:.4g}"

    # predictions at loads the fit never saw, by `zerogap sim plan --config FILE`
    predicted = _plan(out, capsys)
    errors = []
    for step in held_out:
        row = predicted[step["concurrency"]]
        tps = row["output_tps"] / step["output_tps"] - 1
        tpot = 1000 * row["tpot_p50_s"] / step["tpot_ms"]["p50"] - 1
        ttft = 1000 * row["ttft_p50_s"] / step["ttft_ms"]["p50"] - 1
        errors.append((step["concurrency"], tps, tpot, ttft))
        print(f"held out {step['concurrency']} users: TPS {tps:+.1%}, TPOT p50 {tpot:+.1%}, TTFT p50 {ttft:+.1%}")
    for users, tps, tpot, ttft in errors:
        assert abs(tps) <= 0.10 and abs(tpot) <= 0.10 and abs(ttft) <= 0.25, (users, tps, tpot, ttft)


def test_without_engine_signals_it_says_what_it_could_not_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No GPU busy, no CPU interval, one prompt length (a vLLM run without a GPU source): the sums are
    fitted, the split and the client's turnaround are assumed, and the output says so."""
    truth = SimSettings(async_scheduling=False, slot_reuse=True).with_flags(**TRUTH)
    run = write_run(tmp_path / "run", truth, FIT, engine_signals=False)
    config, out = tmp_path / "config.toml", tmp_path / "fitted.toml"
    config.write_text(_mode_config(False, True))
    assert cli.main(["calibrate", str(run), "--config", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "no GPU-busy signal" in printed and "cannot be split" in printed
    assert "one prompt length (256 tokens)" in printed and "client_gap_ms assumed 1 " in printed
    fitted = settings_from_config(load_config(out, strict_env=False)).cost
    step_fixed = fitted.forward_fixed_ms + fitted.interval_fixed_ms
    assert step_fixed == pytest.approx(TRUTH["forward_fixed_ms"] + TRUTH["interval_fixed_ms"], rel=0.10)
    default = SimSettings().cost
    assert fitted.forward_fixed_ms / fitted.interval_fixed_ms == pytest.approx(
        default.forward_fixed_ms / default.interval_fixed_ms, rel=1e-5
    )  # split as in CONFIG (the defaults); the file holds 6 significant digits of each


def test_calibrate_refuses_a_folder_without_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    config = tmp_path / "config.toml"
    config.write_text("")
    argv = ["calibrate", str(tmp_path / "empty"), "--config", str(config), "--out", str(tmp_path / "o.toml")]
    assert cli.main(argv) == 2
    assert "no report.json in it" in capsys.readouterr().err
    assert not (tmp_path / "o.toml").exists()
